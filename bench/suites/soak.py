"""Soak: mixed load from gtarantool greenlets with faults injected at intervals.

    python -m bench.soak --duration 300        # or: make soak DURATION=300

A throwaway Tarantool (WAL on) serves two connections, one direct and one
through ``gtarantool.testing.faults.FaultProxy``.  Greenlets run a mix of inserts (each id
once, remembered when acknowledged), selects, updates, replaces, calls and
evals while an injector cycles through ``kill -9`` + restart from the WAL,
SIGSTOP/SIGCONT, proxy resets and resets in the middle of a frame.  At the end
every acknowledged insert is looked up in the restarted server.

Prints ops, errors by kind, faults injected, acknowledged writes lost (must be
0), calls slower than request_timeout + 1 s, and RSS at start, peak and end.
Exit status 1 when a write was lost or a call hung.  Not part of CI.
"""
import argparse
import array
import collections
import itertools
import random
import signal
import sys
import time

import gevent
import psutil
from gevent.event import Event

import gtarantool
from gtarantool.testing.faults import FaultProxy
from gtarantool.testing.server import TarantoolServer

LUA = """
box.once('soak', function()
    box.schema.user.grant('guest', 'read,write,execute', 'universe')
    local s = box.schema.space.create('soak')
    s:create_index('primary', {parts = {1, 'unsigned'}})
    local k = box.schema.space.create('soak_kv')
    k:create_index('primary', {parts = {1, 'unsigned'}})
end)
function soak_echo(...) return ... end
"""
MB = 1 << 20


def rss():
    return psutil.Process().memory_info().rss


def connect(host, port, timeout):
    deadline = time.monotonic() + 30
    while True:
        try:
            return gtarantool.connect(host, port, request_timeout=timeout,
                                      reconnect_max_attempts=3, reconnect_delay=0.1,
                                      connection_timeout=timeout)
        except gtarantool.NetworkError:
            if time.monotonic() > deadline:
                raise
            gevent.sleep(0.1)


