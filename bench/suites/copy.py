"""``python -m bench.copy``: what a bulk import costs the client, against a raw socket.

One throwaway server (``$TARANTOOL`` picks the binary).  For each row shape
(``3col``: an unsigned, a 12-byte string and an integer; ``1536b``: an
unsigned and a string, 1,536 bytes encoded) and ``--rows`` rows, interleaved
``--runs`` times, each into an empty space:

* ``raw``: the insert requests encoded before the clock starts, written to a
  plain socket as fast as it takes them while the replies are counted (the
  floor: no client work but the system calls);
* ``pipeline``: ``conn.pipeline()`` inserts of the same tuples, replies read;
* ``copy_from``: :func:`gtarantool.copy.copy_from` of the same tuples;
* ``cli``: ``python -m gtarantool.copy from FILE --procs P`` of the same rows
  as CSV, parsing and conversion included (its CPU: every process of it).
  The same command on an empty file gives its fixed cost (the interpreter's
  start-up and imports, the worker's start, the connection, the exit), and a
  line says what the rows cost beyond it.

Then, with the rows in the space, selects of each row by its key, also
interleaved:

* ``raw``: the select requests encoded before the clock starts, written to a
  plain socket at most 10,000 ahead of the replies, which are counted;
* ``raw+decode``: the same, every reply decoded (its header and body, by one
  streaming msgpack unpacker) and its tuples counted: the least any client
  does to hand the rows over;
* ``pipeline``: ``p.select(space, key)`` on ``conn.pipeline()`` 10,000 at a
  time, each reply's ``.data`` read;
* ``select_many``: ``p.select_many(space, keys)``, 10,000 keys a pipeline,
  each reply's ``.data`` read.

The figure is rows per client CPU-second (user + system), the median over
runs, and its ratio to ``raw``'s.  CPU time is what a busy host moves least;
wall time is printed beside it.  ``--demo N`` instead generates an N-row CSV
file of customers and imports it with the command line (``make copy-demo``).
"""
import argparse
import os
import resource
import select
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time

import msgpack

import gtarantool
from bench.core.config import positive_int
from gtarantool.copy import copy_from
from gtarantool.testing.server import TarantoolServer, binary_version

LUA = """
box.schema.user.grant('guest', 'super', nil, nil, {if_not_exists = true})
for _, name in ipairs({'rows3', 'rows1536'}) do
    local s = box.schema.space.create(name, {if_not_exists = true})
    s:create_index('pk', {if_not_exists = true})
end
box.space.rows3:format({{'id', 'unsigned'}, {'name', 'string'}, {'n', 'integer'}})
box.space.rows1536:format({{'id', 'unsigned'}, {'payload', 'string'}})
local c = box.schema.space.create('customers', {if_not_exists = true, format = {
    {'id', 'unsigned'}, {'name', 'string'}, {'email', 'string'}, {'city', 'string'},
    {'signup', 'string'}, {'balance', 'number'}, {'active', 'boolean'}}})
c:create_index('pk', {if_not_exists = true})
"""

SHAPES = {"3col": "rows3", "1536b": "rows1536"}
WINDOW = 10000   # selects in flight at most (a pipeline of that many at a time)
INSERT_WINDOW = 20000   # inserts in flight at most (copy_from's default max_in_flight)


def rows_of(shape, n):
    if shape == "3col":
        return [(k, "name-%07d" % k, k * 7) for k in range(n)]
    pad = "x" * (1536 - 12)
    return [(k, pad) for k in range(n)]


def csv_of(rows):
    return "".join("%s\n" % ",".join(str(v) for v in row) for row in rows)


def raw_requests(space_id, rows):
    """(the insert requests in one piece, where each ends)."""
    out, ends, end = [], [], 0
    for sync, row in enumerate(rows, 1):
        frame = msgpack.packb({0: 2, 1: sync}) + msgpack.packb({0x10: space_id, 0x21: row})
        out.append(b"\xce" + struct.pack(">I", len(frame)) + frame)
        end += len(out[-1])
        ends.append(end)
    return b"".join(out), ends


