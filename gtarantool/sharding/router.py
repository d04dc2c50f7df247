"""Routing by bucket in the client: ``vshard.router``'s API over one
:class:`gtarantool.ConnectionPool` per storage replica set, with no Lua router
in between.

::

    router = gtarantool.Router(cfg["sharding"], user="app", password="secret")
    bucket_id = router.bucket_id_mpcrc32(customer_id)
    router.callrw(bucket_id, "customer_add", (bucket_id, customer_id, name), timeout=1)

What callers rely on: bucket ids equal vshard's (the bucket count is the
storages', checked); the bucket map is discovered from the storages in the
background and corrected when a storage refuses a call because the bucket is
not there or is moving; a call is sent again only after such a proven refusal,
within its timeout; every error carries ``applied`` (False: proven not run,
None: may have run) and, when it concerns a replica set, ``replicaset``.
"""
from __future__ import annotations

import itertools
import time
from typing import Any, Dict, Iterable, List, Optional, Sequence

import gevent
import gevent.event
import gevent.pool
from gevent import Timeout
from tarantool.connection_pool import Mode
from tarantool.error import ConfigurationError, DatabaseError, NetworkError, PoolTopologyError

from gtarantool import monitoring
from gtarantool.connection import Connection
from gtarantool.errors import ConnectionClosed, RequestTimeout
from gtarantool.pool import ConnectionPool
from gtarantool.sharding.config import vshard_cfg
from gtarantool.sharding.errors import (
    MOVED,
    NO_ROUTE_TO_BUCKET,
    NOT_READY,
    READ_ELSEWHERE,
    UNKNOWN_BUCKETS,
    UNREACHABLE_MASTER,
    UNREACHABLE_REPLICASET,
    WRONG_BUCKET,
    ShardingError,
    StorageError,
    raised_refusal,
    refusal,
)
from gtarantool.sharding.hashing import mpcrc32, strcrc32
from gtarantool.sharding.replicaset import Replicaset, check_func, parse_uri
from gtarantool.sharding.replicaset import seconds as _seconds
from gtarantool.transport import CopiedCall, check_process, process_token

__all__ = ["Router"]

# vshard's timeouts (consts.lua): a call's default, discovery's periods.
CALL_TIMEOUT = 0.5
DISCOVERY_IDLE_INTERVAL = 10.0
DISCOVERY_WORK_INTERVAL = 1.0
DISCOVERY_TIMEOUT = 10.0

RW, PREFER_RW, PREFER_RO, ANY = Mode.RW, Mode.PREFER_RW, Mode.PREFER_RO, Mode.ANY
# vshard.router.info()'s status: each alert raises it to its level.
GREEN, YELLOW, ORANGE, RED = 0, 1, 2, 3
_COUNT_LUA = "return vshard.storage.internal.total_bucket_count"


def _closed():
    exc = ConnectionClosed("the router is closed")
    exc.applied = False
    return exc


def _check_sharding(sharding, weights):
    """vshard's cfg checks the router relies on: no uri or id twice (two replica
    sets sharing an instance would send one's calls and maps to the other), and
    weights as ``{zone: {zone: weight >= 0}}``, a zone's own weight 0."""
    # (A replica set and a replica may share a name: Tarantool 3's name_as_key.)
    ids: set = set()
    addresses: Dict[Any, Any] = {}
    for rs_id, rs_cfg in sharding.items():
        replicas = rs_cfg.get("replicas") if isinstance(rs_cfg, dict) else None
        if not isinstance(replicas, dict):
            continue   # (refused with its reason when the replica set is built)
        for replica_id, replica in replicas.items():
            if replica_id in ids:
                raise ConfigurationError("Duplicate id %s (replica set %s)"
                                         % (replica_id, rs_id))
            ids.add(replica_id)
            if not isinstance(replica, dict) or "uri" not in replica:
                continue
            host, port = parse_uri(replica["uri"])[:2]
            if (host, port) in addresses:
                raise ConfigurationError(
                    "Duplicate uri %s: replica %s of replica set %s and replica %s of "
                    "replica set %s" % (replica["uri"] if not isinstance(replica["uri"], dict)
                                        else replica["uri"].get("uri"), replica_id, rs_id,
                                        *addresses[(host, port)]))
            addresses[(host, port)] = (replica_id, rs_id)
    if not isinstance(weights, dict):
        raise ConfigurationError("weights must be a map of zones to maps of weights")
    for zone, near in weights.items():
        if type(zone) is bool or not isinstance(zone, (str, int, float)):
            raise ConfigurationError("Zone identifier must be either string or number")
        if not isinstance(near, dict):
            raise ConfigurationError("Zone must be map of relative weights of other zones")
        for other, weight in near.items():
            if type(other) is bool or not isinstance(other, (str, int, float)):
                raise ConfigurationError("Zone identifier must be either string or number")
            if type(weight) is bool or not isinstance(weight, (int, float)) \
                    or not weight >= 0:
                raise ConfigurationError("Zone weight must be either nil or non-negative "
                                         "number, not %r" % (weight,))
            if other == zone and weight != 0:
                raise ConfigurationError("Weight of own zone must be either nil or 0")


def count_mismatch(bucket_count, cluster_count, where="the cluster's storages have"):
    """The error of a router whose bucket_count is not the cluster's."""
    exc = ConfigurationError(
        "bucket_count is %d here but %s %d buckets: bucket ids would differ from "
        "vshard's (leave bucket_count out to use the cluster's)"
        % (bucket_count, where, cluster_count))
    exc.applied = False
    return exc


