"""make locust (bench/locust/): the bench workload under Locust, headless, its counts
checked against box.stat; a master with two workers; --compare and --instructions.

Locust runs in child processes only: importing it monkey-patches the interpreter, which
the rest of the session must not get."""
import csv
import importlib.util
import json
import os
import subprocess
import sys
import time

import pytest

from bench.locust import run as locust_run
from bench.targets.server import EMBEDDED_LUA, PREPARE_LUA, Target
from gtarantool.testing.server import TarantoolServer, free_port

# (importorskip would import Locust here)
pytestmark = pytest.mark.needs_tool(available=importlib.util.find_spec("locust") is not None,
                                   what="locust (the locust extra)")

# Keys drawn from 10**15: no duplicate inserts, so a run has no server errors at
# all and the tests can say so (expected errors have tests of their own).
MIX = ["--bench-mix", "insert=40,select=20,update=20,delete=20", "--bench-keys", str(10**15)]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PY = sys.executable
LOCUST = [PY, "-m", "locust", "-f", os.path.join(ROOT, "bench", "locust", "locustfile.py")]


@pytest.fixture
def bench_server():
    """A server with the bench space, for whole Locust runs."""
    srv = TarantoolServer(EMBEDDED_LUA % (PREPARE_LUA, "bench"))
    srv.start()
    yield srv
    srv.cleanup()


