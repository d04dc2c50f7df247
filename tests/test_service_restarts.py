"""examples/service under HTTP load while Tarantool restarts: gunicorn
``--preload -k gevent -w 2`` (workers inherit the module-level connection and
pool), a graceful restart of the connection's server and a rolling restart of
the pool's replica set with a switchover.  No request gets a 5xx.
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

pytestmark = pytest.mark.skipif(
    binary_version() < (2, 10),
    reason="needs box.shutdown (Tarantool 2.10+): 2.6 drops the requests in flight on a "
           "restart, which the service answers 503 (see docs/restarts.rst)")


def in_thread(fn, *args):
    return gevent.get_hub().threadpool.spawn(fn, *args).get()


def wait_until(predicate, timeout=30.0, step=0.02):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met within %ss" % timeout
        gevent.sleep(step)


def restart(srv, **cfg):
    srv.signal(signal.SIGTERM)
    wait_until(lambda: srv.process.poll() is not None)
    srv.cfg.update(cfg)
    in_thread(srv.start)


class HttpLoad:
    """``CLIENTS`` greenlets writing and reading keys of their own via ``via``
    (``conn`` or ``pool``) until ``stop()``: every status is kept."""

    def __init__(self, service, via):
        self.service, self.via = service, via
        self.statuses, self.failures = [], []
        self._stop = False
        self.greenlets = [gevent.spawn(self._run, i) for i in range(CLIENTS)]

    def _run(self, i):
        n = 0
        while not self._stop:
            n += 1
            key = "%s%d" % (self.via[0], i)
            for method, body in (("PUT", n), ("GET", None)):
                try:
                    status, reply = self.service.request(method, "/%s/%s" % (self.via, key), body)
                except Exception as exc:  # noqa: BLE001 - asserted by the test
                    self.failures.append(repr(exc))
                    continue
                self.statuses.append(status)
                if status >= 500:
                    self.failures.append("%s %s: %s %r" % (method, key, status, reply))

    def stop(self):
        self._stop = True
        assert len(gevent.joinall(self.greenlets, timeout=60)) == len(self.greenlets)


@pytest.fixture
def stack():
    """A server for the connection, a replica set for the pool, gunicorn over both."""
    if binary("gunicorn") is None:
        pytest.fail("gunicorn is not installed: it is in the test extra (pip install -e '.[test]')")
    srv = TarantoolServer(_lua())
    rs = ReplicaSet(_lua(), user=USER, password=PASSWORD)
    try:
        srv.start()
        rs.start()
        env = {"TARANTOOL": "%s:%d" % (srv.host, srv.port),
               "TARANTOOL_POOL": ",".join("%s:%d" % (s.host, s.port) for s in rs.servers),
               "TARANTOOL_USER": USER, "TARANTOOL_PASSWORD": PASSWORD}
        with Service("gunicorn", APP_DIR, env=env, workers=2) as service:
            yield service, srv, rs
    finally:
        rs.cleanup()
        srv.cleanup()


def test_a_tarantool_restart_under_http_load_gives_no_5xx(stack):
    service, srv, _ = stack
    load = HttpLoad(service, "conn")
    gevent.sleep(0.5)
    restart(srv)
    before = len(load.statuses)
    wait_until(lambda: len(load.statuses) > before + 4 * CLIENTS)   # served after it too
    load.stop()
    assert not load.failures, (len(load.failures), load.failures[:5], service.log_tail())
    assert set(load.statuses) == {200}


def test_a_rolling_restart_with_switchover_under_http_load_gives_no_5xx(stack):
    service, _, rs = stack
    master, r1, r2 = rs.servers
    load = HttpLoad(service, "pool")
    gevent.sleep(0.5)
    for replica in (r1, r2):
        restart(replica)
        gevent.sleep(0.5)
    rs.eval(master, "box.cfg{read_only = true}")
    rs.promote(r1)
    gevent.sleep(0.5)
    restart(master, read_only=True)
    before = len(load.statuses)
    wait_until(lambda: len(load.statuses) > before + 4 * CLIENTS)
    load.stop()
    assert not load.failures, (len(load.failures), load.failures[:5], service.log_tail())
    assert set(load.statuses) == {200}
