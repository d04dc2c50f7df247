"""Routing by bucket in the client: ``vshard.router``'s API over one
:class:`gtarantool.ConnectionPool` per storage replica set, with no Lua router
in between.

::

    router = gtarantool.Router(cfg["sharding"], user="app", password="secret",
                               bucket_count=cfg["bucket_count"])
    bucket_id = router.bucket_id_mpcrc32(customer_id)
    router.callrw(bucket_id, "customer_add", (bucket_id, customer_id, name), timeout=1)

What callers rely on: bucket ids equal vshard's (``bucket_id_strcrc32``,
``bucket_id_mpcrc32``); the bucket map is discovered from the storages in the
background and corrected when a storage answers that a bucket is not there or
is moving (such a call is sent again within its timeout: the storage refused
it before running the function); every other error reaches the caller, and an
error about a replica set names it (``ShardingError.replicaset``).
"""
from __future__ import annotations

import itertools
import struct
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import gevent
import gevent.event
from gevent import Timeout
from tarantool.connection_pool import Mode
from tarantool.error import ConfigurationError, DatabaseError, NetworkError

from gtarantool import monitoring
from gtarantool.connection import Connection
from gtarantool.errors import ConnectionClosed, RequestTimeout
from gtarantool.pool import ConnectionPool
from gtarantool.protocol.constants import ER_NO_SUCH_PROC

_crc32c: Optional[Callable[[bytes], int]]
try:
    from crc32c import crc32c as _crc32c
except ImportError:   # an optional dependency: gtarantool[sharding]
    _crc32c = None

__all__ = ["Router", "ShardingError", "StorageError", "bucket_id_strcrc32",
           "bucket_id_mpcrc32", "strcrc32", "mpcrc32"]

# vshard's timeouts (consts.lua): a call's default, discovery's periods.
CALL_TIMEOUT = 0.5
DISCOVERY_IDLE_INTERVAL = 10.0
DISCOVERY_WORK_INTERVAL = 1.0
DISCOVERY_TIMEOUT = 10.0

# vshard's error codes (error.lua) the router acts on.
WRONG_BUCKET = 1
NON_MASTER = 2
TRANSFER_IS_IN_PROGRESS = 7
UNREACHABLE_REPLICASET = 8
NO_ROUTE_TO_BUCKET = 9
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
               UNKNOWN_BUCKETS: "UNKNOWN_BUCKETS", BUCKET_IS_LOCKED: "BUCKET_IS_LOCKED"}
# The bucket is elsewhere or on its way: correct the map, send again.
MOVED = frozenset((WRONG_BUCKET, TRANSFER_IS_IN_PROGRESS, BUCKET_IS_LOCKED))
# The storage cannot take the call yet (a failover, a start-up): send again later.
NOT_READY = frozenset((NON_MASTER, STORAGE_IS_DISABLED, STORAGE_CFG_IS_IN_PROGRESS,
                       MASTER_NOT_SYNCED))

RW, PREFER_RW, PREFER_RO, ANY = Mode.RW, Mode.PREFER_RW, Mode.PREFER_RO, Mode.ANY


class ShardingError(DatabaseError):
    """A vshard error (``type`` ``'ShardingError'``): ``code`` and ``name`` are
    vshard's (error.lua), ``details`` the error's fields as the storage sent them
    (``bucket_id``, ``destination``, ...), ``replicaset`` the id of the replica
    set it concerns (None when it concerns none)."""

    def __init__(self, code: int, message: str, details: Optional[Dict[str, Any]] = None,
                 replicaset: Any = None, name: Optional[str] = None) -> None:
        super().__init__(code, message)
        self.details = dict(details or {})
        self.name = name or self.details.get("name") or ERROR_NAMES.get(code)
        self.type = "ShardingError"
        self.replicaset = replicaset

    @classmethod
    def from_storage(cls, err, replicaset):
        return cls(err.get("code", 0), err.get("message", str(err)), err, replicaset)


class StorageError(DatabaseError):
    """The function failed on the storage (raised, or returned ``nil, err``):
    ``code`` and ``type`` are the error's (box's, or the application's),
    ``details`` its fields, ``replicaset`` where it ran."""

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


# -- bucket ids ----------------------------------------------------------------------

_NUMBER_MAX = 10 ** 14 - 1   # larger integers decode to int64/uint64 cdata on the server
_NULL = b"cdata<void *>: NULL"   # tostring(box.NULL): a nil inside a key