def raw_selects(space_id, keys):
    """(the select requests in one piece, where each ends)."""
    out, ends, end = [], [], 0
    for sync, key in enumerate(keys, 1):
        frame = msgpack.packb({0: 1, 1: sync}) + msgpack.packb(
            {0x10: space_id, 0x11: 0, 0x12: 0xFFFFFFFF, 0x13: 0, 0x14: 0, 0x20: [key]})
        out.append(b"\xce" + struct.pack(">I", len(frame)) + frame)
        end += len(out[-1])
        ends.append(end)
    return b"".join(out), ends


def run_raw(srv, payload, n, ends, window=WINDOW, decode=False):
    """``payload``'s ``n`` requests (``ends``: where each ends) written as fast
    as the socket takes them, at most ``window`` ahead of the replies counted
    (as a pipeline or copy_from keeps its requests in flight bounded: 100,000
    at once would pile up at the server).  ``decode``: every reply's header
    and body decoded as well, by one streaming msgpack unpacker (a reply's
    length prefix is a msgpack integer too), and its tuples counted."""
    sock = socket.create_connection((srv.host, srv.port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    greeting = b""
    while len(greeting) < 128:
        greeting += sock.recv(128 - len(greeting))
    sock.setblocking(False)
    view = memoryview(payload)
    sent, replies, buf = 0, 0, b""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False) if decode else None
    objects, found = 0, 0
    cpu, wall = time.process_time(), time.perf_counter()
    while replies < n:
        limit = ends[min(n, replies + window) - 1]
        want_write = [sock] if sent < limit else []
        readable, writable, _ = select.select([sock], want_write, [], 60)
        if not readable and not writable:
            raise RuntimeError("raw: no reply from the server for 60 s (%d of %d)"
                               % (replies, n))
        if writable:
            try:
                sent += sock.send(view[sent:min(limit, sent + (1 << 20))])
            except BlockingIOError:
                pass
        if readable:
            data = sock.recv(1 << 20)
            if not data:
                raise RuntimeError("raw: the server closed the connection (%d of %d replies)"
                                   % (replies, n))
            if unpacker is not None:
                unpacker.feed(data)
                for obj in unpacker:   # size, header, body; size, header, body; ...
                    objects += 1
                    if objects % 3 == 0:
                        found += len(obj.get(0x30, ()))
                replies = objects // 3
                continue
            buf += data
            pos = 0
            while len(buf) - pos >= 5:
                size = struct.unpack_from(">I", buf, pos + 1)[0]
                if len(buf) - pos < 5 + size:
                    break
                pos += 5 + size
                replies += 1
            buf = buf[pos:]
    result = time.process_time() - cpu, time.perf_counter() - wall
    sock.close()
    if decode and found != n:
        raise RuntimeError("raw: %d tuples in %d replies" % (found, n))
    return result


def run_pipeline(conn, space, rows):
    cpu, wall = time.process_time(), time.perf_counter()
    for start in range(0, len(rows), 10000):
        with conn.pipeline() as p:
            for row in rows[start:start + 10000]:
                p.insert(space, row)
        for reply in p.results():
            if isinstance(reply, Exception):
                raise reply
    return time.process_time() - cpu, time.perf_counter() - wall


def _selects_per_pipeline(conn, space, keys, queue):
    """``queue(p, space, keys)`` of WINDOW keys a pipeline, each reply's rows read."""
    cpu, wall = time.process_time(), time.perf_counter()
    found = 0
    for start in range(0, len(keys), WINDOW):
        with conn.pipeline() as p:
            queue(p, space, keys[start:start + WINDOW])
        for reply in p.results():
            if isinstance(reply, Exception):
                raise reply
            found += len(reply.data)
    assert found == len(keys), (found, len(keys))
    return time.process_time() - cpu, time.perf_counter() - wall


def _select_each(p, space, keys):
    for key in keys:
        p.select(space, key)


def run_pipeline_select(conn, space, keys):
    return _selects_per_pipeline(conn, space, keys, _select_each)


def run_select_many(conn, space, keys):
    return _selects_per_pipeline(conn, space, keys, lambda p, space, keys:
                                 p.select_many(space, keys))


def run_copy(conn, space, rows):
    cpu, wall = time.process_time(), time.perf_counter()
    report = copy_from(conn, space, rows)
    assert report.written == len(rows), report
    return time.process_time() - cpu, time.perf_counter() - wall


def run_cli(srv, space, path, procs, extra=()):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "gtarantool.copy", "from", path, "--space", space,
                          "--host", srv.host, "--port", str(srv.port), "--procs", str(procs)]
                         + list(extra), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                         text=True, check=False)
    wall = time.perf_counter() - wall
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        raise RuntimeError("the import failed: %s" % out.stdout)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return cpu, wall, out.stdout.strip()


