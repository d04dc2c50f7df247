"""The benchmark over a replica set: ``--pool`` (``make bench POOL=1 [HOSTS=h1:p1,...]``).

Each worker drives a ``gtarantool.ConnectionPool`` (``bench.drivers.pool``): reads go to read-only
instances (``mode=RO``), writes to the read-write one.  The target reads
``box.stat()`` on every instance: the run's figures compare the client's
selects with the sum over the instances and its writes with the read-write
instance (replicas count the rows they apply as requests too), and the report
shows each instance's counts.  Without ``HOSTS`` a throwaway replica set
(a master and two replicas, ``gtarantool.testing.replicaset``) is started.
"""
import contextlib
import time

from bench.core.hosts import addresses, parse_hosts
from bench.targets.server import EMBEDDED_LUA, PREPARE_LUA, SetupError, Target
from gtarantool.testing.replicaset import ReplicaSet

# The replicated components of box.info.vclock (0 counts each instance's local writes).
VCLOCK = ("local r = {} for id, lsn in pairs(box.info.vclock) do "
          "if id ~= 0 then r[tostring(id)] = lsn end end return r")
WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE", "UPSERT")
# The replication user of the embedded replica set (the bench itself runs as guest).
REPLICATION_USER = ("bench", "bench")
USER_LUA = """
box.once('bench-user', function()
    box.schema.user.create(%r, {password = %r})
    box.schema.user.grant(%r, 'read,write,execute', 'universe')
end)
"""


class PoolTarget:
    """The runner's target for a replica set: ``host`` is ``"h1:p1,h2:p2"`` (what
    the workers' pools connect to), ``port`` None."""

    def __init__(self, hosts, config, servers=()):
        self.config = config
        self.servers = list(servers)
        self.members = [Target(host, port, config) for host, port in hosts]
        self.host, self.port = addresses(hosts), None
        self.version = self.members[0].version

    @property
    def pid(self):
        return None

    def describe(self):
        return {"host": self.host, "port": "pool", "embedded": bool(self.servers),
                "wal": self.config.wal if self.servers else None, "version": self.version}

    def _master(self):
        masters = [m for m in self.members if m._eval("return box.info.ro")[0] is False]
        if len(masters) != 1:
            raise SetupError("the replica set at %s has %d read-write instances; the pool "
                             "benchmark needs exactly one" % (self.host, len(masters)))
        return masters[0]

    def prepare(self, space):
        self._master().prepare(space)
        # The replicas' schema once they have the space: a replica's schema read half
        # way through applying it would name an index of a space it does not know yet.
        self.settle()
        for member in self.members:
            member.admin.flush_schema()

    def settle(self, timeout=30.0):
        """Wait until every replica has applied the master's writes (before a phase:
        the select phase reads what the insert phase wrote, on the replicas)."""
        master = self._master()
        want = master._eval(VCLOCK)[0]
        deadline = time.monotonic() + timeout
        for member in self.members:
            while True:
                have = member._eval(VCLOCK)[0]
                if all(have.get(k, 0) >= v for k, v in want.items()):
                    break
                if time.monotonic() > deadline:
                    raise SetupError("%s:%s did not catch up with the master within %ss"
                                     % (member.host, member.port, timeout))
                time.sleep(0.01)

    def stat(self):
        """Selects summed over every instance, writes of the read-write ones, and each
        instance's own counts as ``"SELECT@host:port"``."""
        total = {}
        for member in self.members:
            counts, ro = member._eval("return box.stat(), box.info.ro")
            name = "%s:%s" % (member.host, member.port)
            for op, value in counts.items():
                total["%s@%s" % (op, name)] = value["total"]
                if op not in WRITES or not ro:
                    total[op] = total.get(op, 0) + value["total"]
        return total

    def cpu_seconds(self):
        """CPU time of the servers this target started (None for existing ones)."""
        if not self.servers:
            return None
        import psutil
        total = 0.0
        for srv in self.servers:
            times = psutil.Process(srv.pid).cpu_times()
            total += times.user + times.system
        return total

    def close(self):
        for member in self.members:
            member.close()


@contextlib.contextmanager
def open_pool_target(config):
    """The replica set at ``config.hosts``, or a new embedded one."""
    if config.hosts:
        target = PoolTarget(parse_hosts(config.hosts), config)
        try:
            yield target
        finally:
            target.close()
        return
    user, password = REPLICATION_USER
    # The space is made on the master; replicas receive it.
    lua = (USER_LUA % (user, password, user) + "if not box.info.ro then\n"
           + EMBEDDED_LUA % (PREPARE_LUA, config.space) + "end\n")
    rs = ReplicaSet(lua, user=user, password=password, memtx_memory=1 << 30)
    for srv in rs.servers:
        srv.wal_mode = config.wal
    try:
        rs.start()
        target = PoolTarget([(s.host, s.port) for s in rs.servers], config, rs.servers)
        try:
            yield target
        finally:
            target.close()
    finally:
        rs.cleanup()
