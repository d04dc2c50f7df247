"""A throwaway Tarantool server in a temp dir, for the benchmark and the tests.

``TarantoolServer(lua)`` writes an ``init.lua`` that calls ``box.cfg`` on a
free port (``free_port``: below the ephemeral range), with any more options
given as ``cfg={...}``, and then runs ``lua``; ``start()`` waits until the
server answers with its greeting.  ``stop()`` always reaps the process.  ``kill()`` and
``start()`` again on the same object restart the server from its WAL on the
same port, which the fault tests rely on.
"""
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time

INSTALL_HINT = ("the Tarantool server binary 'tarantool' is not on PATH; install it with "
                "'sudo apt-get install tarantool' (Debian/Ubuntu) or run 'make test', "
                "which installs it; or name a binary with TARANTOOL=/path/to/tarantool")

GREETING_SIZE = 128


def find_binary():
    """Path of the server binary: ``$TARANTOOL`` when set (any build, e.g. one of
    ``../shared/tarantool/*/tarantool``), else ``tarantool`` on PATH; RuntimeError
    saying how to get one otherwise."""
    named = os.environ.get("TARANTOOL")
    if named:
        path = shutil.which(named)
        if path is None:
            raise RuntimeError("TARANTOOL=%s is not an executable file" % named)
        return os.path.abspath(path)
    path = shutil.which("tarantool")
    if path is None:
        raise RuntimeError(INSTALL_HINT)
    return path


def binary_version(binary=None):
    """The server's version as a tuple of ints, e.g. ``(3, 8, 0)``."""
    out = subprocess.run([binary or find_binary(), "--version"], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, check=True).stdout
    words = out.split()
    number = words[1].split("-")[0] if len(words) > 1 else ""
    return tuple(int(part) for part in number.split(".") if part.isdigit())


def free_port():
    """A local port nothing is bound to, below the kernel's range of ephemeral
    ports: the local ports of outgoing connections (a test's clients, a replica
    connecting to a peer not started yet) come from that range, and one of them
    could take a port picked there before the server binds it.  Never one this
    process was given before: a replica set picks its members' ports before it
    starts them, and two equal picks (one in 16,384 per pair) fail the second
    start with "Address already in use"."""
    low = _ephemeral_low()
    first, last = _slice(max(1024, low - 16384), low)
    for _ in range(100):
        port = _ports.randrange(first, last)
        if port in _given:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _given.add(port)
        return port
    with socket.socket() as sock:   # (all taken: let the kernel pick)
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


_ports = random.Random()   # (not the global one: tests seed that)


def _slice(first, last):
    """This process's share of the ports ``first`` to ``last``: tests run in
    parallel processes (pytest-xdist) pick from disjoint slices, so two of
    them never start servers on one port."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if not worker.startswith("gw") or not worker[2:].isdigit() or count < 2:
        return first, last
    size = (last - first) // count
    index = int(worker[2:]) % count
    return first + index * size, first + (index + 1) * size
_given = set()             # every port free_port returned in this process


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768   # Linux's default


def _lua_str(value):
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"


def _lua_value(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return _lua_str(value)


class TarantoolServer:
    """One local ``tarantool`` process.  Use as a context manager or call start/stop."""

    def __init__(self, lua="", *, port=None, unix_socket=False, wal_mode="write",
                 memtx_memory=1 << 30, readahead=1 << 20, workdir=None, cfg=None):
        self.lua = lua
        self.cfg = dict(cfg or {})   # more box.cfg options: str, int, float or bool values
        self.wal_mode = wal_mode
        self.memtx_memory = memtx_memory
        self.readahead = readahead
        self._own_workdir = workdir is None
        self.workdir = workdir or tempfile.mkdtemp(prefix="gtarantool-")
        self.host = "127.0.0.1"
        if unix_socket:
            self.host = None
            self.port = os.path.join(self.workdir, "tarantool.sock")
        else:
            self.port = port or free_port()
        self.process = None
        self.log_path = os.path.join(self.workdir, "tarantool.log")
        self._ready_path = os.path.join(self.workdir, "ready")

    @property
    def listen(self):
        return self.port if self.host is None else "%s:%d" % (self.host, self.port)

    @property
    def pid(self):
        return self.process.pid if self.process else None

    def _write_init(self):
        path = os.path.join(self.workdir, "init.lua")
        with open(path, "w") as f:
            # feedback_enabled=false: 2.11's and 3.x's feedback daemon
            # collects metrics every minute with a select of its own, which
            # box.stat() counts (a bench phase's counts would be one off), and
            # a throwaway server has nobody to report to.
            f.write("box.cfg{listen=%s, work_dir=%s, wal_mode=%s, memtx_memory=%d, "
                    "readahead=%d, log=%s, net_msg_max=%d, feedback_enabled=false%s}\n"
                    % (_lua_str(self.listen), _lua_str(self.workdir), _lua_str(self.wal_mode),
                       self.memtx_memory, self.readahead, _lua_str(self.log_path), 1 << 16,
                       "".join(", %s=%s" % (name, _lua_value(value))
                               for name, value in self.cfg.items())))
            f.write(self.lua)
            f.write("\n")
            # box.cfg returns after recovery; before that the port may already
            # answer with "bootstrap hasn't finished yet".
            f.write("io = require('fio').open(%s, {'O_CREAT', 'O_WRONLY'}, tonumber('644', 8))"
                    " io:close()\n" % _lua_str(self._ready_path))
        return path

    def start(self, timeout=30.0):
        """Start (or restart) the server and wait for its greeting."""
        binary = find_binary()
        init = self._write_init()
        for stale in ([self.port] if self.host is None else []) + [self._ready_path]:
            if os.path.exists(stale):
                os.unlink(stale)
        self.process = subprocess.Popen([binary, init], cwd=self.workdir,
                                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError("tarantool exited with code %s during start-up; log:\n%s"
                                   % (self.process.returncode, self.log_tail()))
            if os.path.exists(self._ready_path) and self._answers():
                return self
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("tarantool did not answer on %s within %.0fs; log:\n%s"
                                   % (self.listen, timeout, self.log_tail()))
            time.sleep(0.05)

    def _answers(self):
        family = socket.AF_UNIX if self.host is None else socket.AF_INET
        address = self.port if self.host is None else (self.host, self.port)
        try:
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                sock.settimeout(1.0)
                sock.connect(address)
                data = b""
                while len(data) < GREETING_SIZE:
                    chunk = sock.recv(GREETING_SIZE - len(data))
                    if not chunk:
                        return False
                    data += chunk
                return data.startswith(b"Tarantool")
        except OSError:
            return False

    def log_tail(self, lines=30):
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return "(no log)"

    def signal(self, signum):
        self.process.send_signal(signum)

    def kill(self):
        """SIGKILL the server and reap it; the data directory stays for a restart."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self):
        """Stop the server: SIGCONT (in case it was frozen), SIGTERM, then SIGKILL."""
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def cleanup(self):
        self.stop()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.cleanup()
