"""``python -m gtarantool.copy from FILE`` / ``to FILE`` (also ``gtarantool-copy``).

``from``: the parent process reads the file in blocks of bytes and cuts
them into chunks at record ends (it parses nothing), honouring ``--skip-rows``,
``--max-rows`` and ``--rate``; ``--procs`` worker processes, each with its own
connection, parse, convert by the space's format and write with
:func:`gtarantool.copy.copy_from`, and answer once per chunk.  A worker holds
at most two chunks, so memory stays bounded whatever the file's size.
Rejected rows go to ``--errors FILE`` as they were in the input, their
reasons to ``FILE.reasons`` (without it, the first ones' reasons to
stderr).  Exit status: 0 when every row was written, 2 when some were
rejected, 1 on a fatal error; the summary names the rows known settled from
the start, which ``--skip-rows`` skips on a new run.

``to``: every tuple of the space (or an index range) in the same formats.
"""
from __future__ import annotations

import argparse
import codecs
import gc
import json
import math
import multiprocessing
import multiprocessing.connection
import os
import resource
import signal
import sys
import time
from typing import Any, Dict, Iterator, List, Optional, Tuple

from gtarantool.copy.formats import (
    FORMATS,
    BadRow,
    Converter,
    Exporter,
    blocks,
    dialect,
    lines_of,
    parse,
    records,
    split_records,
)

EXIT_OK, EXIT_FATAL, EXIT_REJECTED = 0, 1, 2
IN_FLIGHT_CHUNKS = 2        # chunks a worker holds: one it works on, one waiting
BLOCK = 1 << 20             # bytes the feeder reads at a time (then to a record's end)
CHUNK_BYTES = 4 << 20       # a chunk's most bytes (about: a block's rows at a time), so
                            # that wide rows keep a worker's memory bounded too
MAX_PROCS = max(256, 4 * (os.cpu_count() or 1))   # --procs' most: a process and a
                                                  # connection each, started one by one


# -- the target ------------------------------------------------------------------------

def _addr(text: str, default_port: int = 3301) -> Tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host:
        return text, default_port
    return host, int(port)


def target_spec(args: argparse.Namespace) -> Dict[str, Any]:
    """What a process needs to open its own connection to the target (picklable)."""
    password = None
    if args.password_file:
        with open(args.password_file) as f:
            password = f.read().strip()
    elif os.environ.get("TARANTOOL_PASSWORD"):
        password = os.environ["TARANTOOL_PASSWORD"]
    spec: Dict[str, Any] = {"user": args.user, "password": password}
    if args.sharding:
        with open(args.sharding) as f:
            spec["sharding"] = json.load(f)
    elif args.router:
        spec["router"] = _addr(args.router)
    elif args.pool:
        spec["pool"] = [_addr(a) for a in args.pool.split(",") if a]
    else:
        spec["addr"] = (args.host, args.port)
    return spec


def open_target(spec: Dict[str, Any]) -> Any:
    """A Connection, ConnectionPool or Router as ``spec`` says."""
    import gtarantool

    user, password = spec["user"], spec["password"]
    if "sharding" in spec:
        return gtarantool.Router(spec["sharding"], user=user, password=password,
                                 fetch_schema=True)
    if "router" in spec:
        host, port = spec["router"]
        return gtarantool.Router.from_router(host, port, user=user, password=password,
                                             fetch_schema=True)
    if "pool" in spec:
        return gtarantool.ConnectionPool([{"host": h, "port": p} for h, p in spec["pool"]],
                                         user=user, password=password)
    host, port = spec["addr"]
    return gtarantool.connect(host, port, user=user, password=password)


# -- a worker ----------------------------------------------------------------------------

