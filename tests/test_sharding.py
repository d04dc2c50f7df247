"""gtarantool.Router against real vshard clusters (gtarantool.testing.cluster):
bucket ids equal vshard's, calls land where their bucket is, buckets moving,
a master switching and the whole cluster restarting under load, map_callrw,
an unreachable replica set."""
import importlib.util
import json
import os
import random
import struct
import subprocess
import sys

import gevent
import gevent.event
import pytest
from tarantool.error import NetworkError

import gtarantool
from gtarantool import RequestTimeout, Router, ShardingError, StorageError
from gtarantool.testing.cluster import ShardedCluster, vshard_missing

HERE = os.path.dirname(os.path.abspath(__file__))
MISSING = vshard_missing()
ER_READONLY, ER_LOADING = 7, 116


def refused_read_only(exc):
    """A storage's refusal to write while read-only or loading: the box error's own
    code (3.x), or, on 2.x, ER_PROC_LUA (32) with box's read-only message."""
    return exc.code in (ER_READONLY, ER_LOADING) or (
        exc.code == 32 and "read-only instance" in str(exc))
pytestmark = pytest.mark.skipif(MISSING is not None, reason=str(MISSING))

STORAGE = """
if not box.info.ro then box.once('kv', function()
    local s = box.schema.space.create('kv')
    s:create_index('pk', {parts = {{1, 'unsigned'}}})
    s:create_index('bucket_id', {parts = {{2, 'unsigned'}}, unique = false})
end) end
calls = setmetatable({}, {__serialize = 'map'})   -- kv_* calls here, by bucket id
local function count(bucket_id) calls[bucket_id] = (calls[bucket_id] or 0) + 1 end
function kv_put(bucket_id, id, value)
    count(bucket_id)
    box.space.kv:insert{id, bucket_id, value}
    return cluster_replicaset
end
function kv_get(bucket_id, id)
    count(bucket_id)
    local t = box.space.kv:get(id)
    return {cluster_replicaset, t and t[3]}
end
function kv_fail(message) error(message) end
function kv_soft_fail() return nil, 'soft failure' end
function kv_count() return box.space.kv:count() end
function kv_ids() return box.space.kv.index.pk:select({}, {iterator = 'ALL'}) end
function kv_calls() return calls end
"""
ROUTER = """
local hash = require('vshard.hash')
function hashes(keys)
    local s, m = {}, {}
    for i, key in ipairs(keys) do
        s[i] = hash.strcrc32(key)
        m[i] = hash.mpcrc32(key)
    end
    return s, m
end
function bucket_ids(keys)
    local s, m = {}, {}
    for i, key in ipairs(keys) do
        s[i] = vshard.router.bucket_id_strcrc32(key)
        m[i] = vshard.router.bucket_id_mpcrc32(key)
    end
    return s, m
end
"""


def make_cluster(shards=2):
    return ShardedCluster(shards, storage_lua=STORAGE, router_lua=ROUTER).start()


@pytest.fixture(scope="module")
def cluster():
    c = make_cluster()
    yield c
    c.cleanup()


def open_router(cluster, **options):
    router = Router(cluster.cfg, user=cluster.user, password=cluster.password, **options)
    with gevent.Timeout(10):
        while router.known_bucket_count < cluster.bucket_count:
            gevent.sleep(0.02)
    return router


@pytest.fixture
def router(cluster):
    r = open_router(cluster)
    yield r
    r.close()


def connect(cluster, srv):
    return gtarantool.connect(srv.host, srv.port, user=cluster.user, password=cluster.password)


def all_rows(cluster):
    """{id: (replica set uuid, bucket_id)} from every master; fails on a duplicate."""
    rows = {}
    for shard in cluster.shards:
        for row in cluster.eval(shard.master, "return kv_ids()")[0]:
            assert row[0] not in rows, "id %d on two replica sets" % row[0]
            rows[row[0]] = (shard.uuid, row[1])
    return rows


def calls_by_replicaset(cluster):
    counts = {}
    for shard in cluster.shards:
        total = {}
        for srv in shard.servers:
            for bucket_id, n in (cluster.eval(srv, "return kv_calls()")[0] or {}).items():
                total[bucket_id] = total.get(bucket_id, 0) + n
        counts[shard.uuid] = total
    return counts


