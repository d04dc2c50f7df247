"""Watchers (conn.watch, conn.watch_once) against a real server."""
import gc
import logging
import time
import weakref

import gevent
import pytest
from gevent.event import Event
from tarantool.error import NotSupportedError

import gtarantool
from gtarantool.testing.server import binary_version
from tests.conftest import PASSWORD, USER

VERSION = binary_version()
needs_watchers = pytest.mark.skipif(
    VERSION < (2, 10), reason="needs Tarantool 2.10+ (watchers); server is %s"
    % ".".join(map(str, VERSION)))


def wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        gevent.sleep(0.005)


def broadcast(conn, key, value):
    conn.eval("box.broadcast(...)", key, value)


@pytest.mark.skipif(VERSION >= (2, 10), reason="a server without watchers (2.6) only")
def test_watch_without_watchers_names_the_version(conn):
    with pytest.raises(gtarantool.FeatureNotSupported, match=r"needs Tarantool 2\.10\+ "
                       r"\(watchers\); server is 2\.") as info:
        conn.watch("box.status", lambda key, value: None)
    assert isinstance(info.value, NotSupportedError)
    assert conn.ping(notime=True) == "Success"   # the connection is fine


@pytest.mark.skipif(VERSION >= (3, 0), reason="a server without watch_once (before 3.0) only")
def test_watch_once_without_the_feature_names_the_version(conn):
    with pytest.raises(gtarantool.FeatureNotSupported, match=r"needs Tarantool 3\.0\+"):
        conn.watch_once("box.status")
    assert conn.ping(notime=True) == "Success"


@needs_watchers
@pytest.mark.usefixtures("reader")
def test_current_value_first_then_changes_in_order(conn, record_property):
    broadcast(conn, "order", 0)
    seen = []
    times = {}
    watcher = conn.watch("order", lambda key, value: (seen.append((key, value)),
                                                       times.setdefault(value, time.monotonic())))
    wait_for(lambda: seen)
    assert seen == [("order", 0)]
    latencies = []
    for value in range(1, 51):
        sent = time.monotonic()
        broadcast(conn, "order", value)
        wait_for(lambda: value in times)
        latencies.append(times[value] - sent)
    values = [value for _, value in seen]
    assert values == list(range(51))   # one broadcast at a time: none coalesced
    latencies.sort()
    record_property("broadcast_to_callback_median_us", round(latencies[25] * 1e6))
    for value in range(51, 251):   # faster than acks: coalesced, but in order
        broadcast(conn, "order", value)
    wait_for(lambda: seen[-1][1] == 250)
    values = [value for _, value in seen]
    assert values == sorted(set(values))
    watcher.unregister()


@needs_watchers
def test_builtin_key_and_a_key_never_set(conn):
    status, missing = [], []
    conn.watch("box.status", lambda key, value: status.append(value))
    conn.watch("never.set", lambda key, value: missing.append(value))
    wait_for(lambda: status and missing)
    assert status[0]["status"] == "running"
    assert missing == [None]


@needs_watchers
def test_watchers_of_one_key_all_get_each_value(conn):
    seen = {1: [], 2: []}
    conn.watch("shared", lambda key, value: seen[1].append(value))
    broadcast(conn, "shared", "a")
    wait_for(lambda: seen[1] == ["a"] or seen[1] == [None, "a"])
    conn.watch("shared", lambda key, value: seen[2].append(value))   # gets "a" at once
    wait_for(lambda: seen[2] == ["a"])
    broadcast(conn, "shared", "b")
    wait_for(lambda: seen[1][-1] == "b" and seen[2] == ["a", "b"])


@needs_watchers
def test_callbacks_never_overlap_and_a_failing_one_goes_on(conn, caplog):
    running, overlaps, seen = [0], [], []

    def slow(key, value):
        running[0] += 1
        overlaps.append(running[0])
        gevent.sleep(0.01)
        seen.append(value)
        running[0] -= 1
        if value == 1:
            raise RuntimeError("callback failure %d" % value)

    with caplog.at_level(logging.ERROR, logger="gtarantool.watchers"):
        conn.watch("slow", slow)
        for value in range(1, 6):
            broadcast(conn, "slow", value)
            gevent.sleep(0.003)
        wait_for(lambda: seen and seen[-1] == 5)
    assert max(overlaps) == 1
    values = [v for v in seen if v is not None]
    assert values == sorted(set(values)) and 1 in values
    assert "callback failure 1" in caplog.text
    assert conn.ping(notime=True) == "Success"


@needs_watchers
def test_unregister_stops_the_callback(conn):
    seen = []
    watcher = conn.watch("gone", lambda key, value: seen.append(value))
    wait_for(lambda: seen)
    watcher.unregister()
    watcher.unregister()   # twice is harmless
    assert not watcher.registered
    broadcast(conn, "gone", 1)
    again = []
    conn.watch("gone", lambda key, value: again.append(value))   # a fresh subscription
    wait_for(lambda: again == [1])
    gevent.sleep(0.05)
    assert seen == [None]


