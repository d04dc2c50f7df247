"""gtarantool.Router's outcomes and vshard's semantics on a real cluster of two
replica sets of three storages: a call is re-sent only after a proven refusal,
every error says whether the call may have run (``applied``), a disabled
storage is waited out, reads go to another replica first, the bucket count is
the cluster's, one search per unknown bucket, map_callrw over some buckets."""
import json
import os
import signal
import time

import gevent
import gevent.os
import pytest
from tarantool.error import ConfigurationError

import gtarantool
from gtarantool import RequestTimeout, Router, ShardingError, StorageError
from gtarantool.sharding.replicaset import parse_uri
from gtarantool.testing.cluster import ShardedCluster, vshard_missing

MISSING = vshard_missing()
needs_vshard = pytest.mark.skipif(MISSING is not None, reason=str(MISSING))

STORAGE = """
local fiber = require('fiber')
if not box.info.ro then box.once('kv', function()
    local s = box.schema.space.create('kv')
    s:create_index('pk', {parts = {{1, 'unsigned'}}})
    s:create_index('bucket_id', {parts = {{2, 'unsigned'}}, unique = false})
end) end
calls = 0   -- kv_* calls on this instance
function kv_put(bucket_id, id, value)
    calls = calls + 1
    box.space.kv:insert{id, bucket_id, value}
    return cluster_replicaset
end
function kv_get(bucket_id, id)
    calls = calls + 1
    local t = box.space.kv:get(id)
    return {cluster_replicaset, t and t[3]}
end
function slow_put(bucket_id, id, delay)
    box.space.kv:insert{id, bucket_id, 'slow'}
    fiber.sleep(delay)
    return true
end
function own_wrong_bucket(bucket_id, id)
    box.space.kv:insert{id, bucket_id, 'ran'}
    error(vshard.error.vshard(vshard.error.code.WRONG_BUCKET, bucket_id, 'its own', nil))
end
function kv_fail(message) error(message) end
function kv_count() return box.space.kv:count() end
function echo(...) return {...} end
function slow_count(delay) fiber.sleep(delay) return box.space.kv:count() end
function disable_for(seconds)
    vshard.storage.disable()
    fiber.create(function() fiber.sleep(seconds) vshard.storage.enable() end)
end
"""


@pytest.fixture(scope="module")
def cluster():
    if MISSING is not None:
        pytest.skip(MISSING)
    c = ShardedCluster(2, replicas=2, storage_lua=STORAGE).start()
    yield c
    c.cleanup()


def open_router(cluster, **options):
    options.setdefault("discovery_mode", "once")
    router = Router(cluster.cfg, user=cluster.user, password=cluster.password, **options)
    with gevent.Timeout(10):
        while (options["discovery_mode"] != "off"
               and router.known_bucket_count < router.bucket_count):
            gevent.sleep(0.02)
    return router


@pytest.fixture
def router(cluster):
    r = open_router(cluster)
    yield r
    r.close()


keys = iter(range(5_000_000, 6_000_000))


def row(cluster, key):
    """The kv row ``key`` on whichever master holds it, or None."""
    for shard in cluster.shards:
        got = cluster.eval(shard.master, "return box.space.kv:get(...)", key)
        if got and got[0] is not None:
            return got[0]
    return None


def move(cluster, bucket_id, to, timeout=10):
    """bucket_send, again while the destination still holds the bucket's last
    visit as garbage (vshard refuses to receive it until it is collected)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return cluster.bucket_send(bucket_id, to)
        except Exception:
            if time.monotonic() > deadline:
                raise
            gevent.sleep(0.1)


def bucket_of(cluster, rs_index, nth=0):
    """The ``nth`` bucket of replica set ``rs_index`` (tests that move one take
    their own ``nth``: a bucket just moved back cannot move again at once)."""
    shard = cluster.shards[rs_index]
    return [b for b, rs in sorted(cluster.buckets().items()) if rs == shard.uuid][nth]


# -- outcomes -----------------------------------------------------------------------

@needs_vshard
def test_a_write_that_ran_after_a_stale_map_resend_is_a_timeout_that_may_have_applied(
        cluster, router):
    """The map is stale (the bucket moved): the first send is refused, the second
    runs on the new owner past the timeout: a RequestTimeout with applied None,
    the refusal attached, never the refusal itself."""
    src, dst = cluster.shards
    bucket_id = bucket_of(cluster, 0)
    assert router.route(bucket_id).id == src.uuid
    assert move(cluster, bucket_id, dst.uuid)
    key = next(keys)
    with pytest.raises(RequestTimeout) as info:
        router.callrw(bucket_id, "slow_put", (bucket_id, key, 1.5), timeout=0.5)
    assert info.value.applied is None
    assert isinstance(info.value.last_refusal, ShardingError)
    assert info.value.last_refusal.applied is False
    assert row(cluster, key) is not None   # it ran: a retry would apply it twice
    assert move(cluster, bucket_id, src.uuid)


@needs_vshard
def test_a_function_raising_a_sharding_error_ran_once_and_is_not_resent(cluster, router):
    """``false, err`` is the function's own failure, even when err is a vshard
    error: only ``nil, err`` is vshard's refusal."""
    bucket_id = bucket_of(cluster, 1)
    key = next(keys)
    with pytest.raises(StorageError) as info:
        router.callrw(bucket_id, "own_wrong_bucket", (bucket_id, key), timeout=2)
    assert info.value.applied is None
    assert row(cluster, key) is not None
    assert router.route(bucket_id).id == cluster.shards[1].uuid   # the map kept


@needs_vshard
def test_a_disabled_storage_is_decoded_and_waited_out(cluster, router):
    """vshard raises STORAGE_IS_DISABLED with error(): a PROC_LUA error holding
    JSON.  It is decoded, waited out within the timeout, and at the timeout
    raised as a refusal (applied False)."""
    shard = cluster.shards[0]
    bucket_id = bucket_of(cluster, 0)

    def waited_out_then_refused(router, waiting, refused):
        """A disabled storage is waited out within the timeout; past it, the
        call is refused unapplied."""
        cluster.eval(shard.master, "disable_for(...)", 0.7)
        key = next(keys)
        started = time.monotonic()
        assert router.callrw(waiting, "kv_put", (waiting, key, 1), timeout=5) == shard.uuid
        assert time.monotonic() - started > 0.3   # it waited for the storage
        cluster.eval(shard.master, "disable_for(...)", 1.5)
        key = next(keys)
        with pytest.raises(ShardingError) as info:
            router.callrw(refused, "kv_put", (refused, key, 1), timeout=0.4)
        assert info.value.name == "STORAGE_IS_DISABLED" and info.value.applied is False
        assert info.value.replicaset == shard.uuid
        assert row(cluster, key) is None
        gevent.sleep(1.2)

    waited_out_then_refused(router, bucket_id, bucket_id)
    # The same while the bucket is still to be found (its search meets the refusal).
    unmapped = open_router(cluster, discovery_mode="off")
    try:
        waited_out_then_refused(unmapped, bucket_id, bucket_of(cluster, 0, nth=1))
    finally:
        unmapped.close()


