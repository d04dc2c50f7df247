"""gtarantool.monitoring on real servers: the events of a connection's life, of a
graceful restart and of a switchover, in the order they happened; the loggers
that log them; listeners that fail."""
import logging
import signal
import time

import gevent
import pytest
from tarantool.error import NetworkError

import gtarantool
from gtarantool import monitoring
from gtarantool.monitoring import (
    ConnectionAuthenticatedEvent,
    ConnectionClosedEvent,
    ConnectionFailedEvent,
    ConnectionOpenedEvent,
    InstanceBackInRotationEvent,
    ReconnectAttemptEvent,
    RoleChangedEvent,
    ShutdownAnnouncedEvent,
)
from gtarantool.testing.replicaset import ReplicaSet
from gtarantool.testing.server import TarantoolServer, binary_version, free_port

USER, PASSWORD = "test", "secret"
LUA = """
box.once('monitoring', function()
    box.schema.user.create('test', {password = 'secret'})
    box.schema.user.grant('test', 'read,write,execute', 'universe')
    box.schema.space.create('t'):create_index('pk')
end)
"""


class Recorder:
    def __init__(self):
        self.events = []

    def __call__(self, event):
        self.events.append(event)

    def of(self, address):
        """The events of ``address`` (a connection an earlier test left open in
        this process may still be reconnecting elsewhere)."""
        return [event for event in self.events if event.address == address]

    def kinds(self, address=None):
        return [type(event) for event in self.events
                if address is None or event.address == address]


@pytest.fixture
def events():
    recorder = Recorder()
    monitoring.register(recorder)
    yield recorder
    monitoring.unregister(recorder)


@pytest.fixture
def srv():
    server = TarantoolServer(LUA)
    server.start()
    yield server
    server.cleanup()


