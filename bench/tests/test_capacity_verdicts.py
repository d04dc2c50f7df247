"""``python -m bench.capacity`` end to end, where the answer is no number or a lower bound:
every request failing gives ``capacity: none`` and exit status 1; a client that spends
CPU on each answer (``--client-work``) ends the search ``client-bound``."""
import json

import pytest

from bench.__main__ import main as bench_main
from bench.core.config import Config
from bench.suites.capacity import main as capacity_main
from bench.targets.server import Target


def _last_verdict(out):
    return [line for line in out.splitlines() if line.startswith("capacity: ")][-1]


def test_every_request_failing_is_capacity_none(server, tmp_path, capsys):
    path = tmp_path / "none.json"
    code = capacity_main([
        "--host", server.host, "--port", str(server.port), "--user", "test",
        "--password", "secret", "--mix", "call=100", "--call", "no_such_function_here",
        "--records", "100", "--greenlets", "10", "--slo", "p99=50ms", "--start", "200",
        "--factor", "4", "--step", "0.5", "--samples", "0", "--warmup", "0.2",
        "--json", str(path)])
    assert code == 1
    line = _last_verdict(capsys.readouterr().out)
    assert line.startswith("capacity: none") and "errors 100%" in line, line
    result = json.loads(path.read_text())
    assert result["capacity"] is None
    step = result["steps"][0]
    assert step["errors"] == step["ops"] > 0 and not step["ok"]
    assert sum(step["errors_by_kind"].values()) == step["errors"]


# (its steps need their CPU on time: a host busy with other tests can break every
# step, the lowest included, which the rerun in CI gives a second chance)
@pytest.mark.timing
def test_a_busy_client_makes_the_search_client_bound(server, tmp_path, capsys):
    # 2 ms of CPU per answer: one process holds at most 500/s, a local server far more.
    path = tmp_path / "bound.json"
    code = capacity_main([
        "--host", server.host, "--port", str(server.port), "--user", "test",
        "--password", "secret", "--mix", "select=100", "--records", "100",
        "--greenlets", "10", "--client-work", "2000", "--slo", "p99=1s", "--start", "100",
        "--factor", "4", "--precision", "0.3", "--step", "1", "--samples", "0",
        "--warmup", "0.2",
        "--json", str(path)])
    out = capsys.readouterr().out
    assert code == 0, out
    line = _last_verdict(out)
    assert line.startswith("capacity: >= ") and "(client-bound: 1 worker process at " in line
    assert line.endswith("add -p)"), line
    result = json.loads(path.read_text())
    assert result["client_bound"] is True
    broken = [s for s in result["steps"] if s["client_bound"]]
    # (the CPU it used plus its wait for one, on a busy host)
    assert broken and all(
        max(c + (w or 0) for c, w in zip(s["worker_cpu"], s["worker_wait"])) >= 0.85
        for s in broken)
    assert result["capacity"] < 500
    # The server runs here: its CPU is read for --host too.
    assert all(s["server_cpu"] is not None for s in result["steps"])


def test_an_existing_servers_cpu_is_read_through_the_connection(server):
    config = Config(host=server.host, port=server.port, user="test", password="secret")
    target = Target(server.host, server.port, config)
    try:
        assert target.cpu_source == "lua" and target.cpu_missing is None
        before = target.cpu_seconds()
        target._eval("local t = 0 for i = 1, 3e7 do t = t + i end return t")
        after = target.cpu_seconds()
    finally:
        target.close()
    assert 0 < before < after


def test_an_open_loop_records_service_time_by_interval_and_counts_gc(server, tmp_path):
    path, log = tmp_path / "run.json", tmp_path / "run.hlog"
    assert bench_main(["--host", server.host, "--port", str(server.port), "--user", "test",
                       "--password", "secret", "--workload", "mix", "--mix", "select=100",
                       "--records", "100", "--rate", "400", "--duration", "1", "-q",
                       "--json", str(path), "--hlog", str(log)]) == 0
    results = json.loads(path.read_text())
    run = [i for i in results["intervals"] if i["phase"] == "run"]
    assert run and all("service_time_ms" in i for i in run)
    assert all(i["service_time_ms"]["p50"] <= i["latency_ms"]["p99.9"] for i in run)
    assert "service_time.select" in log.read_text()
    phase = results["phases"][-1]
    assert len(phase["client_gc_collections"]) == 3
    assert len(phase["client_cpu_by_process"]) == 1