# -- bucket ids ------------------------------------------------------------------------

def sample_keys(rng):
    ints = ([rng.randrange(-2 ** 63, 2 ** 64) for _ in range(600)]
            + [rng.randrange(-10 ** 15, 10 ** 15) for _ in range(600)]
            + [rng.randrange(-1000, 100000) for _ in range(600)]
            + [0, 10 ** 14 - 1, 10 ** 14, -(10 ** 14 - 1), -(10 ** 14), 2 ** 32, 2 ** 53 + 1,
               2 ** 64 - 1, -(2 ** 63), 127, 128, -32, -33])
    strings = ["".join(rng.choice("abcxyz019 _-éЖ中😀") for _ in range(rng.randrange(0, 40)))
               for _ in range(2000)] + ["1", "true", "x" * 300]
    blobs = [bytes(rng.randrange(256) for _ in range(rng.randrange(0, 70)))
             for _ in range(2000)]
    floats = ([rng.uniform(-1e6, 1e6) for _ in range(300)]
              + [struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0]
                 for _ in range(300)]
              + [1.0, -0.0, 0.5, 1e15, 1e100, 2.0 ** 63, 1.8e19, -1e19, float("inf")])
    floats = [f for f in floats if f == f]   # NaN's sign varies with how it is made
    scalars = ints + strings + blobs + floats + [True, False]
    tuples = [tuple(rng.choice(scalars) for _ in range(rng.randrange(1, 4)))
              for _ in range(2000)] + [(1, None, "a"), [5, "x", b"y"]]
    return {"ints": ints, "strings": strings, "bytes": blobs, "floats": floats,
            "bools": [True, False], "tuples": tuples}


@pytest.mark.timeout(120)
def test_bucket_ids_equal_vshards(cluster, router):
    """strcrc32 and mpcrc32 (the hashes and the bucket ids) equal the real
    router's, computed from the same keys sent as call arguments."""
    conn = connect(cluster, cluster.router)
    try:
        for kind, keys in sample_keys(random.Random(7)).items():
            for start in range(0, len(keys), 500):
                chunk = keys[start:start + 500]
                strs, mps = conn.call("hashes", [chunk]).data
                ids_s, ids_m = conn.call("bucket_ids", [chunk]).data
                ours_strs, ours_mps, ours_ids_s, ours_ids_m = [], [], [], []
                for key in chunk:
                    ours_strs.append(gtarantool.sharding.strcrc32(key)
                                     if not _nested_none(key) else None)
                    ours_mps.append(gtarantool.sharding.mpcrc32(
                        key, router._uses_varbinary()))
                    ours_ids_m.append(router.bucket_id_mpcrc32(key))
                    ours_ids_s.append(router.bucket_id_strcrc32(key)
                                      if not _nested_none(key) else None)
                for i, key in enumerate(chunk):
                    if ours_strs[i] is not None:
                        assert ours_strs[i] == strs[i], ("strcrc32", kind, key)
                        assert ours_ids_s[i] == ids_s[i], ("bucket_id_strcrc32", kind, key)
                    assert ours_mps[i] == mps[i], ("mpcrc32", kind, key)
                    assert ours_ids_m[i] == ids_m[i], ("bucket_id_mpcrc32", kind, key)
    finally:
        conn.close()


