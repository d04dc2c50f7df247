"""Which names a connection's requests were encoded from, per schema version.

A request names its space (and index) by id: the methods resolve a name to
its id from the schema cache, then encode.  After error 109 (the schema
changed) the connection reloads the schema and sends the same bytes again,
which is only the same request when the names still stand for those ids: a
space dropped and another created in its place takes its id.  ``Resolutions``
records each name resolved at each schema version (on a cache miss only, so
nothing per request), and says after the reload whether a refused request's
ids still carry the names it was encoded from.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

import msgpack
from tarantool.error import SchemaError

from gtarantool.protocol.constants import IPROTO_INDEX_ID, IPROTO_SPACE_ID

# Schema versions remembered: a request refused with 109 was encoded at a
# version at most a few reloads old.
VERSIONS = 4


class Resolutions:
    """Names resolved at each schema version: ``{version: {space id: name,
    (space id, index id): index name}}``."""

    __slots__ = ("_names",)

    def __init__(self) -> None:
        self._names: Dict[Any, Dict[Any, str]] = {}

    def note(self, version: Any, key: Any, name: str) -> None:
        """``name`` resolved to ``key`` (a space id, or (space id, index id))
        at schema ``version``."""
        names = self._names.get(version)
        if names is None:
            if len(self._names) >= VERSIONS:
                self._names.clear()
            names = self._names[version] = {}
        names[key] = name

    def still_named(self, schema: Optional[Any], version: Any, body: Any) -> bool:
        """Whether the request ``body`` encoded at ``version`` names, in the
        reloaded ``schema`` (a tarantool-python ``Schema``), the space and
        index it was encoded for: True when no name was resolved for it (ids
        given by the caller mean what they say), False when a name now stands
        for another id or for nothing.

        :raises tarantool.error.NetworkError: the schema could not be read.
        """
        names = self._names.get(version)
        if not names or schema is None:
            return True
        try:
            fields = msgpack.unpackb(body, strict_map_key=False)
        except Exception:  # noqa: BLE001 - not a map of ids: nothing resolved in it
            return True
        if type(fields) is not dict:
            return True
        space_id = fields.get(IPROTO_SPACE_ID)
        index_id = fields.get(IPROTO_INDEX_ID, 0)
        space, index = names.get(space_id), names.get((space_id, index_id))
        try:
            if space is not None and schema.get_space(space).sid != space_id:
                return False
            if index is not None and schema.get_index(space_id, index).iid != index_id:
                return False
        except SchemaError:   # the name is gone
            return False
        return True