def test_options_no_search_can_take_are_usage_errors(capsys):
    """Before a server starts: an infinite value (a rate or a duration no run
    ends), an empty driver list, a budget of no time or a start beyond the
    staircase's top (no step would run, and "every rate broke" would be a lie)."""
    import pytest

    for argv in (["--step", "inf"], ["--samples", "inf"], ["--budget", "0"],
                 ["--budget", "-1"], ["--start", "inf"], ["--start", "2e7"],
                 ["--drivers", ","]):
        with pytest.raises(SystemExit) as exit_:
            capacity_main(argv)
        assert exit_.value.code == 2, argv   # (argparse's usage error)
        assert "error:" in capsys.readouterr().err
    for bad in ({"rate": float("inf")}, {"duration": float("inf")},
                {"warmup": float("inf"), "workload": "mix"}, {"client_work": float("inf")}):
        with pytest.raises(ValueError, match="finite"):
            Config(**bad)


def test_a_run_where_every_request_failed_exits_1(server, capsys):
    code = bench_main([
        "--host", server.host, "--port", str(server.port), "--user", "test",
        "--password", "secret", "--workload", "mix", "--mix", "call=100",
        "--call", "no_such_function_here", "--records", "10", "--greenlets", "4",
        "--duration", "0.5", "-q"])
    assert code == 1
    assert "every request of run failed" in capsys.readouterr().err


def _throwaway_server():
    from gtarantool.testing.server import TarantoolServer
    srv = TarantoolServer("box.schema.user.grant('guest', 'read,write,execute,create', "
                          "'universe', nil, {if_not_exists = true})")
    srv.start()
    return srv


# (tarantool-python warns at each reconnect attempt to the server killed here)
@pytest.mark.filterwarnings("ignore::tarantool.error.NetworkWarning")
def test_a_server_gone_during_setup_is_a_lost_connection_not_a_missing_grant():
    import tarantool

    srv = _throwaway_server()
    try:
        target = Target(srv.host, srv.port, Config(host=srv.host, port=srv.port))
        srv.kill()
        try:
            with pytest.raises(tarantool.error.NetworkError):
                target.prepare("bench")
        finally:
            target.close()
    finally:
        srv.cleanup()


# (tarantool-python warns at each reconnect attempt to the server killed here)
@pytest.mark.filterwarnings("ignore::tarantool.error.NetworkWarning")
def test_a_server_killed_during_the_search_gives_no_capacity(monkeypatch, capsys):
    from bench.suites import capacity

    srv = _throwaway_server()
    readings = []

    def read_steal():   # (read before and after each step: kill the server after the first)
        readings.append(1)
        if len(readings) == 2:
            srv.kill()
        return None
    monkeypatch.setattr(capacity, "read_steal", read_steal)
    try:
        code = capacity_main([
            "--host", srv.host, "--port", str(srv.port), "--mix", "select=100",
            "--records", "100", "--greenlets", "10", "--slo", "p99=1s", "--start", "100",
            "--step", "0.5", "--samples", "0", "--warmup", "0"])
    finally:
        srv.cleanup()
    out, err = capsys.readouterr()
    assert code == 1
    assert "lost the server" in err and "no capacity" in err, err
    import re
    assert not re.search(r"^capacity: (>= )?[0-9]", out, re.M), out


def test_a_bad_slo_or_error_share_says_what_it_must_be(capsys):
    import pytest

    for argv, expected in ((["--slo", "p99=abc"], "SLO must be [OPERATION:]PERCENTILE=BOUND"),
                           (["--slo", "p99=0ms"], "bound must be > 0"),
                           (["--slo", "nosuchop:p99=1ms"], "operation must be one of"),
                           (["--max-errors", "200"], "need a percentage in 0..100")):
        with pytest.raises(SystemExit) as exit_:
            capacity_main(argv)
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and expected in err, (argv, err)
        assert "Traceback" not in err