def tie_floats(rng):
    """Floats exactly halfway between two 14-digit decimals (LuaJIT's tostring rounds
    them away from zero, C's printf to even), others of every magnitude, and the
    special ones."""
    ties = ([rng.randrange(10 ** 13, 10 ** 14) * 10 + 5.0 for _ in range(300)]
            + [(rng.randrange(10 ** 13, 10 ** 14) * 2 + 1) / 2 for _ in range(300)]
            + [(rng.randrange(10 ** 12, 10 ** 13) * 4 + 1) / 4 for _ in range(300)]
            + [(rng.randrange(10 ** 11, 10 ** 12) * 8 + 3) / 8 for _ in range(300)]
            + [(rng.randrange(10 ** 13, 10 ** 14) * 2 + 1) / 2 ** 20 for _ in range(300)]
            + [123456789012345.0, 99999999999999.5, 0.5, 2.5])
    others = ([struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0]
               for _ in range(1000)]
              + [rng.uniform(-1, 1) * 10.0 ** rng.randrange(-320, 308) for _ in range(1000)]
              + [10.0 ** e for e in range(-310, 309)] + [5e-324, 2.0 ** -1074 * 3,
                                                         1.7976931348623157e308]
              + [-0.0, 0.0, float("inf"), float("-inf"), 1e-4, 1e-5, 1e13, 1e14])
    floats = [f for f in ties + [-t for t in ties] + others if f == f]
    return floats + [float("nan"), struct.unpack(">d", b"\xff\xf8" + bytes(6))[0]]


def test_float_bucket_ids_equal_vshards_ties_and_nan_included(cluster, router):
    conn = connect(cluster, cluster.router)
    try:
        keys = tie_floats(random.Random(11))
        for start in range(0, len(keys), 1000):
            chunk = keys[start:start + 1000]
            strs, mps = conn.call("hashes", [chunk]).data
            for key, theirs_s, theirs_m in zip(chunk, strs, mps):
                assert gtarantool.sharding.strcrc32(key) == theirs_s, ("strcrc32", key)
                assert gtarantool.sharding.mpcrc32(key) == theirs_m, ("mpcrc32", key)
                assert gtarantool.sharding.mpcrc32([key, 1]) == \
                    gtarantool.sharding.mpcrc32([key, 1], False)
        nested = [[f, "x"] for f in keys[::7]] + [[float("nan")]]
        strs, mps = conn.call("hashes", [nested]).data
        for key, theirs_s, theirs_m in zip(nested, strs, mps):
            assert gtarantool.sharding.strcrc32(key) == theirs_s, ("strcrc32", key)
            assert gtarantool.sharding.mpcrc32(key) == theirs_m, ("mpcrc32", key)
        ids_s, ids_m = conn.call("bucket_ids", [[123456789012345.0, float("nan")]]).data
        assert [router.bucket_id_strcrc32(123456789012345.0),
                router.bucket_id_mpcrc32(float("nan"))] == [ids_s[0], ids_m[1]]
    finally:
        conn.close()


def _nested_none(key):
    return isinstance(key, (list, tuple)) and any(part is None for part in key)


def test_bucket_id_rejects_keys_vshard_cannot_hash(router):
    for bad in (None, {"a": 1}, 2 ** 64, -(2 ** 63) - 1, object()):
        with pytest.raises(ValueError):
            router.bucket_id_mpcrc32(bad)
    with pytest.raises(ValueError):
        router.bucket_id_strcrc32((1, [2, 3]))


# -- routing -------------------------------------------------------------------------------

def test_calls_land_on_the_replicaset_holding_their_bucket(cluster, router):
    truth = cluster.buckets()
    before = calls_by_replicaset(cluster)
    expected = {shard.uuid: {} for shard in cluster.shards}
    base = 1_000_000
    calls = [(router.callrw, "kv_put"), (router.callro, "kv_get"), (router.callbro, "kv_get"),
             (router.callre, "kv_get"), (router.callbre, "kv_get")]
    for i in range(300):
        key = base + i
        bucket_id = router.bucket_id_mpcrc32(key)
        owner = truth[bucket_id]
        assert router.route(bucket_id).id == owner
        assert router.callrw(bucket_id, "kv_put", (bucket_id, key, "v%d" % i), timeout=5) == owner
        for method, func in calls[1:]:
            got = method(bucket_id, func, (bucket_id, key), timeout=5)
            assert got[0] == owner
            assert got[1:] in (["v%d" % i], [])   # a replica may not have it yet
        expected[owner][bucket_id] = expected[owner].get(bucket_id, 0) + len(calls)
    after = calls_by_replicaset(cluster)
    for rs_id, by_bucket in expected.items():
        for bucket_id, n in by_bucket.items():
            assert after[rs_id].get(bucket_id, 0) - before[rs_id].get(bucket_id, 0) == n
    info = router.info()
    assert info["bucket"] == {"total": cluster.bucket_count, "available_rw": cluster.bucket_count,
                              "available_ro": 0, "unreachable": 0, "unknown": 0}
    assert sum(rs["bucket"]["available_rw"] for rs in info["replicasets"].values()) \
        == cluster.bucket_count
    assert info["status"] == 0 and info["alerts"] == []