def _tostring(value):
    """Lua's tostring() of ``value`` as the server decodes it from MessagePack."""
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if value is True:
        return b"true"
    if value is False:
        return b"false"
    if isinstance(value, int):
        if -_NUMBER_MAX <= value <= _NUMBER_MAX:
            return b"%d" % value
        if value > 0:
            if value >= 1 << 64:
                raise ValueError("%d does not fit in uint64" % value)
            return b"%dULL" % value
        if value < -(1 << 63):
            raise ValueError("%d does not fit in int64" % value)
        return b"%dLL" % value
    if isinstance(value, float):
        return (b"%.14g" % value).replace(b"-nan", b"nan")
    if value is None:
        return _NULL
    raise ValueError("a shard key part must be str, bytes, int, float, bool or None, not %s"
                     % type(value).__name__)


def _pack_uint(value):
    if value < 0x80:
        return bytes((value,))
    if value < 0x100:
        return b"\xcc" + value.to_bytes(1, "big")
    if value < 0x10000:
        return b"\xcd" + value.to_bytes(2, "big")
    if value < 0x100000000:
        return b"\xce" + value.to_bytes(4, "big")
    return b"\xcf" + value.to_bytes(8, "big")


def _pack_int(value):
    if value >= 0:
        return _pack_uint(value)
    if value >= -0x20:
        return (value & 0xff).to_bytes(1, "big")
    if value >= -0x80:
        return b"\xd0" + value.to_bytes(1, "big", signed=True)
    if value >= -0x8000:
        return b"\xd1" + value.to_bytes(2, "big", signed=True)
    if value >= -0x80000000:
        return b"\xd2" + value.to_bytes(4, "big", signed=True)
    return b"\xd3" + value.to_bytes(8, "big", signed=True)


def _pack_bin(value):
    n = len(value)
    head = (b"\xc4" + n.to_bytes(1, "big") if n < 0x100 else
            b"\xc5" + n.to_bytes(2, "big") if n < 0x10000 else b"\xc6" + n.to_bytes(4, "big"))
    return head + value


def _mp_one(value, varbinary):
    """vshard's mpcrc32 input for one key part: a string as is, anything else as
    the server's msgpackffi encodes the value it decoded."""
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytes, bytearray)) and not varbinary:
        return bytes(value)   # before 3.0 the server decodes MP_BIN to a Lua string
    return _mp_nested(value, varbinary)


def _mp_nested(value, varbinary):
    if isinstance(value, str) or (isinstance(value, (bytes, bytearray)) and not varbinary):
        data = value.encode() if isinstance(value, str) else bytes(value)
        n = len(data)
        head = (bytes((0xa0 | n,)) if n < 32 else b"\xd9" + n.to_bytes(1, "big") if n < 0x100
                else b"\xda" + n.to_bytes(2, "big") if n < 0x10000
                else b"\xdb" + n.to_bytes(4, "big"))
        return head + data
    if isinstance(value, (bytes, bytearray)):
        return _pack_bin(bytes(value))   # 3.0+: varbinary, encoded back with its header
    if value is None:
        return b"\xc0"
    if value is True:
        return b"\xc3"
    if value is False:
        return b"\xc2"
    if isinstance(value, int):
        if not -(1 << 63) <= value < (1 << 64):
            raise ValueError("%d does not fit in int64 or uint64" % value)
        return _pack_int(value)
    if isinstance(value, float):
        # msgpackffi encodes an integral Lua number as an integer.
        if value == value and -(2.0 ** 63) <= value < 2.0 ** 64 and value.is_integer():
            return _pack_int(int(value))
        return b"\xcb" + struct.pack(">d", value)
    if isinstance(value, (list, tuple)):
        n = len(value)
        head = (bytes((0x90 | n,)) if n < 16 else b"\xdc" + n.to_bytes(2, "big") if n < 0x10000
                else b"\xdd" + n.to_bytes(4, "big"))
        return head + b"".join(_mp_nested(v, varbinary) for v in value)
    raise ValueError("a shard key part must be str, bytes, int, float, bool, None or a list "
                     "of them, not %s" % type(value).__name__)


def _crc(data):
    # Tarantool's digest.crc32 is CRC-32C without the final inversion.
    return _crc32c(data) ^ 0xFFFFFFFF


def _no_crc32c(data):
    raise ImportError("bucket ids need the crc32c package: pip install 'gtarantool[sharding]'")


if _crc32c is None:
    _crc32c = _no_crc32c


def _parts(key):
    if key is None:
        raise ValueError("a shard key is needed (vshard: Usage: bucket_id(key))")
    if isinstance(key, dict):
        raise ValueError("a shard key is a scalar or a tuple/list of scalars, not a dict")
    return key if isinstance(key, (list, tuple)) else None


