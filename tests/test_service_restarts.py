"""examples/service under HTTP load while Tarantool restarts, served by gunicorn
``--preload -k gevent -w 2``: the workers inherit the module-level connection
and pool.  A graceful restart of the connection's server, and a rolling restart
of the pool's replica set with a switchover (replicas first, then the master
made read-only, a replica promoted, the old master restarted read-only).

2.10+: no request gets a 5xx.  2.6 announces no shutdown: a request in flight
on the restarting server fails with NetworkError, which the app answers with a
503, and the requests after the server is back are served (docs/restarts.rst).
"""
import os
import signal
import time

import gevent
import pytest

from gtarantool.testing.replicaset import ReplicaSet
from gtarantool.testing.server import TarantoolServer, binary_version
from gtarantool.testing.service import Service, binary
from tests.conftest import PASSWORD, USER, _lua

APP_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                       "examples", "service")
CLIENTS = 20   # concurrent HTTP clients
WORKERS = 2
SHUTDOWN = binary_version() >= (2, 10)   # box.shutdown: restarts are announced


def in_thread(fn, *args):
    return gevent.get_hub().threadpool.spawn(fn, *args).get()


def wait_until(predicate, timeout=30.0, step=0.02):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met within %ss" % timeout
        gevent.sleep(step)


def restart(srv, **cfg):
    """SIGTERM ``srv``, wait for it to exit, start it again (with ``cfg`` added)."""
    srv.signal(signal.SIGTERM)
    wait_until(lambda: srv.process.poll() is not None)
    srv.cfg.update(cfg)
    in_thread(srv.start)


class HttpLoad:
    """``CLIENTS`` greenlets each writing and reading a key of its own through
    ``/<via>/`` (``conn`` or ``pool``) until ``stop()``: every status is kept,
    every reply that is no 200 in ``failures``."""

    def __init__(self, service, via):
        self.service, self.via = service, via
        self.statuses, self.failures = [], []
        self.pids = set()   # the workers that answered 200
        self.acked = {}     # key -> the last n a PUT of it was answered 200 for
        self._stop = False
        self.greenlets = [gevent.spawn(self._run, i) for i in range(CLIENTS)]

    def _run(self, i):
        n = 0
        key = "%s%d" % (self.via[0], i)
        while not self._stop:
            n += 1
            for method, body in (("PUT", n), ("GET", None)):
                try:
                    status, reply = self.service.request(method, "/%s/%s" % (self.via, key), body)
                except Exception as exc:  # noqa: BLE001 - asserted by the test
                    self.failures.append((None, repr(exc)))
                    continue
                self.statuses.append(status)
                if status != 200:
                    self.failures.append((status, "%s %s: %r" % (method, key, reply)))
                elif isinstance(reply, dict):
                    self.pids.add(reply.get("pid"))
                    if method == "PUT":
                        self.acked[key] = n

    def warmed_up(self):
        """Wait until every worker has served this load (each has its own sockets)."""
        wait_until(lambda: len(self.pids) >= WORKERS)

    def served_more(self, count=4 * CLIENTS):
        """Wait until ``count`` more requests got a reply."""
        before = len(self.statuses)
        wait_until(lambda: len(self.statuses) > before + count)

    def stop(self):
        self._stop = True
        assert len(gevent.joinall(self.greenlets, timeout=60)) == len(self.greenlets)


def check(load, service):
    """2.10+: nothing but 200s.  2.6: what failed is a 503 carrying the lost
    connection's error (NetworkError, or a caller's timeout waiting for the
    reconnect), and the service served requests after it."""
    print("requests: %d, failed: %d %s" % (len(load.statuses), len(load.failures),
                                           load.failures[:2]))
    if SHUTDOWN:
        assert not load.failures, (len(load.failures), load.failures[:5], service.log_tail(100))
        assert set(load.statuses) == {200}
        return
    assert {status for status, _ in load.failures} <= {503}, load.failures[:5]
    assert all("NetworkError" in text or "RequestTimeout" in text or "ConnectionClosed" in text
               for _, text in load.failures), load.failures[:5]
    assert load.statuses[-CLIENTS:].count(200) > 0, "served nothing after the restart"


@pytest.fixture
def gunicorn_binary():
    if binary("gunicorn") is None:
        pytest.fail("gunicorn is not installed: it is in the test extra (pip install -e '.[test]')")


@pytest.fixture
def single(gunicorn_binary):
    """A server (the app's connection and its pool of one), gunicorn over it."""
    srv = TarantoolServer(_lua())
    try:
        srv.start()
        env = {"TARANTOOL": "%s:%d" % (srv.host, srv.port),
               "TARANTOOL_USER": USER, "TARANTOOL_PASSWORD": PASSWORD}
        with Service("gunicorn", APP_DIR, env=env, workers=WORKERS) as service:
            yield service, srv
    finally:
        srv.cleanup()


@pytest.fixture
def replicated(gunicorn_binary, server):
    """A master and two replicas (the app's pool), gunicorn over them."""
    rs = ReplicaSet(_lua(), replicas=2, user=USER, password=PASSWORD)
    try:
        rs.start()
        env = {"TARANTOOL": "%s:%d" % (server.host, server.port),
               "TARANTOOL_POOL": ",".join("%s:%d" % (s.host, s.port) for s in rs.servers),
               "TARANTOOL_USER": USER, "TARANTOOL_PASSWORD": PASSWORD}
        with Service("gunicorn", APP_DIR, env=env, workers=WORKERS) as service:
            yield service, rs
    finally:
        rs.cleanup()


def test_a_tarantool_restart_under_http_load(single):
    service, srv = single
    load = HttpLoad(service, "conn")
    try:
        load.warmed_up()
        restart(srv)
        load.served_more()   # served after it too
    finally:
        load.stop()
    check(load, service)


def test_a_rolling_restart_with_switchover_under_http_load(replicated):
    service, rs = replicated
    master, r1, r2 = rs.servers
    load = HttpLoad(service, "pool")
    try:
        load.warmed_up()
        for replica in (r1, r2):
            restart(replica)
            load.served_more(CLIENTS)
        rs.eval(master, "box.cfg{read_only = true}")
        rs.wait_caught_up(r1, master)
        rs.promote(r1)
        load.served_more(CLIENTS)
        restart(master, read_only=True)
        load.served_more()
    finally:
        load.stop()
    check(load, service)
    # The last write of each key the service acknowledged is on the new master.
    lua = "local r = {} for _, t in box.space.kv:pairs() do r[t[1]] = t[2] end return r"
    assert load.acked
    wait_until(lambda: all((rs.eval(r1, lua)[0].get(key) or 0) >= n
                           for key, n in load.acked.items()), timeout=10)