def test_errors_of_the_function_reach_the_caller(cluster, router):
    bucket_id = 7
    owner = cluster.buckets()[bucket_id]
    with pytest.raises(StorageError) as info:
        router.callrw(bucket_id, "kv_fail", ("broken on purpose",), timeout=5)
    assert "broken on purpose" in str(info.value) and info.value.replicaset == owner
    with pytest.raises(StorageError, match="soft failure"):
        router.callro(bucket_id, "kv_soft_fail", timeout=5)
    with pytest.raises(StorageError):
        router.callrw(bucket_id, "no_such_function", timeout=5)
    with pytest.raises(StorageError):   # a duplicate key: the storage's error, not retried
        key = 2_000_000
        bid = router.bucket_id_mpcrc32(key)
        router.callrw(bid, "kv_put", (bid, key, 1), timeout=5)
        router.callrw(bid, "kv_put", (bid, key, 1), timeout=5)
    for bad in (0, cluster.bucket_count + 1, "1", 1.0):
        with pytest.raises(ValueError):
            router.callrw(bad, "kv_count")
    with pytest.raises(TypeError):
        router.callrw(1, "kv_count", "not a tuple")


def test_map_callrw_runs_on_every_master(cluster, router):
    result = router.map_callrw("kv_count", timeout=5)
    assert set(result) == {shard.uuid for shard in cluster.shards}
    for shard in cluster.shards:
        assert result[shard.uuid] == [cluster.eval(shard.master, "return kv_count()")[0]]
    with pytest.raises(StorageError, match="map failure") as info:
        router.map_callrw("kv_fail", ("map failure",), timeout=5)
    assert info.value.replicaset in result
    # The refs were released: a bucket can move at once.
    moved = next(b for b, rs in cluster.buckets().items() if rs == cluster.shards[0].uuid)
    assert cluster.bucket_send(moved, cluster.shards[1].uuid, timeout=2)
    assert cluster.buckets()[moved] == cluster.shards[1].uuid


def test_from_router_reads_the_lua_routers_configuration(cluster):
    router = Router.from_router(cluster.router.host, cluster.router.port, user=cluster.user,
                                password=cluster.password)
    try:
        assert set(router.replicasets) == set(cluster.cfg["sharding"])
        assert router.bucket_count == cluster.bucket_count
        assert router.callrw(3, "kv_get", (3, 1), timeout=5)[0] == cluster.buckets()[3]
        discoveries = [rs.discovery for rs in router.replicasets.values()]
        assert discoveries and not any(g.dead for g in discoveries)
    finally:
        router.close()
    assert all(g.dead for g in discoveries)   # owned: killed and joined by close()
    with pytest.raises(gtarantool.ConnectionClosed):
        router.callro(3, "kv_get", (3, 1))


# -- under load ------------------------------------------------------------------------------

