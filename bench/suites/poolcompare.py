"""``python -m bench.poolcompare``: gtarantool.ConnectionPool against tarantool-python's
ConnectionPool on the same throwaway replica set (a master and two replicas).

Two figures, each client in its own process (tarantool-python's pool runs an OS
thread per instance: it runs without gevent, not monkey-patched):

* throughput: ``G`` greenlets (gtarantool) or threads (tarantool-python), each
  alternating a replace (RW) and a select (RO) of 100-byte tuples, for ``S``
  seconds; runs interleaved, medians reported;
* failover: 20 writers insert unique keys; the master is killed (SIGKILL), a
  replica promoted (``box.cfg{read_only = false}``) 0.3 s later (the kill comes at a
  random point of the pools' ``refresh_delay`` period); the figure is the
  time from the promotion to the first write acknowledged by the new master.
  Each failover run gets a fresh replica set.
"""
import argparse
import json
import random
import statistics
import subprocess
import sys
import threading
import time

from gtarantool.testing.replicaset import ReplicaSet

USER, PASSWORD = "bench", "bench"
LUA = """
box.once('poolcompare', function()
    box.schema.user.create(%r, {password = %r})
    box.schema.user.grant(%r, 'read,write,execute', 'universe')
    box.schema.space.create('kv'):create_index('pk', {parts = {1, 'unsigned'}})
end)
""" % (USER, PASSWORD, USER)
CLIENTS = ("gtarantool", "tarantool-python")
FAILOVER_WRITERS = 20


# -- the client processes --------------------------------------------------------------

def _pool(client, addrs, refresh_delay):
    import tarantool
    if client == "gtarantool":
        import gtarantool
        return gtarantool.ConnectionPool(addrs, user=USER, password=PASSWORD,
                                         refresh_delay=refresh_delay)
    return tarantool.ConnectionPool(addrs, user=USER, password=PASSWORD,
                                    refresh_delay=refresh_delay)


def _spawn_all(client, fn, n):
    """Start ``n`` greenlets (gtarantool) or threads; returns a join function."""
    if client == "gtarantool":
        import gevent
        workers = [gevent.spawn(fn, i) for i in range(n)]
        return lambda: gevent.joinall(workers)
    workers = [threading.Thread(target=fn, args=(i,), daemon=True) for i in range(n)]
    for worker in workers:
        worker.start()
    return lambda: [worker.join() for worker in workers]


def _sleep(client):
    if client == "gtarantool":
        import gevent
        return gevent.sleep
    return time.sleep


def child_throughput(client, addrs, greenlets, seconds):
    import tarantool
    pool = _pool(client, addrs, 1)
    payload = "x" * 100
    done = [0] * greenlets
    stop_at = time.monotonic() + seconds

    def work(i):
        key = i
        while time.monotonic() < stop_at:
            pool.replace("kv", (key, payload))
            pool.select("kv", key, mode=tarantool.Mode.RO)
            done[i] += 2
            key += greenlets
    cpu = time.process_time()
    started = time.monotonic()
    _spawn_all(client, work, greenlets)()
    elapsed = time.monotonic() - started
    cpu = time.process_time() - cpu
    pool.close()
    return {"ops_per_sec": sum(done) / elapsed, "cpu_per_op_us": cpu / sum(done) * 1e6}


def child_failover(client, addrs, refresh_delay, seconds):
    """Writes until ``seconds`` have passed; prints the wall-clock time of each ack."""
    import tarantool
    pool = _pool(client, addrs, refresh_delay)
    acks, errors = [], {}
    stop_at = time.monotonic() + seconds
    sleep = _sleep(client)

    def write(i):
        key = i
        while time.monotonic() < stop_at:
            key += FAILOVER_WRITERS
            try:
                pool.insert("kv", (key, "w"))
                acks.append(time.time())
            except tarantool.error.Error as exc:
                errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                sleep(0.005)
    print(json.dumps({"ready": True}), flush=True)
    _spawn_all(client, write, FAILOVER_WRITERS)()
    pool.close()
    return {"acks": acks, "errors": errors}


