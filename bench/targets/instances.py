"""The benchmark over many independent instances: ``make bench INSTANCES=4``
(throwaway local instances) or ``make bench HOSTS=h1:p1,h2:p2`` (existing ones).

A Tarantool instance runs its transactions on one core, so a box with many
cores is loaded with many instances.  Worker process ``i`` connects to
instance ``i % N``; each instance gets its own bench space.  ``box.stat()`` is
read on every instance: totals summed, and each instance's counts as
``"SELECT@host:port"``, which the run checks against the requests of the
workers that drove that instance.
"""
import contextlib

from bench.core.hosts import addresses, parse_hosts
from bench.targets.replicaset import PoolTarget
from bench.targets.server import EMBEDDED_LUA, PREPARE_LUA, SetupError, Target
from gtarantool.testing.server import TarantoolServer


class InstancesTarget:
    """The runner's target for N instances: ``address(i)`` is worker ``i``'s."""

    def __init__(self, hosts, config, servers=()):
        _check_procs(len(hosts), config)
        self.config = config
        self.servers = list(servers)
        self.members = []
        try:
            for host, port in hosts:
                self.members.append(Target(host, port, config))
        except SetupError:
            self.close()
            raise
        self.host, self.port = addresses(hosts), None
        self.version = self.members[0].version

    def address(self, index):
        member = self.members[index % len(self.members)]
        return member.host, member.port

    @property
    def pid(self):
        return None

    def describe(self):
        return {"host": self.host, "port": "%d instances" % len(self.members),
                "embedded": bool(self.servers),
                "wal": self.config.wal if self.servers else None, "version": self.version}

    def prepare(self, space):
        for member in self.members:
            member.prepare(space)

    def settle(self):
        """Nothing to wait for: the instances do not replicate."""

    def stat(self):
        """Every instance's counts summed, and each one's as ``"SELECT@host:port"``."""
        total = {}
        for member in self.members:
            name = "%s:%s" % (member.host, member.port)
            for op, value in member.stat().items():
                total["%s@%s" % (op, name)] = value
                total[op] = total.get(op, 0) + value
        return total

    # The servers' CPU time and closing every member: as a pool's target.
    cpu_seconds = PoolTarget.cpu_seconds
    close = PoolTarget.close


def _check_procs(instances, config):
    if config.procs < instances:
        raise SetupError("%d instances need at least as many worker processes (PROCS=%d)"
                         % (instances, config.procs))


@contextlib.contextmanager
def open_instances_target(config):
    """The instances at ``config.hosts``, or ``config.instances`` new local ones."""
    if config.hosts:
        target = InstancesTarget(parse_hosts(config.hosts), config)
        try:
            yield target
        finally:
            target.close()
        return
    _check_procs(config.instances, config)
    servers = [TarantoolServer(EMBEDDED_LUA % (PREPARE_LUA, config.space), wal_mode=config.wal)
               for _ in range(config.instances)]
    try:
        for server in servers:
            server.start()
        target = InstancesTarget([(s.host, s.port) for s in servers], config, servers)
        try:
            yield target
        finally:
            target.close()
    finally:
        for server in servers:
            server.cleanup()
