"""The examples the manual shows, run as a reader would: ``examples/quickstart``
(``tarantool init.lua``, then ``python quickstart.py``) and ``examples/flask``
under ``gunicorn --preload -k gevent``, against that ``init.lua``'s server,
whose user has only the grants docs/production.rst lists.
"""
import os
import socket
import subprocess
import sys
import tempfile
import time

import gevent
import pytest

import gtarantool
from gtarantool import Mode
from gtarantool.testing.server import GREETING_SIZE, TarantoolServer, find_binary, free_port
from gtarantool.testing.service import Service, binary

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
INIT = os.path.join(EXAMPLES, "quickstart", "init.lua")


@pytest.fixture(scope="module")
def quickstart_server():
    """``tarantool examples/quickstart/init.lua`` in a temp dir, on a free port."""
    workdir = tempfile.mkdtemp(prefix="gtarantool-examples-")
    port = free_port()
    log = open(os.path.join(workdir, "tarantool.log"), "wb")
    proc = subprocess.Popen([find_binary(), INIT], cwd=workdir, stdout=log,
                            stderr=subprocess.STDOUT, env=dict(os.environ,
                                                               LISTEN="127.0.0.1:%d" % port))
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, open(log.name).read()[-2000:]
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
                    if len(sock.recv(GREETING_SIZE)) == GREETING_SIZE:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, open(log.name).read()[-2000:]
            time.sleep(0.05)
        yield "127.0.0.1:%d" % port
    finally:
        proc.kill()
        proc.wait()
        log.close()
        subprocess.run(["rm", "-rf", workdir], check=False)


def test_quickstart_runs_as_the_manual_shows(quickstart_server):
    out = subprocess.run([sys.executable, "quickstart.py"],
                         cwd=os.path.join(EXAMPLES, "quickstart"),
                         env=dict(os.environ, TARANTOOL=quickstart_server),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "[42, 'active']"
    assert lines[1].startswith("Stats(requests=")


def test_the_app_user_grants_are_enough_for_a_pool(quickstart_server):
    # The pool's role check calls box.info on 2.6 (and on a wrong-role error on 2.10+):
    # the user has execute on that function only.
    pool = gtarantool.ConnectionPool([quickstart_server], user="app", password="secret",
                                     wait_timeout=10, request_timeout=5)
    try:
        pool.replace("carts", (900001, "pool"))
        assert pool.select("carts", 900001, mode=Mode.RW).data == [[900001, "pool"]]
        (member,) = pool.info().values()
        assert member["role"] == "master" and member["healthy"], member
        conn = pool.pool[next(iter(pool.pool))].conn
        assert conn.call("box.info").data[0]["status"] == "running"
        with pytest.raises(gtarantool.DatabaseError, match="denied"):
            conn.call("box.cfg")   # nothing beyond what the examples need
    finally:
        pool.close()


def test_without_the_box_info_grant_a_polling_pool_shows_the_error():
    """docs/troubleshooting.rst: the role check's permission error, as pool.info() shows it."""
    lua = "box.schema.user.create('nobox', {password = 'secret', if_not_exists = true})"
    with TarantoolServer(lua) as server:
        pool = gtarantool.ConnectionPool([{"host": server.host, "port": server.port}],
                                         user="nobox", password="secret")
        try:
            (member,) = pool.info().values()
            if member["role_source"] == "poll":
                assert not member["healthy"] and member["role"] is None, member
                assert "Execute access to function 'box.info' is denied" in member["last_error"]
            else:   # the box.status watcher needs no grant
                assert member["healthy"] and member["role"] == "master", member
        finally:
            pool.close()


def test_flask_app_under_gunicorn(quickstart_server):
    if binary("gunicorn") is None:
        pytest.fail("gunicorn is not installed: it is in the test extra (pip install -e '.[test]')")
    pytest.importorskip("flask", reason="Flask comes with the test extra")
    with Service("gunicorn", os.path.join(EXAMPLES, "flask"), module="app:app",
                 env={"TARANTOOL": quickstart_server}, workers=2) as svc:
        keys = range(50_000, 50_040)
        puts = [gevent.spawn(svc.request, "PUT", "/carts/%d" % k, "open-%d" % k) for k in keys]
        gevent.joinall(puts, timeout=30, raise_error=True)
        gets = [gevent.spawn(svc.request, "GET", "/carts/%d" % k) for k in keys]
        gevent.joinall(gets, timeout=30, raise_error=True)
        pids = set()
        for k, put, get in zip(keys, puts, gets):
            assert put.value[0] == 200, (put.value, svc.log_tail())
            status, reply = get.value
            assert status == 200 and reply["user_id"] == k and reply["status"] == "open-%d" % k, \
                (get.value, svc.log_tail())
            pids.add(reply["pid"])
        assert svc.process.pid not in pids   # the workers answered, not the master
        assert svc.request("GET", "/carts/999999")[0] == 404
