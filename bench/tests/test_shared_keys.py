"""One key space over all processes: each process's zipfian draws from every process's
records, so the hottest records are the same in each; inserts stay partitioned."""
import collections
import json

from bench.__main__ import main as bench_main
from bench.core import dataset


def hottest(index, procs, shared, mix=None, n=20000):
    items, window = dataset.run_items(mix or {"select": 100}, 1000, index, procs, "zipfian",
                                      seed=index, count=n, shared=shared)
    drawn = list(items)
    keys = collections.Counter(key for op, key in drawn if op == "select")
    return [key for key, _ in keys.most_common(2)], drawn


def test_both_processes_hottest_keys_coincide():
    shared = [0] * 4
    first, _ = hottest(0, 2, shared)
    second, _ = hottest(1, 2, shared)
    assert first == second
    # Each draws the other's records too.
    assert {k % 2 for k in first} == {k % 2 for k in second}


def test_without_a_shared_space_each_process_has_its_own():
    first, _ = hottest(0, 2, None)
    second, _ = hottest(1, 2, None)
    assert all(k % 2 == 0 for k in first) and all(k % 2 == 1 for k in second)


def test_inserts_stay_partitioned_and_reads_stay_on_acknowledged_records():
    shared = [0] * 4
    mix = {"insert": 50, "select": 50}
    items_a, window_a = dataset.run_items(mix, 100, 0, 2, "zipfian", 0, count=2000,
                                          shared=shared)
    items_b, window_b = dataset.run_items(mix, 100, 1, 2, "zipfian", 1, count=2000,
                                          shared=shared)
    a, b = list(items_a), list(items_b)
    assert all(key % 2 == 0 for op, key in a if op == "insert")
    assert all(key % 2 == 1 for op, key in b if op == "insert")
    # No insert was acknowledged: the reads are of the 100 loaded records alone, both
    # processes' (YCSB's acknowledged counter, one per process here).
    reads = {key for op, key in a + b if op == "select"}
    assert reads <= set(range(100)) and {k % 2 for k in reads} == {0, 1}
    window_b.ack(101)
    assert shared[3] == 51


def test_a_mix_with_deletes_reads_each_process_own_records():
    # Another process's delete may be on its way: its records are not read.
    first, _ = hottest(0, 2, [0] * 4, {"select": 60, "delete": 40}, 800)
    assert all(k % 2 == 0 for k in first)


def test_processes_read_each_others_records_without_errors(server, tmp_path):
    path = tmp_path / "out.json"
    assert bench_main([
        "--host", server.host, "--port", str(server.port), "--user", "test", "--password",
        "secret", "--workload", "mix", "--mix", "insert=20,select=50,update=30",
        "--distribution", "zipfian", "--records", "500", "--rate", "800", "--duration", "1",
        "--procs", "2", "--greenlets", "8", "--driver", "threads", "-q",
        "--json", str(path)]) == 0
    phase = json.loads(path.read_text())["phases"][1]
    # Reads of the other process's records found them: none missing, none changed.
    assert phase["ops"] == 800 and phase["errors"] == {} and phase["server"]["match"]


def test_the_space_is_the_same_when_the_shares_differ():
    # 2001 operations over 2 processes: 1001 and 1000, one key space all the same.
    spaces = [dataset.run_items({"insert": 50, "select": 50}, 100, i, 2, "zipfian", i,
                                count=1001 - i, shared=[0] * 4, expected_all=2001)[1].space
              for i in (0, 1)]
    assert spaces[0] == spaces[1]
