"""The load generator's tests: throwaway servers from ``gtarantool.testing``; ``server`` is
one for the whole session with the user test/secret, which may create spaces."""
import pytest

from gtarantool.testing.server import TarantoolServer

USER, PASSWORD = "test", "secret"
LUA = """
box.once('bench-tests', function()
    box.schema.user.create(%r, {password = %r})
    box.schema.user.grant(%r, 'read,write,execute,create,drop,alter', 'universe')
end)
""" % (USER, PASSWORD, USER)


@pytest.fixture(scope="session")
def server():
    """The shared server: ``server.host``, ``server.port``."""
    srv = TarantoolServer(LUA)
    srv.start()
    yield srv
    srv.cleanup()
