"""Workloads over loaded records on a real server: the load phase leaves exactly N, the
run phase's mix has no accidental errors, the presets and the extra operations run."""
import json

import pytest
import tarantool

from bench.__main__ import main as bench_main
from bench.core.config import Config
from bench.core.dataset import PRESETS
from bench.core.keys import fnv64
from bench.core.report import final
from gtarantool.testing.server import TarantoolServer, binary_version

GRANT = "box.schema.user.grant('guest', 'read,write,execute,create', 'universe')"


@pytest.fixture(scope="module")
def server():
    srv = TarantoolServer(GRANT)
    srv.start()
    yield srv
    srv.cleanup()


def run(server, tmp_path, *args):
    path = tmp_path / "out.json"
    assert bench_main(["--host", server.host, "--port", str(server.port), "-q",
                       "--json", str(path), "--greenlets", "10"] + list(args)) == 0
    return json.loads(path.read_text())


def server_eval(server, lua):
    conn = tarantool.Connection(server.host, server.port)
    try:
        return conn.eval(lua).data[0]
    finally:
        conn.close()


def space_len(server):
    return server_eval(server, "return box.space.bench:len()")


def test_load_phase_leaves_exactly_n_records(server, tmp_path):
    results = run(server, tmp_path, "--workload", "mix", "--mix", "select=100",
                  "--records", "1234", "--procs", "2", "--ops", "500")
    load, phase = results["phases"]
    assert load["ops"] == 1234 and load["server"]["requests"]["insert"] == 1234
    assert space_len(server) == 1234
    assert phase["errors"] == {} and phase["server"]["match"]


@pytest.mark.parametrize("driver", ["gtarantool", "sync"])
def test_the_load_phase_is_pipelined_through_copy_from_with_gtarantool(server, tmp_path, driver):
    results = run(server, tmp_path, "--workload", "mix", "--mix", "select=100", "--driver",
                  driver, "--records", "30000", "--procs", "2", "--ops", "500")
    load, phase = results["phases"]
    assert load["ops"] == 30000 and load["server"]["requests"]["insert"] == 30000
    assert load["server"]["match"] and load["errors"] == {} and phase["server"]["match"]
    assert space_len(server) == 30000
    sends = load["connection"]["send_calls_per_1000_ops"]
    if driver == "gtarantool":   # copy_from: a write per batch of rows
        assert sends < 5
    else:                        # a request at a time
        assert sends >= 900


def test_copy_load_counts_each_refused_row_as_its_error(server):
    """A key loaded already: the load's other rows are written, that one counts as a
    duplicate key, as one insert's error would."""
    import gtarantool
    from bench.core.recorder import Recorder
    from bench.core.workloads import Payloads, Phase
    from bench.drivers.clients import copy_load
    from gtarantool.copy import space_info

    conn = gtarantool.connect(server.host, server.port)
    try:
        conn.eval("if box.space.bench_copy then box.space.bench_copy:drop() end "
                  "box.schema.space.create('bench_copy'):create_index('pk')")
        conn.insert("bench_copy", (7, 0, b"taken"))
        payloads = Payloads(16)
        phase = Phase("load", [("insert", k) for k in range(120)], 120)
        recorder = Recorder("load", lambda message: None)
        copy_load(conn, space_info(conn, "bench_copy"), phase, recorder, payloads)
        recorder.flush()
        assert recorder.counts["insert"] == 120
        assert dict(recorder.errors) == {("insert", "duplicate_key"): 1}
        assert conn.eval("return box.space.bench_copy:count()").data[0] == 120
        assert conn.select("bench_copy", 8).data[0][2] == payloads(8)
        assert conn.select("bench_copy", 7).data[0][2] == b"taken"
    finally:
        conn.close()


def test_default_mix_has_no_accidental_errors(server, tmp_path, capsys):
    results = run(server, tmp_path, "--workload", "mix", "--records", "300", "--procs", "2",
                  "--ops", "4000", "--distribution", "zipfian")
    phase = results["phases"][1]
    assert set(phase["operations"]) == {"insert", "select", "update", "delete"}
    assert phase["errors"] == {} and results["totals"]["errors"] == 0
    server_counts = phase["server"]["requests"]
    assert phase["server"]["match"]
    # The space holds what was loaded, inserted and not deleted.
    assert space_len(server) == 300 + server_counts["insert"] - server_counts["delete"]
    out = capsys.readouterr().out
    assert "  insert" in out and "server counts equal the client's" in out


@pytest.mark.parametrize("preset", sorted(set(PRESETS) - {"ycsb-e"}))
def test_presets_run_without_errors(server, tmp_path, preset):
    results = run(server, tmp_path, "--workload", preset, "--records", "200", "--ops", "600")
    phase = results["phases"][1]
    # (F's select and update rows also hold its rmw's requests: an update row of 0 ops)
    assert {op for op, f in phase["operations"].items() if f["ops"]} == \
        {op for op, n in PRESETS[preset][0].items() if n}
    assert phase["errors"] == {} and phase["server"]["match"]
    assert results["config"]["distribution"] == PRESETS[preset][1]