def test_headless_processes_counts_match_box_stat(tmp_path):
    """make locust, 5 s, --processes 2: every check passes; each process opened
    one connection for its 10 users."""
    out = subprocess.run([PY, "-m", "bench.locust_run", "-u", "20", "-p", "2", "-t", "5s",
                          "--out", str(tmp_path), "--mix", MIX[1], "--keys", MIX[3]],
                         cwd=ROOT, timeout=120,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert out.returncode == 0, out.stdout[-4000:]
    assert "MISMATCH" not in out.stdout and out.stdout.count("[ok]") == 5, out.stdout[-4000:]
    report = json.loads((tmp_path / "bench-report.json").read_text())
    workers = report["workers"].values()
    assert len(workers) == 2
    assert all(w["connections"] == 1 and w["started"] > 0 for w in workers)
    assert all(w["failed"] == 0 and w["server_errors"] == 0 for w in workers)
    assert all(0 < w["busy"] <= 1 for w in workers)
    assert "gtarantool: 2 worker processes busy" in out.stdout
    assert "Response time percentiles (ms)" in out.stdout
    for suffix in ("_stats.csv", ".html", ".json"):
        assert (tmp_path / ("locust" + suffix)).stat().st_size > 0
    # The locustfile switched the fine buckets on: percentiles to 0.01 ms in the CSV.
    with open(tmp_path / "locust_stats.csv") as f:
        total = [row for row in csv.DictReader(f) if row["Name"] == "Aggregated"][0]
    assert any("." in total[column] for column in ("50%", "90%", "99%")), total


def test_master_and_two_workers(bench_server, tmp_path):
    target = Target(bench_server.host, bench_server.port, locust_run.Config())
    try:
        cost = locust_run.connect_cost(target)
        before = target.stat()
        port = free_port()
        report = tmp_path / "report.json"
        host = "tarantool://%s:%s" % (bench_server.host, bench_server.port)
        master = subprocess.Popen(LOCUST + [
            "--master", "--master-bind-port", str(port), "--expect-workers", "2", "--headless",
            "-u", "20", "-r", "20", "-t", "3s", "--stop-timeout", "5", "--host", host,
            "--bench-report", str(report), "--only-summary"] + MIX, cwd=ROOT,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        workers = [subprocess.Popen(LOCUST + ["--worker", "--master-port", str(port)], cwd=ROOT,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                   for _ in range(2)]
        try:
            output = master.communicate(timeout=90)[0]
            for worker in workers:
                worker.wait(timeout=30)
        finally:
            for proc in [master] + workers:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        after = target.stat()
    finally:
        target.close()
    assert master.returncode == 0, output[-4000:]
    data = json.loads(report.read_text())
    assert len(data["workers"]) == 2
    lines, ok = locust_run.reconcile(data, before, after, cost)
    assert ok, "\n".join(lines)
    assert sum(w["reported"] for w in data["workers"].values()) > 0


def test_unreachable_server_fails_once_and_stops(tmp_path):
    """Nothing listens: one error, exit code 1, and the run stops at once
    although -t asks for a minute."""
    report = tmp_path / "report.json"
    started = time.monotonic()
    port = str(free_port())   # (not Locust's default: another run may hold it)
    out = subprocess.run(LOCUST + [
        "--headless", "--processes", "2", "--master-bind-port", port, "--master-port", port,
        "-u", "20", "-r", "20", "-t", "60s",
        "--host", "tarantool://127.0.0.1:%d" % free_port(), "--bench-report", str(report),
        "--only-summary"], cwd=ROOT, timeout=90,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    elapsed = time.monotonic() - started
    assert out.returncode == 1, out.stdout[-4000:]
    assert elapsed < 30, elapsed
    assert out.stdout.count("cannot connect to tarantool://127.0.0.1") == 1, out.stdout[-4000:]
    assert "Traceback" not in out.stdout
    entries = json.loads(report.read_text())["entries"]
    assert entries == [{"type": "tarantool", "name": "connect", "requests": 1, "failures": 1}]


def test_compare_pairs_each_round_with_its_own_no_op():
    """--compare's share: per round, the Locust run against the no-op that ran
    right after it (not against another round's)."""
    rates = {"locust": [50.0, 30.0, 60.0], "locust --noop": [100.0, 40.0, 100.0],
             "make bench": [1.0, 1.0, 1.0]}
    assert locust_run.round_shares(rates) == pytest.approx([0.5, 0.25, 0.4])


def test_compare_reads_rate_and_server_errors_from_a_report():
    """A --bench-report: Locust's tarantool requests per worker CPU second (steps
    left out), and the share of them that were error replies."""
    data = {"entries": [{"type": "tarantool", "requests": 600}, {"type": "step", "requests": 50},
                        {"type": "tarantool", "requests": 400}],
            "workers": {"a": {"cpu_seconds": 1.5, "busy": 0.75, "server_errors": 70},
                        "b": {"cpu_seconds": 0.5, "busy": 0.25, "server_errors": 55}}}
    assert locust_run.report_rate(data) == pytest.approx((500.0, 0.125, 0.5))
    for worker in data["workers"].values():
        worker["server_errors"] = 0
        worker["busy"] = None
    assert locust_run.report_rate(data) == (500.0, 0.0, None)


def test_instructions_child_runs_the_users_until_n_requests(bench_server):
    """--instructions' counted process (here without callgrind): the
    locustfile's USERS/PROCS users make at least N requests, all of them to the
    server; its no-op makes them without one."""
    target = Target(bench_server.host, bench_server.port, locust_run.Config())
    try:
        target.admin.replace("bench", (3, 0, b"x"))
        locust_run.fill_half(target, "bench", locust_run.FILL_LIMIT + 1, 16)
        assert len(target.admin.select("bench")) == 0   # (a key range the mix never fills)
        locust_run.fill_half(target, "bench", 10, 16)
        assert sorted(t[0] for t in target.admin.select("bench")) == [0, 2, 4, 6, 8]
        url = locust_run.locust_url(target, None)
        made = {}
        for noop in (False, True):
            before = target.stat()
            out = subprocess.run([PY, "-m", "bench.locust.counted", "300", url,
                                  "-u", "20", "-p", "2", "--keys", "10", "--size", "16"]
                                 + (["--noop"] if noop else []), cwd=ROOT, timeout=120,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            after = target.stat()
            assert out.returncode == 0, out.stderr[-3000:]
            made[noop] = int(out.stdout.split()[-1])
            served = sum(after[k] - before.get(k, 0) for k in ("SELECT", "INSERT", "UPDATE",
                                                                "DELETE"))
            assert made[noop] >= 300
            # (more: the schema's selects, and up to one request a user in flight at the end)
            assert (served == 0) if noop else (made[noop] <= served <= made[noop] + 30), (
                made[noop], served)
    finally:
        target.close()


def test_instructions_per_request_between_two_runs():
    """Start-up and connecting cancel out: only the requests between the runs count."""
    assert locust_run.per_request((5_000_000, 1_000), (7_000_000, 1_040)) == 50_000