# -- the parent ------------------------------------------------------------------------

def _start_child(args):
    return subprocess.Popen([sys.executable, "-m", "bench.poolcompare", "--child"] + args,
                            stdout=subprocess.PIPE, text=True)


def throughput(rs, client, greenlets, seconds):
    addrs = json.dumps(rs.addrs)
    proc = _start_child([client, "throughput", addrs, str(greenlets), str(seconds)])
    out, _ = proc.communicate()
    if proc.returncode:
        raise SystemExit("%s throughput child failed" % client)
    return json.loads(out.splitlines()[-1])


def failover(client, refresh_delay, seconds=6.0):
    with ReplicaSet(LUA, user=USER, password=PASSWORD) as rs:
        proc = _start_child([client, "failover", json.dumps(rs.addrs), str(refresh_delay),
                             str(seconds)])
        proc.stdout.readline()       # ready
        # A random phase against the pools' periodic checks (which start with them).
        time.sleep(1.0 + random.uniform(0, refresh_delay))
        rs.master.kill()
        time.sleep(0.3)
        rs.promote(rs.replicas[0])
        promoted = time.time()
        out, _ = proc.communicate()
        result = json.loads(out.splitlines()[-1])
    after = [t for t in result["acks"] if t > promoted]
    return {"seconds": (min(after) - promoted) if after else None,
            "errors": result["errors"]}


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.poolcompare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="interleaved runs (default 3)")
    parser.add_argument("--seconds", type=float, default=3, help="per throughput run")
    parser.add_argument("--greenlets", type=int, default=100,
                        help="greenlets / threads (default 100)")
    parser.add_argument("--refresh-delay", type=float, default=1.0,
                        help="refresh_delay of both pools (default 1, both libraries' default)")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        client, what, addrs, *rest = args.child
        addrs = json.loads(addrs)
        if what == "throughput":
            result = child_throughput(client, addrs, int(rest[0]), float(rest[1]))
        else:
            result = child_failover(client, addrs, float(rest[0]), float(rest[1]))
        print(json.dumps(result), flush=True)
        return 0
    from gtarantool.testing.server import binary_version
    version = ".".join(map(str, binary_version()))
    figures = {client: {"ops": [], "cpu": [], "failover": [], "errors": []} for client in CLIENTS}
    with ReplicaSet(LUA, user=USER, password=PASSWORD) as rs:
        for _ in range(args.runs):
            for client in CLIENTS:
                result = throughput(rs, client, args.greenlets, args.seconds)
                figures[client]["ops"].append(result["ops_per_sec"])
                figures[client]["cpu"].append(result["cpu_per_op_us"])
    for _ in range(args.runs):
        for client in CLIENTS:
            result = failover(client, args.refresh_delay)
            figures[client]["failover"].append(result["seconds"])
            figures[client]["errors"].append(result["errors"])
    print("Tarantool %s, replica set of 3 on localhost; %d %s; %d runs interleaved, medians"
          % (version, args.greenlets, "greenlets/threads", args.runs))
    print("%-18s %12s %14s %30s" % ("client", "ops/s", "client CPU/op", "failover s (each run)"))
    for client in CLIENTS:
        f = figures[client]
        runs = ", ".join("n/a" if s is None else "%.3f" % s for s in f["failover"])
        done = [s for s in f["failover"] if s is not None]
        print("%-18s %12s %11.1f us %30s" % (
            client, "{:,.0f}".format(statistics.median(f["ops"])),
            statistics.median(f["cpu"]),
            "%s (median %s)" % (runs, "%.3f" % statistics.median(done) if done else "n/a")))
    print("refresh_delay=%s; failover: SIGKILL the master, promote a replica 0.3 s later, "
          "time from the promotion to the first acknowledged write" % args.refresh_delay)
    for client in CLIENTS:
        print("  %s errors while failing over: %s" % (client, figures[client]["errors"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
