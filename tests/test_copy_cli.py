"""gtarantool.copy's command line: its processes, signals and files, against real servers."""
import argparse
import io
import os
import signal
import subprocess
import sys
import time

import pytest

import gtarantool
from gtarantool.copy import cli
from tests.conftest import PASSWORD, USER
from tests.test_copy import _conn_args, _run, _space, _write


@pytest.fixture(autouse=True)
def password(monkeypatch):
    monkeypatch.setenv("TARANTOOL_PASSWORD", PASSWORD)


def _kv(conn):
    _space(conn, "copy_kv", [("id", "unsigned"), ("name", "string"), ("n", "integer")])


def _rows(path, total, pad=""):
    _write(path, ["%d,n%d%s,%d\n" % (k, k, pad, k) for k in range(total)])


def _count(server):
    c = gtarantool.connect(server.host, server.port, user=USER, password=PASSWORD)
    try:
        return c.eval("return box.space.copy_kv:count()").data[0]
    finally:
        c.close()


def _children(pid):
    with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
        return [int(p) for p in f.read().split()]


def _alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _started(proc, server, rows=2000):
    """The import's workers, once it has written ``rows`` rows."""
    deadline = time.monotonic() + 60
    while _count(server) < rows:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return _children(proc.pid)


def _default_sigint():
    # (a job started in the background by a non-interactive shell, as a CI's may
    # be, inherits SIGINT ignored: a terminal's command has it as it is by default)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _popen(*argv, own_group=False):
    return subprocess.Popen([sys.executable, "-m", "gtarantool.copy"] + [str(a) for a in argv],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=own_group, preexec_fn=_default_sigint,
                            env=dict(os.environ, TARANTOOL_PASSWORD=PASSWORD))


def _finish(proc, timeout=60):
    try:
        return proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _gone(pids, within=10.0):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.1)
    for p in pids:   # (ours: the test's own import's workers)
        if _alive(p):
            os.kill(p, signal.SIGKILL)
    return False


def _slow_import(src, server, *more, own_group=False):
    return _popen("from", src, "--space", "copy_kv", "--procs", 2, "--chunk", 500,
                  "--rate", 5000, "--mode", "replace", *more, *_conn_args(server),
                  own_group=own_group)


def test_workers_hold_none_of_their_parents_pipe_ends(conn, server, tmp_path):
    """A worker keeping the parent's end of a pipe (its own or an earlier
    worker's) would never see that pipe end when the parent dies."""
    _kv(conn)
    src = tmp_path / "in.csv"
    _rows(src, 100000)
    proc = _slow_import(src, server)
    workers = []
    try:
        workers = _started(proc, server)
        assert len(workers) == 2

        def sockets(pid):
            found = set()
            for fd in os.listdir("/proc/%d/fd" % pid):
                try:
                    target = os.readlink("/proc/%d/fd/%s" % (pid, fd))
                except OSError:
                    continue
                if target.startswith("socket:"):
                    found.add(target)
            return found

        parents = sockets(proc.pid)
        for pid in workers:
            assert not sockets(pid) & parents
    finally:
        proc.kill()
        _finish(proc)
        _gone(workers)


def _running_import(conn, server, tmp_path, own_group=False):
    """A slow import of 100,000 rows under way, and its workers."""
    _kv(conn)
    src = tmp_path / "in.csv"
    _rows(src, 100000)
    proc = _slow_import(src, server, own_group=own_group)
    return proc, _started(proc, server)


def test_workers_exit_when_the_parent_is_killed(conn, server, tmp_path):
    proc, workers = _running_import(conn, server, tmp_path)
    proc.kill()
    _finish(proc)
    assert _gone(workers, within=10)


def test_sigterm_stops_the_import_with_a_summary_and_a_resume_point(conn, server, tmp_path):
    proc, workers = _running_import(conn, server, tmp_path)
    proc.terminate()
    out, err = _finish(proc)
    assert proc.returncode == 1, (out, err)
    assert "stopped: terminated (SIGTERM)" in out and "Traceback" not in err, (out, err)
    resume = int(out.rsplit("--skip-rows ", 1)[1].split()[0])
    settled = int(out.split("rows 1-", 1)[1].split()[0])
    assert 0 < resume == settled < 100000
    assert _gone(workers)
    # the rows before the resume point are all there
    assert [t[0] for t in conn.select("copy_kv", limit=resume).data] == list(range(resume))


