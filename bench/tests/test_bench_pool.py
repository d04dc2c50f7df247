"""The load generator over a replica set (``--pool``): selects go to the replicas, writes
to the master, and each instance's box.stat agrees with the requests it got."""
import pytest

from bench.core import config as options
from bench.core.hosts import parse_hosts
from bench.run import runner
from gtarantool.testing.replicaset import ReplicaSet

from .conftest import LUA, PASSWORD, USER


@pytest.fixture
def rs():
    replicaset = ReplicaSet(LUA, user=USER, password=PASSWORD)
    replicaset.start()
    yield replicaset
    replicaset.cleanup()


def name(srv):
    return "%s:%s" % (srv.host, srv.port)


def test_bench_pool_routes_and_counts_per_instance(rs):
    assert parse_hosts("a:1, :2") == [("a", 1), ("127.0.0.1", 2)]
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_hosts("a:1,b")
    hosts = ",".join(name(srv) for srv in rs.servers)
    config = options.Config(pool=True, hosts=hosts, user=USER, password=PASSWORD, ops=2000,
                            greenlets=20, quiet=True)
    results = runner.run(config)
    assert results["totals"]["errors"] == 0 and results["totals"]["server_counts_match"]
    select = next(p for p in results["phases"] if p["name"] == "select")
    master, r1, r2 = rs.servers
    assert select["connection"]["requests@%s" % name(master)] == 0
    assert select["server"]["instances"] == {"SELECT@%s" % name(r1): 1000,
                                             "SELECT@%s" % name(r2): 1000}
