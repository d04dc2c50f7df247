"""``python -m bench.restarts``: what callers see while the server restarts.

``--scenario restart``: one server, ``--writers`` greenlets inserting keys of
their own and ``--readers`` selecting, all on one connection (gtarantool) or
on tarantool-python's ``ConnectionPool`` of that one server; the server gets
SIGTERM and is started again at once, on the same data (``--rows`` rows to
recover besides the writes: it answers, read-only, while it loads them).

``--scenario rolling``: a master and two replicas; writers in RW, readers in
PREFER_RO, through ``gtarantool.ConnectionPool`` or tarantool-python's
``ConnectionPool``: each replica restarted in turn, the master switched over
(``read_only`` on it, then off on the first replica) and restarted read-only.

Printed: the errors callers saw (by type), the acknowledged writes missing
afterwards, the writes applied without an acknowledgement, and how long writes
waited (p50/p99/max over the run, the restarts included).  The process is
monkey-patched, so tarantool-python's blocking sockets and its pool's threads
run as greenlets beside the servers' control.  The server is ``$TARANTOOL``
(else ``tarantool`` on PATH)::

    TARANTOOL=/path/to/3.8.0/tarantool python -m bench.restarts --scenario restart \\
        --driver gtarantool
"""
from gevent import monkey

monkey.patch_all()

import argparse  # noqa: E402 - after patching, as every module that opens sockets
import collections  # noqa: E402
import signal  # noqa: E402
import time  # noqa: E402

import gevent  # noqa: E402
import tarantool  # noqa: E402
from tarantool.connection_pool import Mode  # noqa: E402

import gtarantool  # noqa: E402
from gtarantool.testing.replicaset import ReplicaSet  # noqa: E402
from gtarantool.testing.server import TarantoolServer, binary_version, find_binary  # noqa: E402

USER, PASSWORD = "bench", "secret"
LUA = """
box.once('restarts', function()
    box.schema.user.create('bench', {password = 'secret'})
    box.schema.user.grant('bench', 'read,write,execute', 'universe')
    box.schema.space.create('t'):create_index('pk')
    -- Data to recover: a restarted server stays read-only while it loads.
    local fill = box.schema.space.create('fill')
    fill:create_index('pk')
    for i = 1, %d, 10000 do
        box.begin()
        for k = i, i + 9999 do fill:insert{k, string.rep('x', 100)} end
        box.commit()
    end
end)
"""
REQUEST_TIMEOUT = 8.0   # longer than any restart here: callers may wait it out
SETTLE = 1.0            # seconds of load between two steps of a scenario


class Load:
    """Writers and readers on ``target`` until ``stop()``; what they saw."""

    def __init__(self, target, writers, readers, write_kw=None, read_kw=None):
        self.target = target
        self.acked, self.waits, self.read_waits = [], [], []
        self.errors = collections.Counter()
        self.examples = {}
        self.reads = 0
        self.callers_failed = set()   # the greenlets that saw an error
        self._stop = False
        self._write_kw = write_kw or {}
        self._read_kw = read_kw or {}
        self.greenlets = ([gevent.spawn(self._write, i) for i in range(writers)]
                          + [gevent.spawn(self._read, i) for i in range(readers)])

    def _failed(self, exc):
        self.callers_failed.add(gevent.getcurrent())
        kind = "%s(%s)" % (type(exc).__name__, getattr(exc, "code", "")) if getattr(
            exc, "code", None) else type(exc).__name__
        self.errors[kind] += 1
        self.examples.setdefault(kind, str(exc)[:120])

    def _write(self, i):
        n = 0
        while not self._stop:
            key = i * 10_000_000 + n
            n += 1
            started = time.monotonic()
            try:
                self.target.insert("t", (key, i), **self._write_kw)
            except Exception as exc:  # noqa: BLE001 - what a caller sees is the measurement
                self._failed(exc)
                gevent.sleep(0.01)   # (a caller retrying at once would only count more)
                continue
            self.waits.append(time.monotonic() - started)
            self.acked.append(key)

    def _read(self, i):
        while not self._stop:
            started = time.monotonic()
            try:
                self.target.select("t", i, **self._read_kw)
                self.reads += 1
                self.read_waits.append(time.monotonic() - started)
            except Exception as exc:  # noqa: BLE001 - as above
                self._failed(exc)
                gevent.sleep(0.01)

    def stop(self):
        self._stop = True
        gevent.joinall(self.greenlets, timeout=60)
        gevent.killall(self.greenlets)


def terminate(srv):
    srv.signal(signal.SIGTERM)
    while srv.process.poll() is None:
        gevent.sleep(0.01)


def restart(srv, read_only=None):
    terminate(srv)
    if read_only is not None:
        srv.cfg["read_only"] = read_only
    srv.start()


def keys_on(srv, acked=(), wait=5.0):
    """The keys in ``srv``'s space, once it has every key of ``acked`` or
    after ``wait`` seconds (the last writes may still be replicating)."""
    conn = tarantool.Connection(srv.host, srv.port, user=USER, password=PASSWORD,
                                fetch_schema=False)
    deadline = time.monotonic() + wait
    try:
        while True:
            keys = conn.eval("local r = {} for _, t in box.space.t:pairs() do "
                             "r[#r + 1] = t[1] end return r").data[0]
            if set(acked) <= set(keys) or time.monotonic() > deadline:
                return keys
            gevent.sleep(0.1)
    finally:
        conn.close()


