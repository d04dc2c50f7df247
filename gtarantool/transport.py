"""Framing and transport: one socket, one writer greenlet, one reader greenlet.

Callers register a waiter under their sync id and append a complete, already
encoded request to the write buffer.  The writer greenlet sends everything
queued since its last ``send`` in one call; the reader greenlet receives large
chunks, cuts them into frames and hands each ``(header, body bytes)`` to the
waiter with that sync id.  Decoding the body is left to the waiting greenlet.

On any failure (socket error, EOF, garbage) the transport closes itself and
fails every waiter at once; it never reconnects or re-sends: that is the
connection's decision.
"""
import errno
import os
import socket

import msgpack
from gevent import Greenlet, getcurrent
from gevent.event import Event
from gevent.hub import Waiter, get_hub
from tarantool.const import IPROTO_CHUNK, IPROTO_REQUEST_TYPE, IPROTO_SYNC
from tarantool.error import NetworkError

from gtarantool.errors import ConnectionClosed, ProtocolError

RECV_SIZE = 256 * 1024
# A valid length prefix is a msgpack uint: at most 9 bytes.
MAX_PREFIX = 9


class Stats:
    """Per-connection counters, cumulative over reconnects.

    ``responses`` counts every frame received, push messages included;
    ``discarded`` counts late replies to requests whose caller gave up.
    """

    __slots__ = ("requests", "responses", "send_calls", "recv_calls", "bytes_out",
                 "bytes_in", "max_in_flight", "reconnects", "schema_reloads", "discarded")

    def __init__(self):
        for name in self.__slots__:
            setattr(self, name, 0)

    def as_dict(self):
        return {name: getattr(self, name) for name in self.__slots__}

    def __repr__(self):
        return "Stats(%s)" % ", ".join("%s=%d" % kv for kv in self.as_dict().items())