@needs_watchers
def test_thousand_watchers_on_one_connection(conn):
    seen = {}
    for i in range(1000):
        conn.watch("many.%d" % i, lambda key, value: seen.__setitem__(key, value))
    wait_for(lambda: len(seen) == 1000)
    assert set(seen.values()) == {None}
    conn.eval("for i = 0, 999 do box.broadcast('many.' .. i, i * 2) end")
    wait_for(lambda: all(seen["many.%d" % i] == i * 2 for i in range(1000)))
    assert conn.ping(notime=True) == "Success"
    conn.close()
    assert not conn._watchers


@needs_watchers
def test_watchers_come_back_after_a_restart(fresh_server):
    conn = gtarantool.connect(fresh_server.host, fresh_server.port, user=USER,
                              password=PASSWORD, reconnect_delay=0.05)
    try:
        seen = []
        restart = []
        conn.watch("box.id", lambda key, value: seen.append(value))
        conn.watch("restart", lambda key, value: restart.append(value))
        wait_for(lambda: seen and restart)
        assert restart == [None]   # nothing broadcast on it yet
        first = len(seen)
        fresh_server.kill()
        fresh_server.start()
        # No request of ours: both watchers reconnect by themselves.
        wait_for(lambda: len(seen) > first and len(restart) > 1, timeout=20)
        assert seen[-1] == seen[0] and restart == [None, None]   # the current values again
        assert conn.stats.reconnects == 1
        # and are watching on the new session: a broadcast reaches the second one
        broadcast(conn, "restart", 1)
        wait_for(lambda: restart[-1] == 1)
        assert restart == [None, None, 1] and seen[-1] == seen[0]
    finally:
        conn.close()


@needs_watchers
def test_close_kills_the_watchers_greenlets(conn):
    started = Event()

    def blocking(key, value):
        started.set()
        gevent.sleep(60)
    conn.watch("blocking", blocking)
    started.wait(5)
    registry = conn._watchers
    conn.close()
    assert not registry._greenlets
    assert conn._watchers is None
    seen = []
    conn.watch("blocking", lambda key, value: seen.append(value))   # reconnects
    wait_for(lambda: seen == [None])


@pytest.mark.skipif(VERSION < (3, 0), reason="needs Tarantool 3.0+ (watch_once); server is %s"
                    % ".".join(map(str, VERSION)))
def test_watch_once(conn):
    assert conn.watch_once("once.never") is None
    broadcast(conn, "once", {"a": [1, 2]})
    assert conn.watch_once("once") == {"a": [1, 2]}
    assert conn.watch_once("box.status")["status"] == "running"
    with pytest.raises(TypeError):
        conn.watch_once(1)


@needs_watchers
def test_a_connection_whose_watchers_are_gone_can_be_collected(server):
    conn = gtarantool.connect(server.host, server.port, user=USER, password=PASSWORD)
    seen = []
    watcher = conn.watch("collected", lambda key, value: seen.append(value))
    wait_for(lambda: seen)
    watcher.unregister()
    ref = weakref.ref(conn)
    del conn, watcher
    gevent.sleep(0.01)
    gc.collect()
    assert ref() is None


@needs_watchers
def test_a_connection_dropped_while_its_server_is_down_is_collected(fresh_server):
    """Its own watcher (``box.shutdown``) keeps a greenlet reconnecting it;
    between tries that greenlet holds the connection only weakly (it held it
    through the failed try's exception, so the connection lived, and the
    greenlet tried, as long as the server stayed down)."""
    conn = gtarantool.connect(fresh_server.host, fresh_server.port, user=USER,
                              password=PASSWORD, reconnect_delay=0.01, connection_timeout=1)
    ref = weakref.ref(conn)
    fresh_server.kill()
    registry = conn._watchers   # (it refers to the connection weakly)
    del conn
    wait_for(lambda: registry._reconnector is not None)
    reconnector = registry._reconnector
    deadline = time.monotonic() + 5
    while (ref() is not None or not reconnector.dead) and time.monotonic() < deadline:
        gc.collect()
        gevent.sleep(0.05)
    assert ref() is None
    assert reconnector.dead


@needs_watchers
def test_bad_arguments(conn):
    with pytest.raises(TypeError, match="key must be a str"):
        conn.watch(b"bytes", lambda key, value: None)
    with pytest.raises(TypeError, match="callable"):
        conn.watch("key", None)
    # (box.shutdown: the connection's own)
    assert conn._watchers is None or set(conn._watchers._keys) <= {"box.shutdown"}


@needs_watchers
def test_watchers_keep_trying_while_the_server_is_down(fresh_server, caplog):
    conn = gtarantool.connect(fresh_server.host, fresh_server.port, user=USER,
                              password=PASSWORD, reconnect_delay=0.01,
                              reconnect_max_attempts=1)
    try:
        seen = []
        conn.watch("down", lambda key, value: seen.append(value))
        wait_for(lambda: seen)
        with caplog.at_level(logging.INFO, logger="gtarantool.watchers"):
            fresh_server.kill()
            wait_for(lambda: "reconnect" in caplog.text)
        # a connection event: INFO, never a WARNING an application without a
        # logging set-up would see on stderr
        assert {r.levelno for r in caplog.records if "reconnect" in r.getMessage()} \
            == {logging.INFO}
        fresh_server.start()
        wait_for(lambda: len(seen) == 2, timeout=20)
        assert seen == [None, None]
    finally:
        conn.close()