def open_target(driver, servers):
    addrs = [{"host": srv.host, "port": srv.port} for srv in servers]
    if driver == "gtarantool":
        if len(servers) == 1:
            return gtarantool.connect(servers[0].host, servers[0].port, user=USER,
                                      password=PASSWORD, request_timeout=REQUEST_TIMEOUT)
        return gtarantool.ConnectionPool(addrs, user=USER, password=PASSWORD,
                                         wait_timeout=REQUEST_TIMEOUT,
                                         request_timeout=REQUEST_TIMEOUT)
    return tarantool.ConnectionPool(addrs, user=USER, password=PASSWORD)


def run_restart(driver, writers, readers, rows):
    srv = TarantoolServer(LUA % rows).start(timeout=120)
    try:
        target = open_target(driver, [srv])
        kw = {} if driver == "gtarantool" else {"mode": Mode.ANY}
        load = Load(target, writers, readers, read_kw=kw)
        gevent.sleep(SETTLE)
        started = time.monotonic()
        restart(srv)
        down = time.monotonic() - started
        gevent.sleep(2 * SETTLE)
        load.stop()
        keys = keys_on(srv, load.acked)
        extra = {"restart took (s)": "%.2f" % down}
        if driver == "gtarantool":
            extra["writes sent again once the server was writable"] = getattr(
                getattr(target, "_graceful", None), "resent", "n/a")
        target.close()
        # (tarantool-python's pool must not be left to be finalized at exit)
        del target
        load.target = None
        return load, keys, extra
    finally:
        srv.cleanup()


def run_rolling(driver, writers, readers, rows):
    rs = ReplicaSet(LUA % rows, user=USER, password=PASSWORD).start()
    try:
        master, first, second = rs.servers
        target = open_target(driver, rs.servers)
        load = Load(target, writers, readers, write_kw={"mode": Mode.RW},
                    read_kw={"mode": Mode.PREFER_RO})
        gevent.sleep(SETTLE)
        for replica in (first, second):
            restart(replica)
            gevent.sleep(SETTLE)
        rs.eval(master, "box.cfg{read_only = true}")
        rs.wait_caught_up(first, master)
        rs.promote(first)
        gevent.sleep(SETTLE)
        restart(master, read_only=True)
        gevent.sleep(SETTLE)
        load.stop()
        keys = keys_on(first, load.acked)
        extra = {}
        if driver == "gtarantool":
            extra["writes re-routed after a refusal"] = getattr(target, "rerouted_writes", "n/a")
        target.close()
        del target
        load.target = None
        return load, keys, extra
    finally:
        rs.cleanup()


def percentile(values, fraction):
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def report(args, load, keys, extra):
    version = ".".join(map(str, binary_version()))
    print("scenario %s, driver %s, server Tarantool %s (%s)"
          % (args.scenario, args.driver, version, find_binary()))
    print("  callers: %d writers, %d readers; %d rows to recover; acknowledged writes %d, "
          "reads %d" % (args.writers, args.readers, args.rows, len(load.acked), load.reads))
    print("  errors seen by callers: %d, by %d of the %d callers"
          % (sum(load.errors.values()), len(load.callers_failed), args.writers + args.readers))
    for kind, count in load.errors.most_common():
        print("    %6d %s: %s" % (count, kind, load.examples[kind]))
    present = set(keys)
    print("  acknowledged writes missing after: %d; applied without acknowledgement: %d; "
          "rows twice: %d" % (len(set(load.acked) - present), len(present - set(load.acked)),
                              len(keys) - len(present)))
    print("  write wait (s): p50 %.4f  p99 %.4f  max %.4f"
          % (percentile(load.waits, 0.5), percentile(load.waits, 0.99),
             max(load.waits, default=float("nan"))))
    print("  read wait (s):  p50 %.4f  p99 %.4f  max %.4f"
          % (percentile(load.read_waits, 0.5), percentile(load.read_waits, 0.99),
             max(load.read_waits, default=float("nan"))))
    for name, value in extra.items():
        print("  %s: %s" % (name, value))


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.restarts",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", choices=("restart", "rolling"), default="restart")
    parser.add_argument("--driver", choices=("gtarantool", "tarantool-python"),
                        default="gtarantool")
    parser.add_argument("--writers", type=int, default=None,
                        help="writing greenlets (default 100; rolling 60)")
    parser.add_argument("--readers", type=int, default=None,
                        help="reading greenlets (default 100; rolling 60)")
    parser.add_argument("--rows", type=int, default=200_000,
                        help="rows of 100 bytes the servers recover on each start, "
                             "a multiple of 10,000 (default 200,000)")
    args = parser.parse_args(argv)
    default = 100 if args.scenario == "restart" else 60
    args.writers = default if args.writers is None else args.writers
    args.readers = default if args.readers is None else args.readers
    run = run_restart if args.scenario == "restart" else run_rolling
    report(args, *run(args.driver, args.writers, args.readers, args.rows))


if __name__ == "__main__":
    main()
