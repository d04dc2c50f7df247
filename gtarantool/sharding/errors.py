"""vshard's errors as the router raises them, and what each says about the call.

:class:`ShardingError` is a vshard error (``code``/``name`` as vshard's error.lua);
:class:`StorageError` is the storage function's own failure.  Every error the
router raises carries ``applied``: False when the storages proved the call did
not run (a vshard refusal returned as ``nil, err`` or raised before the
function), None when it may have run (a timeout or a broken connection after
the call was sent, the function's own error).
"""
from __future__ import annotations

import json
from typing import Any, Dict, Optional

from tarantool.error import DatabaseError

from gtarantool.protocol.constants import ER_ACCESS_DENIED, ER_NO_SUCH_PROC, ER_PROC_LUA

__all__ = ["ShardingError", "StorageError"]

# vshard's error codes (error.lua) the router acts on.
WRONG_BUCKET = 1
NON_MASTER = 2
TRANSFER_IS_IN_PROGRESS = 7
UNREACHABLE_REPLICASET = 8
NO_ROUTE_TO_BUCKET = 9
BUCKET_IS_CORRUPTED = 10
UNREACHABLE_MASTER = 11
UNKNOWN_BUCKETS = 18
BUCKET_IS_LOCKED = 22
STORAGE_IS_DISABLED = 33
STORAGE_CFG_IS_IN_PROGRESS = 37
MASTER_NOT_SYNCED = 42
ERROR_NAMES = {WRONG_BUCKET: "WRONG_BUCKET", NON_MASTER: "NON_MASTER",
               TRANSFER_IS_IN_PROGRESS: "TRANSFER_IS_IN_PROGRESS",
               UNREACHABLE_REPLICASET: "UNREACHABLE_REPLICASET",
               NO_ROUTE_TO_BUCKET: "NO_ROUTE_TO_BUCKET", UNREACHABLE_MASTER: "UNREACHABLE_MASTER",
               UNKNOWN_BUCKETS: "UNKNOWN_BUCKETS", BUCKET_IS_LOCKED: "BUCKET_IS_LOCKED",
               STORAGE_IS_DISABLED: "STORAGE_IS_DISABLED",
               STORAGE_CFG_IS_IN_PROGRESS: "STORAGE_CFG_IS_IN_PROGRESS",
               MASTER_NOT_SYNCED: "MASTER_NOT_SYNCED"}
# The bucket is elsewhere or on its way: correct the map, send again.
MOVED = frozenset((WRONG_BUCKET, TRANSFER_IS_IN_PROGRESS, BUCKET_IS_LOCKED))
# The storage cannot take the call yet (a failover, a start-up): send again later.
NOT_READY = frozenset((NON_MASTER, STORAGE_IS_DISABLED, STORAGE_CFG_IS_IN_PROGRESS,
                       MASTER_NOT_SYNCED))
# A read refused so may go to another replica of the same replica set first.
READ_ELSEWHERE = frozenset((WRONG_BUCKET, TRANSFER_IS_IN_PROGRESS, STORAGE_IS_DISABLED,
                            STORAGE_CFG_IS_IN_PROGRESS))


class ShardingError(DatabaseError):
    """A vshard error (``type`` ``'ShardingError'``): ``code`` and ``name`` are
    vshard's (error.lua), ``details`` the error's fields as the storage sent them
    (``bucket_id``, ``destination``, ...), ``replicaset`` the id of the replica
    set it concerns (None when it concerns none), ``applied`` False when the
    storage refused the call before running it."""

    def __init__(self, code: int, message: str, details: Optional[Dict[str, Any]] = None,
                 replicaset: Any = None, name: Optional[str] = None,
                 applied: Optional[bool] = False) -> None:
        super().__init__(code, message)
        self.details = dict(details or {})
        self.name = name or self.details.get("name") or ERROR_NAMES.get(code)
        self.type = "ShardingError"
        self.replicaset = replicaset
        self.applied = applied

    @classmethod
    def from_storage(cls, err: Dict[str, Any], replicaset: Any) -> ShardingError:
        """A refusal the storage sent (``nil, err``): not applied."""
        return cls(err.get("code", 0), err.get("message", str(err)), err, replicaset)


class StorageError(DatabaseError):
    """The function failed on the storage (raised, or returned ``nil, err``):
    ``code`` and ``type`` are the error's (box's, or the application's),
    ``details`` its fields, ``replicaset`` where it ran; ``applied`` is None
    (the function ran, and may have changed data before it failed)."""

    def __init__(self, err: Any, replicaset: Any) -> None:
        details = err if isinstance(err, dict) else {"message": str(err)}
        code = details.get("code") if isinstance(details.get("code"), int) else 0
        inner = getattr(details.get("details"), "errcode", None)
        if isinstance(inner, int):
            code = inner   # 3.x wraps a function's box error in PROC_LUA: the error's own code
        super().__init__(code, str(details.get("message", err)))
        self.details = details
        self.type = details.get("type")
        self.replicaset = replicaset
        self.applied: Optional[bool] = None


def refusal(data: Any, replicaset: Any) -> Optional[Exception]:
    """The error of a ``nil, err`` reply (vshard refused before the function), or None
    when ``data`` is no refusal."""
    if not data or data[0] is not None:
        return None
    err = data[1] if len(data) > 1 else None
    if isinstance(err, dict) and err.get("type") == "ShardingError":
        exc = ShardingError.from_storage(err, replicaset)
        if exc.code == BUCKET_IS_CORRUPTED:
            exc.applied = None   # found when releasing the bucket, after the function ran
        return exc
    exc = StorageError(err, replicaset)
    exc.applied = False   # vshard's own answer in place of the function's
    return exc


def raised_refusal(exc: DatabaseError, func: str, replicaset: Any) -> Optional[ShardingError]:
    """``exc``, raised by a call of vshard's ``func``, decoded when it is a refusal
    before anything ran: a vshard error raised with ``error()`` (a PROC_LUA error
    whose message is the error as JSON), or the function missing or not granted
    (vshard still starting).  None for any other error."""
    message = exc.message if isinstance(getattr(exc, "message", None), str) else str(exc)
    if exc.code == ER_PROC_LUA or message.startswith("{"):
        start = message.find("{")
        if start >= 0:
            try:
                err = json.loads(message[start:])
            except ValueError:
                err = None
            if isinstance(err, dict) and err.get("type") == "ShardingError":
                return ShardingError.from_storage(err, replicaset)
    if exc.code in (ER_NO_SUCH_PROC, ER_ACCESS_DENIED) and "'vshard." in message:
        return ShardingError(STORAGE_IS_DISABLED, "vshard is not loaded on the storage: %s"
                             % message, {"reason": message}, replicaset)
    return None
