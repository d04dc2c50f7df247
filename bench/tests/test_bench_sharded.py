"""The load generator over a sharded cluster (``--shards``): routing in the client
(``vshard``) or through the Lua router (``router``, ``router-threads``), each replica
set's box.stat against the requests it got."""
import pytest

from bench.core import config as options
from bench.run import runner
from bench.targets.sharded import SHARDED_LUA
from gtarantool.testing.cluster import ShardedCluster, vshard_missing

MISSING = vshard_missing()
needs_vshard = pytest.mark.skipif(MISSING is not None, reason=str(MISSING))


def test_sharded_options_are_checked():
    assert options.Config(shards=2).driver == "vshard"
    with pytest.raises(ValueError, match="sharded cluster"):
        options.Config(driver="router")
    with pytest.raises(ValueError, match="sharded cluster"):
        options.Config(shards=2, driver="asynctnt")
    with pytest.raises(ValueError, match="--shards is not for"):
        options.Config(shards=2, pool=True)
    with pytest.raises(ValueError, match="four operations|send insert"):
        options.Config(shards=2, workload="mix", mix={"select": 50, "call": 50})


@needs_vshard
def test_bench_vshard_counts_per_replicaset():
    """A throwaway cluster; each replica set's counts equal the client's requests to it."""
    config = options.Config(shards=2, ops=1000, greenlets=10, quiet=True)
    results = runner.run(config)
    assert results["totals"]["errors"] == 0 and results["totals"]["server_counts_match"]
    assert results["server"]["replicasets"] == ["rs1", "rs2"]
    for phase in results["phases"]:
        sent = {key: n for key, n in phase["connection"].items() if key.startswith("requests@")}
        assert set(sent) == {"requests@rs1", "requests@rs2"}
        assert sum(sent.values()) == 1000 and min(sent.values()) > 0
        assert phase["server"]["replicasets_match"] == {"rs1": True, "rs2": True}


@pytest.fixture(scope="module")
def cluster():
    c = ShardedCluster(2, storage_lua="assert(loadfile(%r))('bench')\n" % SHARDED_LUA).start()
    yield c
    c.cleanup()


@needs_vshard
@pytest.mark.parametrize("driver", ["router", "router-threads", "vshard"])
def test_bench_an_existing_cluster_through_each_driver(cluster, driver):
    config = options.Config(shards=2, driver=driver, host=cluster.router.host,
                            port=cluster.router.port, user=cluster.user,
                            password=cluster.password, ops=600, greenlets=4,
                            workload="mix", keys=200, quiet=True)
    results = runner.run(config)
    assert results["totals"]["server_counts_match"], results["phases"][-1]["server"]
    assert results["server"]["embedded"] is False
    assert [p["name"] for p in results["phases"]] == ["load", "run"]
    phase = results["phases"][-1]
    assert phase["ops"] == 600
    # Every replica set did part of the work, by its own counts.
    for rs in ("rs1", "rs2"):
        assert sum(n for key, n in phase["server"]["instances"].items()
                   if key.endswith("@" + rs)) > 0


@needs_vshard
def test_router_threads_keeps_a_rate(cluster):
    config = options.Config(shards=2, driver="router-threads", host=cluster.router.host,
                            port=cluster.router.port, user=cluster.user,
                            password=cluster.password, ops=300, greenlets=4, rate=300,
                            workload="mix", keys=200, quiet=True)
    results = runner.run(config)
    phase = results["phases"][-1]
    assert phase["ops"] == 300 and phase["errors"] == {}
    assert phase["open_loop"]["scheduled"] == 300
    assert phase["service_time_ms"]["p50"] <= phase["latency_ms"]["p50"]