def test_sigterm_in_a_connection_greenlet_stops_an_import_in_this_process(conn, server,
                                                                        tmp_path, capsys):
    """--procs 0: the signal arrives in whichever greenlet runs (the
    connection's, mostly); the import stops all the same, with its summary."""
    import gevent

    _kv(conn)
    src = tmp_path / "in.csv"
    _rows(src, 30000)

    def terminate():   # (a greenlet other than the import's gets the signal)
        while _count(server) < 2000:
            gevent.sleep(0.01)
        os.kill(os.getpid(), signal.SIGTERM)

    killer = gevent.spawn(terminate)
    status = cli.main([str(a) for a in ("from", src, "--space", "copy_kv", "--procs", 0,
                                        "--chunk", 500, "--rate", 10000,
                                        *_conn_args(server))])
    out, err = capsys.readouterr()
    assert killer.dead and killer.successful(), killer.exception
    assert status == 1 and "stopped: terminated (SIGTERM)" in out, (out, err)
    assert "Traceback" not in err, err
    resume = int(out.rsplit("--skip-rows ", 1)[1].split()[0])
    assert 0 < resume < 30000
    assert [t[0] for t in conn.select("copy_kv", limit=resume).data] == list(range(resume))


def test_ctrl_c_to_the_process_group_gives_a_summary_and_no_tracebacks(conn, server, tmp_path):
    proc, workers = _running_import(conn, server, tmp_path, own_group=True)
    os.killpg(proc.pid, signal.SIGINT)   # (what a terminal's Ctrl-C does)
    out, err = _finish(proc)
    assert proc.returncode == 1, (out, err)
    assert "stopped: interrupted" in out and "resume with --skip-rows" in out, (out, err)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert _gone(workers)


def test_a_worker_killed_while_the_parent_writes_to_it_stops_with_a_summary(
        conn, server, tmp_path):
    """The worker is stopped first, so that the parent is left writing a
    chunk larger than the pipe holds when it dies."""
    _kv(conn)
    src = tmp_path / "in.csv"
    _rows(src, 20000, pad="p" * 1000)
    proc = _popen("from", src, "--space", "copy_kv", "--procs", 1, "--chunk", 3000,
                  *_conn_args(server))
    try:
        (worker,) = _started(proc, server, rows=1)
        os.kill(worker, signal.SIGSTOP)
        time.sleep(1)
        os.kill(worker, signal.SIGKILL)
        out, err = _finish(proc)
    finally:
        _gone([worker])
    assert proc.returncode == 1, (out, err)
    assert "stopped: a worker process died" in out and "Traceback" not in err, (out, err)
    assert "resume with --skip-rows" in out, out
    resume = int(out.rsplit("--skip-rows ", 1)[1].split()[0])
    assert [t[0] for t in conn.select("copy_kv", limit=resume).data] == list(range(resume))


def test_more_worker_processes_than_a_host_could_start_are_refused(tmp_path):
    """Each is a process and a connection, started one after the other: a
    million would never be ready (and exhaust the host on the way)."""
    argv = ["from", str(tmp_path / "in.csv"), "--space", "copy_kv"]
    with pytest.raises(SystemExit, match="--procs must be at most %d .*not 1000000"
                       % cli.MAX_PROCS):
        cli._check(cli.parser().parse_args(argv + ["--procs", "1000000"]))
    cli._check(cli.parser().parse_args(argv + ["--procs", str(cli.MAX_PROCS)]))


def test_output_files_that_are_input_files_are_refused(conn, server, tmp_path):
    """Opening one for writing would empty it before it is read: refused
    before anything is read or written."""
    _kv(conn)
    src, other = tmp_path / "in.csv", tmp_path / "r.csv.reasons"
    _rows(src, 10)
    _rows(other, 10)
    secret = tmp_path / "password"
    secret.write_text(PASSWORD)
    for argv, said in (
            (["from", src, "--errors", src], "the errors file is the input file"),
            (["from", src, "--errors", tmp_path / "." / "in.csv"], "is the input file"),
            (["from", other, "--errors", tmp_path / "r.csv"], "reasons is the input file"),
            (["from", src, "--errors", secret, "--password-file", secret],
             "the errors file is --password-file"),
            (["to", secret, "--password-file", secret], "the output file is --password-file")):
        with pytest.raises(SystemExit, match=said):
            _run(*argv, "--space", "copy_kv", *_conn_args(server))
    assert src.read_bytes() == other.read_bytes() and secret.read_text() == PASSWORD
    assert _count(server) == 0


