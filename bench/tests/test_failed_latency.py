"""A failed request's latency goes to its operation's ``<op>-failed`` row (as YCSB measures
``READ-FAILED``), never into the percentiles of the requests that succeeded: the
operation's row, the phase's, the intervals', the HDR log's untagged lines and the
capacity search's SLOs hold the successful requests only, while the counts of requests
and errors stay what they were."""
import collections
import json

import pytest

from bench.__main__ import main as bench_main
from bench.core.report import final
from bench.suites.capacity import parse_slo, step_from_results
from bench.tests.test_outputs import read_log
from gtarantool.testing.server import TarantoolServer

# A call that fails at once for 3 keys in 5 and takes SLOW seconds for the rest.
SLOW = 0.004
LUA = """
box.schema.user.grant('guest', 'read,write,execute,create', 'universe')
local fiber = require('fiber')
function sometimes(key)
    if key %% 5 < 3 then error('fails fast') end
    fiber.sleep(%r)
    return box.space.bench:get(key)
end
""" % SLOW


@pytest.fixture(scope="module")
def server():
    srv = TarantoolServer(LUA)
    srv.start()
    yield srv
    srv.cleanup()


def run(server, tmp_path, *args, status=0):
    path = tmp_path / "out.json"
    assert bench_main(["--host", server.host, "--port", str(server.port), "-q",
                       "--json", str(path), "--workload", "mix", "--records", "500",
                       "--procs", "1", "--greenlets", "10"] + list(args)) == status
    return json.loads(path.read_text())


@pytest.mark.parametrize("driver", ["gtarantool", "sync"])
def test_calls_that_all_fail_have_no_latency_but_a_failed_row(server, tmp_path, driver):
    log = tmp_path / "run.hlog"
    results = run(server, tmp_path, "--driver", driver, "--mix", "select=50,call=50",
                  "--call", "nope", "--ops", "1000", "--hlog", str(log))
    phase = results["phases"][1]
    select, call = phase["operations"]["select"], phase["operations"]["call"]
    failures = sum(call["errors"].values())
    # counted as before: every call a request and an error
    assert call["ops"] == failures > 0 and select["ops"] + call["ops"] == phase["ops"] == 1000
    assert phase["errors"] == call["errors"] and results["totals"]["errors"] == failures
    # no latency under call; its requests' under call-failed
    assert call["latency_ms"] is None and call["samples"] == 0
    assert set(phase["failed"]) == {"call"}
    row = phase["failed"]["call"]
    assert row["ops"] == row["samples"] == failures and row["errors"] == call["errors"]
    assert row["latency_ms"]["p50"] > 0
    # the phase's latency is the selects' alone
    assert select["samples"] == select["ops"] and phase["latency_ms"] == select["latency_ms"]
    assert phase["percentiles_ms"]["latency"][-1][1] == select["latency_ms"]["max"]
    # intervals count every request; their latency is the successful ones'
    intervals = [i for i in results["intervals"] if i["phase"] == "run"]
    assert sum(i["ops"] for i in intervals) == 1000
    assert sum(i["operations"].get("call", 0) for i in intervals) == failures
    # the HDR log: untagged lines the successful requests, Tag=call-failed the failures
    lines, _ = read_log(str(log))
    by_tag = collections.Counter()
    for tag, _, _, hist in lines:
        by_tag[tag] += hist.get_total_count()
    assert by_tag["select"] == select["ops"] and by_tag["insert"] == 500   # (the load)
    assert by_tag[None] == by_tag["select"] + by_tag["insert"]
    assert by_tag["call-failed"] == failures and by_tag["call"] == 0
    text = final(results)
    assert "  call-failed " in text
    assert [line.split()[4] for line in text.splitlines()
            if line.startswith("  call ")] == ["-"]   # its p50


def test_fast_failures_do_not_lower_the_percentiles_the_capacity_search_judges(server,
                                                                            tmp_path):
    results = run(server, tmp_path, "--mix", "call=100", "--call", "sometimes",
                  "--rate", "400", "--duration", "1")
    phase = results["phases"][1]
    call = phase["operations"]["call"]
    failures = sum(call["errors"].values())
    assert 0.4 * call["ops"] < failures < 0.8 * call["ops"]   # (3 keys in 5)
    # every successful call took SLOW on the server: so do the row's and the phase's
    assert call["latency_ms"]["p50"] >= SLOW * 1000
    assert phase["latency_ms"]["p50"] >= SLOW * 1000
    assert call["service_time_ms"]["p50"] >= SLOW * 1000
    assert phase["failed"]["call"]["latency_ms"]["p50"] < SLOW * 1000
    step = step_from_results(400, results)
    assert step.errors == failures and step.latency_ms["p50"] >= SLOW * 1000
    # an SLO below the successful calls' latency breaks, the failures notwithstanding;
    # the error budget still counts them
    assert not step.judge([parse_slo("p50=2ms")], max_errors=100)
    assert step.reasons[0].startswith("p50 ")
    assert not step.judge([parse_slo("call:p50=1s")], max_errors=10)
    assert step.reasons == ["errors %.3g%%" % step.error_percent]


def test_a_step_where_nothing_succeeded_breaks_its_slo(server, tmp_path):
    results = run(server, tmp_path, "--mix", "call=100", "--call", "nope", "--rate", "200",
                  "--duration", "0.5", status=1)   # (every request failed)
    step = step_from_results(200, results)
    assert step.errors == step.ops > 0 and step.latency_ms["p99"] is None
    assert not step.judge([parse_slo("p99=1s"), parse_slo("call:p99=1s")], max_errors=100)
    assert step.reasons[:2] == ["no request succeeded", "no call succeeded"]
