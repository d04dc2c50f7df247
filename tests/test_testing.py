"""gtarantool.testing, the throwaway servers tests and the load generator start: free
ports, and servers that send no requests of their own."""


def test_free_ports_are_below_the_ephemeral_range():
    """Outgoing connections take local ports from the ephemeral range: a port
    picked there could be taken before the server binds it."""
    import socket

    from gtarantool.testing.server import _ephemeral_low, free_port
    ports = {free_port() for _ in range(20)}
    assert len(ports) > 1 and all(1024 <= port < _ephemeral_low() for port in ports)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", ports.pop()))


def test_throwaway_servers_send_no_requests_of_their_own(conn):
    """2.11's and 3.x's feedback daemon selects once a minute, and box.stat()
    counts it: a bench phase spanning that moment would find the server's
    counts one off the client's."""
    assert conn.eval("return box.cfg.feedback_enabled").data == [False]


def test_free_port_never_gives_a_port_twice(monkeypatch):
    """A replica set picks all its ports before starting any server: the same
    port picked twice would fail the second server's start."""
    from gtarantool.testing import server

    class Repeating:   # a generator that draws the same port again and again
        def __init__(self):
            self.draws = iter([20000, 20000, 20000, 20001])

        def randrange(self, low, high):
            return next(self.draws)

    monkeypatch.setattr(server, "_ports", Repeating())
    monkeypatch.setattr(server, "_given", set(), raising=False)
    monkeypatch.setattr(server, "_ephemeral_low", lambda: 32768)
    assert [server.free_port(), server.free_port()] == [20000, 20001]