@needs_vshard
def test_a_read_goes_to_another_replica_when_one_is_disabled(cluster, router):
    shard = cluster.shards[0]
    bucket_id = bucket_of(cluster, 0)
    first = router.route(bucket_id).pick("re")
    disabled = next(srv for srv in shard.servers if srv.port == first.addr["port"])
    cluster.eval(disabled, "disable_for(...)", 2)
    try:
        for method in (router.callre, router.callbre, router.callbro):
            for _ in range(4):
                assert method(bucket_id, "kv_get", (bucket_id, 1), timeout=0.5)[0] == shard.uuid
    finally:
        cluster.eval(disabled, "vshard.storage.enable()")


@needs_vshard
def test_every_error_carries_applied(cluster):
    router = open_router(cluster)
    bucket_id = bucket_of(cluster, 1)
    with pytest.raises(StorageError) as info:
        router.callrw(bucket_id, "kv_fail", ("boom",), timeout=2)
    assert info.value.applied is None
    with pytest.raises(StorageError) as info:
        router.callro(bucket_id, "no_such_function", timeout=2)
    assert info.value.applied is None
    with pytest.raises(StorageError) as info:
        router.map_callrw("kv_fail", ("map boom",), timeout=2)
    assert info.value.applied is None
    router.close()
    with pytest.raises(gtarantool.ConnectionClosed) as info:
        router.callrw(bucket_id, "kv_count")
    assert info.value.applied is False


# -- vshard's semantics --------------------------------------------------------------

@needs_vshard
def test_callre_stays_on_one_replica_and_callbre_balances(cluster, router):
    shard = cluster.shards[1]
    bucket_id = bucket_of(cluster, 1)

    def calls():
        return [cluster.eval(srv, "return calls")[0] for srv in shard.servers]

    before = calls()
    for _ in range(6):
        router.callre(bucket_id, "kv_get", (bucket_id, 1), timeout=2)
    after_re = calls()
    for _ in range(6):
        router.callbre(bucket_id, "kv_get", (bucket_id, 1), timeout=2)
    after_bre = calls()
    master = next(i for i, srv in enumerate(shard.servers) if srv is shard.master)
    by_re = [a - b for a, b in zip(after_re, before)]
    by_bre = [a - b for a, b in zip(after_bre, after_re)]
    assert sorted(by_re) == [0, 0, 6] and by_re[master] == 0
    assert by_bre[master] == 0 and sorted(by_bre) == [0, 3, 3]


@needs_vshard
def test_one_search_per_unknown_bucket_however_many_wait(cluster):
    router = open_router(cluster, discovery_mode="off")
    searches = []
    resolve = router._resolve
    router._resolve = lambda bucket_id: (searches.append(bucket_id), resolve(bucket_id))[1]
    try:
        bucket_id = bucket_of(cluster, 1)
        greenlets = [gevent.spawn(router.callro, bucket_id, "kv_get", (bucket_id, 1), 2)
                     for _ in range(20)]
        gevent.joinall(greenlets, raise_error=True)
        assert searches == [bucket_id]
        assert {g.value[0] for g in greenlets} == {cluster.shards[1].uuid}
    finally:
        router.close()


@needs_vshard
def test_map_callrw_refused_by_one_master_after_another_ran_it_may_have_applied(cluster,
                                                                                  router):
    """The map goes to every master: one refusing it (its storage disabled
    between the ref and the map) says nothing of the others, which ran it."""
    shard = cluster.shards[1]
    cluster.eval(shard.master, """
        if rawget(_G, 'plain_call') == nil then plain_call = vshard.storage._call end
        vshard.storage._call = function(op, ...)
            local res = {plain_call(op, ...)}
            if op == 'storage_ref' then vshard.storage.disable() end
            return unpack(res, 1, table.maxn(res))
        end""")
    try:
        before = [cluster.eval(s.master, "return calls")[0] for s in cluster.shards]
        with pytest.raises(ShardingError) as info:
            router.map_callrw("kv_get", (0, 0), timeout=2)
        ran = [cluster.eval(s.master, "return calls")[0] - b
               for s, b in zip(cluster.shards, before)]
        assert ran == [1, 0]
        assert info.value.applied is None
    finally:
        cluster.eval(shard.master, "vshard.storage._call = plain_call vshard.storage.enable()")


@needs_vshard
def test_map_callrw_and_calls_refuse_bad_arguments_before_sending(cluster, router):
    before = [cluster.eval(s.master, "return calls")[0] for s in cluster.shards]
    for bad in ("abc", {"k": 1}, 5):
        with pytest.raises(TypeError, match="args must be a list or tuple"):
            router.map_callrw("kv_get", bad)
    bucket_id = bucket_of(cluster, 0)
    for bad in (0, -1, float("nan"), float("inf"), "1", True):
        with pytest.raises(ValueError, match="positive, finite number of seconds"):
            router.callrw(bucket_id, "kv_get", (bucket_id, 0), timeout=bad)
        with pytest.raises(ValueError, match="positive, finite number of seconds"):
            router.map_callrw("kv_get", (0, 0), timeout=bad)
        with pytest.raises(ValueError, match="positive, finite number of seconds"):
            router.route(bucket_id, timeout=bad)
        with pytest.raises(ConfigurationError, match="positive, finite number of seconds"):
            Router(cluster.cfg, user=cluster.user, password=cluster.password, timeout=bad)
    assert [cluster.eval(s.master, "return calls")[0] for s in cluster.shards] == before


