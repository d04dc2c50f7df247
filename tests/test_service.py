"""examples/service run for real: gunicorn ``--preload -k gevent -w 2`` and uWSGI's
prefork (``--master --processes 4 --gevent 100``, the app loaded in the master),
whose workers inherit the module-level connection and pool.  Concurrent HTTP
requests of distinct keys: every one answers 200 with its own key's data.
"""
import os

import gevent
import pytest

import gtarantool
from gtarantool.testing.replicaset import ReplicaSet
from gtarantool.testing.service import Service, binary
from tests.conftest import PASSWORD, USER, _lua

APP_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                       "examples", "service")
KEYS = 40     # concurrent requests per wave, each of its own key
WAVES = 5
SERVERS = {"gunicorn": {"workers": 2}, "uwsgi": {"workers": 4, "greenlets": 100}}


@pytest.fixture(scope="module")
def replicaset():
    rs = ReplicaSet(_lua(), replicas=1, user=USER, password=PASSWORD)
    rs.start()
    rs.eval(rs.master, "for i = 0, %d do box.space.kv:replace{'p' .. i, i} end" % (KEYS - 1))
    rs.wait_synced()
    yield rs
    rs.cleanup()


@pytest.fixture(params=list(SERVERS))
def service(request, server, replicaset):
    if binary(request.param) is None:
        pytest.fail("%s is not installed: it is in the test extra (pip install -e '.[test]')"
                    % request.param)
    conn = gtarantool.connect(server.host, server.port, user=USER, password=PASSWORD)
    for i in range(KEYS):
        conn.replace("kv", ("c%d" % i, i))
    conn.close()
    env = {"TARANTOOL": "%s:%d" % (server.host, server.port),
           "TARANTOOL_POOL": ",".join("%s:%d" % (s.host, s.port) for s in replicaset.servers),
           "TARANTOOL_USER": USER, "TARANTOOL_PASSWORD": PASSWORD}
    with Service(request.param, APP_DIR, env=env, **SERVERS[request.param]) as svc:
        yield svc


def _wave(service, requests):
    """Send ``requests`` ((method, path, body, expected key, expected rows)) at once."""
    calls = [gevent.spawn(service.request, method, path, body)
             for method, path, body, _, _ in requests]
    gevent.joinall(calls, timeout=30)
    failures, pids = [], set()
    for call, (method, path, _, key, rows) in zip(calls, requests):
        if not call.successful():
            failures.append("%s %s: %r" % (method, path, call.exception))
            continue
        status, reply = call.value
        if status != 200 or not isinstance(reply, dict) or reply.get("key") != key \
                or reply.get("rows") != rows:
            failures.append("%s %s: %s %r" % (method, path, status, reply))
        else:
            pids.add(reply["pid"])
    return failures, pids


def test_forked_workers_answer_every_request_with_its_own_data(service, server, replicaset):
    failures, pids = [], set()
    for wave in range(WAVES):
        reads = [("GET", "/%s/%s%d" % (via, via[0], i), None, "%s%d" % (via[0], i),
                  [["%s%d" % (via[0], i), i]])
                 for i in range(KEYS) for via in ("conn", "pool")]
        writes = [("PUT", "/%s/w%s%d-%d" % (via, via[0], wave, i), i,
                   "w%s%d-%d" % (via[0], wave, i), [["w%s%d-%d" % (via[0], wave, i), i]])
                  for i in range(KEYS // 4) for via in ("conn", "pool")]
        got, seen = _wave(service, reads + writes)
        failures += got
        pids |= seen
    assert not failures, (len(failures), failures[:10], service.log_tail())
    assert service.process.pid not in pids   # the workers answered, not the master
    # The writes are there, each once, with its own value.
    conn = gtarantool.connect(server.host, server.port, user=USER, password=PASSWORD)
    try:
        for wave in range(WAVES):
            for i in range(KEYS // 4):
                key = "wc%d-%d" % (wave, i)
                assert conn.select("kv", key).data == [[key, i]]
    finally:
        conn.close()
    on_master = {key: n for key, n in replicaset.eval(replicaset.master,
                                                      "return box.space.kv:select()")[0]}
    for wave in range(WAVES):
        for i in range(KEYS // 4):
            assert on_master["wp%d-%d" % (wave, i)] == i