class Soak:
    def __init__(self, args):
        self.args = args
        self.rng = random.Random(args.seed)
        self.ops = collections.Counter()
        self.errors = collections.Counter()
        self.faults = collections.Counter()
        self.acked = array.array("Q")      # compact: millions of ids
        self.slow = 0
        self.max_call = 0.0
        self.ids = itertools.count(1)
        self.stop = Event()
        self.peak = 0

    def worker(self, conn, n):
        rng = random.Random(n)
        limit = self.args.request_timeout + 1.0
        while not self.stop.is_set():
            r = rng.random()
            t0 = time.monotonic()
            try:
                if r < 0.4:
                    key = next(self.ids)
                    conn.insert("soak", (key, n, "v" * 64))
                    self.acked.append(key)
                    kind = "insert"
                elif r < 0.6:
                    conn.select("soak", rng.randrange(1, max(2, len(self.acked))))
                    kind = "select"
                elif r < 0.75:
                    conn.upsert("soak_kv", (n % 100, 0), [("+", 1, 1)])
                    kind = "upsert"
                elif r < 0.85:
                    conn.replace("soak_kv", (1000 + n, rng.random()))
                    kind = "replace"
                elif r < 0.95:
                    conn.call("soak_echo", n, "x" * rng.randrange(0, 2048))
                    kind = "call"
                else:
                    conn.eval("return ...", n)
                    kind = "eval"
                self.ops[kind] += 1
            except gtarantool.DatabaseError as exc:
                if isinstance(exc, gtarantool.NetworkError):
                    self.errors[type(exc).__name__] += 1
                else:       # the server's own refusals, by code (116: still loading)
                    self.errors["DatabaseError(%s)" % (exc.code,)] += 1
                gevent.sleep(0.05)
            except gtarantool.Error as exc:
                self.errors[type(exc).__name__] += 1
                gevent.sleep(0.05)
            finally:
                took = time.monotonic() - t0
                self.max_call = max(self.max_call, took)
                if took > limit:
                    self.slow += 1

    def sampler(self):
        while not self.stop.is_set():
            self.peak = max(self.peak, rss())
            gevent.sleep(0.25)

    def injector(self, server, proxy):
        hub = gevent.get_hub()
        cycle = itertools.cycle(["kill", "stop", "proxy_reset", "mid_frame"])
        while not self.stop.wait(self.args.fault_interval):
            fault = next(cycle)
            if fault == "kill":
                server.kill()
                gevent.sleep(self.rng.uniform(0.5, 3.0))
                hub.threadpool.apply(server.start)
            elif fault == "stop":
                server.signal(signal.SIGSTOP)
                gevent.sleep(self.rng.uniform(0.5, 2 * self.args.request_timeout))
                server.signal(signal.SIGCONT)
            elif fault == "proxy_reset":
                proxy.reset_all()
            else:
                proxy.reset_mid_frame()
            self.faults[fault] += 1
            self.log("fault %s injected" % fault)

    def log(self, msg):
        print("[%7.1fs] %s" % (time.monotonic() - self.t0, msg), flush=True)

    def run(self):
        args = self.args
        self.t0 = time.monotonic()
        # Every acknowledged insert stays for the final check: ~20,000 a second fill
        # 512 MB of memtx in about 200 s, so give the server room for long soaks.
        memtx = max(512, 16 * int(args.duration)) * MB
        with TarantoolServer(LUA, wal_mode="write", memtx_memory=memtx) as server, \
                FaultProxy(server.host, server.port) as proxy:
            direct = connect(server.host, server.port, args.request_timeout)
            proxied = connect(proxy.host, proxy.port, args.request_timeout)
            direct.ping()
            proxied.ping()
            rss_start = self.peak = rss()
            conns = [direct, proxied]
            workers = [gevent.spawn(self.worker, conns[n % 2], n)
                       for n in range(args.greenlets)]
            helpers = [gevent.spawn(self.sampler), gevent.spawn(self.injector, server, proxy)]
            last = 0
            deadline = self.t0 + args.duration
            while time.monotonic() < deadline:
                gevent.sleep(min(10.0, max(0.0, deadline - time.monotonic())))
                total = sum(self.ops.values())
                self.log("%d ops (+%d), errors %s, acked inserts %d, RSS %.0f MB"
                         % (total, total - last, dict(self.errors), len(self.acked),
                            rss() / MB))
                last = total
            self.stop.set()
            gevent.joinall(helpers, timeout=60)
            gevent.joinall(workers, timeout=args.request_timeout + 5)
            hung = sum(1 for w in workers if not w.dead)
            rss_end = rss()
            self.peak = max(self.peak, rss_end)
            elapsed = time.monotonic() - self.t0
            # Every acknowledged insert must be in the (possibly restarted) server.
            check = connect(server.host, server.port, 30)
            stored = set()
            last_key = 0
            while True:
                rows = check.select("soak", last_key, iterator="GT", limit=50000).data
                if not rows:
                    break
                stored.update(row[0] for row in rows)
                last_key = rows[-1][0]
            lost = len(set(self.acked) - stored)
            stats = {name: c.stats.as_dict() for name, c in (("direct", direct),
                                                             ("proxied", proxied))}
            for c in (direct, proxied, check):
                c.close()

        total = sum(self.ops.values())
        print()
        print("soak summary (%.0fs, %d greenlets, request_timeout %.1fs)"
              % (elapsed, args.greenlets, args.request_timeout))
        print("  ops ok            %d (%.0f ops/s): %s" % (total, total / elapsed,
                                                          dict(self.ops)))
        print("  errors by kind    %s" % (dict(self.errors) or "none"))
        print("  faults injected   %s" % (dict(self.faults) or "none"))
        print("  acked inserts     %d, stored rows %d" % (len(self.acked), len(stored)))
        print("  acked writes lost %d" % lost)
        print("  calls > timeout+1s %d (max call %.2fs), hung greenlets %d"
              % (self.slow, self.max_call, hung))
        print("  late replies discarded %d, reconnects %d"
              % (sum(s["discarded"] for s in stats.values()),
                 sum(s["reconnects"] for s in stats.values())))
        print("  RSS start %.0f MB, peak %.0f MB, end %.0f MB"
              % (rss_start / MB, self.peak / MB, rss_end / MB))
        return 1 if lost or hung or self.slow else 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=300, help="seconds (default 300)")
    p.add_argument("--greenlets", type=int, default=200)
    p.add_argument("--fault-interval", type=float, default=8.0,
                   help="seconds between injected faults")
    p.add_argument("--request-timeout", type=float, default=2.0)
    p.add_argument("--seed", type=int, default=1)
    return Soak(p.parse_args(argv)).run()


if __name__ == "__main__":
    sys.exit(main())