def test_chunks_are_cut_by_bytes_as_well_as_by_rows(monkeypatch):
    """Wide rows: a chunk of --chunk rows would be hundreds of MiB in a worker."""
    monkeypatch.setattr(cli, "CHUNK_BYTES", 1 << 16)
    row = b"x" * 1000 + b"\n"
    data = row * 5000
    args = argparse.Namespace(chunk=20000, rate=None, skip_rows=0, max_rows=None,
                              format="csv", quote='"', delimiter=None)
    chunks = list(cli._chunks(io.BytesIO(data), args, []))
    sizes = [sum(map(len, pieces)) for _no, _first, pieces, _n in chunks]
    assert max(sizes) <= (1 << 16) + len(row)
    assert sum(n for *_, n in chunks) == 5000 and b"".join(
        bytes(p) for _no, _first, pieces, _n in chunks for p in pieces) == data
    assert [first for _no, first, _p, _n in chunks] == [
        sum(c[3] for c in chunks[:k]) for k in range(len(chunks))]


def test_wide_rows_import_whole_in_chunks_of_bytes(conn, server, tmp_path):
    _kv(conn)
    src = tmp_path / "in.csv"
    _rows(src, 3000, pad="w" * 5000)
    status, out = _run("from", src, "--space", "copy_kv", "--procs", 1, *_conn_args(server))
    assert status == 0 and "3,000 written" in out, out
    assert _count(server) == 3000


def test_a_space_by_its_id(conn, server, tmp_path):
    _kv(conn)
    sid = conn.eval("return box.space.copy_kv.id").data[0]
    src = tmp_path / "in.csv"
    _rows(src, 3)
    status, out = _run("from", src, "--space", sid, "--procs", 0, *_conn_args(server))
    assert status == 0 and "3 written" in out, out
    status, out = _run("to", tmp_path / "out.csv", "--space", sid, *_conn_args(server))
    assert status == 0 and (tmp_path / "out.csv").read_bytes() == src.read_bytes()


def test_header_and_columns_skip_the_header_and_take_the_columns(conn, server, tmp_path):
    """The header's names need not be the fields' (a file from elsewhere); a
    rejected row's errors file starts with that header."""
    _kv(conn)
    src = tmp_path / "in.csv"
    _write(src, ["Number,Name,Key\n", "1,one,10\n", "x,two,20\n", "3,three,30\n"])
    errors = tmp_path / "e.csv"
    status, out = _run("from", src, "--space", "copy_kv", "--header", "--columns", "n,name,id",
                       "--procs", 0, "--errors", errors, *_conn_args(server))
    assert status == 2 and "3 rows read, 2 written, 1 rejected" in out, out
    assert conn.select("copy_kv").data == [[10, "one", 1], [30, "three", 3]]
    assert errors.read_text() == "Number,Name,Key\nx,two,20\n"


def test_a_clean_run_leaves_no_rejections_of_an_earlier_one(conn, server, tmp_path):
    _kv(conn)
    src = tmp_path / "in.csv"
    _write(src, ["1,a,1\n", "2,b,x\n"])
    errors = tmp_path / "e.csv"
    args = ["--space", "copy_kv", "--procs", 0, "--errors", errors, *_conn_args(server)]
    assert _run("from", src, *args)[0] == 2
    assert errors.read_text() == "2,b,x\n"
    _write(src, ["2,b,2\n"])
    status, out = _run("from", src, *args)
    assert status == 0, out
    assert errors.read_text() == "" and (tmp_path / "e.csv.reasons").read_text() == ""