def strcrc32(key: Any) -> int:
    """vshard's ``strcrc32`` (Tarantool's ``digest.crc32`` of ``tostring`` of the
    key, or of each part of a tuple or list in turn).

    :param key: str, bytes, int, float, bool, or a tuple/list of them.
    :returns: the CRC, an unsigned 32-bit integer.
    :raises ValueError: a key vshard cannot hash the same way every time.
    """
    if type(key) is str:
        return _crc(key.encode())
    parts = _parts(key)
    if parts is None:
        return _crc(_tostring(key))
    for part in parts:
        if isinstance(part, (list, tuple, dict)):
            raise ValueError("strcrc32 takes scalar key parts (vshard would hash the "
                             "address of a nested table)")
    return _crc(b"".join(_tostring(part) for part in parts))


def mpcrc32(key: Any, varbinary: bool = True) -> int:
    """vshard's ``mpcrc32``: the CRC of each part's MessagePack (strings as they are).

    :param key: str, bytes, int, float, bool, None inside a tuple, or a tuple/list.
    :param varbinary: the server decodes binary keys to varbinary (Tarantool 3.0+);
        False for 2.x, where a binary part is hashed as a string.
    :returns: the CRC, an unsigned 32-bit integer.
    :raises ValueError: a key vshard cannot hash.
    """
    kind = type(key)
    if kind is int and -(1 << 63) <= key < (1 << 64):   # the usual keys, directly
        return _crc(_pack_int(key))
    if kind is str:
        return _crc(key.encode())
    parts = _parts(key)
    if parts is None:
        return _crc(_mp_one(key, varbinary))
    return _crc(b"".join(_mp_one(part, varbinary) for part in parts))


def bucket_id_strcrc32(key: Any, bucket_count: int) -> int:
    """``strcrc32(key) % bucket_count + 1``, as ``vshard.router.bucket_id_strcrc32``.

    :param key: as for :func:`strcrc32`.
    :param bucket_count: vshard's ``bucket_count``.
    :returns: the bucket id, 1..bucket_count.
    :raises ValueError: a key vshard cannot hash the same way every time.
    """
    return strcrc32(key) % bucket_count + 1


def bucket_id_mpcrc32(key: Any, bucket_count: int, varbinary: bool = True) -> int:
    """``mpcrc32(key) % bucket_count + 1``, as ``vshard.router.bucket_id_mpcrc32``.

    :param key: as for :func:`mpcrc32`.
    :param bucket_count: vshard's ``bucket_count``.
    :param varbinary: as for :func:`mpcrc32`.
    :returns: the bucket id, 1..bucket_count.
    :raises ValueError: a key vshard cannot hash.
    """
    return mpcrc32(key, varbinary) % bucket_count + 1


# -- the router -----------------------------------------------------------------------

def _parse_uri(uri):
    """(host, port, user, password) of a vshard replica's ``uri``."""
    if isinstance(uri, dict):
        uri = uri.get("uri", uri)
    if isinstance(uri, int):
        return "127.0.0.1", uri, None, None
    if not isinstance(uri, str):
        raise ConfigurationError("a replica's uri must be a string, not %r" % (uri,))
    user = password = None
    creds, at, address = uri.rpartition("@")
    if at:
        user, _, password = creds.partition(":")
        password = password or None
    host, colon, port = address.rpartition(":")
    if not colon or not port.isdigit():
        raise ConfigurationError("a replica's uri must name a TCP port: %r" % (uri,))
    return host or "127.0.0.1", int(port), user, password


class Replicaset:
    """One storage replica set: ``id`` (vshard's uuid or name), ``name`` (for
    messages), ``pool`` (its :class:`gtarantool.ConnectionPool`), ``bucket_count``
    (the buckets the router maps to it)."""

    discovery_error: Optional[Exception]
    discovery: Any   # its discovery greenlet, or None

    def __init__(self, rs_id: Any, name: str, pool: ConnectionPool) -> None:
        self.id, self.name, self.pool = rs_id, name, pool
        self.bucket_count = 0
        self.discovery_error = None
        self.discovery_rounds = 0
        self.discovery = None

    def __repr__(self) -> str:
        return "replicaset %s" % (self.name if self.name == self.id
                                  else "%s (%s)" % (self.name, self.id))