class Router:
    """``vshard.router`` in the client.

    :param sharding: vshard's ``sharding`` table: replica sets by uuid (or name),
        each ``{"replicas": {id: {"uri": "user:pass@host:port", "name": ...,
        "zone": ...}}, "master": "auto", "name": ...}``; or a whole vshard
        configuration (``{"sharding": ..., "bucket_count": ..., "zone": ...,
        "weights": ...}``).
    :param user: the user for every storage (default: each replica's uri's, or
        its uri table's ``login``; a replica naming none: its replica set's first).
    :param password: that user's password (default: the uri's, or its table's).
    :param bucket_count: vshard's ``bucket_count`` (default: the configuration's,
        else the storages'); checked against the storages'.
    :param timeout: a call's default timeout in seconds (vshard's: 0.5).
    :param discovery_mode: ``'on'`` (keep discovering: idle every 10 s once every
        bucket is known), ``'once'`` (stop when every bucket is known) or ``'off'``
        (buckets are found on first use only).
    :param varbinary: how ``bucket_id_mpcrc32`` hashes ``bytes`` (see
        :func:`gtarantool.sharding.mpcrc32`); by default as the storages'
        Tarantool does (3.0+: True), decided once.
    :param zone: the router's zone: replicas are read from in the order of
        ``weights[zone][their zone]`` (vshard's ``zone``/``weights``).
    :param weights: ``{zone: {zone: weight}}``, lower first.
    :param pool_options: more :class:`gtarantool.ConnectionPool` arguments
        (``connection_timeout``, ``refresh_delay``, ``strategy_class``...).
    :raises tarantool.error.ConfigurationError: a malformed configuration, or a
        ``bucket_count`` that is not the storages' (or none given and no storage
        answered).
    """

    replicasets: Dict[Any, Replicaset]   # by vshard's id
    _routes: List[Optional[Replicaset]]   # by bucket id
    _destinations: Dict[Any, Replicaset]

    def __init__(self, sharding: Dict[Any, Any], user: Optional[str] = None,
                 password: Optional[str] = None, bucket_count: Optional[int] = None, *,
                 timeout: float = CALL_TIMEOUT, discovery_mode: str = "on",
                 varbinary: Optional[bool] = None, zone: Any = None,
                 weights: Optional[Dict[Any, Dict[Any, float]]] = None,
                 **pool_options: Any) -> None:
        if isinstance(sharding, dict) and isinstance(sharding.get("sharding"), dict):
            if bucket_count is None:
                bucket_count = sharding.get("bucket_count")
            zone = sharding.get("zone") if zone is None else zone
            weights = sharding.get("weights") if weights is None else weights
            sharding = sharding["sharding"]
        if not isinstance(sharding, dict) or not sharding:
            raise ConfigurationError("sharding must be vshard's non-empty table of replica sets")
        if bucket_count is not None and not (isinstance(bucket_count, int)
                                             and bucket_count > 0):
            raise ConfigurationError("bucket_count must be a positive integer, not %r"
                                     % (bucket_count,))
        if discovery_mode not in ("on", "once", "off"):
            raise ConfigurationError("discovery_mode must be 'on', 'once' or 'off'")
        try:
            self.timeout = _seconds(timeout)
        except ValueError as exc:
            raise ConfigurationError(str(exc)) from None
        self.discovery_mode = discovery_mode
        self.zone, self.weights = zone, weights or {}
        self._varbinary = varbinary
        self._closed = False
        self._closing = gevent.event.Event()   # set by close(): wakes the calls pausing
        self._broken: Optional[Exception] = None   # the cluster is not the router's
        self.known_bucket_count = 0
        self._ref_ids = itertools.count(1)
        self._wakeup = gevent.event.Event()
        self._searches: Dict[int, gevent.event.AsyncResult] = {}
        self._tasks = gevent.pool.Group()   # bucket searches, unrefs: killed by close()
        _check_sharding(sharding, self.weights)
        self.replicasets = {}
        pool_options.setdefault("fetch_schema", False)
        # No wait inside the pool: a call with no instance of its role is refused
        # unsent, and the router waits within the call's own timeout.
        pool_options.setdefault("wait_timeout", 0)
        try:
            for rs_id, rs_cfg in sharding.items():
                self.replicasets[rs_id] = self._replicaset(rs_id, rs_cfg, user, password,
                                                           pool_options)
            gevent.joinall([gevent.spawn(rs.pool.connect) for rs in self.replicasets.values()])
            self.bucket_count = self._cluster_bucket_count(bucket_count)
        except BaseException:
            self.close()
            raise
        self._routes = [None] * (self.bucket_count + 1)
        if self._varbinary is None:
            self._varbinary = self._server_varbinary()
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
        addrs, zones, logins = [], [], []
        for replica_id, replica in replicas.items():
            if not isinstance(replica, dict) or "uri" not in replica:
                raise ConfigurationError("replica %s of replica set %s has no uri"
                                         % (replica_id, rs_id))
            host, port, uri_user, uri_password = parse_uri(replica["uri"])
            addrs.append({"host": host, "port": port})
            zones.append(replica.get("zone"))
            logins.append((uri_user, uri_password))
        given = user is not None
        if not given:   # the first uri naming a user: the replica set's default
            user, password = next(((u, p) for u, p in logins if u is not None),
                                  (user, password))
        pool = ConnectionPool(addrs, user=user, password=password, connect_now=False,
                              **pool_options)
        if not given:
            # A replica connects as its own uri says (a uri table's login and
            # password too), before its first connection.
            for instance, (uri_user, uri_password) in zip(pool.pool.values(), logins):
                if uri_user is not None and (uri_user, uri_password) != (user, password):
                    instance.conn.user, instance.conn.password = uri_user, uri_password
        names = list(pool.pool)
        near = self.weights.get(self.zone, {}) if self.zone is not None else {}
        order = [name for _, _, name in sorted(
            (0 if zone == self.zone else near.get(zone, float("inf")), i, name)
            for i, (name, zone) in enumerate(zip(names, zones)))]
        return Replicaset(rs_id, rs_cfg.get("name") or rs_id, pool, order)

    def _ask_count(self, rs):
        """The storages' bucket count as ``rs`` has it, or None when it cannot say."""
        try:
            with Timeout(DISCOVERY_TIMEOUT):
                count = rs.pool.eval(_COUNT_LUA, mode=PREFER_RW).data[0]
        except (Exception, Timeout):   # unreachable, or no right to eval: not checked
            return None
        if isinstance(count, int) and count > 0:
            rs.count_checked = True
            return count
        return None

    def _cluster_bucket_count(self, given):
        replicasets = list(self.replicasets.values())
        greenlets = [gevent.spawn(self._ask_count, rs) for rs in replicasets]
        gevent.joinall(greenlets)
        counts = {rs.name: g.value for rs, g in zip(replicasets, greenlets)
                  if g.value is not None}
        if len(set(counts.values())) > 1:
            raise ConfigurationError("the storages disagree on bucket_count: %s" % ", ".join(
                "%s has %d" % item for item in sorted(counts.items())))
        learned = next(iter(counts.values()), None)
        if given is None:
            if learned is None:
                raise ConfigurationError("bucket_count is not given and no storage told it "
                                         "(none answered): pass bucket_count")
            return learned
        if learned is not None and learned != given:
            raise count_mismatch(given, learned)
        return given

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

    @classmethod
    def from_config(cls, config: Any, user: Optional[str] = None,
                    password: Optional[str] = None, **options: Any) -> Router:
        """A Router over the storages of a Tarantool 3 cluster configuration (the
        YAML file ``tarantool --config`` reads, or the same document as a dict,
        e.g. from etcd): instances with ``sharding.roles`` containing ``storage``,
        each reached at the address and as the login Tarantool 3's own router
        uses (``iproto.advertise.sharding``, else ``iproto.advertise.peer``,
        else the first ``iproto.listen`` uri a client can connect to; the
        advertised password, else the login's in ``credentials.users``; see
        ``gtarantool.sharding.config.vshard_cfg``), ``sharding.bucket_count``.

        :param config: a path to the YAML file, or the parsed document.
        :param user: the user to connect to every storage as (default: each
            storage's advertised login, else guest).
        :param password: its password (default: ``credentials.users[user]``'s).
        :param options: :class:`Router`'s keyword arguments.
        :returns: the :class:`Router`, connected to the storages.
        :raises tarantool.error.ConfigurationError: the configuration names no
            storage, or one without an address.
        """
        cfg, _, found = vshard_cfg(config, user, password)
        if user is None:   # each replica's uri table holds its own login and password
            return cls(cfg, **options)
        return cls(cfg, user=user, password=found, **options)

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
        :raises ValueError: a key vshard cannot hash, or a binary key before any
            storage said its Tarantool version (pass ``varbinary``).
        """
        return mpcrc32(key, self._uses_varbinary()) % self.bucket_count + 1

    def _server_varbinary(self):
        for rs in self.replicasets.values():
            for instance in rs.pool.pool.values():
                version = getattr(instance.conn, "version_id", None)
                if version:
                    # version_id packs (major, minor, patch) as tarantool-python does.
                    return version >= (3 << 16)
        return None

    def _uses_varbinary(self):
        if self._varbinary is None:
            # Decided once, for the whole cluster, by the first storage that answered.
            self._varbinary = self._server_varbinary()
            if self._varbinary is None:
                raise ValueError("no storage has said its Tarantool version yet, so binary "
                                 "keys cannot be hashed as vshard does: pass varbinary= "
                                 "(True for Tarantool 3.0+)")
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
            try:
                self._discover_once(rs)
                rs.discovery_error = None
                rs.discovery_rounds += 1
            except (Exception, Timeout) as exc:   # shown by info(); tried again later
                rs.discovery_error = exc if isinstance(exc, Exception) else RequestTimeout(
                    "no discovery reply within %ss" % DISCOVERY_TIMEOUT)
                if self._closed:
                    return
            known = self.known_bucket_count == self.bucket_count
            if self._broken is not None or (known and self.discovery_mode == "once"):
                return
            self._wakeup.wait(DISCOVERY_IDLE_INTERVAL if known else DISCOVERY_WORK_INTERVAL)

    def _discover_once(self, rs):
        if not rs.count_checked:
            count = self._ask_count(rs)
            if count is not None and count != self.bucket_count:
                self._broken = count_mismatch(self.bucket_count, count,
                                              "the storages of replicaset %s have" % rs.name)
                return
        start = 1
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
                if not 0 < bucket_id <= count:
                    self._broken = count_mismatch(
                        count, bucket_id, "replicaset %s holds bucket %d: the cluster has "
                        "at least" % (rs.name, bucket_id))
                    return
                if routes[bucket_id] is not rs:
                    self._set(bucket_id, rs)

    def _moved(self, bucket_id, rs, refused):
        """Correct the map after ``rs`` refused ``bucket_id`` as moved (a ShardingError
        in MOVED): the bucket is forgotten, or set to the replica set the refusal
        names as its destination.  Returns that replica set, or None (a search
        finds the bucket when it is asked for next)."""
        self._reset(bucket_id)
        dest = self._destinations.get(refused.details.get("destination"))
        if dest is not None and dest is not rs:
            self._set(bucket_id, dest)
        monitoring.emit(monitoring.BucketMapCorrectedEvent, rs.name, bucket_id=bucket_id,
                        to=dest.name if dest else "", code=refused.code)
        return dest

    def discovery_wakeup(self) -> None:
        """Run every replica set's discovery now rather than at its next period."""
        wakeup, self._wakeup = self._wakeup, gevent.event.Event()
        wakeup.set()

    def _search(self, bucket_id):
        """The replica set holding ``bucket_id``, found by one search however many
        callers wait for it.

        :raises gtarantool.ConnectionClosed: the router is (or gets) closed.
        """
        if self._closed:   # a closed pool would only fail the search, again and again
            raise _closed()
        search = self._searches.get(bucket_id)
        if search is None:
            search = self._searches[bucket_id] = gevent.event.AsyncResult()
            self._tasks.spawn(self._find, bucket_id, search)
        return search.get()

    def _find(self, bucket_id, search):
        # The outcome goes to the waiters, never to the hub (no traceback printed).
        try:
            with Timeout(max(self.timeout, CALL_TIMEOUT), False):
                search.set(self._resolve(bucket_id))
                return
            unanswered = ShardingError(
                NO_ROUTE_TO_BUCKET, "Bucket %d cannot be found: no master answered within "
                "%ss" % (bucket_id, max(self.timeout, CALL_TIMEOUT)), {"bucket_id": bucket_id})
            unanswered.unanswered = True   # (the search's bound, not the storages' answer)
            search.set_exception(unanswered)
        except Exception as exc:
            search.set_exception(exc)
        except gevent.GreenletExit:   # close() killed it: its waiters hear why, at once
            search.set_exception(_closed())
        finally:
            if self._searches.get(bucket_id) is search:
                del self._searches[bucket_id]

    def _resolve(self, bucket_id):
        """Find ``bucket_id`` by asking every replica set's master at once (vshard's
        bucket_resolve); only an ACTIVE or PINNED bucket is held (``bucket_stat``
        answers a stat and an error for one being sent or received)."""
        def ask(rs):
            # An error is returned, not raised: a greenlet dying would print it.
            try:
                data = rs.pool.call("vshard.storage.bucket_stat", bucket_id, mode=RW).data
            except Exception as exc:
                if isinstance(exc, DatabaseError) and not isinstance(exc, NetworkError):
                    # (a disabled or starting storage raises its refusal: waited out)
                    return raised_refusal(exc, "vshard.storage.bucket_stat", rs.id) or exc
                return exc
            stat = data[0] if data else None
            err = data[1] if len(data) > 1 else None
            if isinstance(stat, dict) and err is None:
                return stat.get("status") in ("active", "pinned")
            if stat is not None or (isinstance(err, dict) and err.get("code") == WRONG_BUCKET):
                return False
            return (ShardingError.from_storage(err, rs.id) if isinstance(err, dict)
                    else StorageError(err, rs.id))

        replicasets = list(self.replicasets.values())
        greenlets = [gevent.spawn(ask, rs) for rs in replicasets]
        owner = {greenlet: rs for greenlet, rs in zip(greenlets, replicasets)}
        try:
            for greenlet in gevent.iwait(greenlets):
                if greenlet.value is True:
                    rs = owner[greenlet]
                    self._set(bucket_id, rs)
                    return rs
        finally:
            gevent.killall(greenlets)
        for greenlet in greenlets:
            if isinstance(greenlet.value, (NetworkError, PoolTopologyError)):
                rs = owner[greenlet]
                raise ShardingError(UNREACHABLE_REPLICASET, "There is no active replicas in "
                                    "replicaset %s: %s" % (rs.name, greenlet.value),
                                    {"bucket_id": bucket_id}, rs.id)
        for greenlet in greenlets:
            if isinstance(greenlet.value, Exception):
                exc = greenlet.value
                if getattr(exc, "replicaset", None) is None:
                    exc.replicaset = owner[greenlet].id
                raise exc
        raise ShardingError(NO_ROUTE_TO_BUCKET, "Bucket %d cannot be found. Is rebalancing "
                            "in progress?" % bucket_id, {"bucket_id": bucket_id})

    def route(self, bucket_id: int, timeout: Optional[float] = None) -> Replicaset:
        """The :class:`Replicaset` holding ``bucket_id`` (asked of the storages when
        the map does not know it yet).

        :param bucket_id: 1..bucket_count.
        :param timeout: seconds for the search (default: the router's ``timeout``).
        :returns: the :class:`Replicaset`.
        :raises ValueError: ``bucket_id`` is not an integer in 1..bucket_count, or
            ``timeout`` is not a positive, finite number.
        :raises ShardingError: NO_ROUTE_TO_BUCKET, or UNREACHABLE_REPLICASET.
        :raises StorageError: a storage failed to say whether it holds the bucket.
        :raises gtarantool.RequestTimeout: no answer within ``timeout``.
        """
        self._usable()
        self._check(bucket_id)
        timeout = self.timeout if timeout is None else _seconds(timeout)
        rs = self._routes[bucket_id]
        if rs is not None:
            return rs
        with Timeout(timeout, False):
            while True:
                try:
                    return self._search(bucket_id)
                except ShardingError as exc:
                    # A search that ran out of its own bound (a master slow to
                    # answer) ends no caller's longer timeout: searched again.
                    if not getattr(exc, "unanswered", False):
                        raise
                gevent.sleep(0.005)
        exc = RequestTimeout("bucket %d was not found within %ss" % (bucket_id, timeout))
        exc.applied = False
        raise exc

    bucket_discovery = route

    def routeall(self) -> Dict[Any, Replicaset]:
        """{replica set id: :class:`Replicaset`}.

        :returns: a new dict (changing it changes nothing in the router).
        """
        return dict(self.replicasets)

    def _check(self, bucket_id):
        if type(bucket_id) is not int or not 0 < bucket_id <= self.bucket_count:
            raise ValueError("bucket_id must be an integer from 1 to %d, not %r"
                             % (self.bucket_count, bucket_id))

    def _usable(self):
        if self._closed:
            raise _closed()
        if self._broken is not None:
            raise self._broken

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
        :raises ValueError: ``bucket_id`` is not an integer in 1..bucket_count, or
            ``timeout`` is not a positive, finite number.
        :raises TypeError: ``func`` is not a str, or ``args`` not a list or tuple.
        :raises StorageError: the function raised, or returned ``nil, err``
            (``applied`` None).
        :raises ShardingError: a vshard refusal that is not about the bucket's
            place, or, at the timeout when every send was refused, the last
            refusal (e.g. UNREACHABLE_MASTER naming the replica set): ``applied``
            False.
        :raises gtarantool.RequestTimeout: the timeout came with a send whose
            outcome is unknown (``applied`` None; ``last_refusal`` the last
            refusal before it, if any).
        :raises tarantool.error.NetworkError: the connection failed with the call in
            flight: it may have run (``applied`` None).
        :raises tarantool.error.ConfigurationError: the router's ``bucket_count``
            is not the cluster's.
        :raises gtarantool.ConnectionClosed: the router is closed, or gets closed
            while the call waits (``applied`` False, or None when an earlier send
            of it may have run).
        """
        return self._call(bucket_id, None, func, args, timeout)

    def callro(self, bucket_id: int, func: str, args: Sequence[Any] = (),
               timeout: Optional[float] = None) -> Any:
        """As :meth:`callrw` for a read: on the master while it is up, else a replica.
        A read refused by a replica (the bucket not there yet, the storage
        disabled) or failing with its connection goes to the next replica, then
        the master, within ``timeout``.

        :param bucket_id: 1..bucket_count.
        :param func: the storage function's name.
        :param args: its arguments (a list or tuple).
        :param timeout: seconds for the whole call (default: the router's ``timeout``).
        :returns: the function's first return value.
        :raises: as :meth:`callrw`; a connection failure is not raised but
            the call sent elsewhere, within ``timeout``.
        """
        return self._call(bucket_id, "ro", func, args, timeout)

    def callbro(self, bucket_id: int, func: str, args: Sequence[Any] = (),
                timeout: Optional[float] = None) -> Any:
        """As :meth:`callro`, balanced over every member of the replica set.

        Parameters, return value and errors as :meth:`callro`.
        """
        return self._call(bucket_id, "bro", func, args, timeout)

    def callre(self, bucket_id: int, func: str, args: Sequence[Any] = (),
               timeout: Optional[float] = None) -> Any:
        """As :meth:`callro` on the first replica up (in zone order), else the master.

        Parameters, return value and errors as :meth:`callro`.
        """
        return self._call(bucket_id, "re", func, args, timeout)

    def callbre(self, bucket_id: int, func: str, args: Sequence[Any] = (),
                timeout: Optional[float] = None) -> Any:
        """As :meth:`callre`, balanced over the replicas (the master when none is up).

        Parameters, return value and errors as :meth:`callro`.
        """
        return self._call(bucket_id, "bre", func, args, timeout)

    def _call(self, bucket_id, kind, func, args, timeout):
        if self._closed or self._broken is not None:
            self._usable()
        if type(func) is not str:
            check_func(func)
        if type(bucket_id) is not int or not 0 < bucket_id <= self.bucket_count:
            self._check(bucket_id)
        if type(args) is not tuple and not isinstance(args, (list, tuple)):
            raise TypeError("args must be a list or tuple, not %s" % type(args).__name__)
        timeout = self.timeout if timeout is None else _seconds(timeout)
        token = process_token()   # a copy of this call in a forked child sends nothing
        timer = Timeout(timeout)
        timer.start()
        call = None
        rs = self._routes[bucket_id]
        try:
            # The usual call: one send to the replica set the map names, one reply;
            # anything else goes on in a _Call, which knows it was sent.
            instance = None
            if rs is not None:
                try:
                    if kind is None:
                        data = rs.pool.call("vshard.storage.call", bucket_id, "write", func,
                                            args, mode=RW).data
                    else:
                        instance = rs.pick(kind)
                        if instance is None:
                            raise PoolTopologyError("no healthy instance")
                        data = rs.send(instance, "vshard.storage.call",
                                       (bucket_id, "read", func, args)).data
                except Exception as exc:
                    call = _Call(self, token, bucket_id, kind, func, args, rs, instance)
                    return call.run(error=exc)
                if data and data[0] and (len(data) < 3 or data[1] is not None
                                         or data[2] is None):
                    return data[1] if len(data) > 1 else None
                call = _Call(self, token, bucket_id, kind, func, args, rs, instance)
                return call.run(data=data)
            call = _Call(self, token, bucket_id, kind, func, args)
            return call.run()
        except Timeout as exc:
            if exc is not timer:
                raise
            if call is None:   # the first send was in flight
                call = _Call(self, token, bucket_id, kind, func, args, rs)
                call.in_flight = True
            raise call.timed_out(timeout) from None
        finally:
            timer.close()

    # -- map-reduce -----------------------------------------------------------------------

    def map_callrw(self, func: str, args: Sequence[Any] = (), timeout: Optional[float] = None,
                   bucket_ids: Optional[Iterable[int]] = None) -> Dict[Any, List[Any]]:
        """vshard's Ref-Map-Reduce: ``func(*args)`` on every replica set's master
        (with ``bucket_ids``: on the masters of the replica sets holding those
        buckets), each run while the buckets are referenced (none moves meanwhile).

        :param func: the storage function's name.
        :param args: its arguments (a list or tuple).
        :param timeout: seconds for the whole call (default: the router's ``timeout``).
        :param bucket_ids: the buckets the function needs (vshard's partial map).
        :returns: {replica set id: [result]} for each master whose function returned
            a value (as vshard's router).
        :raises ShardingError: UNKNOWN_BUCKETS (the masters do not hold every bucket),
            or a storage's refusal; ``replicaset`` names where; ``applied`` False
            when no function ran.
        :raises StorageError: the function failed on a master (``replicaset``).
        :raises gtarantool.RequestTimeout: a master did not answer within ``timeout``.
        :raises TypeError: ``func`` is not a str, or ``args`` not a list or tuple.
        :raises ValueError: ``timeout`` is not a positive, finite number.
        :raises gtarantool.ConnectionClosed: the router is (or gets) closed.

        Once the function was sent (the map stage), every error says it may
        have run (``applied`` None): another master may have run it.
        """
        self._usable()
        check_func(func)
        if not isinstance(args, (list, tuple)):
            raise TypeError("args must be a list or tuple, not %s" % type(args).__name__)
        timeout = self.timeout if timeout is None else _seconds(timeout)
        rid = next(self._ref_ids)
        token = process_token()
        deadline = time.monotonic() + timeout
        sent: List[Replicaset] = []   # every replica set a ref went to, answered or not
        mapped = False   # storage_map sent: it releases the ref itself
        try:
            if bucket_ids is None:
                replicasets = list(self.replicasets.values())
                sent.extend(replicasets)
                counts = self._each(replicasets, deadline, token, "ref", "storage_ref", rid,
                                    timeout)
                total = sum(counts.values())
                if total != self.bucket_count:
                    raise ShardingError(UNKNOWN_BUCKETS, "%d buckets are not discovered"
                                        % (self.bucket_count - total),
                                        {"not_discovered_cnt": self.bucket_count - total})
            else:
                replicasets = self._ref_buckets(rid, list(bucket_ids), deadline, timeout, sent,
                                                 token)
            check_process(token)   # (the refs were the parent's: no map from a child)
            mapped = True
            results = self._each(replicasets, deadline, token, "map", "storage_map", rid, func,
                                 list(args))
            # (the replies came in the parent, which forked before this call
            # ran again: they are the parent's call's, which goes on there)
            check_process(token)
            return {rs_id: [value] for rs_id, value in results.items() if value is not None}
        except BaseException as exc:
            # The caller's gevent.Timeout or a kill (BaseExceptions) ends the call
            # too: its refs are released all the same, and it is told nothing.
            if not isinstance(exc, Exception) or isinstance(exc, CopiedCall):
                pass   # (a copy's: the parent's map goes on, it may run the function)
            elif not mapped:
                if getattr(exc, "applied", None) is None:
                    exc.applied = False  # type: ignore[attr-defined]   # the refs only ran
            else:   # (one master's refusal says nothing of the others', which may have run it)
                exc.applied = None  # type: ignore[attr-defined]
            if sent and process_token() == token:   # (a child's copy leaves them to the parent)
                # Released in the background (owned by the router), so the rebalancer
                # need not wait for the refs' timeout, nor the caller (or a killed
                # greenlet, which must not block) for the unrefs.
                self._tasks.spawn(self._each, list(sent), time.monotonic() + max(timeout, 1.0),
                                  token, "unref", "storage_unref", rid, quiet=True)
            raise

    def _ref_buckets(self, rid, bucket_ids, deadline, timeout, sent, token):
        """Ref the replica sets holding ``bucket_ids`` (vshard's partial map), following
        buckets that moved until none did; the replica sets."""
        for bucket_id in bucket_ids:
            self._check(bucket_id)
        refs: Dict[Replicaset, bool] = {}   # ref'd -> holding a needed bucket
        pending = sorted(set(bucket_ids))
        while pending:
            check_process(token)
            by_rs: Dict[Replicaset, List[int]] = {}
            for bucket_id in pending:
                remaining = deadline - time.monotonic()
                if remaining <= 0:   # (a search that ended just at the deadline)
                    raise _map_timeout("bucket %d was not found" % bucket_id)
                rs = self.route(bucket_id, remaining)
                by_rs.setdefault(rs, []).append(bucket_id)
            targets = list(by_rs)
            fresh = [rs for rs in targets if rs not in refs]
            sent.extend(rs for rs in fresh if rs not in sent)
            answers = {}
            if fresh:
                answers.update(self._each(fresh, deadline, token, "ref",
                                          "storage_ref_make_with_buckets", rid, timeout, by_rs,
                                          per_rs=True))
            old = [rs for rs in targets if rs in refs]
            if old:
                answers.update(self._each(old, deadline, token, "ref",
                                          "storage_ref_check_with_buckets", rid, by_rs,
                                          per_rs=True))
            pending = []
            for rs in targets:
                answer = answers.get(rs.id) or {}
                moved = answer.get("moved") or []
                if answer.get("is_done") or rs in refs:
                    refs[rs] = True   # ref'd: the map runs there
                for item in moved:
                    bucket_id = item.get("id")
                    self._reset(bucket_id)
                    dest = self._destinations.get(item.get("dst"))
                    if dest is not None and dest is not rs:
                        self._set(bucket_id, dest)
                    pending.append(bucket_id)
            if time.monotonic() >= deadline:
                raise _map_timeout("the buckets kept moving")
        return list(refs)

    def _each(self, replicasets, deadline, token, stage, *call, quiet=False, per_rs=False):
        """``vshard.storage._call(*call)`` on every master in parallel; {id: value}.
        With ``per_rs``, the last argument is {replica set: its own last argument}.
        ``token``: the caller's ``process_token()``; nothing is sent in another process."""
        def one(rs):
            # Errors are returned, not raised: the caller raises the first one.
            args = call[:-1] + (call[-1][rs],) if per_rs else call
            try:
                # (A greenlet spawned before a fork may start in the child.)
                check_process(token)
                data = rs.pool.call("vshard.storage._call", *args, mode=RW).data
            except PoolTopologyError:   # refused unsent
                return ShardingError(UNREACHABLE_MASTER, "Master of replicaset %s is "
                                     "unreachable" % rs.name, None, rs.id)
            except Exception as exc:
                if isinstance(exc, DatabaseError) and not isinstance(exc, NetworkError):
                    return raised_refusal(exc, "vshard.storage._call", rs.id) or exc
                return exc
            if not data or data[0] is None or data[0] is False:
                err = data[1] if len(data) > 1 else None
                failure: DatabaseError
                if isinstance(err, dict) and err.get("type") == "ShardingError":
                    failure = ShardingError.from_storage(err, rs.id)
                else:
                    failure = StorageError(err, rs.id)
                failure.applied = False if stage == "ref" else None
                return failure
            if stage == "map":
                return (data[1] if len(data) > 1 else None,)
            return (data[0],)

        greenlets = [gevent.spawn(one, rs) for rs in replicasets]
        try:
            gevent.joinall(greenlets, timeout=max(0.0, deadline - time.monotonic()))
            results = {}
            for rs, greenlet in zip(replicasets, greenlets):
                if quiet:
                    continue
                if not greenlet.ready():
                    exc = _map_timeout("no reply from the master of replicaset %s"
                                       % rs.name)
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

    def buckets_info(self) -> Dict[int, Dict[str, Any]]:
        """{bucket id: {"uuid": replica set id, "status": "available_rw" or
        "available_ro" or "unreachable"}} for each bucket the map knows.

        :returns: that dict, built anew."""
        status = {rs: self._rs_status(rs.pool.info()) for rs in self.replicasets.values()}
        return {bucket_id: {"uuid": rs.id, "status": status[rs]}
                for bucket_id, rs in enumerate(self._routes) if rs is not None}

    @staticmethod
    def _rs_status(instances):
        roles = [i["role"] for i in instances.values()]
        if "master" in roles:
            return "available_rw"
        return "available_ro" if "replica" in roles else "unreachable"

    def info(self) -> Dict[str, Any]:
        """``vshard.router.info()``'s shape: ``{"bucket": {"available_rw",
        "available_ro", "unreachable", "unknown"}, "replicasets": {id: {"name",
        "bucket": {"available_rw"/"available_ro"/"unreachable"}, "bucket_count", "master",
        "replicas", "instances" (the pool's info), "discovery"}}, "alerts":
        [[name, message]], "status": 0 green .. 3 red}``.

        :returns: that dict, built anew."""
        bucket = {"available_rw": 0, "available_ro": 0, "unreachable": 0,
                  "unknown": self.bucket_count - self.known_bucket_count,
                  "total": self.bucket_count}
        alerts: List[List[str]] = []
        status = GREEN
        replicasets = {}
        for rs in self.replicasets.values():
            instances = rs.pool.info()
            state = self._rs_status(instances)
            bucket[state] += rs.bucket_count
            masters = [i for i in instances.values() if i["role"] == "master"]
            down = [i for i in instances.values() if not i["healthy"]]
            if state == "unreachable":
                alerts.append(["UNREACHABLE_REPLICASET", "There is no active replicas in "
                               "replicaset %s" % rs.name])
                status = max(status, RED)
            elif not masters:
                alerts.append(["UNREACHABLE_MASTER", "Master of replicaset %s is unreachable"
                               % rs.name])
                status = max(status, ORANGE)
            elif down:
                alerts.append(["UNREACHABLE_REPLICA", "Replica %s of replicaset %s is "
                               "unreachable" % (down[0]["address"], rs.name)])
                status = max(status, YELLOW)
            replicasets[rs.id] = {
                "name": rs.name, "bucket": {state: rs.bucket_count},
                "bucket_count": rs.bucket_count,
                "master": {"uri": masters[0]["address"], "status": "available"} if masters
                else {"status": "unreachable"},
                "replicas": [i["address"] for i in instances.values()
                             if i["role"] == "replica"],
                "instances": instances,
                "discovery": {"rounds": rs.discovery_rounds,
                              "last_error": None if rs.discovery_error is None
                              else str(rs.discovery_error)},
            }
        if bucket["unknown"]:
            alerts.append(["UNKNOWN_BUCKETS", "%d buckets are not discovered"
                           % bucket["unknown"]])
            status = max(status, ORANGE)
        if self._broken is not None:
            alerts.append(["INVALID_CFG", str(self._broken)])
            status = RED
        return {"bucket": bucket, "replicasets": replicasets, "alerts": alerts,
                "status": status}

    def close(self) -> None:
        """Stop discovery, searches and unrefs (killing and joining their greenlets)
        and close every pool.  Calls waiting (for a bucket's search, an instance
        to send to, or their next attempt) end at once with
        :class:`gtarantool.ConnectionClosed`: ``applied`` False, or None when an
        earlier send of the call may have run."""
        self._closed = True
        self._closing.set()
        discoveries = [rs.discovery for rs in self.replicasets.values() if rs.discovery]
        gevent.killall(discoveries)
        self._tasks.kill()
        for rs in self.replicasets.values():
            rs.discovery = None
            rs.pool.close()

    def __enter__(self) -> Router:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


def _map_timeout(what):
    exc = RequestTimeout("map_callrw: %s within the timeout" % what)
    exc.applied = None
    return exc


class _Call:
    """One call through the router after its first send (or with no route yet):
    its attempts and what they proved."""

    __slots__ = ("router", "token", "bucket_id", "kind", "func", "args", "rs", "instance",
                 "last", "unsure", "in_flight", "tried")

    def __init__(self, router, token, bucket_id, kind, func, args, rs=None, instance=None):
        self.router, self.token, self.bucket_id, self.kind = router, token, bucket_id, kind
        self.func, self.args = func, args
        self.rs, self.instance = rs, instance
        self.last = self.tried = None
        self.unsure = False      # a send whose outcome is unknown (it may have run)
        self.in_flight = False

    def run(self, data=None, error=None):
        """The call's result; ``data`` or ``error``: the outcome of a send already
        made to ``self.rs`` (``self.instance`` for a read)."""
        router, bucket_id = self.router, self.bucket_id
        pause = 0.0
        while True:
            # Only the process that made the call goes on with it: a forked
            # child's copy ends here, whatever it was waiting on (CopiedCall).
            check_process(self.token)
            if data is None and error is None:
                if router._closed:   # close() ends every waiting call
                    raise self.closed()
                if router._broken is not None:
                    raise router._broken
                rs = router._routes[bucket_id]
                if rs is None:
                    try:
                        rs = router._search(bucket_id)
                    except ShardingError as exc:   # in transit, or one replica set is down
                        self.last = exc
                        pause = self.pause(pause)
                        continue
                    except ConnectionClosed:   # close() ended the search
                        raise self.closed() from None
                self.rs = rs
                data, error = self.send(rs)
                if data is None and error is None:   # no instance to send to
                    pause = self.pause(pause)
                    continue
            if error is not None:
                failure, error = error, None
                pause = self.failed(failure, pause)
                continue
            reply, data = data, None
            result = self.replied(reply)
            if result is not _AGAIN:
                return result
            pause = self.after_refusal(pause)

    def send(self, rs):
        """(data, None) or (None, the error) of one send; (None, None) when no
        instance fits (the reason in ``last``)."""
        # Checked here too, not only at the top of run: the search for the
        # bucket yields, and its result may wake a forked child's copy.
        check_process(self.token)
        # in_flight stays set when the call's timer interrupts the send.
        self.in_flight = True
        try:
            if self.kind is None:
                data = rs.pool.call("vshard.storage.call", self.bucket_id, "write", self.func,
                                    self.args, mode=RW).data
            else:
                instance = self.instance = rs.pick(self.kind, self.tried)
                if instance is None:
                    self.in_flight = False
                    self.last = self.unreachable(rs)
                    self.tried = None
                    return None, None
                data = rs.send(instance, "vshard.storage.call",
                               (self.bucket_id, "read", self.func, self.args)).data
        except Exception as exc:
            self.in_flight = False
            return None, exc
        self.in_flight = False
        return data, None

    def failed(self, exc, pause):
        """A send raised ``exc``: raise it (or what it means), or return the pause
        before the next attempt."""
        rs, router = self.rs, self.router
        if isinstance(exc, PoolTopologyError):   # no instance of the role: refused unsent
            self.last = self.unreachable(rs)
            return self.pause(pause)
        if isinstance(exc, NetworkError):
            proven_unsent = getattr(exc, "applied", None) is False
            if not proven_unsent:
                self.unsure = True
            if router._closed:   # close() broke the connection: say so, not how
                raise self.closed() from exc
            if self.kind is None:
                if proven_unsent:
                    self.last = exc   # proven unsent: send it again
                    return self.pause(pause)
                exc.replicaset = rs.id
                exc.applied = getattr(exc, "applied", None)
                raise exc
            self.last = exc   # a read changes nothing: send it elsewhere
            return self.elsewhere(self.instance, pause)
        if not isinstance(exc, DatabaseError):
            raise exc
        refused = raised_refusal(exc, "vshard.storage.call", rs.id)
        if refused is None:
            exc.replicaset = rs.id
            if not hasattr(exc, "applied"):
                exc.applied = None
            raise exc
        self.last = refused   # vshard raised it before the function: not run
        if refused.code not in NOT_READY:
            raise refused
        return self.pause(pause) if self.kind is None else self.elsewhere(self.instance, pause)

    def replied(self, data):
        """The function's result, or _AGAIN after a refusal (in ``last``)."""
        rs = self.rs
        first = data[0] if data else None
        if first:
            if len(data) > 2 and data[1] is None and data[2] is not None:
                raise StorageError(data[2], rs.id)
            return data[1] if len(data) > 1 else None
        if first is not None:   # false, err: the function raised
            raise StorageError(data[1] if len(data) > 1 else None, rs.id)
        refused = refusal(data, rs.id) or StorageError(None, rs.id)
        self.last = refused
        if getattr(refused, "applied", None) is not False:
            self.unsure = True
            raise refused
        return _AGAIN

    def after_refusal(self, pause):
        """The pause before the next attempt after the refusal in ``last`` (raised
        when it is not one to wait out)."""
        router, rs, refused, instance = self.router, self.rs, self.last, self.instance
        code = getattr(refused, "code", None)
        if self.kind is not None and code in READ_ELSEWHERE and not rs.is_master(instance):
            self.tried = (self.tried or ()) + (instance,)
            if rs.pick(self.kind, self.tried) is not None:
                return pause   # the next replica, then the master
        if code in MOVED:
            self.tried = None
            dest = router._moved(self.bucket_id, rs, refused)
            # The first redirect goes at once; a bucket still moving is
            # asked again after a growing pause.
            return self.pause(pause) if pause or dest is None else 0.001
        if code in NOT_READY:
            return self.pause(pause) if self.kind is None else self.elsewhere(instance, pause)
        raise refused

    def elsewhere(self, instance, pause):
        """A read failed on ``instance``: the next one at once, a pause once all were tried."""
        self.tried = (self.tried or ()) + (instance,)
        if self.rs.pick(self.kind, self.tried) is not None:
            return pause
        self.tried = None
        return self.pause(pause)

    def pause(self, pause):
        """Wait ``pause`` seconds (less when close() comes first); the next pause."""
        if pause:
            self.router._closing.wait(pause)
        else:
            gevent.sleep(0)
        return min(0.2, pause * 2 or 0.005)

    def closed(self):
        """The error of a call ended by close(): not run, unless a send may have."""
        exc = _closed()
        if self.unsure:
            exc.applied = None
        exc.replicaset = self.rs.id if self.rs is not None else None
        return exc

    def unreachable(self, rs):
        info = rs.pool.info().values()
        errors = "; ".join("%s: %s" % (i["address"], i["last_error"] or i["status"])
                           for i in info)
        if self.kind is None and any(i["healthy"] for i in info):
            return ShardingError(UNREACHABLE_MASTER, "Master of replicaset %s is unreachable: "
                                 "%s" % (rs.name, errors), {"bucket_id": self.bucket_id}, rs.id)
        return ShardingError(UNREACHABLE_REPLICASET, "There is no active replicas in "
                             "replicaset %s (%s)" % (rs.name, errors),
                             {"bucket_id": self.bucket_id}, rs.id)

    def timed_out(self, timeout):
        rs, last = self.rs, self.last
        if self.unsure or self.in_flight:
            where = "replicaset %s" % rs.name if rs is not None else "the cluster"
            error = RequestTimeout("no reply from %s for bucket %d within %ss; the call may "
                                 "have run%s" % (where, self.bucket_id, timeout,
                                                 " (refused before: %s)" % last if last else ""))
            error.replicaset = rs.id if rs is not None else None
            error.applied = None
            error.last_refusal = last
            return error
        if last is not None and getattr(last, "applied", None) is False:
            return last   # every send was refused: not run anywhere
        error = RequestTimeout("bucket %d: nothing was sent within %ss%s" % (
            self.bucket_id, timeout, " (last error: %s)" % last if last else ""))
        error.replicaset = rs.id if rs is not None else None
        error.applied = False
        error.last_refusal = last
        return error


_AGAIN = object()   # a refusal: the call goes on

