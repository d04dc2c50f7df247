"""One server under load: a throwaway embedded Tarantool or an existing one.

``open_server_target(config)`` yields a :class:`Target`; an embedded server is stopped when
the block exits, whatever the reason (error, Ctrl-C).  The target's admin connection creates
and empties the bench space and reads ``box.stat()``; it only ever sends EVAL requests, so it
never adds to the INSERT/SELECT/UPDATE/DELETE counters the run compares with the client's.
"""
import contextlib
import os

import tarantool

from gtarantool.testing.server import TarantoolServer, binary_version

HERE = os.path.dirname(os.path.abspath(__file__))
PREPARE_LUA = os.path.join(HERE, "prepare.lua")

# The embedded server lets the guest user do everything the benchmark does; it creates the
# space as admin, since guest may not create spaces.
EMBEDDED_LUA = """
box.schema.user.grant('guest', 'read,write,execute', 'universe', nil, {if_not_exists = true})
assert(loadfile(%r))(%r)
"""


# The server's own CPU seconds (user + system, every thread): misc.getrusage where the
# server has it, else getrusage(2) through LuaJIT's ffi.
SERVER_CPU_LUA = """
local ok, misc = pcall(require, 'misc')
if ok and type(misc) == 'table' and misc.getrusage then
    local r = misc.getrusage()
    if type(r) == 'table' and r.utime and r.stime then return r.utime + r.stime end
end
local ffi = require('ffi')
-- Tarantool 3.x declares struct rusage and getrusage itself; 2.x does not.
if not pcall(ffi.typeof, 'struct rusage') then
    ffi.cdef[[
        struct bench_timeval { long tv_sec; long tv_usec; };
        struct rusage { struct bench_timeval ru_utime; struct bench_timeval ru_stime;
                        long ru_rest[14]; };
    ]]
end
if not pcall(function() return ffi.C.getrusage end) then
    ffi.cdef('int getrusage(int who, struct rusage *usage);')
end
local r = ffi.new('struct rusage')
if ffi.C.getrusage(0, r) ~= 0 then return nil end
return tonumber(r.ru_utime.tv_sec) + tonumber(r.ru_utime.tv_usec) / 1e6
    + tonumber(r.ru_stime.tv_sec) + tonumber(r.ru_stime.tv_usec) / 1e6
"""