def truncate(conn, space):
    conn.eval("box.space.%s:truncate()" % space)


def bench(args):
    srv = TarantoolServer(LUA, memtx_memory=2 << 30)
    srv.start()
    conn = gtarantool.connect(srv.host, srv.port)
    tmp = tempfile.mkdtemp(prefix="gtarantool-copy-bench-")
    empty = os.path.join(tmp, "empty.csv")
    open(empty, "w").close()
    try:
        print("server %s, %d rows per run, %d runs interleaved, Python %s"
              % (".".join(map(str, binary_version())), args.rows, args.runs,
                 sys.version.split()[0]))
        for shape in args.shapes:
            space = SHAPES[shape]
            rows = rows_of(shape, args.rows)
            space_id = conn.space(space).space_no
            payload, payload_ends = raw_requests(space_id, rows)
            path = os.path.join(tmp, shape + ".csv")
            with open(path, "w") as f:
                f.write(csv_of(rows))
            kinds = {"raw": lambda: run_raw(srv, payload, len(rows), payload_ends, INSERT_WINDOW),
                     "pipeline": lambda: run_pipeline(conn, space, rows),
                     "copy_from": lambda: run_copy(conn, space, rows),
                     "cli": lambda: run_cli(srv, space, path, args.procs)[:2]}
            figures = {k: [] for k in kinds}
            cli_cpu, startup = [], []
            for _ in range(args.runs):
                for kind, run in kinds.items():
                    truncate(conn, space)
                    cpu, wall = run()
                    written = conn.eval("return box.space.%s:len()" % space).data[0]
                    if written != len(rows):   # (raw reads no reply's code)
                        raise RuntimeError("%s wrote %d of %d rows" % (kind, written, len(rows)))
                    figures[kind].append((len(rows) / cpu, wall))
                    if kind == "cli":
                        cli_cpu.append(cpu)
                # the command line's fixed cost: the same command on an empty file
                startup.append(run_cli(srv, space, empty, args.procs)[0])
            print("\n%s rows (%d bytes encoded):" % (shape, len(msgpack.packb(rows[0]))))
            base = _table(figures)
            fixed = statistics.median(startup)
            rows_cpu = statistics.median(c - fixed for c in cli_cpu)
            print("  cli on an empty file (start-up, connection, exit): %.3f CPU-s; the "
                  "rows beyond it: %s rows/CPU-s, %.2f x raw"
                  % (fixed, format(int(len(rows) / rows_cpu), ",") if rows_cpu > 0 else "-",
                     len(rows) / rows_cpu / base if rows_cpu > 0 else 0.0))
            truncate(conn, space)
            copy_from(conn, space, rows)
            keys = [row[0] for row in rows]
            selects, ends = raw_selects(space_id, keys)
            kinds = {"raw": lambda: run_raw(srv, selects, len(keys), ends),
                     "raw+decode": lambda: run_raw(srv, selects, len(keys), ends, decode=True),
                     "pipeline": lambda: run_pipeline_select(conn, space, keys),
                     "select_many": lambda: run_select_many(conn, space, keys)}
            figures = {k: [] for k in kinds}
            for _ in range(args.runs):
                for kind, run in kinds.items():
                    cpu, wall = run()
                    figures[kind].append((len(keys) / cpu, wall))
            print("%s selects by key (one row each):" % shape)
            _table(figures)
        steal = _steal()
        if steal is not None:
            print("\nhost CPU stolen during the run: %.1f%%" % steal)
    finally:
        conn.close()
        srv.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)


