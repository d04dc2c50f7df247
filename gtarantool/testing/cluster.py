"""A throwaway vshard cluster on localhost: N storage replica sets and a Lua router.

``ShardedCluster(shards=2)`` starts, in parallel, ``shards`` replica sets of
``1 + replicas`` storages each (the first member writable, the others
read-only replicas; vshard's ``master = 'auto'`` follows ``box.info.ro``) and
one router instance running ``vshard.router``; ``start()`` bootstraps the
buckets (``bucket_count``, spread evenly).  vshard comes from
``../shared/tarantool/rocks`` (see ``rocks_dir``) and
needs Tarantool 2.11+: ``vshard_missing()`` says why a cluster cannot start.

``cfg`` is vshard's configuration (replica sets and replicas by uuid, uris with
``user:password``), what ``gtarantool.Router`` takes; ``storage_lua`` runs on
every storage after ``vshard.storage.cfg`` with the global
``cluster_replicaset`` naming its replica set's uuid.
"""
import os
import shutil
import uuid
from concurrent.futures import ThreadPoolExecutor

import tarantool

from gtarantool.testing.server import TarantoolServer, binary_version, free_port

HERE = os.path.dirname(os.path.abspath(__file__))
REPLICATION = {"replication_connect_timeout": 1, "replication_timeout": 0.2}

_PRELUDE = """
local rocks = %(rocks)s
package.path = rocks .. '/?.lua;' .. rocks .. '/?/init.lua;' .. package.path
if not box.info.ro then
    box.once('sharded-cluster-user', function()
        box.schema.user.create(%(user)s, {password = %(password)s, if_not_exists = true})
        box.schema.user.grant(%(user)s, 'super', nil, nil, {if_not_exists = true})
    end)
end
vshard = require('vshard')
"""

_STORAGE = """
cluster_replicaset = %(rs)s
vshard.storage.cfg(%(cfg)s, %(instance)s)
"""

_ROUTER = """
vshard.router.cfg(%(cfg)s)
"""


def rocks_dir():
    """The folder holding vshard: ``$GTARANTOOL_ROCKS``, else ``rocks`` beside the
    ``$TARANTOOL`` build's folder, else the first ``shared/tarantool/rocks`` in a
    folder above this package (None when there is none)."""
    named = os.environ.get("GTARANTOOL_ROCKS")
    if named:
        return named
    candidates = []
    binary = os.environ.get("TARANTOOL") and shutil.which(os.environ["TARANTOOL"])
    if binary:   # ../shared/tarantool/3.8.0/tarantool: ../shared/tarantool/rocks
        binary = os.path.abspath(binary)
        candidates.append(os.path.join(os.path.dirname(os.path.dirname(binary)), "rocks"))
    folder = HERE
    while os.path.dirname(folder) != folder:
        folder = os.path.dirname(folder)
        candidates.append(os.path.join(folder, "shared", "tarantool", "rocks"))
    for path in candidates:
        if os.path.isfile(os.path.join(path, "vshard", "init.lua")):
            return path
    return None


def vshard_missing():
    """Why no sharded cluster can start here (a sentence), or None when one can."""
    if rocks_dir() is None:
        return ("vshard was not found (set GTARANTOOL_ROCKS to a folder holding vshard/, "
                "e.g. ../shared/tarantool/rocks)")
    try:
        version = binary_version()
    except (RuntimeError, OSError) as exc:   # no server binary: say so, as a reason
        return str(exc)
    if version < (2, 11):
        return ("vshard needs Tarantool 2.11+ here; the server is %s (choose one with "
                "TARANTOOL=/path/to/tarantool)" % ".".join(map(str, version)))
    return None