def _proc_cpu(pid):
    """User+system CPU seconds of process ``pid`` from /proc/<pid>/stat, None if unreadable."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def version_tuple(text):
    """``"2.11.9-0-g..."`` -> ``(2, 11, 9)``."""
    numbers = []
    for part in str(text).split("-")[0].split("."):
        if not part.isdigit():
            break
        numbers.append(int(part))
    return tuple(numbers)


class SetupError(RuntimeError):
    """The server cannot be used as asked; the message says what to change."""


class Target:
    def __init__(self, host, port, config, server=None):
        self.host, self.port = host, port
        self.config = config
        self.server = server
        self.user = config.user or "guest"
        try:
            self.admin = tarantool.Connection(host, port, user=config.user,
                                              password=config.password)
        except tarantool.error.Error as exc:
            raise SetupError("cannot connect to %s:%s as %s: %s"
                             % (host, port, self.user, exc)) from exc
        self.version = self._eval("return box.info.version")[0]
        # On 2.11 and 3.x the feedback daemon selects once a minute, counted by box.stat.
        self.feedback = self._eval("return box.cfg.feedback_enabled == true")[0]
        self.cpu_source, self.cpu_missing = ("process", None) if server is not None \
            else self._find_cpu_source()

    def _find_cpu_source(self):
        """How an existing server's CPU time can be read: ``("lua", None)`` through the
        connection, ``("proc", None)`` from /proc/<pid>/stat on this host, or
        ``(None, why)``."""
        try:
            if self._eval(SERVER_CPU_LUA)[0] is not None:
                return "lua", None
        except tarantool.error.Error as exc:
            lua_error = str(exc)
        else:
            lua_error = "neither misc.getrusage nor ffi's getrusage answered"
        try:
            self.server_pid = self._eval("return box.info.pid")[0]
        except tarantool.error.Error:
            self.server_pid = None
        if self.server_pid and _proc_cpu(self.server_pid) is not None \
                and self.host in ("127.0.0.1", "localhost", "::1"):
            return "proc", None
        return None, ("the server's CPU time cannot be read: %s, and it does not run on "
                      "this host" % lua_error)

    @property
    def pid(self):
        """The embedded server's pid (for its CPU time), None for an existing server."""
        return self.server.pid if self.server else None

    def describe(self):
        return {"host": self.host, "port": self.port, "embedded": self.server is not None,
                "wal": self.config.wal if self.server else None, "version": self.version,
                "feedback": self.feedback, "cpu_source": self.cpu_source,
                "cpu_missing": self.cpu_missing}

    def _eval(self, lua, *args):
        try:
            return self.admin.eval(lua, list(args)).data
        except tarantool.error.DatabaseError as exc:
            if "Execute access" in str(exc):
                raise SetupError(
                    "user %r may not evaluate Lua, which the benchmark needs for box.stat() "
                    "and to set up its space; on the server run: "
                    "box.schema.user.grant(%r, 'execute', 'universe')"
                    % (self.user, self.user)) from exc
            raise

    def supports(self, version):
        """True when the server is at least ``version``, e.g. ``(2, 10)``."""
        return version_tuple(self.version) >= version

    def prepare(self, space):
        """Create ``space`` if it is missing, then empty it."""
        with open(PREPARE_LUA) as f:
            lua = f.read()
        try:
            self._eval(lua, space)
        except tarantool.error.NetworkError:
            raise   # (a DatabaseError too, but the server went away: not a missing grant)
        except tarantool.error.DatabaseError as exc:
            raise SetupError(
                "cannot set up space %r as user %r: %s. On the server, either create it as "
                "admin: box.schema.space.create(%r):create_index('primary', {parts = {1, "
                "'unsigned'}}); box.schema.user.grant(%r, 'read,write', 'space', %r) "
                "or let the user create it: box.schema.user.grant(%r, 'read,write,create', "
                "'universe')" % (space, self.user, exc, space, self.user, space, self.user)
            ) from exc
        self.admin.flush_schema()

    def stat(self):
        """``box.stat()`` totals by request type, e.g. {'INSERT': 100000, ...}."""
        return {name: value["total"] for name, value in self._eval("return box.stat()")[0].items()}

    def cpu_seconds(self):
        """User+system CPU seconds of the server (all its threads): the embedded one's
        from its process, an existing one's through the connection or /proc when it
        runs here; None when neither can be read (``cpu_missing`` says why)."""
        if self.cpu_source == "process":
            import psutil
            times = psutil.Process(self.pid).cpu_times()
            return times.user + times.system
        if self.cpu_source == "lua":
            return self._eval(SERVER_CPU_LUA)[0]
        if self.cpu_source == "proc":
            return _proc_cpu(self.server_pid)
        return None

    def settle(self):
        """Called before each phase (a replica set waits for its replicas)."""

    def close(self):
        self.admin.close()


@contextlib.contextmanager
def open_server_target(config):
    """Yield the Target for one server: the one at ``config.host``, or a new embedded one
    that is stopped when the block exits."""
    if not config.embedded:
        target = Target(config.host, config.port, config)
        try:
            yield target
        finally:
            target.close()
        return
    # A transaction spans requests: memtx lets it yield between them only under MVCC.
    mvcc = config.workload != "phases" and config.mix.get("tx", 0) > 0 \
        and binary_version() >= (2, 10)
    server = TarantoolServer(EMBEDDED_LUA % (PREPARE_LUA, config.space), wal_mode=config.wal,
                             cfg={"memtx_use_mvcc_engine": True} if mvcc else None)
    try:
        server.start()
        target = Target(server.host, server.port, config, server)
        try:
            yield target
        finally:
            target.close()
    finally:
        server.cleanup()
