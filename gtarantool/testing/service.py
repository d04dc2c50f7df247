"""A WSGI app served for real by gunicorn or uWSGI on a free local port, for tests.

``Service(kind, app_dir, module, env=...)``: ``start()`` runs the server (its
own process group, output in a log file) and waits until ``GET /health``
answers 200; ``request(method, path, body)`` makes one HTTP/1.0 request over a
gevent socket and returns ``(status, decoded JSON or text)``; ``stop()`` stops
the server (SIGTERM to its master, then SIGKILL to the whole group after a
grace period) and reaps it.  A context manager: it always stops and reaps.

``kind`` is ``"gunicorn"`` (``--preload -k gevent -w workers``: the app is
imported in the master, workers fork) or ``"uwsgi"`` (``--master --processes
workers --gevent greenlets``: the app loaded in the master, workers forked from
C, no ``--lazy-apps``).  ``extra`` adds command-line arguments.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import gevent
import gevent.socket

from gtarantool.testing.server import free_port

KINDS = ("gunicorn", "uwsgi")


def binary(kind):
    """The command that runs ``kind`` beside this Python (None if not installed)."""
    if kind == "gunicorn":
        try:
            import gunicorn  # noqa: F401 - only whether it is there
        except ImportError:
            return None
        return [sys.executable, "-m", "gunicorn"]
    path = os.path.join(os.path.dirname(sys.executable), "uwsgi")
    if not os.path.exists(path):
        path = shutil.which("uwsgi")
    return [path] if path else None


class Service:
    """One gunicorn or uWSGI server of ``module`` (``"app:application"``) from ``app_dir``."""

    def __init__(self, kind, app_dir, module="app:application", env=None, workers=2,
                 greenlets=100, extra=()):
        if kind not in KINDS:
            raise ValueError("kind must be one of %s, not %r" % (KINDS, kind))
        self.kind = kind
        self.app_dir = os.path.abspath(app_dir)
        self.module = module
        self.env = dict(os.environ, **(env or {}))
        self.workers = workers
        self.greenlets = greenlets
        self.extra = list(extra)
        self.host = "127.0.0.1"
        self.port = None
        self.process = None
        self.log_path = None

    def command(self):
        bind = "%s:%d" % (self.host, self.port)
        base = binary(self.kind)
        if base is None:
            raise RuntimeError("%s is not installed (pip install -e '.[test]')" % self.kind)
        if self.kind == "gunicorn":
            return base + ["--preload", "-k", "gevent", "-w", str(self.workers), "-b", bind,
                           "--chdir", self.app_dir, "--graceful-timeout", "5",
                           *self.extra, self.module]
        module, _, callable_ = self.module.partition(":")
        return base + ["--master", "--processes", str(self.workers),
                       "--gevent", str(self.greenlets), "--http-socket", bind,
                       "--chdir", self.app_dir, "--pythonpath", self.app_dir,
                       "--module", module, "--callable", callable_ or "application",
                       "--need-app", "--die-on-term", "--disable-logging", *self.extra]

    def start(self, timeout=30.0):
        """Start the server; wait until ``/health`` answers (RuntimeError with the
        log's tail if it exits or does not answer within ``timeout``)."""
        self.port = free_port()
        fd, self.log_path = tempfile.mkstemp(prefix="gtarantool-%s-" % self.kind, suffix=".log")
        with os.fdopen(fd, "wb") as log:
            self.process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, env=self.env,
                                            start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError("%s exited with %s:\n%s"
                                   % (self.kind, self.process.returncode, self.log_tail()))
            try:
                status, _ = self.request("GET", "/health", timeout=1)
                if status == 200:
                    return self
            except (OSError, ValueError, gevent.Timeout):
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("%s did not answer within %ss:\n%s"
                                   % (self.kind, timeout, self.log_tail()))
            gevent.sleep(0.1)

    def request(self, method, path, body=None, timeout=10):
        """One HTTP/1.0 request: ``(status code, JSON body decoded, or its text)``."""
        data = b"" if body is None else str(body).encode()
        head = ("%s %s HTTP/1.0\r\nHost: %s:%d\r\nContent-Length: %d\r\n\r\n"
                % (method, path, self.host, self.port, len(data))).encode()
        with gevent.Timeout(timeout):
            sock = gevent.socket.create_connection((self.host, self.port))
            try:
                sock.sendall(head + data)
                chunks = []
                while True:
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    chunks.append(chunk)
            finally:
                sock.close()
        raw = b"".join(chunks)
        header, _, content = raw.partition(b"\r\n\r\n")
        status = int(header.split(None, 2)[1])
        try:
            return status, json.loads(content)
        except ValueError:
            return status, content.decode(errors="replace")

    def signal(self, signum):
        """Send ``signum`` to the master (gunicorn: HUP reloads, TERM stops gracefully)."""
        self.process.send_signal(signum)

    def stop(self, timeout=10.0):
        """Stop the server and reap it: SIGTERM, then SIGKILL to its process group."""
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while process.poll() is None and time.monotonic() < deadline:
                gevent.sleep(0.05)
        try:
            os.killpg(process.pid, signal.SIGKILL)   # workers left behind, if any
        except OSError:
            pass
        process.wait()
        self.process = None

    def log_tail(self, lines=40):
        if not self.log_path or not os.path.exists(self.log_path):
            return ""
        with open(self.log_path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])

    def cleanup(self):
        self.stop()
        if self.log_path and os.path.exists(self.log_path):
            os.unlink(self.log_path)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.cleanup()
