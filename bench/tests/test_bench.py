"""The load generator on small runs: totals add up, the server counted what the client sent,
and the JSON report holds every figure."""
import argparse
import json
import re
import time

import pytest
import tarantool

from bench.__main__ import main as bench_main
from bench.core.config import OPERATIONS, Config
from bench.core.workloads import NOT_FOUND
from bench.run import runner
from bench.targets.server import SetupError
from gtarantool.testing.server import TarantoolServer

EXISTING_LUA = """
box.schema.user.create('loader', {password = 'pw'})
box.schema.user.grant('loader', 'read,write,execute,create', 'universe')
box.schema.user.create('noexec', {password = 'pw'})
box.schema.user.create('nocreate', {password = 'pw'})
box.schema.user.grant('nocreate', 'execute', 'universe')
"""

SMALL = dict(procs=2, greenlets=10, ops=2000, size=1536, quiet=True)
LATENCY = ("p50", "p90", "p99", "p99.9", "max", "mean")


def check_phase(phase, expected_ops):
    assert phase["ops"] == expected_ops
    assert sum(op["ops"] for op in phase["operations"].values()) == expected_ops
    assert phase["seconds"] > 0 and phase["ops_per_sec"] > 0
    assert phase["client_cpu_seconds"] > 0 and phase["ops_per_client_cpu_second"] > 0
    assert 0 <= phase["client_system_seconds"] <= phase["client_cpu_seconds"] * 1.01 + 0.001
    assert set(phase["latency_ms"]) == set(LATENCY)
    assert 0 < phase["latency_ms"]["p50"] <= phase["latency_ms"]["p99"] \
        <= phase["latency_ms"]["max"]
    server = phase["server"]
    assert server["requests"] == server["client_requests"]
    assert server["errors"] == server["client_errors"]
    assert server["match"]


def series_total(results, phase):
    return sum(sum(s["ops"].values()) for s in results["series"] if s["phase"] == phase)


def check_phases(results, ops):
    assert [p["name"] for p in results["phases"]] == list(OPERATIONS)
    for phase in results["phases"]:
        check_phase(phase, ops)
        assert list(phase["operations"]) == [phase["name"]]
        assert phase["errors"] == {}
        assert phase["server"]["requests"][phase["name"]] == ops
        assert series_total(results, phase["name"]) == ops
    assert results["totals"]["ops"] == 4 * ops
    assert results["totals"]["errors"] == 0
    assert results["totals"]["server_counts_match"]


def check_mix(results, ops, records):
    load, phase = results["phases"]
    check_phase(load, records)
    check_phase(phase, ops)
    # Every operation ran on records that exist: no error at all.
    assert set(phase["operations"]) == set(OPERATIONS)
    assert phase["errors"] == {} and load["errors"] == {}
    assert sum(phase["server"]["requests"].values()) == ops
    assert series_total(results, "run") == ops