def test_rows_that_may_have_been_written_leave_no_resume_hint(conn, server, tmp_path,
                                                             monkeypatch):
    """A row whose reply was lost (a server restarted within --retry-timeout)
    is rejected "(it may have been written)" and copy_from does not count it
    settled; the import still ends with every row written or rejected, so
    there is nothing to resume (following such a hint in insert mode sends
    every later row again, as duplicates)."""
    import gtarantool.copy as copy

    real = copy.copy_from

    def lost_first_reply(target, space, rows, **kw):
        """copy_from's report when the first row's reply is lost."""
        report = real(target, space, rows, **kw)
        if rows and rows[0][0] == 0:
            report.rejected = [copy.Rejected(0, rows[0], "NetworkError: lost", None)]
            report.written -= 1
            report.settled = 0
        return report

    monkeypatch.setattr(copy, "copy_from", lost_first_reply)
    _kv(conn)
    src = tmp_path / "in.csv"
    _rows(src, 10)
    errors = tmp_path / "e.csv"
    status, out = _run("from", src, "--space", "copy_kv", "--procs", 0, "--chunk", 5,
                       "--errors", errors, *_conn_args(server))
    assert status == 2, out
    assert "(it may have been written)" in (tmp_path / "e.csv.reasons").read_text()
    assert "rows 1-10 settled" in out and "--skip-rows" not in out, out


def test_a_json_key_outside_columns_is_said_to_be_so(conn, server, tmp_path):
    _space(conn, "copy_kvw", [("id", "unsigned"), ("v", "string"), ("w", "string")],
           nullable=("w",))
    src = tmp_path / "in.jsonl"
    _write(src, ['{"id": 1, "v": "a", "w": "x"}\n'])
    errors = tmp_path / "e.jsonl"
    status, _ = _run("from", src, "--space", "copy_kvw", "--format", "jsonl", "--columns",
                     "id,v", "--procs", 0, "--errors", errors, *_conn_args(server))
    assert status == 2
    reason = (tmp_path / "e.jsonl.reasons").read_text()
    assert "not among --columns" in reason and "no field named" not in reason, reason


@pytest.mark.parametrize("fmt", ["csv", "tsv"])
def test_values_with_line_ends_and_quotes_round_trip_through_the_command_line(
        conn, server, tmp_path, fmt):
    """``to`` then ``from`` gives the same strings, a bare carriage return, a
    newline, a quote and the delimiter in them included, with ``--delimiter``
    too (a quoted value going on over lines after it)."""
    _space(conn, "copy_kv", [("id", "unsigned"), ("name", "string"), ("n", "integer")])
    values = ["a\rb", "c\nd", 'say "hi"', "x;y", "1,5\" screen", "\r", "plain"]
    for k, v in enumerate(values):
        conn.insert("copy_kv", (k, v, k))
    for delimiter in ([], ["--delimiter", ";"]):
        out = tmp_path / ("out%d.%s" % (len(delimiter), fmt))
        status, said = _run("to", out, "--space", "copy_kv", "--format", fmt, *delimiter,
                            *_conn_args(server))
        assert status == 0, said
        conn.eval("box.space.copy_kv:truncate()")
        status, said = _run("from", out, "--space", "copy_kv", "--format", fmt, *delimiter,
                            "--procs", 1, *_conn_args(server))
        assert status == 0, said
        assert conn.select("copy_kv").data == [[k, v, k] for k, v in enumerate(values)]


@pytest.mark.parametrize("procs", [0, 2])
def test_without_an_errors_file_the_first_rejections_are_told_on_stderr(conn, server, tmp_path,
                                                                         procs):
    _kv(conn)
    src = tmp_path / "in.csv"
    # (chunks of 4 rows finish out of order under workers: the lowest rows are told)
    _write(src, ["%d,n%d,%s\n" % (k, k, k if k % 3 else "x%d" % k) for k in range(40)])
    proc = _popen("from", src, "--space", "copy_kv", "--procs", procs, "--chunk", 4,
                  *_conn_args(server))
    out, err = _finish(proc)
    assert proc.returncode == 2, (out, err)
    assert "40 rows read, 26 written, 14 rejected" in out
    told = [line for line in err.splitlines() if line.startswith("gtarantool-copy: row ")]
    assert told == ["gtarantool-copy: row %d: field n (integer): 'x%d': not an integer"
                    % (k + 1, k) for k in range(0, 30, 3)], err
    assert "gtarantool-copy: 4 more rows rejected (--errors FILE keeps each one and its " \
           "reason)" in err
