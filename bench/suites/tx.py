"""``python -m bench.tx``: what a request costs the client inside an interactive
transaction against a plain one, and how soon a watcher hears of ``box.broadcast``.

One throwaway server with memtx MVCC (``$TARANTOOL`` picks the binary; 2.10+).
``G`` greenlets share one connection; each kind of run does ``N`` replaces:

* ``plain``: ``conn.replace``;
* ``stream``: ``stream.replace`` on a stream per greenlet, no transaction;
* ``tx``: ``with conn.transaction() as tx:`` around every ``K`` replaces
  (BEGIN and COMMIT included, per replace: (K + 2) requests for K).

The kinds run interleaved, ``--runs`` times each; the figure is the client's
CPU time (user + system of this process, ``time.process_time``) per replace,
the median over runs, and its ratio to ``plain``'s median.

The watcher part: a server fiber calls ``box.broadcast(key, clock.time())``
every 5 ms; the callback subtracts that from ``time.time()`` (one host, one
clock): median and 99th percentile of broadcast -> callback, over ``--events``.
"""
import argparse
import statistics
import sys
import time

import gevent
from gevent.event import Event

import gtarantool
from gtarantool.testing.server import TarantoolServer, binary_version

LUA = """
box.schema.user.grant('guest', 'super', nil, nil, {if_not_exists = true})
local s = box.schema.space.create('txbench', {if_not_exists = true})
s:create_index('pk', {if_not_exists = true})
local clock = require('clock')
local fiber = require('fiber')
function broadcast_times(n, key)
    fiber.create(function()
        for i = 1, n do
            fiber.sleep(0.005)
            box.broadcast(key, clock.time())
        end
    end)
end
"""
KINDS = ("plain", "stream", "tx")


def run_kind(conn, kind, n, greenlets, per_tx):
    """Client CPU seconds for ``n`` replaces of ``kind`` from ``greenlets`` greenlets."""
    share = n // greenlets

    def worker(g):
        base = g * share
        if kind == "plain":
            for i in range(base, base + share):
                conn.replace("txbench", (i, "x"))
        elif kind == "stream":
            stream = conn.stream()
            for i in range(base, base + share):
                stream.replace("txbench", (i, "x"))
        else:
            for start in range(base, base + share, per_tx):
                with conn.transaction() as tx:
                    for i in range(start, min(start + per_tx, base + share)):
                        tx.replace("txbench", (i, "x"))
    cpu = time.process_time()
    gevent.joinall([gevent.spawn(worker, g) for g in range(greenlets)], raise_error=True)
    return time.process_time() - cpu, share * greenlets


def watcher_latency(conn, events):
    delays = []
    done = Event()

    def callback(key, value):
        if value is not None:
            delays.append(time.time() - value)
            if len(delays) >= events:
                done.set()
    watcher = conn.watch("bench.latency", callback)
    conn.call("broadcast_times", events, "bench.latency")
    done.wait(events * 0.05 + 10)
    watcher.unregister()
    delays.sort()
    return delays


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.tx", description=__doc__.split("\n")[0])
    parser.add_argument("-n", type=int, default=20000, help="replaces per run (default 20000)")
    parser.add_argument("-g", "--greenlets", type=int, default=100, help="default 100")
    parser.add_argument("-k", "--per-tx", type=int, default=5,
                        help="replaces per transaction (default 5)")
    parser.add_argument("--runs", type=int, default=5, help="runs of each kind (default 5)")
    parser.add_argument("--events", type=int, default=200,
                        help="broadcasts timed for the watcher latency (default 200)")
    args = parser.parse_args(argv)
    version = binary_version()
    if version < (2, 10):
        print("bench.tx: needs Tarantool 2.10+ (streams, watchers); server is %s"
              % ".".join(map(str, version)), file=sys.stderr)
        return 1
    with TarantoolServer(LUA, cfg={"memtx_use_mvcc_engine": True}) as srv:
        conn = gtarantool.connect(srv.host, srv.port)
        print("server %s, %d replaces x %d greenlets per run, %d per transaction, %d runs"
              % (".".join(map(str, version)), args.n, args.greenlets, args.per_tx, args.runs))
        run_kind(conn, "plain", args.n // 4, args.greenlets, args.per_tx)   # warm-up
        per_op = {kind: [] for kind in KINDS}
        for _ in range(args.runs):
            for kind in KINDS:
                cpu, done = run_kind(conn, kind, args.n, args.greenlets, args.per_tx)
                per_op[kind].append(cpu / done)
        base = statistics.median(per_op["plain"])
        requests = {"plain": 1.0, "stream": 1.0, "tx": (args.per_tx + 2) / args.per_tx}
        print("%-8s %14s %8s %16s %14s" % ("kind", "CPU us/replace", "ratio",
                                           "requests/replace", "CPU us/request"))
        for kind in KINDS:
            median = statistics.median(per_op[kind])
            print("%-8s %14.2f %8.2f %16.2f %14.2f" % (kind, median * 1e6, median / base,
                                                       requests[kind],
                                                       median * 1e6 / requests[kind]))
        delays = watcher_latency(conn, args.events)
        if delays:
            print("watcher: box.broadcast -> callback over %d events: median %.0f us, "
                  "p99 %.0f us" % (len(delays), statistics.median(delays) * 1e6,
                                   delays[min(len(delays) - 1, int(len(delays) * 0.99))] * 1e6))
        conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
