"""One real Tarantool for the whole test session, started from Debian's binary;
the ``reader`` switch between the C and Python hot paths; and two rules for CI
(``CI`` set in the environment): a test marked ``timing`` (a wall-clock bound,
see tests/timing.py) runs once more before it counts as failed, and a test
that needs a tool ``make install`` installs (``needs_tool``) fails, instead of
skipping, where the tool is missing."""
import os

import pytest

import gtarantool
from gtarantool import protocol, transport

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
                     help="run only this half of the tests that use the reader fixture "
                          "(make sanitize: the C half)")
    parser.addoption("--update-golden", action="store_true",
                     help="tests/test_golden.py writes tests/golden/ from the frames sent "
                          "instead of comparing (after a wire change that is meant)")


def in_ci():
    return bool(os.environ.get("CI"))


def needs_tool(available, what):
    """Marks a test that needs ``what`` (a tool ``make install`` installs).

    :param available: whether the tool was found
    :param what: the tool and where it comes from, for the message
    :returns: a marker: where the tool is missing the test skips, or in CI fails
    """
    return pytest.mark.needs_tool(available=bool(available), what=what)


def pytest_configure(config):
    # (the rerun below is pytest-rerunfailures' flaky marker: without the plugin
    # a timing test would fail at its first overrun, silently stricter)
    if in_ci() and not config.pluginmanager.hasplugin("rerunfailures"):
        raise pytest.UsageError("CI is set: the timing tests' rerun needs "
                                "pytest-rerunfailures (pip install -e .[test])")


def pytest_collection_modifyitems(config, items):
    wanted = config.getoption("--reader")
    if wanted:
        drop = [item for item in items if getattr(item, "callspec", None) is not None
                and item.callspec.params.get("reader", wanted) != wanted]
        config.hook.pytest_deselected(items=drop)
        items[:] = [item for item in items if item not in drop]
    if in_ci():
        # A busy CI host overruns a wall-clock bound now and then: one more run,
        # with fresh function fixtures, before it counts as failed.
        for item in items:
            if item.get_closest_marker("timing") and not item.get_closest_marker("flaky"):
                item.add_marker(pytest.mark.flaky(reruns=1))


def pytest_runtest_setup(item):
    for mark in item.iter_markers("needs_tool"):
        if not mark.kwargs["available"]:
            message = "%s is missing (make install installs it)" % mark.kwargs["what"]
            if in_ci():
                pytest.fail("CI is set: " + message, pytrace=False)
            pytest.skip(message)


@pytest.fixture(params=["c", "python"])
def reader(request, monkeypatch):
    """Runs a test twice: with the hot paths in C (gtarantool._speedups and
    _encoder, which must be built: the reader's loops, the request's, request
    bodies) and with the same paths in Python, as without a compiler.  Modules
    opt in with ``pytestmark = pytest.mark.usefixtures("reader")``."""
    if request.param == "python":
        monkeypatch.setattr(transport, "_speedups", None)
        monkeypatch.setattr(protocol, "_speedups", None)
        monkeypatch.setattr(protocol, "_encoder", None)
    elif transport._speedups is None or protocol._encoder is None:
        pytest.fail("gtarantool._speedups or _encoder is not built (pip install -e . "
                    "compiles them)")
    return request.param