def wait_until(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met within %ss" % timeout
        gevent.sleep(0.01)


def in_thread(fn, *args):
    return gevent.get_hub().threadpool.spawn(fn, *args).get()


def test_a_connections_life_its_loss_and_its_reconnect_in_order(events, srv):
    name = "%s:%s" % (srv.host, srv.port)
    conn = gtarantool.connect(srv.host, srv.port, user=USER, password=PASSWORD,
                              reconnect_max_attempts=0)
    srv.signal(signal.SIGKILL)
    wait_until(lambda: srv.process.poll() is not None)
    with pytest.raises(NetworkError):
        conn.select("t", 1)   # (lost with the server: no reconnect attempt while it is down)
    in_thread(srv.start)
    conn.select("t", 1)
    conn.close()
    kinds = events.kinds(name)
    assert kinds[:2] == [ConnectionOpenedEvent, ConnectionAuthenticatedEvent]
    assert kinds[-3:] == [ConnectionOpenedEvent, ConnectionAuthenticatedEvent,
                          ConnectionClosedEvent]
    # The dead socket replaced by the first attempt (the failed request's, when the
    # reader saw the loss before it; else the next one's), and attempts (on 2.10+ the
    # watchers' own too) that fail while the server is down.
    lost = kinds[2:-3]
    assert lost[:2] == [ReconnectAttemptEvent, ConnectionClosedEvent]
    assert set(lost[2:]) <= {ConnectionFailedEvent, ReconnectAttemptEvent}
    assert [event.reason for event in events.of(name)
            if isinstance(event, ConnectionClosedEvent)][0] != "connection closed by close()"
    assert events.of(name)[1].user == USER
    assert events.of(name)[-1].reason == "connection closed by close()"
    times = [event.time for event in events.of(name)]
    assert times == sorted(times)


def test_a_server_that_cannot_be_reached_is_a_failed_event(events):
    port = free_port()
    with pytest.raises(NetworkError):
        gtarantool.connect("127.0.0.1", port)
    (failed,) = events.of("127.0.0.1:%d" % port)
    assert isinstance(failed, ConnectionFailedEvent)
    assert failed.address == "127.0.0.1:%d" % port
    assert "refused" in failed.error.lower()


@pytest.mark.skipif(binary_version() < (2, 10), reason="box.shutdown needs Tarantool 2.10+")
def test_a_graceful_restart_announces_then_reconnects(events, srv):
    name = "%s:%s" % (srv.host, srv.port)
    conn = gtarantool.connect(srv.host, srv.port, user=USER, password=PASSWORD,
                              request_timeout=10)
    srv.signal(signal.SIGTERM)
    wait_until(lambda: srv.process.poll() is not None, timeout=30)
    in_thread(srv.start)
    conn.select("t", 1)
    conn.close()
    kinds = events.kinds(name)
    assert kinds[:3] == [ConnectionOpenedEvent, ConnectionAuthenticatedEvent,
                         ShutdownAnnouncedEvent], events.of(name)
    assert kinds[3] is ReconnectAttemptEvent, events.of(name)
    assert kinds[-3:] == [ConnectionOpenedEvent, ConnectionAuthenticatedEvent,
                          ConnectionClosedEvent], events.of(name)
    assert set(kinds[3:-3]) <= {ReconnectAttemptEvent, ConnectionFailedEvent}, events.of(name)
    attempts = [event.attempt for event in events.of(name)
                if isinstance(event, ReconnectAttemptEvent)]
    assert attempts == list(range(1, len(attempts) + 1))


def test_a_switchover_through_the_pool_in_order(events, caplog):
    replicaset = ReplicaSet(LUA, user=USER, password=PASSWORD)
    replicaset.start()
    try:
        master, r1, _ = replicaset.servers
        names = {srv: "%s:%s" % (srv.host, srv.port) for srv in replicaset.servers}
        pool = gtarantool.ConnectionPool(replicaset.addrs, user=USER, password=PASSWORD,
                                         refresh_delay=0.05, wait_timeout=5)
        try:
            role = lambda srv: pool.info()[names[srv]]["role"]   # noqa: E731
            with caplog.at_level(logging.INFO, logger="gtarantool.pool"):
                replicaset.eval(master, "box.cfg{read_only = true}")
                wait_until(lambda: role(master) == "replica")
                replicaset.promote(r1)
                wait_until(lambda: role(r1) == "master")
                pool.insert("t", (1, "after"))
        finally:
            pool.close()
    finally:
        replicaset.cleanup()
    roles = [(event.address, event.old, event.new) for event in events.events
             if isinstance(event, RoleChangedEvent) and event.address in names.values()]
    starts = [(names[srv], None, kind) for srv, kind in
              zip(replicaset.servers, ("master", "replica", "replica"))]
    assert sorted(roles[:3]) == sorted(starts)
    assert roles[3:5] == [(names[master], "master", "replica"), (names[r1], "replica", "master")]
    assert {event.address for event in events.events
            if isinstance(event, InstanceBackInRotationEvent)
            and event.address in names.values()} == set(names.values())
    logged = [record.getMessage() for record in caplog.records
              if record.name == "gtarantool.pool"]
    assert "RoleChanged %s (old='master', new='replica')" % names[master] in logged
    assert "RoleChanged %s (old='replica', new='master')" % names[r1] in logged


def test_a_failing_listener_is_logged_and_the_request_goes_on(srv, caplog):
    def broken(event):
        raise RuntimeError("listener bug")

    monitoring.register(broken)
    try:
        conn = gtarantool.connect(srv.host, srv.port, user=USER, password=PASSWORD)
        conn.select("t", 1)
        conn.close()
    finally:
        monitoring.unregister(broken)
    failures = [record for record in caplog.records if record.name == "gtarantool.monitoring"]
    assert failures and "listener bug" in str(failures[0].exc_info[1])
    assert monitoring.listeners() == ()


def test_with_no_listener_and_logging_off_no_event_is_built(srv, monkeypatch):
    built = []
    monkeypatch.setattr(ConnectionOpenedEvent, "__init__",
                        lambda self, *args, **kwargs: built.append(args))
    assert monitoring.listeners() == ()
    conn = gtarantool.connect(srv.host, srv.port, user=USER, password=PASSWORD)
    conn.close()
    assert built == []


def test_register_refuses_what_is_not_callable():
    with pytest.raises(TypeError):
        monitoring.register("not a function")