@needs_vshard
def test_close_ends_calls_waiting_for_a_bucket_search_at_once(cluster):
    """A search waiting for a master that does not answer is the router's: close()
    ends it, and every call waiting on it hears ConnectionClosed, applied False."""
    shard = cluster.shards[1]
    bucket_id = bucket_of(cluster, 1)
    router = open_router(cluster, discovery_mode="off", timeout=8)
    master = shard.master
    master.signal(signal.SIGSTOP)   # the search waits for its bucket_stat
    try:
        calls = [gevent.spawn(router.callrw, bucket_id, "kv_get", (bucket_id, 0)),
                 gevent.spawn(router.route, bucket_id)]
        gevent.sleep(0.3)
        started = time.monotonic()
        router.close()
        gevent.joinall(calls, timeout=5)
        assert time.monotonic() - started < 1
        for call in calls:
            assert isinstance(call.exception, gtarantool.ConnectionClosed), call.exception
            assert call.exception.applied is False
    finally:
        master.signal(signal.SIGCONT)
        router.close()


@needs_vshard
def test_route_is_bounded_and_prints_no_traceback_when_no_master(cluster, capfd):
    shard = cluster.shards[0]
    bucket_id = bucket_of(cluster, 0)
    router = open_router(cluster, discovery_mode="off", refresh_delay=0.05)
    try:
        cluster.eval(shard.master, "box.cfg{read_only = true}")
        with gevent.Timeout(0.5):   # the master's role is seen as gone
            while router.replicasets[shard.uuid].pool.info() and any(
                    i["role"] == "master"
                    for i in router.replicasets[shard.uuid].pool.info().values()):
                gevent.sleep(0.02)
        started = time.monotonic()
        with gevent.Timeout(5):
            with pytest.raises((ShardingError, RequestTimeout)) as info:
                router.route(bucket_id, timeout=0.3)
        assert time.monotonic() - started < 2
        assert info.value.applied is False
        with pytest.raises(ShardingError) as info:
            router.callrw(bucket_id, "kv_count", timeout=0.3)
        assert info.value.applied is False
        state = router.info()
        assert ["UNREACHABLE_MASTER", "Master of replicaset %s is unreachable" % shard.name] \
            in state["alerts"] and state["status"] == 2
        assert "Traceback" not in capfd.readouterr().err
    finally:
        cluster.eval(shard.servers[0], "box.cfg{read_only = false}")
        router.close()


