"""A scripted fake Tarantool for the cases a real server cannot produce.

``FakePeer(handler)`` listens on a free local port in a plain OS thread; every
accepted connection runs ``handler(peer, sock)`` in its own thread.  The helpers
send a real-looking greeting and read and write IPROTO frames, so a handler can
answer normally and then misbehave exactly where a test wants.
"""
import base64
import os
import socket
import threading

import msgpack

IPROTO_CODE, IPROTO_SYNC, IPROTO_SCHEMA_ID = 0x00, 0x01, 0x05


def greeting(version="2.6.0"):
    line1 = ("Tarantool %s (Binary) %s" % (version, "f6b7b3a2-0d8e-4c5e-9a43-7b1e2e0c7d10"))
    line2 = base64.b64encode(os.urandom(32)).decode()
    return line1.ljust(63).encode() + b"\n" + line2.ljust(63).encode() + b"\n"


def frame(header, body=None):
    payload = msgpack.packb(header) + (msgpack.packb(body) if body is not None else b"")
    return msgpack.packb(len(payload)) + payload


def reply(sync, data=None, code=0, schema_id=1):
    """An OK reply (or ``code`` as given) for ``sync`` carrying ``data``."""
    body = {0x30: data if data is not None else []}
    return frame({IPROTO_CODE: code, IPROTO_SYNC: sync, IPROTO_SCHEMA_ID: schema_id}, body)


def tarantool_frame(sync, body, code=0, schema_id=1, schema_width=4):
    """A reply with ``body`` (bytes) in a layout Tarantool writes replies in
    (uint32 length, header {0: uint32, 1: uint64, 5: uint32}, or 5: uint64
    with ``schema_width`` 8 as since 2.10): the reader's fast path."""
    header = (b"\x83\x00\xce" + code.to_bytes(4, "big") + b"\x01\xcf" + sync.to_bytes(8, "big")
              + (b"\x05\xce" if schema_width == 4 else b"\x05\xcf")
              + schema_id.to_bytes(schema_width, "big"))
    return b"\xce" + (len(header) + len(body)).to_bytes(4, "big") + header + body


def misbehave_after(n, payload, then_close=False):
    """A handler answering nothing, then sending ``payload(syncs)`` once ``n``
    requests arrived on the connection; then it closes the connection, or reads
    what else comes without answering."""
    def handler(peer, sock):
        sock.sendall(greeting())
        syncs = [peer.read_request(sock)[0][IPROTO_SYNC] for _ in range(n)]
        sock.sendall(payload(syncs))
        if then_close:
            sock.close()
            return
        while True:
            peer.read_request(sock)
    return handler


class FakePeer:
    def __init__(self, handler):
        self.handler = handler
        self.connections = 0
        self.requests = []               # headers of every request read by read_request
        self.errors = []
        self._socks = []
        self._streams = {}
        self._closed = False
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self._listener.settimeout(0.1)
        self.host, self.port = self._listener.getsockname()
        self._thread = threading.Thread(target=self._accept_loop, daemon=True)
        self._thread.start()

    def _accept_loop(self):
        while not self._closed:
            try:
                sock, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            sock.settimeout(None)
            self.connections += 1
            self._socks.append(sock)
            threading.Thread(target=self._run, args=(sock,), daemon=True).start()

    def _run(self, sock):
        try:
            self.handler(self, sock)
        except OSError:
            pass
        except Exception as exc:  # noqa: BLE001 - reported to the test
            self.errors.append(exc)

    # -- helpers for handlers -------------------------------------------------

    def read_request(self, sock):
        """Read one request frame from ``sock``: (header dict, body dict or None)."""
        stream = self._streams.get(sock)
        if stream is None:
            stream = self._streams[sock] = _Stream(sock)
        header, body = stream.read_frame()
        self.requests.append(header)
        return header, body

    def close(self):
        self._closed = True
        try:
            self._listener.close()
        except OSError:
            pass
        for s in self._socks:
            try:
                s.close()
            except OSError:
                pass
        self._thread.join(1)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _Stream:
    def __init__(self, sock):
        self.sock = sock
        self.buf = b""

    def _need(self, n):
        while len(self.buf) < n:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("client closed")
            self.buf += data

    def read_frame(self):
        self._need(1)
        size = {0xcc: 1, 0xcd: 2, 0xce: 4, 0xcf: 8}.get(self.buf[0], 0)
        self._need(1 + size)
        length = msgpack.unpackb(self.buf[:1 + size])
        self._need(1 + size + length)
        payload = self.buf[1 + size:1 + size + length]
        self.buf = self.buf[1 + size + length:]
        unpacker = msgpack.Unpacker(strict_map_key=False, raw=False)
        unpacker.feed(payload)
        header = unpacker.unpack()
        try:
            body = unpacker.unpack()
        except msgpack.OutOfData:
            body = None
        return header, body