class Load:
    """``writers`` greenlets writing unique ids through ``router`` until stopped;
    each acknowledged id with the replica set that answered, and every error."""

    def __init__(self, router, writers=16, start=10_000_000, timeout=5):
        self.router, self.timeout = router, timeout
        self.acked, self.errors, self.reads = {}, [], 0
        self.ids = iter(range(start, start + 10 ** 6))
        self.stop = gevent.event.Event()
        self.greenlets = [gevent.spawn(self.write) for _ in range(writers)]

    def write(self):
        router = self.router
        while not self.stop.is_set():
            key = next(self.ids)
            bucket_id = router.bucket_id_mpcrc32(key)
            try:
                self.acked[key] = router.callrw(bucket_id, "kv_put", (bucket_id, key, key),
                                                timeout=self.timeout)
                got = router.callro(bucket_id, "kv_get", (bucket_id, key), timeout=self.timeout)
                # (the owner that wrote it, or the one its bucket moved to since:
                # where each row is at the end is check()'s)
                assert got[0] == self.acked[key] or got[0] in router.replicasets, got
                self.reads += 1
            except (NetworkError, ShardingError) as exc:
                self.errors.append((key, exc))
            except StorageError as exc:
                # A restarted master may take a write while still read-only (syncing
                # as an orphan, loading): the storage refuses it, the write is not made.
                if not refused_read_only(exc):
                    raise
                self.errors.append((key, exc))
            gevent.sleep(0.001)

    def wait_more(self, count, more=100, timeout=30):
        """Wait until ``more`` writes past ``count`` are acknowledged; their number."""
        with gevent.Timeout(timeout, False):
            while len(self.acked) < count + more:
                gevent.sleep(0.02)
        assert len(self.acked) >= count + more, ("the writes did not go on: %d errors, last %r"
                                                 % (len(self.errors), self.errors[-1:]))
        return len(self.acked)

    def finish(self):
        self.stop.set()
        gevent.joinall(self.greenlets, raise_error=True)

    def check(self, cluster):
        """Every acknowledged write once, where its bucket is now, and never
        acknowledged by another replica set than its bucket's at the end."""
        rows = all_rows(cluster)
        truth = cluster.buckets()
        for key, answered in self.acked.items():
            assert key in rows, "acknowledged id %d lost" % key
            rs_id, bucket_id = rows[key]
            assert truth[bucket_id] == rs_id
        return rows


@pytest.mark.timeout(120)
def test_buckets_moved_under_load():
    cluster = make_cluster()
    try:
        router = open_router(cluster)
        src, dst = cluster.shards
        load = Load(router)
        gevent.sleep(0.2)
        moving = sorted(b for b, rs in cluster.buckets().items() if rs == src.uuid)[:40]
        conn = connect(cluster, src.master)
        try:
            for bucket_id in moving:
                conn.call("vshard.storage.bucket_send", (bucket_id, dst.uuid, {"timeout": 10}))
                gevent.sleep(0.01)
        finally:
            conn.close()
        gevent.sleep(0.3)
        load.finish()
        assert not load.errors, load.errors[:5]
        assert len(load.acked) > 200 and load.reads == len(load.acked)
        load.check(cluster)
        truth = cluster.buckets()
        assert all(truth[b] == dst.uuid for b in moving)
        router.discovery_wakeup()   # the map learns the moves no call corrected
        with gevent.Timeout(5):
            while not all(router.route(b).id == dst.uuid for b in moving):
                gevent.sleep(0.05)
        router.close()
    finally:
        cluster.cleanup()


@pytest.mark.timeout(120)
def test_master_switch_and_full_restart_under_load():
    cluster = make_cluster()
    try:
        router = open_router(cluster)
        shard = cluster.shards[0]
        load = Load(router)
        gevent.sleep(0.3)
        switched = len(load.acked)
        cluster_call = gevent.get_hub().threadpool.spawn
        cluster_call(shard.switch_master, 1).get()
        after_switch = load.wait_more(switched)
        # NON_MASTER is waited out; only a write that passed vshard's check just before
        # the master turned read-only may be refused, unapplied, by the space itself.
        assert all(isinstance(exc, StorageError) and refused_read_only(exc)
                   for key, exc in load.errors), load.errors[:5]
        assert cluster.eval(shard.servers[1], "return box.info.ro")[0] is False
        rounds = {rs: info["discovery"]["rounds"]
                  for rs, info in router.info()["replicasets"].items()}
        cluster_call(cluster.restart).get()
        router.discovery_wakeup()
        load.wait_more(max(after_switch, len(load.acked)))   # it goes on by itself
        load.finish()
        for key, exc in load.errors:   # only calls in flight across the stop, or refused
            assert isinstance(exc, (NetworkError, ShardingError, StorageError)), exc
        rows = load.check(cluster)
        refused = [key for key, exc in load.errors if isinstance(exc, StorageError)]
        assert not any(key in rows for key in refused)   # refused: not applied
        # Every error says whether the write may have run; none that did is a refusal.
        assert all(hasattr(exc, "applied") for key, exc in load.errors), load.errors[:5]
        assert not any(key in rows for key, exc in load.errors if exc.applied is False)
        info = router.info()
        assert info["bucket"]["unknown"] == 0
        assert all(info["replicasets"][rs]["discovery"]["rounds"] > n
                   for rs, n in rounds.items())
        router.close()
    finally:
        cluster.cleanup()


