"""A throwaway replica set on localhost: one master and N read-only replicas.

The master bootstraps alone; each replica joins from it (``replication`` and
``read_only = true`` in its first ``box.cfg``), then every member replicates
from every other (a full mesh), so a promoted replica's writes reach the rest.
A restart reads the same ``init.lua``: replicas sync from the master again.
"""
import time

import tarantool

from gtarantool.testing.server import TarantoolServer, binary_version, free_port

# Small timeouts: a dead peer is noticed, and a restart without the master
# goes on, within about a second instead of Tarantool's default 30.
REPLICATION = {"replication_connect_timeout": 1, "replication_timeout": 0.2}
GRANT = """
box.once('replicaset-replication', function()
    box.schema.user.grant(%r, 'replication', nil, nil, {if_not_exists = true})
end)
"""


class ReplicaSet:
    """``servers[0]`` is the master; ``addrs`` is a ``ConnectionPool`` address list.

    ``lua`` runs on every member after ``box.cfg`` (it must create ``user``
    with ``password`` on the master; replicas receive it by replication);
    ``cfg`` adds ``box.cfg`` options on every member.
    """

    def __init__(self, lua, replicas=2, user="test", password="secret",
                 memtx_memory=128 << 20, cfg=None):
        self.user, self.password = user, password
        ports = [free_port() for _ in range(replicas + 1)]
        self.uris = ["%s:%s@127.0.0.1:%d" % (user, password, port) for port in ports]
        self.servers = [TarantoolServer(lua + GRANT % user, port=ports[0],
                                        memtx_memory=memtx_memory,
                                        cfg=dict(REPLICATION, **cfg or {}))]
        for port in ports[1:]:
            extra = dict(REPLICATION, replication=self.uris[0], read_only=True, **cfg or {})
            if binary_version() >= (2, 11):
                # 'auto' wants every member listed; a replica here joins from the master only.
                extra["bootstrap_strategy"] = "legacy"
            self.servers.append(TarantoolServer(lua, port=port, memtx_memory=memtx_memory,
                                                cfg=extra))

    @property
    def master(self):
        return self.servers[0]

    @property
    def replicas(self):
        return self.servers[1:]

    @property
    def addrs(self):
        return [{"host": srv.host, "port": srv.port} for srv in self.servers]

    def start(self):
        """Start every member and mesh them; if one fails, stop those started."""
        try:
            for srv in self.servers:
                srv.start()
            self.mesh()
        except BaseException:
            self.cleanup()
            raise
        return self

    def mesh(self, servers=None):
        """Make every member (of ``servers``, default all) replicate from all the others."""
        uris = "{%s}" % ", ".join(repr(uri) for uri in self.uris)
        for srv in servers or self.servers:
            self.eval(srv, "box.cfg{replication = %s}" % uris)
        for srv in servers or self.servers:
            self.wait_running(srv)

    def wait_running(self, srv, timeout=30.0):
        """Wait until ``srv`` is no orphan: an instance whose replication peers did not all
        connect within ``replication_connect_timeout`` (a loaded host) is read-only until
        they do."""
        deadline = time.monotonic() + timeout
        while True:
            status = self.eval(srv, "return box.info.status")[0]
            if status == "running":
                return
            if time.monotonic() > deadline:
                raise RuntimeError("%s is %s after %ss" % (srv.port, status, timeout))
            time.sleep(0.05)

    def eval(self, srv, lua, *args):
        """Run ``lua`` on ``srv`` over a short-lived tarantool-python connection."""
        conn = tarantool.Connection(srv.host, srv.port, user=self.user, password=self.password,
                                    fetch_schema=False)   # no SELECTs in box.stat()
        try:
            return conn.eval(lua, list(args)).data
        finally:
            conn.close()

    def promote(self, srv):
        """Make ``srv`` writable: ``box.cfg{read_only = false}``."""
        self.eval(srv, "box.cfg{read_only = false}")

    def stat(self, srv):
        """``box.stat()`` totals by request type on ``srv``."""
        return {name: value["total"]
                for name, value in self.eval(srv, "return box.stat()")[0].items()}

    def wait_synced(self, timeout=10.0):
        """Wait until every live member has applied the master's writes (vclock[1])."""
        deadline = time.monotonic() + timeout
        want = self.eval(self.master, "return box.info.vclock[1] or 0")[0]
        for srv in self.replicas:
            while self.eval(srv, "return box.info.vclock[1] or 0")[0] < want:
                if time.monotonic() > deadline:
                    raise RuntimeError("replica %s did not sync within %ss" % (srv.port, timeout))
                time.sleep(0.02)

    def wait_caught_up(self, srv, source, timeout=10.0):
        """Wait until ``srv`` has applied every write ``source`` has made so far (its
        vclock holds ``source``'s own component): replication is asynchronous, and
        a switchover makes the new master writable only after this."""
        deadline = time.monotonic() + timeout
        source_id, want = self.eval(source, "return box.info.id, box.info.lsn")
        while True:
            have = self.eval(srv, "return box.info.vclock[...] or 0", source_id)[0]
            if have >= want:
                return
            if time.monotonic() > deadline:
                raise RuntimeError("%s has lsn %s of %s's %s after %ss"
                                   % (srv.port, have, source.port, want, timeout))
            time.sleep(0.02)

    def cleanup(self):
        for srv in self.servers:
            srv.cleanup()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.cleanup()
