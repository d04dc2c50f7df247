"""The benchmark over a sharded cluster: ``--shards N`` (``make bench SHARDS=N``).

Without ``--host`` a throwaway vshard cluster is started (``gtarantool.testing.cluster``:
N replica sets of a master and a replica, and a Lua router; Tarantool 2.11+ and vshard);
with ``--host``/``--port`` of a Lua router, the cluster it routes to is used as its
configuration says (the storages need ``sharded.lua`` loaded).  The drivers send each
operation to a storage function by the key's bucket: through the router in the client
(``--driver vshard``) or through the Lua router (``--driver router``, ``router-threads``).

The target reads ``box.stat()`` on every storage: writes are counted on the masters
(replicas count the rows they apply too), reads and errors by the storage functions' own
counters (``box.stat``'s SELECT also counts vshard's reads of its ``_bucket`` space, and
its ERROR counts a failed call more than once);
each replica set's counts are reported as ``"INSERT@rs1"``, and the client's requests to
each replica set (``--driver vshard``) are checked against them.
"""
import contextlib
import os

import tarantool

from bench.targets.server import SetupError
from gtarantool.testing.cluster import ShardedCluster, vshard_missing

HERE = os.path.dirname(os.path.abspath(__file__))
SHARDED_LUA = os.path.join(HERE, "sharded.lua")
BUCKET_COUNT = 3000
WRITES = {"insert": "INSERT", "update": "UPDATE", "delete": "DELETE"}
# The bench runs as guest on a throwaway cluster, as on a throwaway server.
GUEST_LUA = """
if not box.info.ro then
    box.once('bench-guest', function()
        box.schema.user.grant('guest', 'super', nil, nil, {if_not_exists = true})
    end)
end
"""
CFG_LUA = "local r = vshard.router.internal.static_router return r and r.current_cfg"


def _parse_uri(uri):
    creds, _, address = uri.rpartition("@")
    user, _, password = creds.partition(":")
    host, _, port = address.rpartition(":")
    return host or "127.0.0.1", int(port), user or None, password or None


class Member:
    """One storage instance: an admin connection that only sends EVAL requests."""

    def __init__(self, rs_name, uri, config):
        self.rs = rs_name
        self.host, self.port, user, password = _parse_uri(uri)
        try:
            self.admin = tarantool.Connection(self.host, self.port, user=user or config.user,
                                              password=password or config.password,
                                              fetch_schema=False)
        except tarantool.error.Error as exc:
            raise SetupError("cannot connect to storage %s:%s of %s: %s"
                             % (self.host, self.port, rs_name, exc)) from exc

    def eval(self, lua, *args):
        return self.admin.eval(lua, list(args)).data


class ShardedTarget:
    """The runner's target for a sharded cluster: ``host``/``port`` are the Lua router's
    (what every driver is given: ``--driver vshard`` reads the configuration from it)."""

    def __init__(self, host, port, config, cluster=None):
        self.host, self.port = host, port
        self.config = config
        self.cluster = cluster
        try:
            self.router = tarantool.Connection(host, port, user=config.user,
                                               password=config.password, fetch_schema=False)
            cfg = self.router.eval(CFG_LUA).data[0]
        except tarantool.error.Error as exc:
            raise SetupError("cannot read the vshard configuration of the router at %s:%s: %s"
                             % (host, port, exc)) from exc
        if not cfg:
            raise SetupError("%s:%s runs no configured vshard router" % (host, port))
        self.members = []
        for rs_id, rs in cfg["sharding"].items():
            name = rs.get("name") or rs_id
            for replica in rs["replicas"].values():
                self.members.append(Member(name, replica["uri"], config))
        self.replicasets = sorted({m.rs for m in self.members})
        self.version = self.members[0].eval("return box.info.version")[0]

    @property
    def pid(self):
        return None

    def describe(self):
        return {"host": self.host, "port": self.port, "embedded": self.cluster is not None,
                "wal": self.config.wal if self.cluster else None, "version": self.version,
                "replicasets": self.replicasets, "storages": len(self.members)}

    def prepare(self, space):
        """Empty the bench space on every master (the replicas follow)."""
        for member in self.members:
            member.eval("if not box.info.ro then bench_truncate() end")
        self.settle()

    def settle(self, timeout=30.0):
        """Wait until every replica has applied its master's writes."""
        for member in self.members:
            member.eval("""
                local deadline = require('clock').monotonic() + ...
                for _, upstream in pairs(box.info.replication) do
                    local u = upstream.upstream
                    while u and u.status == 'follow' and u.lag and u.lag > 0.05 and
                            require('clock').monotonic() < deadline do
                        require('fiber').sleep(0.01)
                    end
                end""", timeout)

    def stat(self):
        """INSERT/UPDATE/DELETE of the masters' box.stat; SELECT and ERROR as the storage
        functions count them; the same by replica set as ``"INSERT@rs1"``."""
        total = {"INSERT": 0, "SELECT": 0, "UPDATE": 0, "DELETE": 0, "ERROR": 0}
        for member in self.members:
            stat, ro, counts = member.eval("return box.stat(), box.info.ro, bench_counts")
            rows = {"SELECT": counts["select"], "ERROR": counts["error"]}
            if not ro:
                rows.update({name: stat[name]["total"] for name in WRITES.values()})
            for name, value in rows.items():
                total[name] += value
                key = "%s@%s" % (name, member.rs)
                total[key] = total.get(key, 0) + value
        return total

    def check_phase(self, result, stat_before, stat_after):
        """The client's requests to each replica set (``requests@rs``, from a driver that
        routes itself) against the replica set's counts; sets ``replicasets_match``."""
        connection = result.get("connection") or {}
        sent = {key.split("@", 1)[1]: value for key, value in connection.items()
                if key.startswith("requests@")}
        if not sent:
            return
        matches = {}
        for rs in self.replicasets:
            counted = sum(stat_after["%s@%s" % (name, rs)] - stat_before["%s@%s" % (name, rs)]
                          for name in ("INSERT", "SELECT", "UPDATE", "DELETE"))
            matches[rs] = counted == sent.get(rs, 0)
        server = result["server"]
        server["replicasets_match"] = matches
        server["match"] = server["match"] and all(matches.values())

    def cpu_seconds(self):
        """CPU time of every instance this target started, the Lua router's included."""
        if self.cluster is None:
            return None
        import psutil
        total = 0.0
        for srv in self.cluster.servers + [self.cluster.router]:
            times = psutil.Process(srv.pid).cpu_times()
            total += times.user + times.system
        return total

    def close(self):
        self.router.close()
        for member in self.members:
            member.admin.close()


@contextlib.contextmanager
def open_sharded_target(config):
    """The cluster behind the Lua router at ``config.host``, or a new embedded one."""
    if not config.embedded:
        target = ShardedTarget(config.host, config.port or 3301, config)
        try:
            yield target
        finally:
            target.close()
        return
    missing = vshard_missing()
    if missing:
        raise SetupError(missing)
    storage_lua = GUEST_LUA + "assert(loadfile(%r))(%r)\n" % (SHARDED_LUA, config.space)
    cluster = ShardedCluster(config.shards, bucket_count=BUCKET_COUNT, storage_lua=storage_lua,
                             router_lua=GUEST_LUA, memtx_memory=512 << 20)
    for srv in cluster.servers:
        srv.wal_mode = config.wal
    try:
        cluster.start()
        target = ShardedTarget(cluster.router.host, cluster.router.port, config, cluster)
        try:
            yield target
        finally:
            target.close()
    finally:
        cluster.cleanup()
