"""A small fault-injecting TCP proxy, shared by the reliability tests and the soak.

``FaultProxy(target_host, target_port)`` listens on a free local port and
forwards every accepted connection to the target with plain OS threads, so it
keeps working whatever the client's gevent hub does.  Faults are switched on
and off while connections are open:

- ``delay``: seconds to hold every chunk going server -> client;
- ``reset_mid_frame()``: the next server -> client chunk is cut in half, the
  first half is forwarded and then both sockets are reset (RST);
- ``stop_reading()`` / ``resume_reading()``: stop reading what the client sends
  (its socket buffers fill and its ``send`` blocks);
- ``blackhole()`` / ``resume()``: forward nothing in either direction while
  keeping every socket open (a silent partition);
- ``half_close()``: send FIN to the client (it reads EOF) while the proxy keeps
  reading what it sends;
- ``reset_all()``: RST every open connection at once.
"""
import select
import socket
import struct
import threading
import time

CHUNK = 64 * 1024


def _rst(sock):
    """Close ``sock`` with an RST instead of a FIN."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


class _Link:
    """One client connection and its upstream connection, pumped by two threads."""

    def __init__(self, proxy, client, upstream):
        self.proxy = proxy
        self.client = client
        self.upstream = upstream
        self.closed = False
        self.lock = threading.Lock()
        for src, dst, upward in ((client, upstream, True), (upstream, client, False)):
            t = threading.Thread(target=self._pump, args=(src, dst, upward), daemon=True)
            t.start()

    def _wait_allowed(self, upward):
        p = self.proxy
        while not self.closed and not p.closed:
            if p._blackhole or (upward and p._no_read):
                time.sleep(0.01)
                continue
            return True
        return False

    def _pump(self, src, dst, upward):
        p = self.proxy
        try:
            while self._wait_allowed(upward):
                # Poll briefly so a fault switched on later is honoured promptly.
                if not select.select([src], [], [], 0.05)[0]:
                    continue
                data = src.recv(CHUNK)
                if not data:
                    break
                if not upward:
                    if p.delay:
                        time.sleep(p.delay)
                    if p._cut_next:
                        p._cut_next = False
                        half = max(1, len(data) // 2)
                        dst.sendall(data[:half])
                        p.bytes_down += half
                        p.resets += 1
                        self.reset()
                        return
                    if not self._wait_allowed(upward):
                        break
                    p.bytes_down += len(data)
                else:
                    p.bytes_up += len(data)
                dst.sendall(data)
        except (OSError, ValueError):
            pass
        finally:
            self.close()

    def reset(self):
        with self.lock:
            if self.closed:
                return
            self.closed = True
        _rst(self.client)
        _rst(self.upstream)

    def close(self):
        with self.lock:
            if self.closed:
                return
            self.closed = True
        for s in (self.client, self.upstream):
            try:
                s.close()
            except OSError:
                pass

    def half_close(self):
        try:
            self.client.shutdown(socket.SHUT_WR)
        except OSError:
            pass


class FaultProxy:
    """Forward ``127.0.0.1:self.port`` to ``(target_host, target_port)`` with faults."""

    def __init__(self, target_host, target_port, host="127.0.0.1"):
        self.target = (target_host, target_port)
        self.host = host
        self.delay = 0.0
        self.closed = False
        self.accepted = 0
        self.resets = 0
        self.bytes_up = 0
        self.bytes_down = 0
        self._cut_next = False
        self._no_read = False
        self._blackhole = False
        self._links = []
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((host, 0))
        self._listener.listen(128)
        self._listener.settimeout(0.1)
        self.port = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._accept_loop, daemon=True)
        self._thread.start()

    def _accept_loop(self):
        while not self.closed:
            try:
                client, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                _rst(client)
                continue
            for s in (client, upstream):
                s.settimeout(None)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.accepted += 1
            self._links = [link for link in self._links if not link.closed]
            self._links.append(_Link(self, client, upstream))

    @property
    def links(self):
        return [link for link in self._links if not link.closed]

    # -- faults --------------------------------------------------------------

    def reset_mid_frame(self):
        """Cut the next server -> client chunk in half, then reset the connection."""
        self._cut_next = True

    def stop_reading(self):
        self._no_read = True

    def resume_reading(self):
        self._no_read = False

    def blackhole(self):
        self._blackhole = True

    def resume(self):
        self._blackhole = False
        self._no_read = False
        self.delay = 0.0
        self._cut_next = False

    def half_close(self):
        for link in self.links:
            link.half_close()

    def reset_all(self):
        n = 0
        for link in self.links:
            link.reset()
            n += 1
        self.resets += n
        return n

    def close(self):
        self.closed = True
        try:
            self._listener.close()
        except OSError:
            pass
        for link in list(self._links):
            link.close()
        self._thread.join(1)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