def _table(figures):
    """Print each kind's median rows per CPU-second against raw's; returns raw's."""
    base = statistics.median(f[0] for f in figures["raw"])
    print("  %-12s %14s %8s %10s" % ("", "rows/CPU-s", "x raw", "wall s"))
    for kind, runs in figures.items():
        per_cpu = statistics.median(f[0] for f in runs)
        print("  %-12s %14s %8.2f %10.2f" % (kind, format(int(per_cpu), ","), per_cpu / base,
                                             statistics.median(f[1] for f in runs)))
    return base


_STEAL_START = None


def _steal_counters():
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    return fields[7], sum(fields)


def _steal():
    if _STEAL_START is None:
        return None
    steal, total = _steal_counters()
    return 100.0 * (steal - _STEAL_START[0]) / max(1, total - _STEAL_START[1])


CITIES = ["Lisbon", "Porto", "Berlin", "Hamburg", "Warsaw", "Krakow", "Madrid", "Seville",
          "Oslo", "Bergen", "Tallinn", "Riga", "Vilnius", "Prague", "Brno", "Vienna"]
FIRST = ["Ana", "Bruno", "Clara", "Dmitri", "Elena", "Farid", "Greta", "Hugo", "Ines", "Jonas"]
LAST = ["Silva", "Nowak", "Garcia", "Hansen", "Tamm", "Novak", "Berg", "Ozols", "Costa"]


def demo_file(path, n):
    with open(path, "w") as f:
        f.write("id,name,email,city,signup,balance,active\n")
        for k in range(1, n + 1):
            first, last = FIRST[k % len(FIRST)], LAST[k * 7 % len(LAST)]
            f.write('%d,"%s %s",%s.%s%d@example.com,%s,2024-%02d-%02d,%d.%02d,%s\n'
                    % (k, first, last, first.lower(), last.lower(), k, CITIES[k % 16],
                       1 + k % 12, 1 + k % 28, k % 5000, k % 100,
                       "true" if k % 3 else "false"))


def demo(args):
    srv = TarantoolServer(LUA, memtx_memory=2 << 30)
    srv.start()
    tmp = tempfile.mkdtemp(prefix="gtarantool-copy-demo-")
    path = os.path.join(tmp, "customers.csv")
    try:
        demo_file(path, args.demo)
        print("server %s, %s: %d rows, %.1f MB"
              % (".".join(map(str, binary_version())), path, args.demo,
                 os.path.getsize(path) / 1e6), flush=True)
        for procs in args.demo_procs:
            conn = gtarantool.connect(srv.host, srv.port)
            truncate(conn, "customers")
            conn.close()
            cpu, wall, summary = run_cli(srv, "customers", path, procs, ["--header"])
            print("--procs %d: %s" % (procs, summary), flush=True)
    finally:
        srv.cleanup()
        os.remove(path)
        os.rmdir(tmp)


def main(argv=None):
    global _STEAL_START
    p = argparse.ArgumentParser(prog="python -m bench.copy", description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=positive_int, default=100000,
                   help="rows per run (default 100000)")
    p.add_argument("--runs", type=positive_int, default=3, help="interleaved runs (default 3)")
    p.add_argument("--shapes", type=lambda s: s.split(","), default=list(SHAPES),
                   metavar="S,S", help="row shapes: %s (default all)" % ", ".join(SHAPES))
    p.add_argument("--procs", type=int, default=1, help="the command line's worker processes")
    p.add_argument("--demo", type=positive_int, default=None, metavar="N",
                   help="import a generated N-row customers file with the command line")
    p.add_argument("--demo-procs", type=lambda s: [int(x) for x in s.split(",")],
                   default=[max(1, (os.cpu_count() or 2) - 1)], metavar="P,P")
    args = p.parse_args(argv)
    if args.procs < 0 or min(args.demo_procs) < 0:
        p.error("--procs and --demo-procs must be at least 0 "
                "(0: the import's own process works the rows)")
    unknown = set(args.shapes) - set(SHAPES)
    if unknown:
        p.error("unknown shapes %s; known: %s" % (", ".join(sorted(unknown)), ", ".join(SHAPES)))
    _STEAL_START = _steal_counters()
    if args.demo:
        demo(args)
    else:
        bench(args)
    return 0
