"""One real Tarantool for the whole test session, started from Debian's binary,
and the ``reader`` switch between the C and Python hot paths.  The rules for CI
(``timing``, ``needs_tool``) are in the checkout's top ``conftest.py``."""
import inspect
import os

import pytest

import gtarantool
from gtarantool import compiled
from gtarantool.pool import ConnectionPool
from gtarantool.testing.server import TarantoolServer

HERE = os.path.dirname(os.path.abspath(__file__))
USER, PASSWORD = "test", "secret"


def _lua():
    with open(os.path.join(HERE, "server.lua")) as f:
        return f.read()


@pytest.fixture(scope="session")
def server():
    """The shared server: ``server.host``, ``server.port``; user test/secret."""
    srv = TarantoolServer(_lua())
    srv.start()
    yield srv
    srv.cleanup()


@pytest.fixture
def fresh_server():
    """A private server for tests that kill, freeze or restart it."""
    srv = TarantoolServer(_lua())
    srv.start()
    yield srv
    srv.cleanup()


@pytest.fixture
def conn(server):
    """A gtarantool connection to the shared server as the test user."""
    c = gtarantool.connect(server.host, server.port, user=USER, password=PASSWORD)
    yield c
    c.close()


def pytest_addoption(parser):
    parser.addoption("--reader", choices=("c", "python"),
                     help="run only this half of the tests that use the reader or the "
                          "routes fixture (make sanitize: the C half)")
    parser.addoption("--update-golden", action="store_true",
                     help="tests/test_golden.py writes tests/golden/ from the frames sent "
                          "instead of comparing (after a wire change that is meant)")


def needs_tool(available, what):
    """Marks a test that needs ``what`` (a tool ``make install`` installs).

    :param available: whether the tool was found
    :param what: the tool and where it comes from, for the message
    :returns: a marker: where the tool is missing the test skips, or in CI fails
    """
    return pytest.mark.needs_tool(available=bool(available), what=what)


# Parameters that run a test with the C paths ("c") and with their Python twins
# ("python"): the fixtures reader and routes here, loop in test_reliability.py
# (the reader's loop), encoder in test_protocol.py (request bodies).
TWIN_FIXTURES = ("reader", "routes", "loop", "encoder")
# Test modules of the compiled paths themselves: not run where they are switched off.
COMPILED_ONLY = ("test_speedups.py", "test_encoder.py")


def pytest_collection_modifyitems(config, items):
    wanted = config.getoption("--reader")
    if compiled.PURE_PYTHON:   # GTARANTOOL_PURE_PYTHON: every path in Python
        wanted = "python"
        drop = [item for item in items if item.path.name in COMPILED_ONLY]
        config.hook.pytest_deselected(items=drop)
        items[:] = [item for item in items if item not in drop]
    if wanted:
        drop = [item for item in items if getattr(item, "callspec", None) is not None
                and any(item.callspec.params.get(name, wanted) != wanted
                        for name in TWIN_FIXTURES)]
        config.hook.pytest_deselected(items=drop)
        items[:] = [item for item in items if item not in drop]


@pytest.fixture(params=["c", "python"])
def reader(request, monkeypatch):
    """Runs a test twice: with the hot paths in C (gtarantool._speedups and
    _encoder, which must be built: the reader's loops, the request's, request
    bodies) and with the same paths in Python, as without a compiler.  Modules
    opt in with ``pytestmark = pytest.mark.usefixtures("reader")``."""
    if request.param == "python":
        monkeypatch.setattr(compiled, "speedups", None)
        monkeypatch.setattr(compiled, "encoder", None)
    elif compiled.speedups is None or compiled.encoder is None:
        pytest.fail("gtarantool._speedups or _encoder is not built (pip install -e . "
                    "compiles them)")
    return request.param


# The data methods of ConnectionPool that gtarantool._pool serves in C.
ROUTED = ("select", "insert", "replace", "update", "upsert", "delete")


@pytest.fixture(params=["c", "python"])
def routes(request, monkeypatch):
    """Runs a test with the pool's data methods in C (gtarantool._pool, which
    must be built) and with connection_pool.py's Python methods, as without a
    compiler."""
    if request.param == "python":
        for method in ROUTED:
            monkeypatch.setattr(ConnectionPool, method,
                                inspect.unwrap(getattr(ConnectionPool, method)))
    elif compiled.pool is None:
        pytest.fail("gtarantool._pool is not built (pip install -e . compiles it)")
    return request.param
