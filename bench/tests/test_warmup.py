"""``--warmup``: the run phase's own load before it, a phase of its own (its box.stat
counted apart), not in the figures a capacity step is judged on."""
import json

import pytest

from bench.__main__ import main as bench_main
from bench.core.config import Config
from bench.run import runner
from bench.suites.capacity import step_from_results
from bench.targets.server import Target

MIX = "insert=25,select=25,update=25,delete=25"


def run(server, tmp_path, *args):
    path = tmp_path / "out.json"
    assert bench_main(["--host", server.host, "--port", str(server.port), "--user", "test",
                       "--password", "secret", "--workload", "mix", "--mix", MIX,
                       "--records", "300", "--json", str(path), "-q", *args]) == 0
    return json.loads(path.read_text())


def test_an_open_loops_warmup_is_counted_apart(server, tmp_path):
    rate = 400
    results = run(server, tmp_path, "--rate", str(rate), "--duration", "1", "--warmup",
                  "0.5", "--procs", "2", "--greenlets", "8")
    load, warmup, phase = results["phases"]
    assert [load["name"], warmup["name"], phase["name"]] == ["load", "warmup", "run"]
    # Each phase's box.stat snapshot is its own: the server's counts equal the client's.
    assert all(p["server"]["match"] for p in results["phases"])
    assert warmup["open_loop"]["scheduled"] == warmup["ops"] == rate * 0.5
    assert phase["open_loop"]["scheduled"] == phase["ops"] == rate * 1
    # The run goes on over the warm-up's records: no key inserted twice, none missing.
    assert warmup["errors"] == {} and phase["errors"] == {}
    step = step_from_results(rate, results)
    assert step.ops == phase["ops"] and step.errors == 0


def test_a_counted_run_after_a_warmup_keeps_its_count(server, tmp_path):
    results = run(server, tmp_path, "--ops", "700", "--warmup", "0.2", "--greenlets", "4")
    names = [p["name"] for p in results["phases"]]
    assert names == ["load", "warmup", "run"]
    warmup, phase = results["phases"][1:]
    assert phase["ops"] == 700 and warmup["ops"] > 0
    assert all(p["server"]["match"] for p in results["phases"])
    assert phase["errors"] == {}


def test_warmup_is_for_a_run_phase():
    with pytest.raises(ValueError, match="warmup"):
        Config(workload="phases", warmup=1.0)
    with pytest.raises(ValueError, match="warm-up"):
        Config(workload="mix", warmup=-1.0)


def test_workers_serve_one_run_after_another(server):
    config = Config(workload="mix", mix={"insert": 50, "select": 50}, keys=200, rate=300,
                    duration=0.5, greenlets=4, procs=2, host=server.host,
                    port=server.port, user="test", password="secret", quiet=True)
    target = Target(server.host, server.port, config)
    try:
        with runner.Workers(config, target) as workers:
            pids = [proc.pid for proc in workers.procs]
            first = workers.run(config)
            second = workers.run(config.replace(rate=600, warmup=0.2))
            # The same processes ran both: no start, no connection per run.
            assert [proc.pid for proc in workers.procs] == pids
            assert all(proc.is_alive() for proc in workers.procs)
            with pytest.raises(ValueError, match="differs"):
                workers.run(config.replace(greenlets=8))
        assert not any(proc.is_alive() for proc in workers.procs)
    finally:
        target.close()
    assert first["phases"][-1]["ops"] == 150 and second["phases"][-1]["ops"] == 300
    # Each run starts from an empty space: the second's load inserts its records again.
    for results in (first, second):
        assert results["phases"][0]["ops"] == 200
        assert all(p["server"]["match"] and not p["errors"] for p in results["phases"])


def test_workers_that_cannot_start_are_stopped(server):
    config = Config(workload="mix", mix={"select": 100}, keys=10, rate=100, duration=0.5,
                    greenlets=2, procs=2, host=server.host, port=server.port, user="test",
                    password="not the password", quiet=True)
    target = Target(server.host, server.port, config.replace(password="secret"))
    workers = runner.Workers(config, target)
    try:
        with pytest.raises(runner.BenchError, match="worker"):
            with workers:
                pass
    finally:
        target.close()
    assert workers.procs and not any(proc.is_alive() for proc in workers.procs)