def test_phases_gtarantool_json(tmp_path, capsys):
    path = tmp_path / "out.json"
    assert bench_main(["--driver", "gtarantool", "--procs", "2", "--greenlets", "10",
                       "--ops", "2000", "--workload", "phases", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "[   0s] insert" in out and "server counts equal the client's" in out
    results = json.loads(path.read_text())
    check_phases(results, 2000)
    assert results["config"]["driver"] == "gtarantool"
    assert results["config"]["procs"] == 2 and results["config"]["greenlets"] == 10
    assert results["server"]["embedded"] and results["server"]["wal"] == "write"
    assert results["concurrency"] == 20
    for phase in results["phases"]:
        conn = phase["connection"]
        # Greenlets share a socket: far fewer than one recv per request.
        assert 0 < conn["send_calls_per_1000_ops"] and 0 < conn["recv_calls_per_1000_ops"] < 1000
        assert conn["requests"] == 2000 and 1 <= conn["max_in_flight"] <= 10
        assert phase["server"]["cpu_seconds"] >= 0  # ticks of 10 ms: a short phase may show 0
        assert set(phase["operations"][phase["name"]]["latency_ms"]) == set(LATENCY)
    assert results["series"] and all({"t", "phase", "ops", "errors"} <= set(s)
                                     for s in results["series"])
    assert {s["phase"] for s in results["server_rps"]} == set(OPERATIONS)
    assert all(set(s["rps"]) == set(OPERATIONS) for s in results["server_rps"])


@pytest.fixture(scope="module")
def existing():
    """A server the bench did not start, with users holding more or fewer grants."""
    with TarantoolServer(EXISTING_LUA) as srv:
        yield srv


def test_mix_gtarantool_on_existing_server(existing):
    config = Config(driver="gtarantool", workload="mix", keys=500, host=existing.host,
                    port=existing.port, user="loader", password="pw", **SMALL)
    results = runner.run(config)
    check_mix(results, 2000, 500)
    assert not results["server"]["embedded"]
    assert results["server"]["feedback"] is False
    # An existing server's CPU, read through the connection (getrusage in its Lua).
    assert results["server"]["cpu_source"] == "lua"
    assert results["phases"][0]["server"]["cpu_seconds"] >= 0


@pytest.mark.parametrize("user, grant", [
    ("noexec", "box.schema.user.grant('noexec', 'execute', 'universe')"),
    ("nocreate", "box.schema.user.grant('nocreate', 'read,write,create', 'universe')"),
])
def test_missing_grant_is_named(existing, user, grant):
    config = Config(driver="sync", host=existing.host, port=existing.port, user=user,
                    password="pw", space="other", **SMALL)
    with pytest.raises(SetupError, match=re.escape(grant)):
        runner.run(config)


def test_lazy_errors_is_gtarantools_option():
    with pytest.raises(ValueError, match="--lazy-errors is gtarantool's option"):
        Config(driver="sync", lazy_errors=True)


@pytest.mark.parametrize("lazy_errors", [False, True], ids=["eager", "lazy-errors"])
def test_mix_gaussian_gtarantool_no_wal(lazy_errors):
    """Eager or lazy errors, the mix over loaded records meets none."""
    results = runner.run(Config(driver="gtarantool", workload="mix", keys=200,
                                distribution="gaussian", wal="none",
                                mix={"insert": 40, "select": 40, "update": 10, "delete": 10},
                                lazy_errors=lazy_errors, **SMALL))
    check_mix(results, 2000, 200)
    assert results["config"]["lazy_errors"] is lazy_errors
    ops = results["phases"][1]["operations"]
    assert ops["insert"]["ops"] > ops["update"]["ops"]


@pytest.mark.parametrize("workload", ["phases", "mix"])
def test_sync(workload):
    results = runner.run(Config(driver="sync", workload=workload, **SMALL))
    if workload == "phases":
        check_phases(results, 2000)
        # tarantool-python: one send and two recv calls per request
        conn = results["phases"][0]["connection"]
        assert conn["send_calls_per_1000_ops"] == 1000
        assert conn["recv_calls_per_1000_ops"] == 2000
    else:
        check_mix(results, 2000, Config.keys)
    assert results["concurrency"] == 2


def test_duration_bounds_each_phase():
    results = runner.run(Config(driver="gtarantool", duration=0.5,
                                **dict(SMALL, ops=10)))
    phases = {p["name"]: p for p in results["phases"]}
    inserted = phases["insert"]["ops"]
    assert inserted > 10  # the count is ignored when a duration is given
    for phase in results["phases"]:
        assert phase["errors"] == {} and phase["server"]["match"]
        assert phase["seconds"] < 3
    assert phases["delete"]["ops"] <= inserted


def test_mismatch_is_reported():
    """A select that reads bytes other than those written is an error, not a pass."""
    from bench.core.workloads import MISMATCH, Payloads, check
    payloads = Payloads(16)
    assert check("select", 7, [[7, 0, payloads(7)]], payloads) is None
    assert check("select", 7, [[7, 0, payloads(8)]], payloads) == MISMATCH
    assert check("delete", 7, [], payloads) == NOT_FOUND


RESTARTABLE_LUA = """
box.schema.user.create('loader', {password = 'pw', if_not_exists = true})
box.schema.user.grant('loader', 'read,write,execute,create', 'universe', nil,
                      {if_not_exists = true})
"""


# The admin connection (tarantool-python) warns on each reconnect attempt: expected here.
@pytest.mark.filterwarnings("ignore::tarantool.error.NetworkWarning")
def test_bench_keeps_running_through_a_server_restart():
    """A duration-bound run lives through kill -9 and a restart from the WAL: the outage
    is counted as errors by kind and reported as a gap, and throughput resumes."""
    import threading
    import time

    srv = TarantoolServer(RESTARTABLE_LUA)
    srv.start()
    try:
        config = Config(host=srv.host, port=srv.port, user="loader", password="pw",
                        workload="mix", duration=7, procs=1, greenlets=20, keys=1000,
                        size=64, quiet=True)

        def restart():
            # Once the run phase is under way (the load phase only inserts).
            # No schema: the run's load phase creates its space while this connects.
            admin = tarantool.Connection(srv.host, srv.port, user="loader", password="pw",
                                         fetch_schema=False)
            try:
                # (past what loading the schemas of every connection selects: on a
                # busy host the workers may still be connecting once those are done)
                while admin.eval("return box.stat().SELECT.total").data[0] < 500:
                    time.sleep(0.05)
            finally:
                admin.close()
            time.sleep(1.5)
            srv.kill()
            time.sleep(2)
            srv.start()

        fault = threading.Thread(target=restart)
        fault.start()
        results = runner.run(config)
        fault.join()
    finally:
        srv.cleanup()
    load, phase = results["phases"]
    assert phase["server"]["restarted"]
    assert results["gaps"], results["series"]
    gap = results["gaps"][0]
    assert gap["seconds"] >= 1
    assert gap["errors"] and all(kind in ("NetworkError", "ConnectionClosed", "RequestTimeout")
                                 for kind in gap["errors"]), gap
    answered_after = sum(sum(s["ops"].values()) for s in results["series"]
                         if s["t"] >= gap["to"] + 1)
    assert answered_after > 0
    assert sum(p["ops"] for p in results["phases"]) == sum(
        sum(s["ops"].values()) for s in results["series"])


def test_perf_prints_every_target_and_exits_by_the_verdict(tmp_path, capsys):
    from bench.suites import perf
    out = tmp_path / "perf.json"
    code = perf.main(["--runs", "1", "--ops", "600", "--sync-ops", "200", "--sync-runs", "1",
                      "--pipeline-ops", "600", "--window", "200", "--greenlets", "10",
                      "--json", str(out)])
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    verdict = [line for line in printed.splitlines() if line.startswith(("PASS", "FAIL"))]
    assert verdict == result["verdict"]
    # targets 1 and 2 per operation (CPU, ops/s, sync), 3 (sends, recvs), 4, 5 (p99)
    assert len(verdict) == 4 * 3 + 4 * 2 + 1 + 4
    assert code == (0 if all(line.startswith("PASS") for line in verdict) else 1)
    assert result["ok"] == (code == 0)
    medians = result["medians"]
    for driver in ("gtarantool", "asynctnt", "sync"):
        for op in ("insert", "select", "update", "delete"):
            assert medians[driver][op]["ops_per_client_cpu_second"] > 0
            # (The kernel's share and the whole CPU per op are read over windows
            # that differ by the run's edges: a busy host moves them apart a little.)
            assert 0 <= medians[driver][op]["system_us_per_op"] \
                <= 1e6 / medians[driver][op]["ops_per_client_cpu_second"] * 1.1
    assert "client CPU per op, us (in the kernel)" in printed
    assert 0 <= result["steal_percent"] <= 100 and "stolen by the host" in printed
    # and per run, on each run's line
    assert [len(result["run_steal_percent"][name]) for name in ("gtarantool", "pipeline")] \
        == [1, 1]
    assert all(0 <= p <= 100 for p in result["run_steal_percent"]["asynctnt"])
    assert len(re.findall(r"^run \d .*% stolen\)$", printed, re.M)) == len(
        [v for values in result["run_steal_percent"].values() for v in values])


def test_instructions_per_request_under_callgrind(capsys):
    """(One row: each is two client processes under callgrind, ~13 s apiece.)"""
    from bench.suites import instructions
    assert instructions.main(["-n", "200", "--greenlets", "10", "--ops", "select",
                              "--drivers", "gtarantool"]) == 0
    printed = capsys.readouterr().out
    count = re.search(r"^select\s+([\d,]+)\s*$", printed, re.M)
    assert count, printed
    # A request costs thousands of instructions; start-up (millions) is subtracted.
    assert 5_000 < int(count.group(1).replace(",", "")) < 500_000


def test_instructions_child_runs_make_perfs_pipelined_loop():
    """The pipeline row's counted process, without callgrind: its inserts reach the server."""
    from bench.core.config import Config
    from bench.suites import instructions
    from bench.targets import open_target
    base = Config(workload="phases", procs=1, quiet=True, wal="none")
    with open_target(base) as target:
        instructions.fill(target, base.space, instructions.PIPELINE, 300, 16)
        instructions.child("gtarantool", instructions.PIPELINE, 300, target.host, target.port,
                           base.space, 16, 10)
        assert target._eval("return box.space[...]:len()", base.space) == [300]


def test_instructions_table_says_which_driver_has_no_pipeline():
    from bench.suites import instructions
    args = argparse.Namespace(
        n=10, greenlets=3, size=100, ops=["select", "pipeline"])
    printed = instructions.table({"gtarantool": {"select": 2000.0, "pipeline": 1000.0},
                                  "sync": {"select": 4000.0, "pipeline": None}}, args)
    # the ratio of the first two, and what the first costs more (here less) in percent
    assert re.search(r"^select\s+2,000\s+4,000\s+0\.500 \(-50\.0%\)$", printed, re.M), printed
    assert re.search(r"^pipeline\s+1,000\s+n/a$", printed, re.M), printed


def test_instructions_rejects_unknown_names():
    from bench.suites import instructions
    with pytest.raises(SystemExit):
        instructions.main(["--ops", "frobnicate"])
    with pytest.raises(SystemExit):
        instructions.main(["--drivers", "nosuchdriver"])


def test_sweep_prints_every_level_and_target_and_exits_by_the_verdict(tmp_path, capsys):
    from bench.suites import sweep
    out = tmp_path / "sweep.json"
    code = sweep.main(["--runs", "1", "--ops", "300", "--ops-at-1", "100", "--min-rounds", "2",
                       "--levels", "1,10,200", "--wal", "none", "--json", str(out)])
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    verdict = [line for line in printed.splitlines() if line.startswith(("PASS", "FAIL"))]
    assert verdict == [line for line in result["verdict"] if line.startswith(("PASS", "FAIL"))]
    # G=1: CPU and p50 against asynctnt and sync, per op; G=10 and 200: CPU and ops/s per op;
    # the top level: p99.9/p50 per op and RSS growth
    assert len(verdict) == 2 * 4 + 2 * 2 * 2 + 2 + 1
    assert code == (0 if all(line.startswith("PASS") for line in verdict) else 1)
    assert sorted(result["medians"]) == ["asynctnt@1", "asynctnt@10", "asynctnt@200",
                                         "gtarantool@1", "gtarantool@10", "gtarantool@200",
                                         "sync@1"]
    top = result["medians"]["gtarantool@200"]
    for op in ("insert", "select"):
        figures = top[op]
        assert 0 < figures["p50_ms"] <= figures["p99_ms"] <= figures["p999_ms"] \
            <= figures["max_ms"]
        # 200 greenlets, 400 requests: at least one send per 200 requests, never one each
        assert 5 <= figures["send_calls_per_1000"] < 1000
    assert result["medians"]["gtarantool@1"]["select"]["send_calls_per_1000"] == 1000
    assert top["peak_rss_mb"] > 0
    assert re.search(r"^200 +select +gtarantool .*$", printed, re.M)


def test_the_sweep_shows_gtarantool_without_its_lead_request_beside_it(capsys):
    """At 10 greenlets the lead request of a small batch makes more than one
    write per 10 requests; the contender with it off writes once per batch."""
    from bench.suites import sweep
    sweep.main(["--runs", "1", "--ops", "400", "--levels", "10", "--wal", "none",
                "--drivers", "gtarantool,gtarantool-nolead"])
    rows = {line.split()[2]: line.split() for line in capsys.readouterr().out.splitlines()
            if re.match(r"^10 +select ", line)}
    assert set(rows) == {"gtarantool", "gtarantool-nolead"}
    sends = {name: float(row[9]) for name, row in rows.items()}
    assert sends["gtarantool-nolead"] <= 110 < sends["gtarantool"]


def test_the_sweep_writes_a_batch_n_requests_at_a_time_for_a_flush_contender(capsys):
    """gtarantool-flushN: the lead off, a batch written N requests at a time;
    flush1 writes every request, as asyncio's clients do."""
    from bench.suites import sweep
    assert sweep.write_policy("gtarantool-flush3") == (0, 3)
    assert sweep.write_policy("gtarantool-flush0") is None
    assert sweep.write_policy("gtarantool-flushy") is None
    sweep.main(["--runs", "1", "--ops", "400", "--levels", "10", "--wal", "none",
                "--drivers", "gtarantool-flush1,gtarantool-flush5"])
    rows = {line.split()[2]: line.split() for line in capsys.readouterr().out.splitlines()
            if re.match(r"^10 +select ", line)}
    sends = {name: float(row[9]) for name, row in rows.items()}
    assert set(sends) == {"gtarantool-flush1", "gtarantool-flush5"}
    assert sends["gtarantool-flush1"] >= 900 and 150 <= sends["gtarantool-flush5"] <= 250
    with pytest.raises(SystemExit):
        sweep.main(["--drivers", "gtarantool-flush0"])


def test_a_select_the_server_made_itself_is_explained():
    """An existing 2.11/3.x server with feedback on counts a select of its own
    once a minute: the report says so beside the mismatch it makes."""
    from bench.core.report import feedback_hint
    phase = {"requests": {"select": 101, "insert": 5},
             "client_requests": {"select": 100, "insert": 5}}
    assert "1 more select than sent" in feedback_hint({"feedback": True}, phase)
    assert feedback_hint({"feedback": False}, phase) is None
    assert feedback_hint({"feedback": True}, dict(phase, requests={"select": 99})) is None


def test_a_worker_that_fails_before_a_phase_ends_the_run_at_once():
    config = Config(driver="gtarantool", workload="mix", keys=100, mix={"select": 100}, **SMALL)
    config.mix = {"select": 90, "upsert": 10}   # past the parent's checks: refused in the worker
    started = time.monotonic()
    with pytest.raises(runner.BenchError, match="unknown operations upsert"):
        runner.run(config)
    assert time.monotonic() - started < runner.BARRIER_TIMEOUT / 4


def test_sigterm_stops_the_throwaway_server():
    """``timeout``, systemd and ``docker stop`` send SIGTERM: the run ends as an
    interrupt does, and the server it started (in a session of its own) goes too."""
    import os
    import signal
    import subprocess
    import sys

    import psutil

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    run = subprocess.Popen([sys.executable, "-m", "bench", "--workload", "mix", "--records",
                            "100", "--duration", "60", "-q"], cwd=root,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    servers = []
    try:
        deadline = time.monotonic() + 60
        while not servers:   # the run has started its server
            assert time.monotonic() < deadline and run.poll() is None, run.communicate()
            time.sleep(0.2)
            servers = [p for p in psutil.Process(run.pid).children(recursive=True)
                       if "tarantool" in p.name()]
        time.sleep(1)
        run.send_signal(signal.SIGTERM)
        _, err = run.communicate(timeout=60)
        assert run.returncode == 130 and "interrupted" in err, err
        gone, alive = psutil.wait_procs(servers, timeout=10)
        assert not alive
    finally:
        if run.poll() is None:
            run.kill()
        for server in servers:   # (left behind: the test failed)
            if server.is_running():
                server.kill()