@needs_vshard
def test_route_and_a_partial_map_wait_out_a_master_slow_to_answer_the_search(cluster):
    """The bucket's master stalls (SIGSTOP) for longer than a search's own
    bound (the router's timeout, 0.5 s): route(timeout=5) and map_callrw over
    that bucket searched once and raised NO_ROUTE_TO_BUCKET at 0.5 s; they now
    search again within their own timeout."""
    shard = cluster.shards[1]
    master = shard.master
    buckets = [bucket_of(cluster, 1, nth) for nth in (20, 21, 22)]   # (read while it answers)
    router = open_router(cluster, discovery_mode="off")
    try:
        for call, bucket_id in (
                (lambda b: router.route(b, timeout=5).id, buckets[0]),
                (lambda b: list(router.map_callrw("kv_count", timeout=5, bucket_ids=[b]))[0],
                 buckets[1])):
            master.process.send_signal(signal.SIGSTOP)
            resumed = gevent.spawn_later(1.2, master.process.send_signal, signal.SIGCONT)
            try:
                started = time.monotonic()
                assert call(bucket_id) == shard.uuid
                assert time.monotonic() - started > 1
            finally:
                resumed.join(5)
                master.process.send_signal(signal.SIGCONT)
        # a caller's timeout shorter than the stall is still its own
        master.process.send_signal(signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(RequestTimeout) as info:
                router.route(buckets[2], timeout=0.3)
            assert time.monotonic() - started < 1 and info.value.applied is False
        finally:
            master.process.send_signal(signal.SIGCONT)
    finally:
        router.close()


@needs_vshard
def test_a_write_waiting_for_a_master_is_sent_once_across_a_fork(cluster):
    """A callrw waits (between attempts) for its replica set's master when the
    process forks; the child runs its hub; the master comes back.  Only the
    parent's call sends the write: the child's copy ends with CopiedCall
    (applied False) before it sends anything."""
    shard = cluster.shards[0]
    bucket_id = bucket_of(cluster, 0, nth=2)
    key = next(keys)
    router = open_router(cluster, refresh_delay=0.05)
    before = cluster.eval(shard.servers[0], "return calls")[0]
    try:
        cluster.eval(shard.master, "box.cfg{read_only = true}")
        with gevent.Timeout(5):
            while any(i["role"] == "master"
                      for i in router.replicasets[shard.uuid].pool.info().values()):
                gevent.sleep(0.02)
        write = gevent.spawn(router.callrw, bucket_id, "kv_put", (bucket_id, key, "once"),
                             timeout=15)
        gevent.sleep(0.3)
        assert not write.ready()
        child = _fork_while_waiting(write)   # the child's hub runs its copy of the call
        try:
            gevent.sleep(0.5)
            cluster.eval(shard.servers[0], "box.cfg{read_only = false}")
            write.get(timeout=10)
        finally:
            report = child()
        assert report == ["CopiedCall", None], report
        got = row(cluster, key)
        assert got is not None and got[2] == "once"
        # (kv_put counts every run, a second one failing on the key included.)
        assert cluster.eval(shard.servers[0], "return calls")[0] - before == 1
    finally:
        cluster.eval(shard.servers[0], "box.cfg{read_only = false}")
        router.close()


def _fork_while_waiting(glet):
    """Fork while ``glet`` (a call) waits; the child's hub runs its copy of it
    and reports how the copy ended.  Returns a function that reaps the child
    and gives that report: ``[exception class name, its applied]`` or ``["ok"]``."""
    r, w = os.pipe()
    pid = gevent.fork()
    if pid == 0:
        gevent.get_hub().exception_stream = None
        try:
            glet.join(timeout=4)
            exc = glet.exception
            os.write(w, json.dumps([type(exc).__name__, getattr(exc, "applied", "-")]
                                   if exc is not None else ["ok"]).encode())
        finally:
            os._exit(0)
    os.close(w)

    def report():
        try:
            with gevent.Timeout(10):
                gevent.os.waitpid(pid, 0)   # (gevent.fork's child watcher reaps it)
            gevent.os.make_nonblocking(r)
            with gevent.Timeout(5):
                return json.loads(gevent.os.nb_read(r, 4096).decode())
        finally:
            os.close(r)
    return report


@needs_vshard
def test_a_write_waiting_for_a_bucket_search_is_sent_once_across_a_fork(cluster):
    """A callrw waits for the search of its unknown bucket when the process
    forks, the search not started yet: the child's hub runs the copy of the
    search, which finds the bucket there.  Only the parent's call sends the
    write: the child's copy ends with CopiedCall (applied None: the parent's goes on)."""
    shard = cluster.shards[0]
    bucket_id = bucket_of(cluster, 0, nth=3)
    key = next(keys)
    router = open_router(cluster, discovery_mode="off")
    before = cluster.eval(shard.master, "return calls")[0]
    try:
        assert router.known_bucket_count == 0
        write = gevent.spawn(router.callrw, bucket_id, "kv_put", (bucket_id, key, "once"),
                             timeout=5)
        gevent.sleep(0)   # the call starts, spawns the search and waits for it
        assert not write.ready() and router._searches.get(bucket_id) is not None
        child = _fork_while_waiting(write)
        try:
            assert write.get(timeout=10) == shard.uuid
        finally:
            copy = child()
        assert copy == ["CopiedCall", None], copy
        got = row(cluster, key)
        assert got is not None and got[2] == "once"
        # (kv_put counts every run, a second one failing on the key included.)
        assert cluster.eval(shard.master, "return calls")[0] - before == 1
    finally:
        router.close()


COUNT_REFS = """
refs_made = 0
local call = vshard.storage._call
counted_call = counted_call or call
vshard.storage._call = function(name, ...)
    if name == 'storage_ref_make_with_buckets' then refs_made = refs_made + 1 end
    return counted_call(name, ...)
end
"""


@needs_vshard
def test_map_callrw_waiting_for_a_bucket_search_refs_nothing_from_a_fork(cluster):
    """A partial map_callrw waits for the search of its unknown bucket when the
    process forks: the child's copy of the call ends with CopiedCall before
    it refs anything; only the parent's refs and map are sent."""
    shard = cluster.shards[0]
    bucket_id = bucket_of(cluster, 0, nth=3)
    router = open_router(cluster, discovery_mode="off")
    cluster.eval(shard.master, COUNT_REFS)
    try:
        call = gevent.spawn(router.map_callrw, "kv_count", timeout=5, bucket_ids=[bucket_id])
        gevent.sleep(0)   # the call starts, spawns the search and waits for it
        assert not call.ready() and router._searches.get(bucket_id) is not None
        child = _fork_while_waiting(call)
        try:
            assert list(call.get(timeout=10)) == [shard.uuid]
        finally:
            copy = child()
        assert copy == ["CopiedCall", None], copy
        assert cluster.eval(shard.master, "return refs_made")[0] == 1
    finally:
        cluster.eval(shard.master, "vshard.storage._call = counted_call")
        router.close()


@needs_vshard
def test_map_callrw_answered_then_forked_before_it_returns_ends_copied_in_the_child(
        cluster, router):
    """Every master answered the map, and the process forked before the
    caller ran again: the child's copy of the call returned the parent's
    results (a call of the parent's succeeding in the child); it now ends
    with CopiedCall (applied None), the parent's call returning them."""
    import gc

    def stage(name):
        """The greenlets of the call's ``name`` stage, one per master."""
        return [g for g in gc.get_objects() if isinstance(g, gevent.Greenlet)
                and getattr(g._run, "__name__", "") == "one"
                and name in [c.cell_contents for c in g._run.__closure__ or ()
                             if isinstance(c.cell_contents, str)]]

    call = gevent.spawn(router.map_callrw, "kv_count", timeout=5)
    with gevent.Timeout(5):
        maps = []
        while len(maps) < len(cluster.shards):
            gevent.sleep(0)
            maps = stage("map")
        while not all(g.dead for g in maps):
            gevent.sleep(0)
    assert not call.ready()   # (the caller not run again yet)
    child = _fork_while_waiting(call)
    try:
        assert set(call.get(timeout=10)) == {shard.uuid for shard in cluster.shards}
    finally:
        copy = child()
    assert copy == ["CopiedCall", None], copy


@needs_vshard
def test_map_callrw_over_some_buckets_runs_on_their_replicasets_only(cluster, router):
    bucket_id = bucket_of(cluster, 1)
    result = router.map_callrw("kv_count", timeout=5, bucket_ids=[bucket_id])
    assert list(result) == [cluster.shards[1].uuid]
    both = [bucket_of(cluster, 0), bucket_id]
    assert set(router.map_callrw("kv_count", timeout=5, bucket_ids=both)) == {
        shard.uuid for shard in cluster.shards}


@needs_vshard
def test_map_callrw_honours_its_timeout_and_releases_every_ref(cluster, router):
    started = time.monotonic()
    with pytest.raises(RequestTimeout) as info:
        router.map_callrw("slow_count", (1.0,), timeout=0.3)
    assert time.monotonic() - started < 0.8
    assert info.value.applied is None
    gevent.sleep(1.0)
    moved = bucket_of(cluster, 0, nth=2)   # no ref left: a bucket moves at once
    assert cluster.bucket_send(moved, cluster.shards[1].uuid, timeout=2)
    assert move(cluster, moved, cluster.shards[0].uuid)
    # Over buckets still to be found, the timeout may run out between two searches.
    errors = []
    for _ in range(8):
        unmapped = open_router(cluster, discovery_mode="off")
        def partial(t):
            try:
                unmapped.map_callrw("kv_count", timeout=t,
                                    bucket_ids=range(1, cluster.bucket_count + 1))
            except Exception as exc:   # noqa: BLE001 - each is checked below
                errors.append(exc)
        gevent.joinall([gevent.spawn(partial, 0.004 * (i + 1)) for i in range(8)])
        unmapped.close()
    assert errors and all(isinstance(exc, RequestTimeout) and exc.applied is False
                          for exc in errors), {repr(exc) for exc in errors}


@needs_vshard
def test_replicaset_objects_call_without_a_bucket(cluster, router):
    for rs_id, rs in router.routeall().items():
        master = cluster.shard(rs_id).master
        assert rs.callrw("kv_count", timeout=2) == cluster.eval(master, "return kv_count()")[0]
        assert isinstance(rs.callbro("kv_count", timeout=2), int)
        # args is the argument list, whatever it holds: one list is one argument
        for call in (rs.callrw, rs.callro, rs.callbro):
            assert call("echo", [[1, 2]], timeout=2) == [[1, 2]]
            assert call("echo", ((),)) == [[]]
            assert call("echo", [1, [2]]) == [1, [2]]
            assert call("echo", ()) == []
            # the function's own error names the replica set, as every error
            # about one does (it named none)
            with pytest.raises(gtarantool.DatabaseError) as failed:
                call("kv_fail", ["boom"], timeout=2)
            assert "boom" in str(failed.value)
            assert failed.value.replicaset == rs_id and failed.value.applied is None
    assert router.bucket_discovery(1) is router.route(1)
    closed = open_router(cluster, discovery_mode="off")
    replicasets = closed.routeall().values()
    closed.close()
    for rs in replicasets:   # nothing left the process: not applied
        for call in (rs.callrw, rs.callro, rs.callbro):
            with pytest.raises(gtarantool.ConnectionClosed) as info:
                call("echo", [1], timeout=1)
            assert info.value.applied is False and info.value.replicaset == rs.id
    info = router.buckets_info()
    assert len(info) == cluster.bucket_count
    assert {v["status"] for v in info.values()} == {"available_rw"}


@needs_vshard
def test_callre_reads_past_a_lagging_replica_then_the_master(cluster, router):
    """A replica that has not received a moved bucket refuses the read
    (WRONG_BUCKET): the next replica answers; the map is not reset for it."""
    src, dst = cluster.shards
    bucket_id = bucket_of(cluster, 0, nth=1)
    first = router.replicasets[dst.uuid].pick("re")
    lagging = next(srv for srv in dst.servers if srv.port == first.addr["port"])
    cluster.eval(lagging, "box.cfg{replication = {}}")
    try:
        assert move(cluster, bucket_id, dst.uuid)
        # (A write learns the move: the source's replicas may not know it yet either.)
        assert router.callrw(bucket_id, "kv_get", (bucket_id, 1), timeout=2)[0] == dst.uuid
        for method in (router.callre, router.callbre, router.callro):
            for _ in range(3):
                got = method(bucket_id, "kv_get", (bucket_id, 1), timeout=2)
                assert got[0] == dst.uuid
        assert router.route(bucket_id).id == dst.uuid
        assert not cluster.eval(lagging, "return box.space._bucket:get(...)", bucket_id)
    finally:
        dst.mesh()
        move(cluster, bucket_id, src.uuid)


@needs_vshard
def test_replicas_are_read_in_zone_order(cluster):
    """vshard's zone and weights: callre reads from the replica of the router's
    zone, then the nearest by weight."""
    shard = cluster.shards[1]
    cfg = {"bucket_count": cluster.bucket_count, "zone": "near",
           "weights": {"near": {"far": 10, "farther": 20}},
           "sharding": {rs_id: dict(rs, replicas=dict(rs["replicas"]))
                        for rs_id, rs in cluster.cfg["sharding"].items()}}
    replicas = cfg["sharding"][shard.uuid]["replicas"]
    master_port = shard.master.port
    zone_of = {}
    for replica_id, replica in list(replicas.items()):
        port = int(replica["uri"].rsplit(":", 1)[1])
        zone = "farther" if port == master_port else ("far" if "near" in zone_of else "near")
        zone_of[zone] = port
        replicas[replica_id] = dict(replica, zone=zone)
    router = Router(cfg, user=cluster.user, password=cluster.password, discovery_mode="off")
    try:
        rs = router.replicasets[shard.uuid]
        assert rs.pick("re").addr["port"] == zone_of["near"]
        assert rs.pick("re", [rs.pick("re")]).addr["port"] == zone_of["far"]
        bucket_id = bucket_of(cluster, 1)
        near = next(srv for srv in shard.servers if srv.port == zone_of["near"])
        before = cluster.eval(near, "return calls")[0]
        for _ in range(3):
            router.callre(bucket_id, "kv_get", (bucket_id, 1), timeout=2)
        assert cluster.eval(near, "return calls")[0] - before == 3
    finally:
        router.close()


# -- the bucket count ----------------------------------------------------------------

@needs_vshard
def test_the_bucket_count_is_the_clusters(cluster):
    sharding = cluster.cfg["sharding"]
    router = Router(sharding, user=cluster.user, password=cluster.password,
                    discovery_mode="off")
    try:
        assert router.bucket_count == cluster.bucket_count
        # bytes are hashed one way for the whole cluster, decided as it connects
        from gtarantool.testing.server import binary_version
        assert router._varbinary is (binary_version() >= (3, 0))
        assert router.bucket_id_mpcrc32(42) == gtarantool.sharding.bucket_id_mpcrc32(
            42, cluster.bucket_count)
    finally:
        router.close()
    for wrong in (cluster.bucket_count * 10 + 7, cluster.bucket_count // 2):
        with pytest.raises(ConfigurationError) as info:
            Router(sharding, user=cluster.user, password=cluster.password,
                   bucket_count=wrong, discovery_mode="off")
        message = str(info.value)
        assert "bucket_count" in message and str(wrong) in message
        assert str(cluster.bucket_count) in message


# -- configuration -------------------------------------------------------------------

def test_a_configuration_vshard_refuses_is_refused_before_connecting():
    # Nothing listens here: each configuration is refused before any connection.
    def sharding(rs2_second_uri="127.0.0.1:9"):
        return {"rs1": {"replicas": {"a1": {"uri": "u:p@127.0.0.1:7", "zone": "a"},
                                     "a2": {"uri": "127.0.0.1:8", "zone": "b"}}},
                "rs2": {"replicas": {"b1": {"uri": "127.0.0.1:10", "zone": "a"},
                                     "b2": {"uri": rs2_second_uri, "zone": "b"}}}}

    # rs2 lists rs1's instance too: its calls and its map would run on rs1
    for uri in ("127.0.0.1:7", "x:y@127.0.0.1:7", {"uri": "127.0.0.1:8"}):
        with pytest.raises(ConfigurationError, match="Duplicate uri"):
            Router(sharding(uri), bucket_count=10, discovery_mode="off")
    twice = sharding()
    twice["rs2"]["replicas"]["a1"] = twice["rs2"]["replicas"].pop("b2")
    with pytest.raises(ConfigurationError, match="Duplicate id a1"):
        Router(twice, bucket_count=10, discovery_mode="off")
    named = sharding()   # a replica named as its replica set (Tarantool 3): no duplicate
    named["rs1"]["replicas"]["rs1"] = named["rs1"]["replicas"].pop("a1")
    Router(named, bucket_count=10, discovery_mode="off").close()
    for weights, says in (({"a": {"b": "1"}}, "non-negative"), ({"a": {"b": -1}}, "non-negative"),
                          ({"a": {"b": float("nan")}}, "non-negative"),
                          ({"a": {"a": 5}}, "own zone"), ({"a": 3}, "map of relative"),
                          ([("a", {"b": 1})], "weights must be")):
        with pytest.raises(ConfigurationError, match=says):
            Router(sharding(), bucket_count=10, discovery_mode="off", zone="a",
                   weights=weights)


def test_uris_with_ipv6_and_unix_sockets():
    assert parse_uri("u:p@[::1]:3301") == ("::1", 3301, "u", "p")
    assert parse_uri("[fe80::1]:3302") == ("fe80::1", 3302, None, None)
    assert parse_uri("u:p@unix/:/run/t.sock") == (None, "/run/t.sock", "u", "p")
    assert parse_uri("/run/t.sock") == (None, "/run/t.sock", None, None)
    assert parse_uri("h:3301") == ("h", 3301, None, None)
    for bad in ("::1:3301", "[::1]", "host", 3.5):
        with pytest.raises(ConfigurationError):
            parse_uri(bad)


CONFIG = """
credentials:
  users:
    storage:
      password: secret
      roles: [sharding]
    admin:
      password: secret
      roles: [super]
iproto:
  advertise:
    sharding:
      login: storage
sharding:
  bucket_count: 120
replication:
  failover: manual
groups:
  storages:
    sharding:
      roles: [storage]
    replicasets:
%(replicasets)s
  routers:
    sharding:
      roles: [router]
    replicasets:
      routers:
        leader: router
        instances:
          router:
            iproto:
              listen:
              - uri: 127.0.0.1:%(router)d
"""
REPLICASET = """      %(rs)s:
        leader: %(rs)s-a
        instances:
          %(rs)s-a:
            iproto:
              listen:
              - uri: 127.0.0.1:%(port)d
"""


ADVERTISED = [   # (iproto section of one storage, credentials.users.storage)
    ({"listen": [{"uri": "0.0.0.0:3301"}, {"uri": "[::]:3301"}, {"uri": "localhost:0"},
                 {"uri": "10.0.0.1:3301"}],
      "advertise": {"sharding": {"login": "storage", "password": "advertised"}}},
     {"password": "secret", "roles": ["sharding"]}),
    ({"listen": [{"uri": "0.0.0.0:3301"}],
      "advertise": {"sharding": {"uri": "10.0.0.3:3301", "login": "storage"}}},
     {"password": "secret", "roles": ["sharding"]}),
    ({"listen": [{"uri": "0.0.0.0:3301"}],
      "advertise": {"peer": {"uri": "10.0.0.2:3301", "login": "storage"}}},
     {"password": "secret", "roles": ["sharding"]}),
    ({"listen": [{"uri": "10.0.0.4:3301"}]}, {"password": "secret", "roles": ["sharding"]}),
    ({"listen": [{"uri": "unix/:/tmp/storage.sock"}],
      "advertise": {"sharding": {"login": "storage"}}}, {"roles": ["sharding"]}),
]


def _tarantool_instance_uri(iproto, user):
    """Tarantool 3's own config:instance_uri('sharding') of that storage."""
    import subprocess

    from gtarantool.testing.server import find_binary
    script = ("local ic = require('internal.config.instance_config') "
              "local json = require('json') "
              "local cfg = json.decode(os.getenv('GTARANTOOL_ICONFIG')) "
              "print(json.encode(ic:instance_uri(cfg, 'sharding', {}) or box.NULL)) "
              "os.exit(0)")
    iconfig = {"iproto": iproto, "credentials": {"users": {"storage": user}}}
    env = dict(os.environ, GTARANTOOL_ICONFIG=json.dumps(iconfig))
    out = subprocess.run([find_binary(), "-e", script], env=env, capture_output=True,
                         text=True, timeout=30, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_from_config_reaches_storages_as_tarantools_router_does():
    """Address, login and password as Tarantool 3's instance_uri('sharding') picks
    them: advertise.sharding, else advertise.peer, else the first listen uri a
    client can connect to; the advertised password, else the credentials'."""
    from gtarantool.sharding.config import vshard_cfg
    from gtarantool.testing.server import binary_version
    for iproto, user in ADVERTISED:
        document = {"credentials": {"users": {"storage": user}}, "groups": {"g": {
            "sharding": {"roles": ["storage"]},
            "replicasets": {"rs": {"instances": {"a": {"iproto": iproto}}}}}}}
        cfg, login, password = vshard_cfg(document)
        uri = cfg["sharding"]["rs"]["replicas"]["a"]["uri"]
        if MISSING is None and binary_version() >= (3, 0):
            theirs = _tarantool_instance_uri(iproto, user)
            assert uri == {key: theirs[key] for key in ("uri", "login", "password")
                           if key in theirs}, iproto
        assert (login, password) == (uri.get("login"), uri.get("password"))
    cfg, _, password = vshard_cfg(document, user="storage", password="given")
    assert cfg["sharding"]["rs"]["replicas"]["a"]["uri"]["password"] == "given"
    with pytest.raises(ConfigurationError, match="can connect to"):
        vshard_cfg({"groups": {"g": {"sharding": {"roles": ["storage"]}, "replicasets": {
            "rs": {"instances": {"a": {"iproto": {"listen": [{"uri": "0.0.0.0:3301"}]}}}}}}}})


def test_from_config_reads_a_tarantool_3_cluster_configuration(tmp_path):
    """A cluster ``tarantool --name`` starts from one YAML file; the router reads
    the same file and routes over its storages."""
    import os
    import subprocess

    from gtarantool.testing.cluster import rocks_dir
    from gtarantool.testing.server import binary_version, find_binary, free_port
    if MISSING is not None:
        pytest.skip(MISSING)
    if binary_version() < (3, 0):
        pytest.skip("a cluster configuration needs Tarantool 3.0+; the server is %s"
                    % ".".join(map(str, binary_version())))
    ports = {"rs1": free_port(), "rs2": free_port()}
    router_port = free_port()
    path = tmp_path / "cluster.yaml"
    path.write_text(CONFIG % {"router": router_port, "replicasets": "".join(
        REPLICASET % {"rs": rs, "port": port} for rs, port in ports.items())})
    rocks = rocks_dir()
    env = dict(os.environ, LUA_PATH="%s/?.lua;%s/?/init.lua;;" % (rocks, rocks))
    binary = find_binary()   # (absolute: the instances run in tmp_path)
    names = ["rs1-a", "rs2-a", "router"]
    processes = [subprocess.Popen([binary, "--name", name, "--config", str(path)],
                                  cwd=str(tmp_path), env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL) for name in names]
    router = None
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                conn = gtarantool.connect("127.0.0.1", router_port, user="admin",
                                          password="secret")
                try:
                    ok = conn.eval("return vshard.router.bootstrap({timeout = 2})").data
                    if ok and ok[0] or "NON_EMPTY" in str(ok):
                        break
                finally:
                    conn.close()
            except Exception:
                if time.monotonic() > deadline:
                    raise
            gevent.sleep(0.2)
        router = open_router_from_config(str(path))
        assert set(router.replicasets) == {"rs1", "rs2"}
        assert router.bucket_count == 120
        owners = {router.callrw(b, "vshard.storage.buckets_count", timeout=5)
                  for b in (1, 120)}
        assert owners and all(isinstance(n, int) and n > 0 for n in owners)
        router.close()
        # The sharding user may not eval: the count is checked by discovery, which
        # sees a bucket id above a bucket_count too small.
        router = Router.from_config(str(path), bucket_count=100)
        assert not any(rs.count_checked for rs in router.replicasets.values())
        with gevent.Timeout(10):
            while router.info()["status"] != 3:
                gevent.sleep(0.05)
        with pytest.raises(ConfigurationError) as info:
            router.callrw(1, "vshard.storage.buckets_count", timeout=5)
        assert "bucket_count is 100" in str(info.value) and "101" in str(info.value)
    finally:
        if router is not None:
            router.close()
        for process in processes:
            process.kill()
            process.wait()


def open_router_from_config(path):
    router = Router.from_config(path, discovery_mode="once")
    with gevent.Timeout(20):
        while router.known_bucket_count < router.bucket_count:
            gevent.sleep(0.05)
    return router


@needs_vshard
@pytest.mark.parametrize("fault", ["blackhole", "reset_all"])
def test_a_write_in_flight_to_a_master_that_hangs_or_drops_may_have_applied(cluster, fault):
    """The master stops answering (a RequestTimeout) or its connection breaks (the
    pool marks it down at once: a NetworkError) with a write in flight: the
    caller hears that it may have run (applied None), never a refusal."""
    from gtarantool.testing.faults import FaultProxy
    shard = cluster.shards[1]
    master = shard.master
    proxy = FaultProxy("127.0.0.1", master.port)
    cfg = {"sharding": {rs_id: dict(rs, replicas={
        replica_id: dict(replica, uri=replica["uri"].replace(
            ":%d" % master.port, ":%d" % proxy.port))
        for replica_id, replica in rs["replicas"].items()})
        for rs_id, rs in cluster.cfg["sharding"].items()}}
    router = Router(cfg, user=cluster.user, password=cluster.password, discovery_mode="off",
                    refresh_delay=0.1)
    try:
        bucket_id = bucket_of(cluster, 1)
        assert router.route(bucket_id, timeout=5).id == shard.uuid
        key = next(keys)
        call = gevent.spawn(router.callrw, bucket_id, "slow_put", (bucket_id, key, 0.3), 1.5)
        gevent.sleep(0.1)
        getattr(proxy, fault)()
        with pytest.raises(gtarantool.NetworkError) as info:
            call.get(timeout=5)
        assert not isinstance(info.value, ShardingError)
        assert info.value.applied is None and info.value.replicaset == shard.uuid
        gevent.sleep(0.5)
        assert row(cluster, key) is not None   # it ran
    finally:
        router.close()
        proxy.close()


@needs_vshard
def test_a_bucket_sent_away_is_not_taken_for_held(cluster):
    """bucket_stat answers a stat and an error for a bucket in SENT (GARBAGE,
    RECEIVING): only an ACTIVE or PINNED bucket is held."""
    shard = cluster.shards[0]
    bucket_id = bucket_of(cluster, 0, nth=3)
    router = open_router(cluster, discovery_mode="off")
    mark = """
        local id, status, dest = ...
        box.space._bucket:run_triggers(false)
        local ok, err = pcall(function()
            if box.space._bucket:get(id) == nil then
                box.space._bucket:insert{id, status, dest}
            else
                box.space._bucket:update(id, {{'=', 2, status}, {'=', 3, dest}})
            end
        end)
        box.space._bucket:run_triggers(true)
        if not ok then error(err) end
    """
    try:
        cluster.eval(shard.master, mark, bucket_id, "sent", cluster.shards[1].uuid)
        with pytest.raises(ShardingError) as info:
            router.route(bucket_id, timeout=2)
        assert info.value.name == "NO_ROUTE_TO_BUCKET" and info.value.applied is False
    finally:
        cluster.eval(shard.master, mark, bucket_id, "active", None)
        router.close()
    assert cluster.buckets()[bucket_id] == shard.uuid


@needs_vshard
def test_storages_reached_over_a_unix_socket_and_ipv6(cluster, tmp_path):
    """Replica uris as vshard takes them: ``unix/:/path`` and ``[::1]:port``."""
    import socket

    from gtarantool.testing.server import free_port
    shard = cluster.shards[1]
    master = shard.master
    sock = str(tmp_path / "storage.sock")
    listen = ["127.0.0.1:%d" % master.port, sock]
    v6_port = None
    if socket.has_ipv6:
        try:
            probe = socket.socket(socket.AF_INET6)
            probe.bind(("::1", 0))
            probe.close()
            v6_port = free_port()
            listen.append("[::1]:%d" % v6_port)
        except OSError:   # no IPv6 loopback on this host
            pass
    cluster.eval(master, "box.cfg{listen = ...}", listen)
    try:
        for uri in ["unix/:" + sock] + (["[::1]:%d" % v6_port] if v6_port else []):
            mine = "%s:%s@%s" % (cluster.user, cluster.password, uri)
            cfg = {"sharding": {rs_id: dict(rs, replicas={
                replica_id: dict(replica, uri=mine if replica["uri"].endswith(
                    ":%d" % master.port) else replica["uri"])
                for replica_id, replica in rs["replicas"].items()})
                for rs_id, rs in cluster.cfg["sharding"].items()}}
            router = Router(cfg, discovery_mode="off")
            try:
                bucket_id = bucket_of(cluster, 1)
                assert router.callrw(bucket_id, "kv_count", timeout=5) == cluster.eval(
                    master, "return kv_count()")[0]
                info = router.replicasets[shard.uuid].pool.info()
                assert any(i["role"] == "master" and i["requests"] for i in info.values())
            finally:
                router.close()
    finally:
        cluster.eval(master, "box.cfg{listen = ...}", "127.0.0.1:%d" % master.port)


# -- closing, cancelling, arguments ----------------------------------------------------

@needs_vshard
def test_close_ends_calls_waiting_for_an_instance_or_a_failing_search_at_once(cluster):
    """A replica set with no instance up: reads and writes wait for one (a
    known bucket), or search again and again (an unknown one); close() ends
    them all at once, ConnectionClosed, applied False."""
    shard = cluster.shards[1]
    bucket_id = bucket_of(cluster, 1)
    quick = dict(timeout=8, connection_timeout=0.3, refresh_delay=0.05)
    known = open_router(cluster, **quick)
    unknown = open_router(cluster, discovery_mode="off", **quick)
    for server in shard.servers:
        server.signal(signal.SIGSTOP)
    try:
        with gevent.Timeout(5):   # every instance is seen as down
            while any(i["healthy"] for router in (known, unknown)
                      for i in router.replicasets[shard.uuid].pool.info().values()):
                gevent.sleep(0.02)
        calls = [gevent.spawn(getattr(router, name), bucket_id, "kv_get", (bucket_id, 0))
                 for router in (known, unknown)
                 for name in ("callrw", "callro", "callbro", "callre", "callbre")]
        gevent.sleep(0.3)
        started = time.monotonic()
        known.close()
        unknown.close()
        gevent.joinall(calls, timeout=5)
        assert time.monotonic() - started < 1
        for call in calls:
            assert isinstance(call.exception, gtarantool.ConnectionClosed), call.exception
            assert "the router is closed" in str(call.exception)
            assert call.exception.applied is False
    finally:
        for server in shard.servers:
            server.signal(signal.SIGCONT)
        known.close()
        unknown.close()


def _refs(cluster, master):
    return cluster.eval(master, "return require('vshard.storage.ref').count")[0]


@needs_vshard
@pytest.mark.parametrize("how", ["timeout", "kill"])
def test_map_callrw_ended_by_its_caller_releases_its_refs(cluster, router, how):
    """A gevent.Timeout or a kill (BaseExceptions) ends map_callrw in its ref stage:
    the refs taken are released then, not at their own timeout."""
    waiting, answering = cluster.shards[1].master, cluster.shards[0].master
    waiting.signal(signal.SIGSTOP)   # its ref waits: the others are taken
    try:
        if how == "timeout":
            with pytest.raises(gevent.Timeout):
                with gevent.Timeout(0.5):
                    router.map_callrw("kv_count", timeout=20)
        else:
            greenlet = gevent.spawn(router.map_callrw, "kv_count", timeout=20)
            gevent.sleep(0.5)
            with gevent.Timeout(1):   # the kill does not wait for the unrefs
                greenlet.kill()
        with gevent.Timeout(2):
            while _refs(cluster, answering):
                gevent.sleep(0.05)
    finally:
        waiting.signal(signal.SIGCONT)
    with gevent.Timeout(5):   # the late ref is released too
        while _refs(cluster, waiting):
            gevent.sleep(0.05)


@needs_vshard
def test_calls_refuse_a_function_name_that_is_not_a_str_before_sending(cluster, router):
    before = [cluster.eval(s.master, "return calls")[0] for s in cluster.shards]
    bucket_id = bucket_of(cluster, 0)
    rs = router.route(bucket_id)
    for bad in (None, 123, b"kv_get"):
        for call in (lambda: router.callrw(bucket_id, bad, (bucket_id, 0)),
                     lambda: router.callro(bucket_id, bad, (bucket_id, 0)),
                     lambda: router.callbro(bucket_id, bad, (bucket_id, 0)),
                     lambda: router.callre(bucket_id, bad, (bucket_id, 0)),
                     lambda: router.callbre(bucket_id, bad, (bucket_id, 0)),
                     lambda: router.map_callrw(bad, (bucket_id, 0)),
                     lambda: router.map_callrw(bad, (bucket_id, 0), bucket_ids=[bucket_id]),
                     lambda: rs.callrw(bad, (bucket_id, 0)),
                     lambda: rs.callro(bad, (bucket_id, 0)),
                     lambda: rs.callbro(bad, (bucket_id, 0))):
            with pytest.raises(TypeError, match="func_name must be a str"):
                call()
    assert [cluster.eval(s.master, "return calls")[0] for s in cluster.shards] == before


@needs_vshard
def test_replicaset_calls_refuse_a_bad_timeout_before_sending(cluster, router):
    before = [cluster.eval(s.master, "return calls")[0] for s in cluster.shards]
    rs = router.route(bucket_of(cluster, 0))
    for bad in (0, -1, float("nan"), float("inf"), "1", True):
        for call in (rs.callrw, rs.callro, rs.callbro):
            with pytest.raises(ValueError, match="positive, finite number of seconds"):
                call("kv_get", (1, 0), timeout=bad)
    assert [cluster.eval(s.master, "return calls")[0] for s in cluster.shards] == before
    assert rs.callrw("kv_count", timeout=2) >= 0   # None: no limit but the pool's


@needs_vshard
def test_a_uri_table_connects_as_its_login_and_errors_name_the_replicaset(cluster):
    """vshard's (and Tarantool 3's) replica uri ``{uri, login, password}``: the
    router connects as that login; an error of a bucket search (guest may not
    call bucket_stat) names its replica set."""
    def with_table_uris(credentials):
        cfg = json.loads(json.dumps(cluster.cfg))
        for rs_cfg in cfg["sharding"].values():
            for replica in rs_cfg["replicas"].values():
                _, port, login, password = parse_uri(replica["uri"])
                replica["uri"] = {"uri": "127.0.0.1:%d" % port}
                if credentials:
                    replica["uri"].update(login=login, password=password)
        return cfg

    router = Router(with_table_uris(True), discovery_mode="off")
    try:
        bucket_id = bucket_of(cluster, 1)
        assert router.callrw(bucket_id, "kv_get", (bucket_id, 0), timeout=5)[0] \
            == cluster.shards[1].uuid
    finally:
        router.close()
    router = Router(with_table_uris(False), bucket_count=cluster.bucket_count,
                    discovery_mode="off")
    try:
        with pytest.raises(gtarantool.DatabaseError) as info:
            router.route(bucket_of(cluster, 0), timeout=5)
        assert info.value.replicaset in {s.uuid for s in cluster.shards}
    finally:
        router.close()