class Worker:
    """Parses, converts and writes chunks; one per process, with its own target."""

    def __init__(self, spec: Dict[str, Any], options: Dict[str, Any]) -> None:
        from gtarantool.copy import space_info

        self.options = options
        self.target = open_target(spec)
        self.info = space_info(self.target, options["space"])
        self.fmt = options["format"]
        self.converter = Converter(self.info.fields, options["columns"], options["null"],
                                   json=self.fmt == "jsonl")
        self.csv = dialect(self.fmt, options["delimiter"], options["quote"])
        self.csv.pop("lineterminator")
        # (an upsert assigns the fields the columns name: the others keep their values)
        names = [f.name for f in self.info.fields]
        self.assign = None if options["columns"] is None else \
            [c for c in options["columns"] if c in names]

    def chunk(self, first: int, data: Any, n: int) -> Tuple[Any, ...]:
        """(rows, written, rejected [(index, raw, reason, applied)], settled, fatal, cpu)
        for the ``n`` records in ``data``, the first of which is row ``first`` (0-based)."""
        from gtarantool.pipeline import _gc_paused

        # A chunk's rows and their replies are tens of thousands of live
        # objects: the cyclic collector would scan them again and again for
        # nothing (they are freed by their counts when the chunk is done).
        with _gc_paused():
            return self._chunk(first, data, n)

    def _chunk(self, first: int, data: Any, n: int) -> Tuple[Any, ...]:
        from gtarantool.copy import CopyError, copy_from

        cpu = time.process_time()
        rejected: List[Tuple[int, bytes, str, Optional[bool]]] = []
        raws: List[bytes] = []      # the records as they were: read when needed
        rows: Optional[List[Any]] = None
        todo: Any = ()
        if self.fmt != "jsonl":
            # each record one line: split and converted in one step (C where built)
            rows = self.converter.line_rows(data, n, self.csv["delimiter"],
                                            self.csv["quotechar"])
        if rows is None:
            raws = split_records(data, self.fmt, self.options["quote"],
                                 self.options["delimiter"])
            rows = [None] * len(raws)
            todo = range(len(raws))
        elif None in rows:
            raws = lines_of(data)
            todo = [k for k, tup in enumerate(rows) if tup is None]
        if todo:
            # the rest parsed together (quoted values: the csv module), converted
            # by the plan, and what is left by the general converter, which says
            # why a record cannot be converted
            parsed = parse([raws[k] for k in todo], self.fmt, self.csv)
            tuples = self.converter.record_rows(parsed) if self.fmt != "jsonl" \
                else [None] * len(parsed)
            row = self.converter.row
            for k, record, tup in zip(todo, parsed, tuples):
                if tup is None:
                    try:
                        if type(record) is BadRow:
                            raise record
                        tup = row(record)
                    except BadRow as exc:
                        rejected.append((first + k, raws[k], str(exc), False))
                        continue
                rows[k] = tup
        where: Any = range(len(rows))
        if rejected:
            where = [k for k, tup in enumerate(rows) if tup is not None]
            rows = [tup for tup in rows if tup is not None]
        fatal = None
        o = self.options
        try:
            report = copy_from(self.target, self.info.id, rows, mode=o["mode"], batch=o["batch"],
                               max_in_flight=o["max_in_flight"], bucket_field=o["bucket_field"],
                               retry_timeout=o["retry_timeout"], info=self.info,
                               assign=self.assign)
        except CopyError as exc:
            report, fatal = exc.report, str(exc)
        if report.rejected and not raws:
            raws = lines_of(data)
        for r in report.rejected:
            k = where[r.position]
            rejected.append((first + k, raws[k], r.reason, r.applied))
        rejected.sort()
        settled = where[report.settled] if report.settled < len(where) else n
        return (n, report.written, rejected, settled, fatal, time.process_time() - cpu)

    def close(self) -> None:
        self.target.close()


def _take(pipe: Any, spare: Optional[bytearray] = None
          ) -> Optional[Tuple[int, int, bytearray, int]]:
    """The next order: a chunk (number, first row, its bytes, records), or None: stop.

    A chunk's bytes follow its message as they are (no frame, no pickle): read
    into one buffer (``spare``, a chunk's done with, when it is large enough:
    memory the process has touched already), with no copy beyond the system's."""
    message = pipe.recv()
    if message is None:
        return None
    chunk_no, first, n, size = message
    if spare is not None and len(spare) >= size:
        data = spare
        del data[size:]
    else:
        data = bytearray(size)
    view, got, fd = memoryview(data), 0, pipe.fileno()
    while got < size:
        k = os.readv(fd, [view[got:]])
        if not k:
            raise EOFError("the feeder went away in the middle of a chunk")
        got += k
    return chunk_no, first, data, n