@pytest.mark.timeout(120)
def test_master_killed_and_a_replica_promoted_under_load():
    """An unplanned failover: the writes the dead master acknowledged but had not
    replicated may be gone (asynchronous replication), the router goes on."""
    cluster = make_cluster()
    try:
        router = open_router(cluster)
        shard = cluster.shards[0]
        load = Load(router, timeout=2)
        load.wait_more(0)
        shard.servers[0].kill()
        cluster_call = gevent.get_hub().threadpool.spawn
        cluster_call(shard.failover, 1).get()
        promoted = len(load.acked)
        load.wait_more(promoted)
        load.finish()
        rows = all_rows(cluster)
        truth = cluster.buckets()
        late = sorted(load.acked)[-50:]   # acknowledged by the new master
        assert all(key in rows and truth[rows[key][1]] == rows[key][0] for key in late)
        assert any(load.acked[key] == shard.uuid for key in late)   # the promoted one wrote
        for key, exc in load.errors:   # only about the dead master, and named so
            assert getattr(exc, "replicaset", None) == shard.uuid, exc
        router.close()
    finally:
        cluster.cleanup()


@pytest.mark.timeout(120)
def test_an_unreachable_replicaset_is_named_and_the_others_served():
    cluster = make_cluster()
    try:
        router = open_router(cluster, timeout=1)
        down, up = cluster.shards
        truth = cluster.buckets()
        down_bucket = next(b for b, rs in truth.items() if rs == down.uuid)
        up_bucket = next(b for b, rs in truth.items() if rs == up.uuid)
        for srv in down.servers:
            srv.kill()
        for method in (router.callrw, router.callro):
            with gevent.Timeout(5):
                with pytest.raises(ShardingError) as info:
                    # (the first may see the connection fail: a NetworkError)
                    for _ in range(3):
                        try:
                            method(down_bucket, "kv_get", (down_bucket, 1))
                        except NetworkError:
                            continue
            assert info.value.replicaset == down.uuid
            assert info.value.name in ("UNREACHABLE_REPLICASET", "UNREACHABLE_MASTER")
            assert down.name in str(info.value)
        assert router.callrw(up_bucket, "kv_get", (up_bucket, 1))[0] == up.uuid
        with pytest.raises((RequestTimeout, ShardingError)) as info:
            router.map_callrw("kv_count", timeout=1)
        assert info.value.replicaset == down.uuid
        router.close()
    finally:
        cluster.cleanup()


def test_the_customer_service_example_runs():
    example = os.path.join(os.path.dirname(HERE), "examples", "sharding", "service.py")
    out = subprocess.run([sys.executable, example], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, timeout=60)
    assert out.returncode == 0, out.stdout
    # 100 customers with orders of 100, 101 and 102 each.
    assert "revenue: 30300" in out.stdout


def test_locust_users_call_through_the_router(cluster):
    """Locust's --host tarantool+vshard://: a gtarantool.Router per process, each call
    reported by its method and function."""
    if importlib.util.find_spec("locust") is None:
        pytest.skip("needs the locust extra: pip install -e .[locust]")
    url = "tarantool+vshard://%s:%s@%s:%s" % (cluster.user, cluster.password,
                                              cluster.router.host, cluster.router.port)
    out = subprocess.run([sys.executable, "-m", "tests.locust_cases", "vshard", url],
                         cwd=os.path.dirname(HERE), timeout=120, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])["vshard"]
    assert got["opened"] == ["Router"]
    assert got["entries"] == [["tarantool", "callbro kv_get", True, False],
                              ["tarantool", "callro kv_get", True, False],
                              ["tarantool", "callrw kv_fail", True, True],
                              ["tarantool", "map_callrw kv_count", True, False]]
    assert [name for name, _ in got["errors"]] == ["callrw kv_fail"]
    assert got["report"]["connection"]["requests"] >= got["report"]["reported"] > 0
