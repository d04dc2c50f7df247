"""--profile DIR: each worker's callgrind files (whole and per greenlet) read by
callgrind_annotate and by ``bench.profiling.callgrind`` alike, and ``python -m bench.profile
compare``'s table of two drivers' profiles."""
import importlib.util
import os
import re
import shutil
import subprocess
import sys

import pytest

from bench.profiling.callgrind import Profile
from bench.profiling.callgrind import main as profile_main

from .conftest import PASSWORD, USER

pytestmark = pytest.mark.needs_tool(available=importlib.util.find_spec("yappi") is not None,
                                   what="yappi (the profile extra)")
needs_annotate = pytest.mark.needs_tool(available=shutil.which("callgrind_annotate") is not None,
                                        what="callgrind_annotate (Debian package valgrind)")


def check_file(path):
    """The file reads with a total above 0 and no inclusive cost above it, both as
    callgrind_annotate and as kcachegrind (callers' call costs, recursion left out) count."""
    out = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", path],
                         capture_output=True, text=True, check=True).stdout
    m = re.search(r"^\s*([\d,]+)\s.*PROGRAM TOTALS", out, re.M)
    assert m, out   # (it exits 0 on some broken files)
    total = int(m.group(1).replace(",", ""))
    assert total > 0, path
    shares = [float(p) for p in re.findall(r"\(\s*([\d.]+)%\)", out)]
    assert shares and max(shares) <= 100.0, path
    prof = Profile(path)
    assert prof.total == total
    assert max(prof.inclusive().values()) <= total
    return out


def bench(*args):
    """``python -m bench ...`` in a child process: its workers fork, and a fork of this
    process, which already runs a gevent hub, would inherit the hub's threadpool."""
    cwd = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return subprocess.run([sys.executable, "-m", "bench"] + list(args), cwd=cwd,
                          capture_output=True, text=True, check=True, timeout=60).stdout


@needs_annotate
def test_bench_profiles_and_compare(server, tmp_path, capsys):
    out_dir = str(tmp_path / "profiles")
    common = ["--host", server.host, "--port", str(server.port), "--user", USER,
              "--password", PASSWORD, "--space", "profiled", "--procs", "1", "--greenlets", "10",
              "--ops", "400", "--workload", "phases", "-q", "--profile", out_dir]
    summary = bench(*common, "--driver", "gtarantool", "--profile-greenlets")
    assert "socket calls per operation" in summary and "top 15 functions" in summary
    assert re.search(r"p0\s+worker-\*\s+40\s", summary)    # 4 phases of 10 greenlets
    assert re.search(r"p0\s+tarantool-%d-reader\s+1\s" % server.port, summary)
    bench(*common, "--driver", "sync")

    stem = os.path.join(out_dir, "gtarantool-phases-p0")
    for name in ("worker-0", "worker-9", "tarantool-%d-reader" % server.port,
                 "tarantool-%d-writer" % server.port):
        check_file("%s.%s.callgrind" % (stem, name))
    gevent_text = check_file(stem + ".callgrind")
    assert "Transport._read_loop" in gevent_text and "Transport._write_loop" in gevent_text
    check_file(os.path.join(out_dir, "sync-phases-p0.callgrind"))

    a = os.path.join(out_dir, "sync-phases-p0.callgrind")
    b = stem + ".callgrind"
    assert profile_main(["compare", a, b, "--top", "5"]) == 0
    table = capsys.readouterr().out
    header = table.splitlines()[0]
    assert "sync-phases-p0.callgrind" in header and "gtarantool-phases-p0.callgrind" in header
    rows = {m.group(1): [m.group(2), m.group(3)] for m in
            (re.match(r"(.*?)\s{2,}(\S+)\s+(\S+)$", line) for line in table.splitlines()[1:8])}
    assert rows["operations"] == ["1600", "1600"]           # 4 phases of 400, from the .json
    sync_send, gevent_send = map(float, rows["send calls per operation"])
    sync_recv, gevent_recv = map(float, rows["recv calls per operation"])
    assert sync_send >= 1.0 and sync_recv >= 1.0              # one request at a time
    assert 0 < gevent_send < sync_send and 0 < gevent_recv < sync_recv