def test_call_eval_execute_and_value_sizes(server, tmp_path):
    results = run(server, tmp_path, "--workload", "mix", "--records", "200", "--ops", "900",
                  "--mix", "call=30,eval=30,execute=30,insert=10", "--size", "10:3,2000:1")
    phase = results["phases"][1]
    assert set(phase["operations"]) == {"call", "eval", "execute", "insert"}
    assert phase["errors"] == {} and phase["server"]["match"]
    assert phase["server"]["requests"]["call"] == phase["operations"]["call"]["ops"]


def test_range_sizes_reach_the_server(server, tmp_path):
    run(server, tmp_path, "--workload", "mix", "--mix", "select=100", "--records", "500",
        "--ops", "10", "--size", "100-300")
    sizes = server_eval(server, "local r = {} for _, t in box.space.bench:pairs() do "
                                "r[#r + 1] = #t[3] end return r")
    assert min(sizes) >= 100 and max(sizes) <= 300 and len(set(sizes)) > 20


needs_2_10 = pytest.mark.skipif(binary_version() < (2, 10),
                                reason="transactions over streams need Tarantool 2.10+")
needs_2_11 = pytest.mark.skipif(binary_version() < (2, 11),
                                reason="pagination (after/fetch_pos) needs Tarantool 2.11+")


@needs_2_10
@pytest.mark.parametrize("driver", ["gtarantool", "asynctnt"])
def test_transactions(tmp_path, driver):
    # The embedded server: it turns MVCC on for a mix with transactions.
    path = tmp_path / "out.json"
    assert bench_main(["--driver", driver, "--workload", "mix", "--mix", "tx=50,select=50",
                       "--records", "2000", "--ops", "400", "--greenlets", "4", "--tx-size",
                       "3", "-q", "--json", str(path)]) == 0
    phase = json.loads(path.read_text())["phases"][1]
    tx = phase["operations"]["tx"]
    # Conflicts between concurrent transactions are real errors, counted as they are.
    assert set(tx["errors"]) <= {"server_error_97"}
    assert phase["server"]["match"]
    answered = phase["server"]["client_requests"]
    assert answered["begin"] == tx["ops"]
    assert answered["update"] >= 3 * (tx["ops"] - sum(tx["errors"].values()))


@needs_2_11
def test_paginated_scan(server, tmp_path):
    results = run(server, tmp_path, "--workload", "mix", "--mix", "scan-pages=95,insert=5",
                  "--distribution", "zipfian", "--records", "500", "--ops", "200",
                  "--scan", "50", "--page", "20")
    phase = results["phases"][1]
    assert phase["errors"] == {} and phase["server"]["match"]
    scans = phase["operations"]["scan-pages"]["ops"]
    # Three pages for 50 records, fewer near the end of the key range.
    selects = phase["server"]["requests"]["select"]
    assert 2 * scans < selects <= 3 * scans


def test_operations_the_client_or_server_cannot_send(server):
    with pytest.raises(ValueError, match="needs the gtarantool or asynctnt driver"):
        Config(workload="mix", mix={"tx": 1}, driver="sync")
    with pytest.raises(ValueError, match="scan-pages needs the gtarantool driver"):
        Config(workload="mix", mix={"scan-pages": 1}, driver="asynctnt")


@pytest.mark.parametrize("driver", ["gtarantool", "asynctnt", "threads"])
@pytest.mark.parametrize("args", [["--mix", "select=100", "--records", "0"],
                                  ["--mix", "delete=100", "--records", "20", "--ops", "50"]])
def test_a_mix_that_runs_out_of_records_ends_with_one_line(server, capsys, driver, args):
    # (no record to read at all, or the deletes took the last one mid-run)
    code = bench_main(["--host", server.host, "--port", str(server.port), "-q",
                       "--workload", "mix", "--greenlets", "4", "--driver", driver] + args)
    err = capsys.readouterr().err
    assert code == 1
    assert "the mix cannot go on: no live record left to" in err
    assert "Traceback" not in err, err