class Transport:
    """A connected socket with its reader and writer greenlets.

    ``register(sync)`` returns a gevent ``Waiter`` whose value is
    ``(header, body, pushes)`` or an exception instance; ``write(data)`` queues
    bytes.  ``close()`` kills and joins both greenlets.
    """

    def __init__(self, sock, stats, max_response_size, name="tarantool"):
        self._sock = sock
        self.stats = stats
        self.max_response_size = max_response_size
        self.error = None                 # set once: why the transport died
        self._hub = get_hub()
        self._pending = {}                # sync -> Waiter
        self._abandoned = set()           # syncs whose caller gave up (timeout, kill)
        self._pushes = {}                 # sync -> [(header, body)] of IPROTO_CHUNK messages
        self._wbuf = []
        self._wakeup = Event()
        self._unpacker = msgpack.Unpacker(raw=False, strict_map_key=False,
                                          max_buffer_size=max_response_size + RECV_SIZE)
        self._fed = 0                     # bytes fed to the unpacker, to know what it holds
        self._frame_start = None          # unpacker offset of the frame being assembled
        self._frame_len = 0
        self._reader = Greenlet(self._read_loop)
        self._writer = Greenlet(self._write_loop)
        self._reader.name = "%s-reader" % name
        self._writer.name = "%s-writer" % name
        self._reader.start()
        self._writer.start()

    @property
    def alive(self):
        return self.error is None

    @property
    def in_flight(self):
        return len(self._pending)

    # -- the caller's side ---------------------------------------------------

    def register(self, sync):
        """Reserve ``sync`` and return the Waiter its reply will be delivered to."""
        if self.error is not None:
            raise self.error
        waiter = Waiter(self._hub)
        self._pending[sync] = waiter
        n = len(self._pending)
        if n > self.stats.max_in_flight:
            self.stats.max_in_flight = n
        return waiter

    def write(self, data):
        """Queue one complete request; the writer greenlet sends it."""
        buf = self._wbuf
        buf.append(data)
        if len(buf) == 1:
            self._wakeup.set()

    def abandon(self, sync):
        """The caller stopped waiting (timeout, kill): discard its reply when it comes."""
        if self._pending.pop(sync, None) is not None and self.error is None:
            self._abandoned.add(sync)
        self._pushes.pop(sync, None)

    # -- the writer greenlet -------------------------------------------------

    def _write_loop(self):
        buf = self._wbuf
        wakeup = self._wakeup
        sock = self._sock
        stats = self.stats
        try:
            while True:
                wakeup.wait()
                wakeup.clear()
                if not buf:
                    continue
                data = buf[0] if len(buf) == 1 else b"".join(buf)
                buf.clear()
                sock.sendall(data)
                stats.send_calls += 1
                stats.bytes_out += len(data)
        except Exception as exc:  # noqa: BLE001 - any failure kills the transport
            self._fail(_network_error(exc, "write"), killer=self._writer)

    # -- the reader greenlet -------------------------------------------------

    def _read_loop(self):
        sock = self._sock
        stats = self.stats
        try:
            while True:
                data = sock.recv(RECV_SIZE)
                if not data:
                    raise _lost("the server closed the connection")
                stats.recv_calls += 1
                stats.bytes_in += len(data)
                self.feed(data)
        except Exception as exc:  # noqa: BLE001 - any failure kills the transport
            self._fail(_network_error(exc, "read"), killer=self._reader)

    def feed(self, data):
        """Cut ``data`` (any piece of the stream) into frames and deliver them."""
        unpacker = self._unpacker
        unpacker.feed(data)
        self._fed += len(data)
        ready = []
        while True:
            if self._frame_start is None:
                try:
                    length = unpacker.unpack()
                except msgpack.OutOfData:
                    if self._fed - unpacker.tell() > MAX_PREFIX:
                        raise ProtocolError("garbage where a frame length was expected")
                    break
                except Exception as exc:
                    raise ProtocolError("undecodable frame length: %r" % (exc,)) from exc
                if type(length) is not int or not 0 < length <= self.max_response_size:
                    raise ProtocolError("bad frame length %r (limit %d bytes)"
                                        % (length, self.max_response_size))
                self._frame_start = unpacker.tell()
                self._frame_len = length
            start = self._frame_start
            if self._fed - start < self._frame_len:
                break
            self._frame_start = None
            end = start + self._frame_len
            try:
                header = unpacker.unpack()
            except Exception as exc:
                raise ProtocolError("undecodable reply header: %r" % (exc,)) from exc
            body_len = end - unpacker.tell()
            if (type(header) is not dict or body_len < 0
                    or type(header.get(IPROTO_SYNC)) is not int
                    or type(header.get(IPROTO_REQUEST_TYPE)) is not int):
                raise ProtocolError("malformed reply header %r" % (header,))
            body = unpacker.read_bytes(body_len) if body_len else b""
            ready.append((header, body))
        if ready:
            self._deliver(ready)

    def _deliver(self, frames):
        pending = self._pending
        wake = []
        for header, body in frames:
            sync = header[IPROTO_SYNC]
            self.stats.responses += 1
            if header[IPROTO_REQUEST_TYPE] == IPROTO_CHUNK:
                if sync in pending:
                    self._pushes.setdefault(sync, []).append((header, body))
                elif sync not in self._abandoned:
                    raise ProtocolError("push message for unknown sync %d" % sync)
                continue
            waiter = pending.pop(sync, None)
            if waiter is None:
                if sync in self._abandoned:
                    self._abandoned.discard(sync)
                    self.stats.discarded += 1
                    continue
                raise ProtocolError("reply for unknown sync %d" % sync)
            pushes = self._pushes.pop(sync, None) if self._pushes else None
            wake.append((waiter, (header, body, pushes)))
        if wake:
            # One hub callback wakes every waiter of this chunk in turn.
            self._hub.loop.run_callback(_wake_all, wake)

    # -- shutting down -------------------------------------------------------

    def _fail(self, exc, killer=None):
        """Mark dead, close the socket, fail every waiter, stop the other greenlet."""
        if self.error is not None:
            return
        self.error = exc
        try:
            self._sock.close()
        except OSError:
            pass
        waiters = list(self._pending.values())
        self._pending.clear()
        self._abandoned.clear()
        self._pushes.clear()
        self._wbuf.clear()
        if waiters:
            self._hub.loop.run_callback(_wake_all, [(w, exc) for w in waiters])
        for glet in (self._reader, self._writer):
            if glet is not killer and glet is not getcurrent():
                glet.kill(block=False)

    def close(self, exc=None):
        """Fail all waiters with ``exc`` and kill and join the reader and writer."""
        self._fail(exc or ConnectionClosed("connection closed"))
        current = getcurrent()
        for glet in (self._reader, self._writer):
            if glet is not current:
                glet.kill(block=True)

    def detach_after_fork(self):
        """In a forked child: make this process's copy of the socket dead without
        touching the stream the parent still uses (no shutdown, no reads)."""
        fd = self._sock.fileno()
        if fd < 0:
            return
        a, b = socket.socketpair()
        try:
            os.dup2(a.fileno(), fd)
        finally:
            a.close()
            b.close()


def _wake_all(pairs):
    for waiter, value in pairs:
        waiter.switch(value)


def _lost(message, errno_=errno.ECONNRESET):
    exc = NetworkError(message)
    exc.errno = errno_
    return exc


def _network_error(exc, what):
    if isinstance(exc, NetworkError):
        return exc
    return _lost("lost connection to server during %s: %s" % (what, exc),
                 getattr(exc, "errno", None) or errno.ECONNRESET)