def lua_literal(value):
    """``value`` (dicts, lists, str, int, float, bool, None) as a Lua expression."""
    if value is None:
        return "nil"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"
    if isinstance(value, dict):
        return "{%s}" % ", ".join("[%s] = %s" % (lua_literal(k), lua_literal(v))
                                  for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return "{%s}" % ", ".join(lua_literal(v) for v in value)
    raise TypeError("no Lua literal for %r" % (value,))


class Shard:
    """One storage replica set: ``uuid``, ``name``, ``servers`` (``servers[0]`` starts
    as the master) and ``instances`` (their uuids, in the same order)."""

    def __init__(self, cluster, index, replicas):
        self.cluster = cluster
        self.uuid = str(uuid.uuid4())
        self.name = "rs%d" % (index + 1)
        self.instances = [str(uuid.uuid4()) for _ in range(replicas + 1)]
        self.ports = [free_port() for _ in self.instances]
        self.servers = []

    def uri(self, i):
        c = self.cluster
        return "%s:%s@127.0.0.1:%d" % (c.user, c.password, self.ports[i])

    @property
    def addrs(self):
        return [{"host": "127.0.0.1", "port": port} for port in self.ports]

    def build(self, cfg):
        c = self.cluster
        for i, (instance, port) in enumerate(zip(self.instances, self.ports)):
            extra = dict(REPLICATION, instance_uuid=instance, replicaset_uuid=self.uuid,
                         **c.box_cfg)
            if i:
                # A replica joins from the first member; mesh() links them all afterwards.
                extra.update(replication=self.uri(0), read_only=True,
                             bootstrap_strategy="legacy")
            lua = (_PRELUDE % c.lua_args + _STORAGE % {
                "rs": lua_literal(self.uuid), "cfg": lua_literal(cfg),
                "instance": lua_literal(instance)} + c.storage_lua)
            self.servers.append(TarantoolServer(lua, port=port, memtx_memory=c.memtx_memory,
                                                cfg=extra))

    def mesh(self):
        """Make every running member replicate from every other."""
        uris = [self.uri(i) for i in range(len(self.servers))]
        for srv in self.servers:
            if srv.process is not None and srv.process.poll() is None:
                self.cluster.eval(srv, "box.cfg{replication = ...}", uris)

    @property
    def master(self):
        """The member that is writable now (None when none answers as one)."""
        for srv in self.servers:
            try:
                if not self.cluster.eval(srv, "return box.info.ro")[0]:
                    return srv
            except Exception:   # a dead member is not the master
                continue
        return None

    def switch_master(self, to, timeout=10.0):
        """A planned failover: the master turns read-only, ``servers[to]`` applies
        everything it wrote, then turns writable (no acknowledged write is lost)."""
        old = self.master
        new = self.servers[to]
        if old is new:
            return
        for i, srv in enumerate(self.servers):
            srv.cfg["read_only"] = i != to
        self.cluster.eval(old, "box.cfg{read_only = true}")
        self.cluster.eval(new, """
            local want, id, timeout = ...
            local deadline = require('clock').monotonic() + timeout
            while (box.info.vclock[id] or 0) < want do
                if require('clock').monotonic() > deadline then error('replica did not sync') end
                require('fiber').sleep(0.01)
            end
            box.cfg{read_only = false}
        """, self.cluster.eval(old, "return box.info.vclock[box.info.id] or 0")[0],
            self.cluster.eval(old, "return box.info.id")[0], timeout)

    def failover(self, to):
        """Make ``self.servers[to]`` the only writable member (the others read-only;
        a dead one is told so in its next start)."""
        for i, srv in enumerate(self.servers):
            ro = i != to
            srv.cfg["read_only"] = ro
            if i != to and srv.process is not None and srv.process.poll() is None:
                self.cluster.eval(srv, "box.cfg{read_only = true}")
        self.cluster.eval(self.servers[to], "box.cfg{read_only = false}")


class ShardedCluster:
    """``shards`` replica sets of ``1 + replicas`` storages and one Lua router.

    :param storage_lua: Lua run on every storage after ``vshard.storage.cfg``.
    :param router_lua: Lua run on the router after ``vshard.router.cfg``.
    :param box_cfg: more ``box.cfg`` options for every storage.
    """

    def __init__(self, shards=2, replicas=1, bucket_count=300, user="storage",
                 password="secret", storage_lua="", router_lua="", box_cfg=None,
                 memtx_memory=64 << 20):
        self.user, self.password = user, password
        self.bucket_count = bucket_count
        self.storage_lua = storage_lua
        self.box_cfg = dict(box_cfg or {})
        self.memtx_memory = memtx_memory
        rocks = rocks_dir()
        if rocks is None:
            raise RuntimeError(vshard_missing())
        self.lua_args = {"rocks": lua_literal(rocks), "user": lua_literal(user),
                         "password": lua_literal(password)}
        self.shards = [Shard(self, i, replicas) for i in range(shards)]
        self.cfg = {
            "bucket_count": bucket_count,
            "box_cfg_mode": "manual",
            "sharding": {shard.uuid: {
                "name": shard.name, "master": "auto",
                "replicas": {instance: {"uri": shard.uri(i), "name": "%s-%d" % (shard.name, i)}
                             for i, instance in enumerate(shard.instances)},
            } for shard in self.shards},
        }
        for shard in self.shards:
            shard.build(self.cfg)
        self.router = TarantoolServer(_PRELUDE % self.lua_args + _ROUTER % {
            "cfg": lua_literal(self.cfg)} + router_lua, port=free_port(),
            memtx_memory=32 << 20)

    @property
    def servers(self):
        """Every storage, replica set by replica set."""
        return [srv for shard in self.shards for srv in shard.servers]

    def shard(self, rs_uuid):
        return next(shard for shard in self.shards if shard.uuid == rs_uuid)

    def eval(self, srv, lua, *args):
        """Run ``lua`` on ``srv`` over a short-lived tarantool-python connection."""
        conn = tarantool.Connection(srv.host, srv.port, user=self.user, password=self.password,
                                    fetch_schema=False)
        try:
            return conn.eval(lua, list(args)).data
        finally:
            conn.close()

    def start(self, timeout=30.0):
        """Start every storage and the router in parallel, mesh each replica set and
        bootstrap the buckets; on failure stop whatever started."""
        try:
            self._parallel(lambda srv: srv.start(timeout), self.servers + [self.router])
            for shard in self.shards:
                shard.mesh()
            self.eval(self.router, """
                local deadline = require('clock').monotonic() + ...
                while true do
                    local ok, err = vshard.router.bootstrap({timeout = 2})
                    if ok or (err and err.code == vshard.error.code.NON_EMPTY) then break end
                    if require('clock').monotonic() > deadline then error(err) end
                    require('fiber').sleep(0.05)
                end
            """, timeout)
            self.wait_buckets(timeout)
        except BaseException:
            self.cleanup()
            raise
        return self

    def wait_buckets(self, timeout=30.0):
        """Wait until the storages hold every bucket (after a bootstrap or restart)."""
        self.eval(self.router, """
            local deadline = require('clock').monotonic() + ...
            while vshard.router.info().bucket.available_rw < %d do
                if require('clock').monotonic() > deadline then
                    error('the buckets are not all writable yet')
                end
                require('fiber').sleep(0.05)
            end
        """ % self.bucket_count, timeout)

    def buckets(self):
        """Ground truth: {bucket id: replica set uuid} of the active buckets, read from
        each replica set's master."""
        owner = {}
        for shard in self.shards:
            ids = self.eval(shard.master, """
                local ids = {}
                for _, b in box.space._bucket:pairs() do
                    if b.status == 'active' or b.status == 'pinned' then table.insert(ids, b.id) end
                end
                return ids""")[0]
            for bucket_id in ids:
                owner[bucket_id] = shard.uuid
        return owner

    def bucket_send(self, bucket_id, to, timeout=10):
        """Move ``bucket_id`` to replica set ``to`` (a uuid) with vshard.storage.bucket_send
        on its current master; returns True when it moved."""
        source = self.shard(self.buckets()[bucket_id])
        ok = self.eval(source.master, """
            local ok, err = vshard.storage.bucket_send(...)
            if not ok then error(tostring(err)) end
            return true""", bucket_id, to, {"timeout": timeout})
        return bool(ok and ok[0])

    def restart(self, timeout=30.0):
        """Stop every instance (the router too) and start them all again in parallel."""
        everyone = self.servers + [self.router]
        self._parallel(lambda srv: srv.stop(), everyone)
        self._parallel(lambda srv: srv.start(timeout), everyone)
        for shard in self.shards:
            shard.mesh()
        self.wait_buckets(timeout)

    @staticmethod
    def _parallel(fn, servers):
        # Threads: a start waits for its server's greeting with blocking sleeps.
        with ThreadPoolExecutor(max(1, len(servers))) as executor:
            for future in [executor.submit(fn, srv) for srv in servers]:
                future.result()

    def cleanup(self):
        self._parallel(lambda srv: srv.cleanup(), self.servers + [self.router])

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.cleanup()
