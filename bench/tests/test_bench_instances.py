"""The load generator over many instances (bench.targets.instances): ``make bench
INSTANCES=2`` and ``HOSTS=h1:p1,h2:p2``, each instance's box.stat checked
against the workers that drove it."""
import pytest

from bench.core.config import OPERATIONS, Config
from bench.run import runner
from bench.targets.server import EMBEDDED_LUA, PREPARE_LUA, SetupError
from gtarantool.testing.server import TarantoolServer

from .test_bench import check_phases

SMALL = dict(procs=4, greenlets=10, ops=2000, size=256, quiet=True)


def check_instances(results, count, ops):
    check_phases(results, ops)
    for phase in results["phases"]:
        matches = phase["server"]["instances_match"]
        assert len(matches) == count and all(matches.values()), phase["server"]
        per_instance = {k: v for k, v in phase["connection"].items() if k.startswith("requests@")}
        # four workers over two instances: each instance gets two workers' share
        assert sorted(per_instance.values()) == [ops // count] * count
        assert sum(v for k, v in phase["server"]["instances"].items()) == ops


def test_instances_two_local():
    results = runner.run(Config(instances=2, **SMALL))
    assert results["server"]["port"] == "2 instances"
    check_instances(results, 2, SMALL["ops"])


def test_hosts_existing_instances():
    servers = [TarantoolServer(EMBEDDED_LUA % (PREPARE_LUA, "bench")) for _ in range(2)]
    try:
        for server in servers:
            server.start()
        hosts = ",".join("%s:%s" % (s.host, s.port) for s in servers)
        results = runner.run(Config(hosts=hosts, workload="mix", keys=500,
                                    **dict(SMALL, procs=2)))
        load, phase = results["phases"]
        assert phase["ops"] == SMALL["ops"]
        assert phase["server"]["match"], phase["server"]
        assert set(phase["server"]["instances_match"]) == {
            "%s:%s" % (s.host, s.port) for s in servers}
        assert set(phase["operations"]) <= set(OPERATIONS)
    finally:
        for server in servers:
            server.cleanup()


def test_fewer_processes_than_instances():
    with pytest.raises(SetupError, match="3 instances need at least as many worker processes"):
        runner.run(Config(instances=3, **dict(SMALL, procs=2)))


def test_instances_not_with_host():
    with pytest.raises(ValueError, match="--instances starts local servers"):
        Config(instances=2, host="127.0.0.1", port=3301)