class Router:
    """``vshard.router`` in the client.

    :param sharding: vshard's ``sharding`` table: replica sets by uuid (or name),
        each ``{"replicas": {id: {"uri": "user:pass@host:port", "name": ...,
        "master": bool}}, "master": "auto", "name": ...}``; or a whole vshard
        configuration (``{"sharding": ..., "bucket_count": ...}``).
    :param user: the user for every storage (default: the uri's).
    :param password: that user's password (default: the uri's).
    :param bucket_count: vshard's ``bucket_count`` (the configuration's if it has one).
    :param timeout: a call's default timeout in seconds (vshard's: 0.5).
    :param discovery_mode: ``'on'`` (keep discovering: idle every 10 s once every
        bucket is known), ``'once'`` (stop when every bucket is known) or ``'off'``
        (buckets are found on first use only).
    :param varbinary: how ``bucket_id_mpcrc32`` hashes ``bytes`` (see :func:`mpcrc32`);
        by default as the storages' Tarantool does (3.0+: True).
    :param pool_options: more :class:`gtarantool.ConnectionPool` arguments
        (``connection_timeout``, ``refresh_delay``, ``strategy_class``...).
    :raises tarantool.error.ConfigurationError: a malformed configuration.
    """

    replicasets: Dict[Any, Replicaset]   # by vshard's id
    _routes: List[Optional[Replicaset]]   # by bucket id
    _destinations: Dict[Any, Replicaset]

    def __init__(self, sharding: Dict[Any, Any], user: Optional[str] = None,
                 password: Optional[str] = None, bucket_count: int = 3000, *,
                 timeout: float = CALL_TIMEOUT, discovery_mode: str = "on",
                 varbinary: Optional[bool] = None, **pool_options: Any) -> None:
        if isinstance(sharding, dict) and isinstance(sharding.get("sharding"), dict):
            bucket_count = sharding.get("bucket_count", bucket_count)
            sharding = sharding["sharding"]
        if not isinstance(sharding, dict) or not sharding:
            raise ConfigurationError("sharding must be vshard's non-empty table of replica sets")
        if not (isinstance(bucket_count, int) and bucket_count > 0):
            raise ConfigurationError("bucket_count must be a positive integer, not %r"
                                     % (bucket_count,))
        if discovery_mode not in ("on", "once", "off"):
            raise ConfigurationError("discovery_mode must be 'on', 'once' or 'off'")
        self.bucket_count = bucket_count
        self.timeout = timeout
        self.discovery_mode = discovery_mode
        self._varbinary = varbinary
        self._closed = False
        self._routes = [None] * (bucket_count + 1)
        self.known_bucket_count = 0
        self._ref_ids = itertools.count(1)
        self._wakeup = gevent.event.Event()
        self.replicasets = {}
        pool_options.setdefault("fetch_schema", False)
        # A call waits for a replica of the right role within its own timeout.
        pool_options.setdefault("wait_timeout", 24 * 3600)
        try:
            for rs_id, rs_cfg in sharding.items():
                self.replicasets[rs_id] = self._replicaset(rs_id, rs_cfg, user, password,
                                                           pool_options)
            gevent.joinall([gevent.spawn(rs.pool.connect) for rs in self.replicasets.values()])
        except BaseException:
            self.close()
            raise
        # A storage names a destination by uuid or by name (3.x's name_as_key).
        self._destinations = {}
        for (rs_id, rs_cfg), rs in zip(sharding.items(), self.replicasets.values()):
            for alias in (rs_id, rs.name, rs_cfg.get("uuid")):
                if alias is not None:
                    self._destinations.setdefault(alias, rs)
        if discovery_mode != "off":
            for rs in self.replicasets.values():
                rs.discovery = gevent.spawn(self._discover, rs)
                rs.discovery.name = "vshard-discovery-%s" % (rs.name,)

    def _replicaset(self, rs_id, rs_cfg, user, password, pool_options):
        replicas = rs_cfg.get("replicas") if isinstance(rs_cfg, dict) else None
        if not isinstance(replicas, dict) or not replicas:
            raise ConfigurationError("replica set %s has no replicas" % (rs_id,))
        addrs = []
        for replica_id, replica in replicas.items():
            if not isinstance(replica, dict) or "uri" not in replica:
                raise ConfigurationError("replica %s of replica set %s has no uri"
                                         % (replica_id, rs_id))
            host, port, uri_user, uri_password = _parse_uri(replica["uri"])
            addrs.append({"host": host, "port": port})
            if user is None and uri_user is not None:
                user, password = uri_user, uri_password
        pool = ConnectionPool(addrs, user=user, password=password, connect_now=False,
                              **pool_options)
        return Replicaset(rs_id, rs_cfg.get("name") or rs_id, pool)

    @classmethod
    def from_router(cls, host: str, port: int, user: Optional[str] = None,
                    password: Optional[str] = None, **options: Any) -> Router:
        """A Router configured as the Lua router at ``host:port`` is (its
        ``vshard.router.cfg``, read with ``eval``: the user needs execute rights
        on it).  ``options`` as for :class:`Router`.

        :param host: the Lua router's address.
        :param port: its port.
        :param user: the user for the router and every storage.
        :param password: that user's password.
        :param options: :class:`Router`'s keyword arguments.
        :returns: the :class:`Router`, connected to the storages.
        :raises tarantool.error.DatabaseError: the instance runs no vshard router.
        :raises tarantool.error.NetworkError: it cannot be reached.
        :raises tarantool.error.ConfigurationError: its configuration is not one
            the Router takes.
        """
        conn = Connection(host, port, user=user, password=password, fetch_schema=False)
        try:
            cfg = conn.eval("local r = vshard.router.internal.static_router "
                            "return r and r.current_cfg").data[0]
        finally:
            conn.close()
        if not cfg:
            raise DatabaseError(0, "%s:%s runs no configured vshard router" % (host, port))
        return cls(cfg, user=user, password=password, **options)

    # -- bucket ids ---------------------------------------------------------------------

    def bucket_id_strcrc32(self, key: Any) -> int:
        """The bucket of ``key`` as ``vshard.router.bucket_id_strcrc32`` computes it.

        :param key: str, bytes, int, float, bool, or a tuple/list of them.
        :returns: the bucket id, 1..bucket_count.
        :raises ValueError: a key vshard cannot hash the same way every time.
        """
        return strcrc32(key) % self.bucket_count + 1

    def bucket_id_mpcrc32(self, key: Any) -> int:
        """The bucket of ``key`` as ``vshard.router.bucket_id_mpcrc32`` computes it
        (integers of any size hash alike; binary keys as the storages' Tarantool).

        :param key: str, bytes, int, float, bool, None inside a tuple, or a tuple/list.
        :returns: the bucket id, 1..bucket_count.
        :raises ValueError: a key vshard cannot hash.
        """
        return mpcrc32(key, self._uses_varbinary()) % self.bucket_count + 1

    def _uses_varbinary(self):
        if self._varbinary is None:
            for rs in self.replicasets.values():
                for instance in rs.pool.pool.values():
                    version = getattr(instance.conn, "version_id", None)
                    if version:
                        # version_id packs (major, minor, patch) as tarantool-python does.
                        self._varbinary = version >= (3 << 16)
                        return self._varbinary
            return True
        return self._varbinary

    # -- the bucket map -------------------------------------------------------------------

    def _set(self, bucket_id, rs):
        old = self._routes[bucket_id]
        if old is rs:
            return
        if old is None:
            self.known_bucket_count += 1
        else:
            old.bucket_count -= 1
        rs.bucket_count += 1
        self._routes[bucket_id] = rs

    def _reset(self, bucket_id):
        old = self._routes[bucket_id]
        if old is not None:
            old.bucket_count -= 1
            self.known_bucket_count -= 1
            self._routes[bucket_id] = None

    def _discover(self, rs):
        """Page through ``rs``'s active buckets (vshard's buckets_discovery) again and
        again: every second while some bucket is unknown, else every 10 s."""
        while True:
            start = 1
            try:
                while start is not None:
                    with Timeout(DISCOVERY_TIMEOUT):
                        page = rs.pool.call("vshard.storage.buckets_discovery", {"from": start},
                                            mode=PREFER_RW).data[0]
                    if isinstance(page, dict):
                        buckets, start = page.get("buckets") or [], page.get("next_from")
                    else:   # an old storage: every bucket at once
                        buckets, start = page or [], None
                    routes, count = self._routes, self.bucket_count
                    for bucket_id in buckets:
                        if 0 < bucket_id <= count and routes[bucket_id] is not rs:
                            self._set(bucket_id, rs)
                rs.discovery_error = None
                rs.discovery_rounds += 1
            except (Exception, Timeout) as exc:   # logged in info(); tried again later
                rs.discovery_error = exc if isinstance(exc, Exception) else RequestTimeout(
                    "no discovery reply within %ss" % DISCOVERY_TIMEOUT)
                if self._closed:
                    return
            known = self.known_bucket_count == self.bucket_count
            if known and self.discovery_mode == "once":
                return
            self._wakeup.wait(DISCOVERY_IDLE_INTERVAL if known else DISCOVERY_WORK_INTERVAL)

    def discovery_wakeup(self) -> None:
        """Run every replica set's discovery now rather than at its next period."""
        wakeup, self._wakeup = self._wakeup, gevent.event.Event()
        wakeup.set()

    def _resolve(self, bucket_id):
        """Find ``bucket_id`` by asking every replica set's master at once (vshard's
        bucket_resolve); NO_ROUTE_TO_BUCKET when none has it."""
        def ask(rs):
            data = rs.pool.call("vshard.storage.bucket_stat", bucket_id, mode=RW).data
            if data and data[0]:
                return True
            err = data[1] if len(data) > 1 else None
            if isinstance(err, dict) and err.get("code") == WRONG_BUCKET:
                return False
            raise (ShardingError.from_storage(err, rs.id) if isinstance(err, dict)
                   else StorageError(err, rs.id))

        replicasets = list(self.replicasets.values())
        greenlets = [gevent.spawn(ask, rs) for rs in replicasets]
        owner = {greenlet: rs for greenlet, rs in zip(greenlets, replicasets)}
        try:
            for greenlet in gevent.iwait(greenlets):
                if greenlet.successful() and greenlet.value:
                    rs = owner[greenlet]
                    self._set(bucket_id, rs)
                    return rs
        finally:
            gevent.killall(greenlets)
        for greenlet in greenlets:
            if isinstance(greenlet.exception, NetworkError):
                rs = owner[greenlet]
                raise ShardingError(UNREACHABLE_REPLICASET, "There is no active replicas in "
                                    "replicaset %s: %s" % (rs.name, greenlet.exception),
                                    {"bucket_id": bucket_id}, rs.id)
        raise ShardingError(NO_ROUTE_TO_BUCKET, "Bucket %d cannot be found. Is rebalancing "
                            "in progress?" % bucket_id, {"bucket_id": bucket_id})

    def route(self, bucket_id: int) -> Replicaset:
        """The :class:`Replicaset` holding ``bucket_id`` (asked of the storages when
        the map does not know it yet).

        :param bucket_id: 1..bucket_count.
        :returns: the :class:`Replicaset`.
        :raises ValueError: ``bucket_id`` is not an integer in 1..bucket_count.
        :raises ShardingError: NO_ROUTE_TO_BUCKET, or UNREACHABLE_REPLICASET.
        :raises StorageError: a storage failed to say whether it holds the bucket.
        """
        self._check(bucket_id)
        return self._routes[bucket_id] or self._resolve(bucket_id)

    def routeall(self) -> Dict[Any, Replicaset]:
        """{replica set id: :class:`Replicaset`}.

        :returns: a new dict (changing it changes nothing in the router).
        """
        return dict(self.replicasets)

    def _check(self, bucket_id):
        if type(bucket_id) is not int or not 0 < bucket_id <= self.bucket_count:
            raise ValueError("bucket_id must be an integer from 1 to %d, not %r"
                             % (self.bucket_count, bucket_id))

    # -- calls ---------------------------------------------------------------------------

    def callrw(self, bucket_id: int, func: str, args: Sequence[Any] = (),
               timeout: Optional[float] = None) -> Any:
        """Call ``func(*args)`` on the master of the replica set holding ``bucket_id``
        (``vshard.storage.call`` refuses it there unless the bucket is writable).

        :param bucket_id: 1..bucket_count.
        :param func: the storage function's name.
        :param args: its arguments (a list or tuple).
        :param timeout: seconds for the whole call, moves of the bucket included
            (default: the router's ``timeout``).
        :returns: the function's first return value (as vshard's router).
        :raises ValueError: ``bucket_id`` is not an integer in 1..bucket_count.
        :raises TypeError: ``args`` is not a list or tuple.
        :raises StorageError: the function raised, or returned ``nil, err``.
        :raises ShardingError: a vshard error that is not about the bucket's place,
            or, at the timeout, the last of those (e.g. UNREACHABLE_MASTER naming
            the replica set).
        :raises gtarantool.RequestTimeout: no reply within ``timeout``; the function
            may still run.
        :raises tarantool.error.NetworkError: the connection failed with the call in
            flight: it may have run.
        :raises tarantool.error.DatabaseError: the storage refused the call.
        :raises gtarantool.ConnectionClosed: the router is closed.
        """
        return self._call(bucket_id, RW, "write", func, args, timeout)

    def callro(self, bucket_id: int, func: str, args: Sequence[Any] = (),
               timeout: Optional[float] = None) -> Any:
        """As :meth:`callrw` for a read: on the master while it is up, else a replica
        (vshard's nearest replica, with no zones); a read is re-sent after a
        connection failure.

        :param bucket_id: 1..bucket_count.
        :param func: the storage function's name.
        :param args: its arguments (a list or tuple).
        :param timeout: seconds for the whole call (default: the router's ``timeout``).
        :returns: the function's first return value.
        :raises: as :meth:`callrw`; a connection failure is not raised but
            the call sent again, within ``timeout``.
        """
        return self._call(bucket_id, PREFER_RW, "read", func, args, timeout)

    def callbro(self, bucket_id: int, func: str, args: Sequence[Any] = (),
                timeout: Optional[float] = None) -> Any:
        """As :meth:`callro`, balanced over every member of the replica set.

        Parameters, return value and errors as :meth:`callro`.
        """
        return self._call(bucket_id, ANY, "read", func, args, timeout)

    def callre(self, bucket_id: int, func: str, args: Sequence[Any] = (),
               timeout: Optional[float] = None) -> Any:
        """As :meth:`callro` on a replica (the master when no replica is up).

        Parameters, return value and errors as :meth:`callro`.
        """
        return self._call(bucket_id, PREFER_RO, "read", func, args, timeout)

    def callbre(self, bucket_id: int, func: str, args: Sequence[Any] = (),
                timeout: Optional[float] = None) -> Any:
        """As :meth:`callre`, balanced over the replicas.

        Parameters, return value and errors as :meth:`callro`.
        """
        return self._call(bucket_id, PREFER_RO, "read", func, args, timeout)

    def _call(self, bucket_id, mode, vmode, func, args, timeout):
        if self._closed:
            raise ConnectionClosed("the router is closed")
        if type(bucket_id) is not int or not 0 < bucket_id <= self.bucket_count:
            self._check(bucket_id)
        if type(args) is not tuple and not isinstance(args, (list, tuple)):
            raise TypeError("args must be a list or tuple, not %s" % type(args).__name__)
        if timeout is None:
            timeout = self.timeout
        timer = Timeout(timeout)
        timer.start()
        rs, last, pause = None, None, 0.0
        try:
            while True:
                rs = self._routes[bucket_id]
                if rs is None:
                    try:
                        rs = self._resolve(bucket_id)
                    except ShardingError as exc:   # in transit, or one replica set is down
                        last = exc
                        pause = self._pause(pause)
                        continue
                try:
                    data = rs.pool.call("vshard.storage.call", bucket_id, vmode, func, args,
                                        mode=mode).data
                except NetworkError as exc:
                    if vmode == "write" or self._closed or isinstance(exc, RequestTimeout):
                        exc.replicaset = rs.id
                        raise
                    last = exc   # a read changes nothing: send it again
                    pause = self._pause(pause)
                    continue
                except DatabaseError as exc:
                    if exc.code != ER_NO_SUCH_PROC:
                        exc.replicaset = rs.id
                        raise
                    last = exc   # vshard.storage is still starting there
                    pause = self._pause(pause)
                    continue
                if data and data[0]:
                    if len(data) > 2 and data[1] is None and data[2] is not None:
                        raise StorageError(data[2], rs.id)
                    return data[1] if len(data) > 1 else None
                err = data[1] if len(data) > 1 else None
                if not (isinstance(err, dict) and err.get("type") == "ShardingError"):
                    raise StorageError(err, rs.id)
                code = err.get("code")
                last = ShardingError.from_storage(err, rs.id)
                if code in MOVED:
                    self._reset(bucket_id)
                    dest = self._destinations.get(err.get("destination"))
                    if dest is not None and dest is not rs:
                        self._set(bucket_id, dest)
                    monitoring.emit(monitoring.BucketMapCorrectedEvent, rs.name,
                                    bucket_id=bucket_id, to=dest.name if dest else "", code=code)
                    # The first redirect goes at once; a bucket still moving is
                    # asked again after a growing pause.
                    pause = self._pause(pause) if pause or dest is None else 0.001
                    continue
                if code in NOT_READY:
                    pause = self._pause(pause)
                    continue
                raise last
        except Timeout as exc:
            if exc is not timer:
                raise
            raise self._timed_out(rs, bucket_id, mode, timeout, last) from None
        finally:
            timer.close()

    @staticmethod
    def _pause(pause):
        gevent.sleep(pause)
        return min(0.2, pause * 2 or 0.005)

    def _timed_out(self, rs, bucket_id, mode, timeout, last):
        if rs is not None:
            info = rs.pool.info().values()
            fits = [i for i in info if i["healthy"]
                    and (mode is not RW or i["role"] == "master")]
            if not fits:
                errors = "; ".join("%s: %s" % (i["address"], i["last_error"] or i["status"])
                                   for i in info)
                if mode is RW and any(i["healthy"] for i in info):
                    return ShardingError(UNREACHABLE_MASTER, "Master of replicaset %s is "
                                         "unreachable: %s" % (rs.name, errors),
                                         {"bucket_id": bucket_id}, rs.id)
                return ShardingError(UNREACHABLE_REPLICASET, "There is no active replicas in "
                                     "replicaset %s (%s)" % (rs.name, errors),
                                     {"bucket_id": bucket_id}, rs.id)
        if isinstance(last, ShardingError):
            return last
        where = "replicaset %s" % rs.name if rs is not None else "the cluster"
        exc = RequestTimeout("no reply from %s for bucket %d within %ss; the call may still "
                             "run%s" % (where, bucket_id, timeout,
                                        " (last error: %s)" % last if last else ""))
        exc.replicaset = rs.id if rs is not None else None
        return exc

    def map_callrw(self, func: str, args: Sequence[Any] = (),
                   timeout: Optional[float] = None) -> Dict[Any, List[Any]]:
        """vshard's Ref-Map-Reduce: ``func(*args)`` on every replica set's master,
        each run while every bucket is referenced (no bucket moves meanwhile).

        :param func: the storage function's name.
        :param args: its arguments (a list or tuple).
        :param timeout: seconds for the whole call (default: the router's ``timeout``).
        :returns: {replica set id: [result]} for each master whose function returned
            a value (as vshard's router).
        :raises ShardingError: UNKNOWN_BUCKETS (the masters do not hold every bucket),
            or a storage's refusal; ``replicaset`` names where.
        :raises StorageError: the function failed on a master (``replicaset``).
        :raises gtarantool.RequestTimeout: a master did not answer within ``timeout``.
        """
        if timeout is None:
            timeout = self.timeout
        rid = next(self._ref_ids)
        deadline = time.monotonic() + timeout
        replicasets = list(self.replicasets.values())
        referenced: List[Replicaset] = []
        try:
            counts = self._each(replicasets, deadline, "storage_ref", rid, timeout,
                                on_ok=referenced.append)
            total = sum(counts.values())
            if total != self.bucket_count:
                raise ShardingError(UNKNOWN_BUCKETS, "%d buckets are not discovered"
                                    % (self.bucket_count - total),
                                    {"not_discovered_cnt": self.bucket_count - total})
            results = self._each(replicasets, deadline, "storage_map", rid, func, list(args),
                                 map_stage=True)
            referenced = []
            return {rs_id: [value] for rs_id, value in results.items() if value is not None}
        finally:
            if referenced:
                # Let the rebalancer go on at once rather than at the ref's timeout.
                self._each(referenced, time.monotonic() + min(timeout, 1.0), "storage_unref",
                           rid, quiet=True)

    def _each(self, replicasets, deadline, *call, on_ok=None, map_stage=False, quiet=False):
        """``vshard.storage._call(*call)`` on every master in parallel; {id: value}."""
        def one(rs):
            # Errors are returned, not raised: the caller raises the first one.
            try:
                data = rs.pool.call("vshard.storage._call", *call, mode=RW).data
            except Exception as exc:
                return exc
            if not data or data[0] is None or data[0] is False:
                err = data[1] if len(data) > 1 else None
                if isinstance(err, dict) and err.get("type") == "ShardingError":
                    return ShardingError.from_storage(err, rs.id)
                return StorageError(err, rs.id)
            if on_ok is not None:
                on_ok(rs)
            return (data[1] if map_stage and len(data) > 1 else (None if map_stage else data[0]),)

        greenlets = [gevent.spawn(one, rs) for rs in replicasets]
        try:
            gevent.joinall(greenlets, timeout=max(0.0, deadline - time.monotonic()))
            results = {}
            for rs, greenlet in zip(replicasets, greenlets):
                if quiet:
                    continue
                if not greenlet.ready():
                    exc = RequestTimeout("no reply from the master of replicaset %s within "
                                         "the timeout (map_callrw)" % rs.name)
                    exc.replicaset = rs.id
                    raise exc
                if isinstance(greenlet.value, BaseException):
                    exc = greenlet.value
                    if getattr(exc, "replicaset", None) is None:
                        exc.replicaset = rs.id
                    raise exc
                results[rs.id] = greenlet.value[0]
            return results
        finally:
            gevent.killall(greenlets)

    # -- state ------------------------------------------------------------------------------

    def info(self) -> Dict[str, Any]:
        """{"bucket": {"total", "known", "unknown"}, "replicasets": {id: {"name",
        "bucket_count", "discovery": {"rounds", "last_error"}, "instances":
        ConnectionPool.info()}}}.

        :returns: that dict, built anew."""
        return {
            "bucket": {"total": self.bucket_count, "known": self.known_bucket_count,
                       "unknown": self.bucket_count - self.known_bucket_count},
            "replicasets": {rs.id: {
                "name": rs.name, "bucket_count": rs.bucket_count,
                "discovery": {"rounds": rs.discovery_rounds,
                              "last_error": None if rs.discovery_error is None
                              else str(rs.discovery_error)},
                "instances": rs.pool.info(),
            } for rs in self.replicasets.values()},
        }

    def close(self) -> None:
        """Stop discovery (killing and joining its greenlets) and close every pool."""
        self._closed = True
        discoveries = [rs.discovery for rs in self.replicasets.values() if rs.discovery]
        gevent.killall(discoveries)
        for rs in self.replicasets.values():
            rs.discovery = None
            rs.pool.close()

    def __enter__(self) -> Router:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()