def _orphan_guard(parent: int) -> None:
    """Have the kernel kill this process when its parent dies (Linux): a worker
    busy with a chunk, or waiting on a server for --retry-timeout, reads no
    pipe that could tell it.  Elsewhere the pipe's end of file does, later."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)    # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:    # (it died before the prctl took)
        os._exit(1)


def _worker_main(pipe: Any, spec: Dict[str, Any], options: Dict[str, Any],
                 inherited: Tuple[Any, ...] = (), parent: Optional[int] = None) -> None:
    """A worker process: ``inherited``, what a forked child got of its parent's
    open files and needs not (the parent's ends of the pipes: while one is open
    here a pipe never ends, and a worker would outlive its parent)."""
    # Ctrl-C reaches the whole process group: the parent stops the import and
    # says where; a worker leaves when the parent says so (or is gone).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    for f in inherited:
        f.close()
    if parent is not None:
        _orphan_guard(parent)
    try:
        try:
            worker = Worker(spec, options)
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which stops
            pipe.send(("failed", "%s: %s" % (type(exc).__name__, exc)))
            return
        pipe.send(("ready", None))
        _work(pipe, worker)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass    # the parent is gone (the pipe ended or broke): nobody to answer


def _work(pipe: Any, worker: Worker) -> None:
    import collections

    from gevent.socket import wait_read

    orders: Any = collections.deque()
    spare = None
    try:
        while True:
            if not orders:
                wait_read(pipe.fileno())     # lets the connection's greenlets run meanwhile
                orders.append(_take(pipe, spare))
                spare = None
            order = orders.popleft()
            if order is None:
                break
            chunk_no, first, data, n = order
            result = worker.chunk(first, data, n)
            # The parent may be writing the next chunk: taking it before answering
            # keeps the two from each waiting for the other to read.
            spare = data
            while pipe.poll():
                orders.append(_take(pipe, spare))
                spare = None
            pipe.send(("chunk", (chunk_no,) + result))
            if result[4] is not None:
                break
    finally:
        worker.close()


# -- the feeder ----------------------------------------------------------------------------

def _chunks(stream: Any, args: argparse.Namespace,
            short: List[int]) -> Iterator[Tuple[int, int, List[Any], int]]:
    """(chunk number, index of its first row, its records as pieces of bytes, their count)
    after --skip-rows, up to --max-rows, no faster than --rate.  The file is
    read in blocks of whole records (formats.blocks) and cut at record ends:
    the feeder parses nothing.  ``short`` gets the input's count of records
    when it ends before --skip-rows does."""
    size = args.chunk
    if args.rate:
        size = max(1, min(size, int(args.rate // 20) or 1))
    started = time.monotonic()
    skip, most = args.skip_rows, args.max_rows
    fed = 0
    pieces: List[Any] = []
    in_chunk = 0
    in_bytes = 0
    index = 0
    chunk_no = 0
    n = 0   # records read
    for block in blocks(stream, args.format, args.quote, BLOCK, args.delimiter):
        pos, left = 0, block.count
        if n < skip:
            k = min(skip - n, left)
            pos = block.after(0, k)
            n += k
            left -= k
        while left:
            take = min(size - in_chunk, left)
            if take > 1:   # (as many as come to CHUNK_BYTES, by the block's average)
                take = min(take, max(1, int((CHUNK_BYTES - in_bytes) * block.count
                                            / max(1, len(block.data)))))
            if most is not None:
                take = min(take, most - fed)
                if take <= 0:
                    break
            end = len(block.data) if take == left else block.after(pos, take)
            if not in_chunk:
                index = n
            # (views: a chunk goes to its worker piece by piece, never joined)
            pieces.append(memoryview(block.data)[pos:end] if pos or end < len(block.data)
                          else block.data)
            in_bytes += end - pos
            pos = end
            n += take
            fed += take
            left -= take
            in_chunk += take
            if in_chunk >= size or in_bytes >= CHUNK_BYTES:
                if args.rate:
                    _pace(started, fed, args.rate)
                yield chunk_no, index, pieces, in_chunk
                chunk_no += 1
                pieces, in_chunk, in_bytes = [], 0, 0
        if most is not None and fed >= most:
            break
    if in_chunk:
        if args.rate:
            _pace(started, fed, args.rate)
        yield chunk_no, index, pieces, in_chunk
    if n < skip:
        short.append(n)


def _pace(started: float, fed: int, rate: float) -> None:
    ahead = started + fed / rate - time.monotonic()
    if ahead > 0:
        time.sleep(ahead)


# -- progress and the summary ----------------------------------------------------------------

class Progress:
    """A bar on a terminal, a plain line every ``interval`` seconds otherwise."""

    def __init__(self, out: Any, total_bytes: Optional[int], interval: float) -> None:
        self.out, self.total_bytes, self.interval = out, total_bytes, interval
        self.tty = out.isatty()
        self.started = self.last = time.monotonic()

    def show(self, rows: int, written: int, rejected: int, fraction: Optional[float]) -> None:
        now = time.monotonic()
        if now - self.last < (0.25 if self.tty else self.interval):
            return
        self.last = now
        elapsed = now - self.started
        rate = written / elapsed if elapsed > 0 else 0.0
        eta = ""
        if fraction:
            eta = " ETA %s" % _clock(elapsed * (1 - fraction) / fraction)
        if self.tty:
            bar = "#" * int(20 * (fraction or 0))
            self.out.write("\r[%-20s] %s rows, %s rejected, %s rows/s%s   "
                           % (bar, format(written, ","), format(rejected, ","),
                              format(int(rate), ","), eta))
        else:
            self.out.write("%s: %s written, %s rejected, %s rows/s%s\n"
                           % (_clock(elapsed), format(written, ","), format(rejected, ","),
                              format(int(rate), ","), eta))
        self.out.flush()

    def done(self) -> None:
        if self.tty:
            self.out.write("\n")
            self.out.flush()


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return "%d:%02d:%02d" % (seconds // 3600, seconds // 60 % 60, seconds % 60)


class _Errors:
    """The rejected rows as they were in the input, and FILE.reasons beside;
    without a file, the first rows' reasons, for :meth:`tell` (else a
    rejection would be told by its count alone)."""

    SHOWN = 10   # reasons told without a file

    def __init__(self, path: Optional[str], header: Optional[bytes]) -> None:
        self.path = path
        self.rows: Any = None
        self.reasons: Any = None
        self.count = 0
        self.header = header
        self.first: List[Tuple[int, str]] = []

    def add(self, rejected: List[Tuple[int, bytes, str, Optional[bool]]]) -> None:
        self.count += len(rejected)
        if self.path is None:
            # (the lowest rows: chunks finish out of order)
            self.first = sorted(self.first + [(index, _reason(reason, applied))
                                              for index, _raw, reason, applied in rejected
                                              ][:self.SHOWN])[:self.SHOWN]
            return
        if not rejected:
            return
        if self.rows is None:
            rows = open(self.path, "wb")
            try:
                self.reasons = open(self.path + ".reasons", "w", encoding="utf-8")
            except OSError:
                rows.close()
                raise
            self.rows = rows
            if self.header is not None:
                self.rows.write(self.header)
        for index, raw, reason, applied in rejected:
            self.rows.write(raw if raw.endswith(b"\n") else raw + b"\n")
            self.reasons.write("row %d: %s\n" % (index + 1, _reason(reason, applied)))

    def close(self) -> None:
        if self.rows is not None:
            self.rows.close()
            self.reasons.close()

    def tell(self, out: Any) -> None:
        """The reasons kept without a file, on ``out``."""
        if self.path is not None:
            return
        for index, reason in self.first:
            print("gtarantool-copy: row %d: %s" % (index + 1, reason), file=out)
        more = self.count - len(self.first)
        if more:
            print("gtarantool-copy: %s more rows rejected (--errors FILE keeps each one and "
                  "its reason)" % format(more, ","), file=out)
        out.flush()


def _reason(reason: str, applied: Optional[bool]) -> str:
    return reason if applied is False else reason + " (it may have been written)"


# -- from --------------------------------------------------------------------------------------

def _header(stream: Any, args: argparse.Namespace) -> Tuple[Optional[List[str]], Optional[bytes]]:
    """The columns' fields (None: the format's), and the header line as it was."""
    columns = [c.strip() for c in args.columns.split(",")] if args.columns else None
    if not args.header or args.format == "jsonl":
        return columns, None
    raw = next(iter(records(stream, args.format, args.quote, args.delimiter)), None)
    if raw is None or columns is not None:   # (--columns: the header's names are not read)
        return columns, raw
    names = parse([raw], args.format, dialect(args.format, args.delimiter, args.quote))[0]
    if type(names) is BadRow:
        raise SystemExit("the header line is not %s: %s" % (args.format, names))
    return [n.strip() for n in names], raw


def _options(args: argparse.Namespace, columns: Optional[List[str]]) -> Dict[str, Any]:
    return {"space": args.space, "columns": columns, "null": args.null, "format": args.format,
            "delimiter": args.delimiter, "quote": args.quote, "mode": args.mode,
            "batch": args.batch, "max_in_flight": args.max_in_flight,
            "bucket_field": args.bucket_field, "retry_timeout": args.retry_timeout}


def _start_method() -> str:
    """``fork`` when this process runs nothing a child could inherit half-way
    (no gevent hub, no other thread: the command line as a program), so that
    the workers start without importing the library again; ``spawn`` otherwise
    (``main()`` called inside a gevent program, or where there is no fork)."""
    import threading

    from gevent._hub_local import get_hub_if_exists

    if ("fork" in multiprocessing.get_all_start_methods() and get_hub_if_exists() is None
            and threading.active_count() == 1):
        return "fork"
    return "spawn"


class _CannotStart(Exception):
    """A worker could not start (its error, as the worker said it)."""


class _Pool:
    """The worker processes: each a pipe, its chunks in flight."""

    def __init__(self, n: int, spec: Dict[str, Any], options: Dict[str, Any],
                 inherited: Tuple[Any, ...] = ()) -> None:
        method = _start_method()
        ctx: Any = multiprocessing.get_context(method)
        self.pipes: List[Any] = []
        self.procs: List[Any] = []
        self.held: Dict[Any, List[int]] = {}
        if method == "fork":
            # What the workers inherit (the modules, mostly) out of the
            # collectors' reach: a worker's collections would touch, and so
            # copy, every page of it, and the program's last one walk it again.
            # (fork is taken only where this process is the command line.)
            gc.freeze()
        for _ in range(n):
            ours, theirs = ctx.Pipe()
            extra: Tuple[Any, ...] = ()
            if method == "fork":
                # (a spawned child inherits only its own end)
                extra = (tuple(inherited) + tuple(self.pipes) + (ours,), os.getpid())
            proc = ctx.Process(target=_worker_main, args=(theirs, spec, options) + extra,
                               daemon=True)
            proc.start()
            theirs.close()
            self.pipes.append(ours)
            self.procs.append(proc)
            self.held[ours] = []
        for pipe in self.pipes:
            kind, detail = self._recv(pipe)
            if kind != "ready":
                self.close()
                raise _CannotStart(detail)

    @staticmethod
    def _recv(pipe: Any) -> Tuple[str, Any]:
        try:
            return pipe.recv()
        except (EOFError, OSError):
            return "failed", "a worker process died"

    def free(self) -> Optional[Any]:
        for pipe in self.pipes:
            if len(self.held[pipe]) < IN_FLIGHT_CHUNKS:
                return pipe
        return None

    def send(self, pipe: Any, chunk: Tuple[int, int, List[Any], int]) -> Optional[str]:
        """Hand a worker a chunk; what went wrong (the worker died), or None."""
        chunk_no, first, pieces, n = chunk
        self.held[pipe].append(chunk_no)
        try:
            pipe.send((chunk_no, first, n, sum(map(len, pieces))))
            fd = pipe.fileno()
            for piece in pieces:   # (the pieces as they are: see _take)
                view = memoryview(piece).cast("B")
                while view:
                    view = view[os.write(fd, view):]
        except OSError:   # (its chunks are lost: unsettled)
            self.pipes.remove(pipe)
            del self.held[pipe]
            return "a worker process died"
        return None

    def busy(self) -> bool:
        return any(self.held.values())

    def results(self) -> Iterator[Tuple[str, Any]]:
        """The answers ready now (waiting for one at least)."""
        waiting = [p for p in self.pipes if self.held[p]]
        for pipe in multiprocessing.connection.wait(waiting):
            kind, detail = self._recv(pipe)
            if kind == "chunk":
                self.held[pipe].remove(detail[0])
            else:   # the worker died: its chunks are lost (unsettled)
                self.pipes.remove(pipe)
                del self.held[pipe]
            yield kind, detail

    def close(self, hurry: bool = False) -> None:
        """Stop the workers: after their chunks, or (``hurry``: the import
        stopped, their answers would not be read) now."""
        for pipe in self.pipes:
            try:
                pipe.send(None)
            except OSError:
                pass
        for proc in self.procs:
            if hurry:
                proc.kill()
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join()


class _Local:
    """``--procs 0``: the parent works the chunks itself, in the same order."""

    def __init__(self, spec: Dict[str, Any], options: Dict[str, Any]) -> None:
        self.worker = Worker(spec, options)
        self.ready: List[Tuple[str, Any]] = []

    def free(self) -> Optional[Any]:
        return None if self.ready else self

    def send(self, pipe: Any, chunk: Tuple[int, int, List[Any], int]) -> Optional[str]:
        chunk_no, first, pieces, n = chunk
        self.ready.append(("chunk", (chunk_no,) + self.worker.chunk(first, b"".join(pieces),
                                                                   n)))
        return None

    def busy(self) -> bool:
        return bool(self.ready)

    def results(self) -> Iterator[Tuple[str, Any]]:
        ready, self.ready = self.ready, []
        yield from ready

    def close(self, hurry: bool = False) -> None:
        self.worker.close()


def _open_input(path: str) -> Tuple[Any, Optional[int]]:
    if path == "-":
        return sys.stdin.buffer, None
    stream = open(path, "rb")
    return stream, os.fstat(stream.fileno()).st_size


def copy_from_file(args: argparse.Namespace) -> int:
    """The ``from`` command: returns the exit status."""
    started = time.monotonic()
    try:
        stream, total = _open_input(args.file)
    except OSError as exc:
        print("gtarantool-copy: cannot read %s: %s" % (args.file, exc.strerror or exc),
              file=sys.stderr)
        return EXIT_FATAL
    if args.errors is not None and not _writable(args.errors):
        print("gtarantool-copy: cannot write the errors file %s" % args.errors, file=sys.stderr)
        return EXIT_FATAL
    if args.errors is not None:
        # (this run's rejections only: an old file would read as them)
        try:
            for path in (args.errors, args.errors + ".reasons"):
                open(path, "wb").close()
        except OSError as exc:
            print("gtarantool-copy: cannot write the errors file %s: %s"
                  % (args.errors, exc.strerror or exc), file=sys.stderr)
            return EXIT_FATAL
    counted = _Counted(stream)
    columns, header = _header(counted, args)
    options = _options(args, columns)
    try:
        spec = target_spec(args)
        workers: Any = _Local(spec, options) if args.procs == 0 else _Pool(
            args.procs, spec, options, () if stream is sys.stdin.buffer else (stream,))
    except Exception as exc:  # noqa: BLE001 - a fatal error, said once in the summary
        reason = str(exc) if isinstance(exc, _CannotStart) else "%s: %s" % (
            type(exc).__name__, exc)
        _summary(args, {"rows": 0, "written": 0}, _Errors(None, None),
                 time.monotonic() - started, args.skip_rows, ["cannot start: " + reason])
        return EXIT_FATAL
    errors = _Errors(args.errors, header)
    progress = Progress(sys.stderr, total, args.progress_interval)
    chunks: Dict[int, Tuple[int, int]] = {}      # chunk -> (first row, rows)
    short: List[int] = []                        # the input's rows, when --skip-rows passed them
    settled: Dict[int, int] = {}                 # chunk -> rows settled from its start
    totals = {"rows": 0, "written": 0}
    fatal: List[str] = []

    def take(kind: str, detail: Any) -> None:
        if kind != "chunk":
            fatal.append(detail)
            return
        chunk_no, rows, written, rejected, done, failed, _cpu = detail
        totals["rows"] += rows
        totals["written"] += written
        try:
            errors.add(rejected)
        except OSError as exc:   # (the chunk is not settled: a resume sends it again)
            fatal.append("cannot write the errors file %s: %s" % (args.errors, exc))
            return
        if failed is None:    # (every row written or rejected, whatever copy_from counts)
            done = rows
        settled[chunk_no] = done
        if failed is not None:
            fatal.append(failed)

    stopping = _Stopping()
    try:
        for chunk in _chunks(counted, args, short):
            chunks[chunk[0]] = (chunk[1], chunk[3])
            pipe = workers.free()
            while pipe is None:
                for kind, detail in workers.results():
                    take(kind, detail)
                progress.show(totals["rows"], totals["written"], errors.count,
                              counted.fraction(total))
                pipe = workers.free()
                if fatal:
                    break
            if fatal:
                break
            died = workers.send(pipe, chunk)
            if died:
                fatal.append(died)
                break
        while workers.busy():
            for kind, detail in workers.results():
                take(kind, detail)
            progress.show(totals["rows"], totals["written"], errors.count,
                          counted.fraction(total))
    except KeyboardInterrupt:
        fatal.append("interrupted")
    except _Terminated:
        fatal.append("terminated (SIGTERM)")
    finally:
        stopping.hold()
        # (interrupted: the workers' answers would not be read; else they are idle)
        workers.close(hurry=bool(fatal) and fatal[-1] in ("interrupted", "terminated (SIGTERM)"))
        errors.close()
        progress.done()
        errors.tell(sys.stderr)
    if stopping.held and not fatal:
        fatal.append("terminated (SIGTERM)")
    resume = short[0] if short else args.skip_rows
    for chunk_no in sorted(chunks):
        first, rows = chunks[chunk_no]
        done = settled.get(chunk_no, 0)
        resume = first + done
        if done < rows:
            break
    _summary(args, totals, errors, time.monotonic() - started, resume, fatal)
    stopping.restore()
    if fatal:
        return EXIT_FATAL
    return EXIT_REJECTED if errors.count else EXIT_OK


class _Terminated(BaseException):
    """SIGTERM: the import stops as on a fatal error (a summary, exit status 1)."""


class _Stopping:
    """SIGTERM raises _Terminated in the import's loop; while the import
    winds up (``hold``) it is only noted, so that the summary is said."""

    def __init__(self) -> None:
        import threading

        from greenlet import getcurrent

        self.live, self.held, self.holding = True, False, False
        self.owner = getcurrent()
        self.previous: Any = None
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        from greenlet import getcurrent

        if not self.live:
            self.held = True
            return
        self.live = False
        if getcurrent() is self.owner:
            raise _Terminated()
        # (--procs 0: another greenlet, its connection's, was running: it would
        # die of the exception and the import go on; the import's is told, at
        # its next wait)
        from gevent import get_hub

        get_hub().loop.run_callback(self._throw)

    def _throw(self) -> None:
        if self.holding:
            self.held = True
        else:
            self.owner.throw(_Terminated())

    def hold(self) -> None:
        self.live = False
        self.holding = True

    def restore(self) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)


def _writable(path: str) -> bool:
    """Whether ``path`` can be created or written (checked before anything starts:
    the errors file is opened at the first rejected row)."""
    if os.path.exists(path):
        return os.path.isfile(path) and os.access(path, os.W_OK)
    return os.access(os.path.dirname(os.path.abspath(path)), os.W_OK)


class _Counted:
    """The input, counting the bytes read (for the ETA), a UTF-8 byte order
    mark at its start skipped (spreadsheets write one: it is not part of the
    first record, a header's first name)."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.bytes = 0
        bom = codecs.BOM_UTF8
        peek = getattr(stream, "peek", None)   # (a file's or stdin's buffered reader)
        if peek is not None and peek(len(bom))[:len(bom)] == bom:
            self.bytes = len(stream.read(len(bom)))

    def __iter__(self) -> Iterator[bytes]:
        for line in self.stream:
            self.bytes += len(line)
            yield line

    def readinto(self, buffer: Any) -> int:
        n = self.stream.readinto(buffer) or 0
        self.bytes += n
        return n

    def readline(self) -> bytes:
        line = self.stream.readline()
        self.bytes += len(line)
        return line

    def fraction(self, total: Optional[int]) -> Optional[float]:
        return self.bytes / total if total else None


def _usage() -> Tuple[float, int]:
    """CPU seconds of this process and its finished children, and the larger
    peak RSS of the two (KiB)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
    return cpu, max(me.ru_maxrss, kids.ru_maxrss)


def _summary(args: argparse.Namespace, totals: Dict[str, int], errors: _Errors,
             elapsed: float, resume: int, fatal: List[str]) -> None:
    cpu, rss = _usage()
    rate = totals["written"] / elapsed if elapsed > 0 else 0.0
    where = " (%s)" % args.errors if args.errors and errors.count else ""
    line = ("gtarantool-copy: %s rows read, %s written, %s rejected%s in %.1f s, %s rows/s, "
            "client CPU %.1f s, peak RSS %d MiB; %s"
            % (format(totals["rows"], ","), format(totals["written"], ","),
               format(errors.count, ","), where, elapsed, format(int(rate), ","), cpu,
               rss // 1024, "rows 1-%d settled (written or rejected)" % resume if resume
               else "no row settled"))
    if fatal:
        line += "; stopped: %s" % (fatal[0],)
    if resume < args.skip_rows and not totals["rows"] and not fatal:
        line += "; the input has %d rows: --skip-rows %d skipped them all" % (
            resume, args.skip_rows)
    elif resume < args.skip_rows + totals["rows"] or fatal:
        line += "; resume with --skip-rows %d" % resume
    print(line, flush=True)


# -- to ----------------------------------------------------------------------------------------

def copy_to_file(args: argparse.Namespace) -> int:
    """The ``to`` command: returns the exit status."""
    started = time.monotonic()
    count = [0]   # rows written to the file so far
    said = sys.stderr if args.file == "-" else sys.stdout   # (stdout may be the rows)
    try:
        _export(args, count)
    except Exception as exc:  # noqa: BLE001 - a fatal error, said once in the summary
        print("gtarantool-copy: %s rows written to %s; stopped: %s: %s"
              % (format(count[0], ","), args.file, type(exc).__name__, exc),
              file=said, flush=True)
        return EXIT_FATAL
    cpu, _rss = _usage()
    print("gtarantool-copy: %s rows written to %s in %.1f s, client CPU %.1f s"
          % (format(count[0], ","), args.file, time.monotonic() - started, cpu),
          file=said, flush=True)
    return EXIT_OK


def _export(args: argparse.Namespace, count: List[int]) -> None:
    """Every row ``args`` selects into ``args.file``; ``count[0]``: rows written."""
    from gtarantool.copy import copy_to, space_info

    key = json.loads(args.key) if args.key is not None else None
    target = open_target(target_spec(args))
    try:
        info = space_info(target, args.space)
        exporter = Exporter(info.fields, args.format, args.null)
        out = sys.stdout if args.file == "-" else open(args.file, "w", encoding="utf-8",
                                                       newline="")
        try:
            tuples = copy_to(target, info.id, index=args.index, key=key,
                             iterator=args.iterator, page=args.batch, timeout=args.timeout)
            if args.format == "jsonl":
                for tup in tuples:
                    out.write(exporter.line(tup))
                    count[0] += 1
            else:
                writer = exporter.writer(out, args.delimiter, args.quote)
                if args.header:
                    writer.writerow(exporter.header())
                for tup in tuples:
                    writer.writerow(exporter.record(tup))
                    count[0] += 1
        finally:
            if out is not sys.stdout:
                out.close()
    finally:
        target.close()


# -- arguments ---------------------------------------------------------------------------------

def parser() -> argparse.ArgumentParser:
    """The command line's parser."""
    p = argparse.ArgumentParser(prog="gtarantool-copy",
                                description="Copy rows between a file and a Tarantool space.")
    sub = p.add_subparsers(dest="command", required=True)
    for name, helptext in (("from", "import FILE into the space"),
                           ("to", "export the space into FILE")):
        c = sub.add_parser(name, help=helptext)
        c.add_argument("file", metavar="FILE", help="the file ('-': stdin/stdout)")
        c.add_argument("--space", required=True, help="the space's name or id")
        c.add_argument("--host", default="127.0.0.1")
        c.add_argument("--port", type=int, default=3301)
        c.add_argument("--user", default=None)
        c.add_argument("--password-file", default=None,
                       help="a file holding the password (else $TARANTOOL_PASSWORD)")
        c.add_argument("--pool", default=None, metavar="H:P,...",
                       help="a replica set: write to its master")
        c.add_argument("--router", default=None, metavar="H:P",
                       help="a vshard router whose configuration names the storages")
        c.add_argument("--sharding", default=None, metavar="CFG",
                       help="a JSON file holding vshard's configuration")
        c.add_argument("--format", choices=FORMATS, default="csv")
        c.add_argument("--delimiter", default=None, help="(csv/tsv) the field separator")
        c.add_argument("--quote", default='"', help="(csv/tsv) the quote character")
        c.add_argument("--null", default="", help="(csv/tsv) the text of a null value")
        c.add_argument("--header", action="store_true",
                       help="the first line names the columns (fields of the space)")
        c.add_argument("--batch", type=int, default=5000,
                       help="rows per pipeline (from) or per select (to)")
    f = sub.choices["from"]
    f.add_argument("--columns", default=None, metavar="A,B,C",
                   help="the fields the columns hold, in order")
    f.add_argument("--mode", choices=("insert", "replace", "upsert"), default="insert")
    f.add_argument("--procs", type=int, default=max(1, (os.cpu_count() or 2) - 1),
                   help="worker processes (0: work in this process); default: cores - 1")
    f.add_argument("--chunk", type=int, default=20000,
                   help="rows a worker takes at a time (fewer when they come to over 4 MiB)")
    f.add_argument("--max-in-flight", type=int, default=20000,
                   help="rows a worker has sent and not seen answered")
    f.add_argument("--rate", type=float, default=None, metavar="ROWS/S",
                   help="read no faster than this")
    f.add_argument("--skip-rows", type=int, default=0, help="skip this many rows first")
    f.add_argument("--max-rows", type=int, default=None, help="import at most this many rows")
    f.add_argument("--errors", default=None, metavar="FILE",
                   help="write rejected rows here, their reasons to FILE.reasons")
    f.add_argument("--bucket-field", default=None,
                   help="(router) the field holding the bucket id (default: bucket_id)")
    f.add_argument("--retry-timeout", type=float, default=30.0,
                   help="seconds to keep re-sending rows a server did not take "
                        "(read-only, unreachable) before stopping")
    f.add_argument("--progress-interval", type=float, default=5.0,
                   help="seconds between progress lines when stderr is not a terminal")
    t = sub.choices["to"]
    t.add_argument("--index", default="0", help="the index to read by (name or id)")
    t.add_argument("--key", default=None, help="the start key, as JSON")
    t.add_argument("--iterator", default=None, help="ALL, EQ, GE, GT, LE, LT, REQ")
    t.add_argument("--timeout", type=float, default=30.0,
                   help="seconds a page of rows may take before the export stops (default 30)")
    return p


def _check(args: argparse.Namespace) -> None:
    """Refuse (exit status 1, a line that says why) what no import or export can take."""
    def option(name: str) -> str:
        return "--" + name.replace("_", "-")

    positive, at_least_0 = ["batch"], []
    if args.command == "from":
        positive += ["chunk", "max_in_flight", "rate", "progress_interval"]
        at_least_0 += ["procs", "skip_rows", "max_rows", "retry_timeout"]
    else:
        positive += ["timeout"]
    for names, good, what in ((positive, lambda v: 0 < v < math.inf, "positive and finite"),
                              (at_least_0, lambda v: v >= 0, "at least 0")):
        for name in names:
            value = getattr(args, name)
            if value is not None and not good(value):   # (a NaN is refused too)
                raise SystemExit("gtarantool-copy: %s must be %s, not %s"
                                 % (option(name), what, value))
    if args.command == "from" and args.procs > MAX_PROCS:
        raise SystemExit("gtarantool-copy: --procs must be at most %d (4 per core, 256 at "
                         "least), not %d" % (MAX_PROCS, args.procs))
    for name in ("delimiter", "quote"):
        value = getattr(args, name)
        if value is not None and (len(value) != 1 or value in "\r\n"):
            raise SystemExit("gtarantool-copy: %s must be one character (not a line end), "
                             "not %r" % (option(name), value))
    written = [("the errors file", args.errors), ("the errors' reasons", args.errors and
                                                       args.errors + ".reasons")] \
        if args.command == "from" else [("the output file", args.file)]
    read = [("the input file", args.file if args.command == "from" else None),
            ("--password-file", args.password_file), ("--sharding", args.sharding)]
    for what, path in written:
        for other, source in read:
            if _same(path, source):   # (it would be emptied before it is read)
                raise SystemExit("gtarantool-copy: %s is %s (%s)" % (what, other, path))
    delimiter = args.delimiter or ("\t" if args.format == "tsv" else ",")
    if delimiter == args.quote:   # (the default delimiter too: every row would split wrong)
        raise SystemExit("gtarantool-copy: the delimiter (%r) and --quote must differ"
                         % (delimiter,))


def _same(a: Optional[str], b: Optional[str]) -> bool:
    """Whether two paths (not stdin/stdout) name the same file."""
    if not a or not b or "-" in (a, b):
        return False
    if os.path.exists(a) and os.path.exists(b):
        return os.path.samefile(a, b)
    return os.path.realpath(a) == os.path.realpath(b)


def main(argv: Optional[List[str]] = None) -> int:
    """Run the command line; returns the exit status."""
    args = parser().parse_args(argv)
    _check(args)
    if args.space.isdigit():
        args.space = int(args.space)
    if args.command == "to" and args.index.isdigit():
        args.index = int(args.index)
    if args.command == "from":
        return copy_from_file(args)
    return copy_to_file(args)

