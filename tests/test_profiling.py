"""Greenlet-aware profiles: valid callgrind files that callgrind_annotate reads with a total
above 0, inclusive costs within 100%, and the connection's greenlets by name."""
import importlib.util
import re
import shutil
import subprocess
import sys

import gevent
import pytest

import gtarantool
import gtarantool.profiling
from gtarantool.contrib import profiling

from .conftest import needs_tool

pytestmark = needs_tool(importlib.util.find_spec("yappi") is not None,
                        "yappi (the profile extra: pip install -e .[profile])")
needs_annotate = needs_tool(shutil.which("callgrind_annotate") is not None,
                            "callgrind_annotate (Debian package valgrind)")

USER, PASSWORD = "test", "secret"


def annotate(path):
    """callgrind_annotate --inclusive=yes: (PROGRAM TOTALS, its text).  It exits 0 on some
    broken files, so the caller checks the totals."""
    out = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", path],
                         capture_output=True, text=True, check=True).stdout
    m = re.search(r"^\s*([\d,]+)\s.*PROGRAM TOTALS", out, re.M)
    assert m, out
    return int(m.group(1).replace(",", "")), out


def check_file(path):
    """The file reads with a total above 0 and no inclusive cost above it, as
    callgrind_annotate counts."""
    total, out = annotate(path)
    assert total > 0, path
    shares = [float(p) for p in re.findall(r"\(\s*([\d.]+)%\)", out)]
    assert shares and max(shares) <= 100.0, path
    return out


def work(conn, base):
    for i in range(50):
        conn.replace("tester", (base + i, "p%d" % i, {"n": i}))
        conn.select("tester", base + i)


def recursive(n):
    return 0 if n == 0 else recursive(n - 1) + 1


@needs_annotate
@pytest.mark.parametrize("clock", ["cpu", "wall"])
def test_profile_block_with_greenlet_files(server, tmp_path, clock):
    path = str(tmp_path / "service.callgrind")
    with profiling.profile(path, clock=clock, per_greenlet=True) as prof:
        conn = gtarantool.connect(server.host, server.port, user=USER, password=PASSWORD)
        glets = [gevent.spawn(work, conn, 900000 + 1000 * n) for n in range(4)]
        for n, glet in enumerate(glets):
            glet.name = "worker-%d" % n
        gevent.joinall(glets, raise_error=True)
        recursive(30)
        conn.close()
    reader, writer = "tarantool-%s-reader" % server.port, "tarantool-%s-writer" % server.port
    names = {g.name for g in prof.greenlets()}
    assert {reader, writer, "worker-0", "worker-3"} <= names
    assert prof.paths[0] == path
    for name in (reader, writer, "worker-0", "worker-3", "MainThread"):
        assert str(tmp_path / ("service.%s.callgrind" % name)) in prof.paths
    for p in prof.paths:
        check_file(p)
    combined = check_file(path)
    assert "Transport._read_loop" in combined and "Transport._write_loop" in combined
    assert "Transport._read_loop" in check_file(str(tmp_path / ("service.%s.callgrind" % reader)))
    # The socket's own methods, or its descriptor's (the writer calls os.write).
    assert re.search(r"<method 'send\w*' of '_socket\.socket' objects>|posix:write\b",
                     combined)
    assert re.search(r"<method 'recv\w*' of '_socket\.socket' objects>|posix:readv?\b",
                     combined)


def test_missing_yappi_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "yappi", None)
    with pytest.raises(ImportError, match=r"pip install yappi"):
        profiling.Profiler()


def test_alias_module_gives_the_same_functions():
    """``from gtarantool.profiling import profile, profile_for`` (the documented
    path) is the integration's own."""
    from gtarantool.profiling import profile, profile_for
    assert profile is profiling.profile and profile_for is profiling.profile_for
    assert gtarantool.profiling.Profiler is profiling.Profiler


def test_a_profile_that_cannot_be_written_is_refused_before_the_block(tmp_path):
    from gtarantool.contrib.profiling import profile
    ran = []
    with pytest.raises(OSError, match="cannot write the profile"):
        with profile(str(tmp_path / "no-such-dir" / "p.callgrind")):
            ran.append(True)
    assert not ran
    with pytest.raises(OSError, match="cannot write the profile"):
        with profile(str(tmp_path)):   # (a directory)
            ran.append(True)
    assert not ran


def test_a_block_that_raises_keeps_its_exception(tmp_path):
    from gtarantool.contrib.profiling import profile
    path = tmp_path / "p.callgrind"
    with pytest.raises(KeyError):
        with profile(str(path)):
            raise KeyError("the block's")
    assert path.exists()