# YCSB's shapes (workloads/workloadf, workloade; CoreWorkload): F is 50% read and 50%
# read-modify-write, so ~1.0 server select and ~0.5 update per operation; E's scan is
# one select of uniform 1..maxscanlength records, so ~0.95 select per operation and
# a mean of ~(1 + max) / 2 records a scan.
@pytest.mark.parametrize("driver", ["gtarantool", "asynctnt", "sync", "threads"])
def test_ycsb_f_reads_then_updates_the_record(server, tmp_path, driver):
    results = run(server, tmp_path, "--driver", driver, "--workload", "ycsb-f",
                  "--records", "1000", "--ops", "2000")
    phase = results["phases"][1]
    assert phase["errors"] == {} and phase["server"]["match"]
    ops, counted = phase["ops"], phase["server"]["requests"]
    assert ops == 2000 and set(phase["operations"]) == {"select", "update", "rmw"}
    assert counted["select"] / ops == pytest.approx(1.0, rel=0.1)
    assert counted["update"] / ops == pytest.approx(0.5, rel=0.1)
    # As YCSB reports F: READ and UPDATE (each request, an rmw's too) beside
    # READ-MODIFY-WRITE (the whole); an rmw counts once among the operations.
    select, update, rmw = (phase["operations"][op] for op in ("select", "update", "rmw"))
    assert select["ops"] + rmw["ops"] == ops == results["totals"]["ops"] - 1000   # (load)
    assert sum(i["ops"] for i in results["intervals"] if i["phase"] == "run") == ops
    assert rmw["samples"] == rmw["ops"] and "parts" not in rmw
    assert select["samples"] == select["ops"] + rmw["ops"]
    assert select["parts"] == update["parts"] == {"rmw": rmw["ops"]}
    assert update["ops"] == 0 and update["samples"] == rmw["ops"]
    assert update["latency_ms"]["max"] <= rmw["latency_ms"]["max"]
    assert "update: latency of %s requests" % "{:,}".format(rmw["ops"]) in final(results)


def test_an_open_loop_rmw_times_its_parts_in_both_series(server, tmp_path):
    results = run(server, tmp_path, "--workload", "ycsb-f", "--records", "500",
                  "--mix", "rmw=100", "--rate", "1000", "--duration", "0.5")
    phase = results["phases"][1]
    select, update, rmw = (phase["operations"][op] for op in ("select", "update", "rmw"))
    assert phase["errors"] == {} and select["ops"] == update["ops"] == 0 < rmw["ops"]
    assert select["samples"] == update["samples"] == rmw["samples"] == phase["ops"]
    assert select["service_time_ms"]["p50"] <= rmw["service_time_ms"]["max"]
    # the phase's latency is the operations' (the rmw's), not their parts'
    assert phase["latency_ms"] == rmw["latency_ms"]


@pytest.mark.parametrize("driver", ["gtarantool", "asynctnt", "sync"])
def test_ycsb_e_scans_in_one_select(server, tmp_path, driver):
    results = run(server, tmp_path, "--driver", driver, "--workload", "ycsb-e",
                  "--records", "2000", "--ops", "1000", "--scan", "40")
    phase = results["phases"][1]
    assert phase["errors"] == {} and phase["server"]["match"]
    ops, counted = phase["ops"], phase["server"]["requests"]
    assert counted["select"] / ops == pytest.approx(0.95, rel=0.1)
    assert counted["insert"] / ops == pytest.approx(0.05, rel=0.5)


@pytest.mark.parametrize("preset", ["ycsb-a", "ycsb-e"])
def test_hashed_insert_order_stores_each_record_under_its_hash(server, tmp_path, preset):
    results = run(server, tmp_path, "--workload", preset, "--records", "300", "--ops", "600",
                  "--insert-order", "hashed")
    phase = results["phases"][1]
    assert phase["errors"] == {} and phase["server"]["match"]
    inserted = phase["server"]["requests"].get("insert", 0)
    ids = server_eval(server, "local r = {} for _, t in box.space.bench:pairs() do "
                              "r[#r + 1] = t[1] end return r")
    assert sorted(ids) == sorted(fnv64(n) for n in range(300 + inserted))


# YCSB's CoreWorkload inserts in hashed order unless told otherwise (insertorder's
# default; workloads/workloade says so); a mix keeps its keys in record order.
@pytest.mark.parametrize("workload, expected", [("ycsb-d", "hashed"), ("mix", "ordered")])
def test_a_preset_inserts_in_ycsbs_default_hashed_order(server, tmp_path, workload, expected):
    results = run(server, tmp_path, "--workload", workload, "--records", "200", "--ops", "200")
    assert results["config"]["insert_order"] == expected
    phase = results["phases"][1]
    assert phase["errors"] == {} and phase["server"]["match"]
    ids = server_eval(server, "local r = {} for _, t in box.space.bench:pairs() do "
                              "r[#r + 1] = t[1] end return r")
    key = fnv64 if expected == "hashed" else (lambda n: n)
    assert ids and set(ids) <= set(key(n) for n in range(400))   # (200 loaded + inserts)


# YCSB's record is fieldcount (10) fields of fieldlength (100) bytes: a preset's payload
# is those 1,000 bytes unless --size says otherwise; a mix keeps the bench's 1,536.
@pytest.mark.parametrize("workload, args, expected", [
    ("ycsb-c", [], 1000), ("mix", [], 1536), ("ycsb-a", ["--size", "200"], 200)])
def test_a_presets_records_are_ycsbs_size(server, tmp_path, workload, args, expected):
    results = run(server, tmp_path, "--workload", workload, "--records", "50", "--ops", "50",
                  *args)
    assert results["config"]["size"] == expected
    sizes = server_eval(server, "local r = {} for _, t in box.space.bench:pairs() do "
                                "r[#r + 1] = #t[3] end return r")
    assert sizes and set(sizes) == {expected}
