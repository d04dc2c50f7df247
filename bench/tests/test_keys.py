"""Key distributions, value sizes and the record window: each produces its shape."""
import collections
import random

import pytest

from bench.core import dataset, keys
from bench.core.config import Config
from bench.core.values import parse_sizes

DRAWS = 200_000
N = 1000


def counts(name, n=N, draws=DRAWS, seed=1, **params):
    pick = keys.chooser(name, random.Random(seed), **params)
    return collections.Counter(pick(0, n) for _ in range(draws))


def test_fnv64_matches_the_reference_hash():
    # FNV-1a 64 of eight zero bytes, from the published offset basis and prime.
    h = 0xCBF29CE484222325
    for _ in range(8):
        h = (h * 1099511628211) & ((1 << 64) - 1)
    expected = h if h < 1 << 63 else (1 << 64) - h
    assert keys.fnv64(0) == expected & ((1 << 63) - 1)
    assert keys.fnv64(1) != keys.fnv64(256)


def test_uniform_covers_the_window_evenly():
    c = counts("uniform")
    assert set(c) == set(range(N))
    assert max(c.values()) < 1.5 * DRAWS / N and min(c.values()) > 0.5 * DRAWS / N


def test_zipfian_most_frequent_key_and_its_share():
    c = counts("zipfian")
    key, n = c.most_common(1)[0]
    # Rank 0 lands where YCSB's scrambled zipfian puts it, with ~1/zeta of the draws.
    assert key == keys.zipfian_item(0, N)
    assert abs(n / DRAWS - 1 / keys.ZETAN) < 0.006
    second = c[keys.zipfian_item(1, N)]
    assert abs(second / DRAWS - 0.5 ** 0.99 / keys.ZETAN) < 0.006
    # Skewed: the 10 hottest keys take far more than 1% of the draws.
    assert sum(n for _, n in c.most_common(10)) / DRAWS > 0.1


def test_zipfian_item_generator_rank_frequencies():
    z = keys.Zipfian(100)
    rng = random.Random(3)
    c = collections.Counter(z.item(rng.random()) for _ in range(DRAWS))
    assert c.most_common(1)[0][0] == 0
    assert abs(c[0] / DRAWS - 1 / z.zetan) < 0.01
    assert max(c) < 100


def test_hotspot_share():
    c = counts("hotspot", hot_set=0.2, hot_ops=0.8)
    hot = sum(n for k, n in c.items() if k < N * 0.2)
    assert abs(hot / DRAWS - 0.8) < 0.01
    assert set(c) == set(range(N))


def test_latest_prefers_the_newest():
    c = counts("latest")
    assert c.most_common(1)[0][0] == N - 1
    assert c[N - 1] > c[N - 2] > c[N - 10] > c[N // 2]


def test_sequential_goes_round_the_window():
    pick = keys.chooser("sequential", random.Random(0))
    assert [pick(5, 9) for _ in range(6)] == [5, 6, 7, 8, 5, 6]
    assert pick(7, 12) == 7   # the window moved past: start again at its low end


def test_unknown_distribution():
    with pytest.raises(ValueError, match="distribution must be one of"):
        keys.chooser("pareto", random.Random(0))
    with pytest.raises(ValueError, match="hot set"):
        keys.chooser("hotspot", random.Random(0), hot_set=1.5)


def test_sizes_forms():
    assert parse_sizes("1536").table(5, random.Random(0)) == [1536] * 5
    sizes = parse_sizes("100-200").table(1000, random.Random(0))
    assert min(sizes) >= 100 and max(sizes) <= 200 and len(set(sizes)) > 50
    weighted = collections.Counter(parse_sizes("10:70,1000:30").table(100, random.Random(0)))
    assert weighted == {10: 70, 1000: 30}
    assert parse_sizes("10:1,30:1").mean == 20
    for bad in ("0", "abc", "5-2", "10:-1", ""):
        with pytest.raises(ValueError, match="size must be"):
            parse_sizes(bad)


def test_window_reads_only_acknowledged_records():
    pick = keys.chooser("latest", random.Random(0))
    window = dataset.Window(10, 0, 1, pick)
    new = window.next("insert")
    assert new == 10
    # Not answered yet: nothing reads it.
    assert all(window.next("select") < 10 for _ in range(200))
    window.ack(new)
    assert any(window.next("select") == 10 for _ in range(200))
    # Deletes take the oldest records first; reads never address them again.
    assert [window.next("delete") for _ in range(3)] == [0, 1, 2]
    assert all(window.next("update") >= 3 for _ in range(500))


def test_window_out_of_order_acks_and_worker_keys():
    window = dataset.Window(6, 1, 3, keys.chooser("uniform", random.Random(0)))
    # Worker 1 of 3 owns keys 1, 4; its inserts continue its own sequence.
    assert {window.next("select") for _ in range(100)} == {1, 4}
    a, b = window.next("insert"), window.next("insert")
    assert (a, b) == (7, 10)
    window.ack(b)
    assert window.acked == 2
    window.ack(a)
    assert window.acked == 4


def test_run_items_mix_and_no_missing_record():
    items, window = dataset.run_items({"select": 50, "delete": 50}, 100, 0, 1, "uniform",
                                      seed=0, count=150)
    got = list(items)
    assert len(got) == 150
    deleted = set()
    for op, key in got:
        if op == "delete":
            assert key not in deleted
            deleted.add(key)
        else:
            assert key not in deleted
    # A mix that runs out of records ends its stream and says why on its window.
    items, window = dataset.run_items({"delete": 1}, 5, 0, 1, "uniform", seed=0, count=10)
    assert len(list(items)) == 5
    assert "no live record left to delete" in window.exhausted
    with pytest.raises(ValueError, match="unknown operations"):
        dataset.run_items({"upsert": 1}, 5, 0, 1, "uniform", seed=0)


def test_batched_hash_matches_the_scalar_one():
    zipf = keys.Zipfian(keys.ITEM_COUNT, zetan=keys.ZETAN)
    rng = random.Random(5)
    hashes = keys._hashed_items(zipf, rng)()
    # Every hash is the FNV hash of some item the generator can produce; the most common
    # one is item 0's.
    top = collections.Counter(hashes).most_common(1)[0][0]
    assert top == keys.fnv64(0)
    assert keys.fnv64(1) in hashes and keys.fnv64(12345678901) == keys.fnv64(12345678901)


def test_gaussian_hot_centre():
    c = counts("gaussian")
    centre = sum(n for k, n in c.items() if 3 * N // 8 <= k < 5 * N // 8)
    assert 0.6 < centre / DRAWS < 0.75    # +-1 sigma: 68%


def test_window_guard_keeps_reads_off_both_ends():
    window = dataset.Window(100, 0, 1, keys.chooser("uniform", random.Random(0)), guard=10)
    picked = {window.next("select") for _ in range(3000)}
    assert min(picked) == 10 and max(picked) == 89
    small = dataset.Window(15, 0, 1, keys.chooser("uniform", random.Random(0)), guard=10)
    assert {small.next("select") for _ in range(500)} == set(range(15))


def test_zipfian_top_keys_stay_put_while_records_are_inserted():
    # A fixed space of records plus expected inserts (YCSB's): the window grows from
    # 1,000 to 1,500 records and the hottest keys among the first 1,000 do not move.
    space = 1500
    pick = keys.chooser("zipfian", random.Random(3), space=space)
    early = collections.Counter(pick(0, 1000) for _ in range(50_000))
    late = collections.Counter(pick(0, 1500) for _ in range(50_000))
    top = [k for k, _ in early.most_common(4)]
    assert [k for k, _ in late.most_common(20) if k < 1000][:4] == top
    assert all(0 <= k < 1000 for k in early) and max(late) >= 1000
    # The window's own modulus (no space) moves them: a control for the test above.
    moving = keys.chooser("zipfian", random.Random(3))
    grown = collections.Counter(moving(0, 1500) for _ in range(50_000))
    assert [k for k, _ in grown.most_common(4)] != top


def test_the_run_phase_fixes_the_zipfian_space_from_its_inserts():
    items, window = dataset.run_items({"select": 90, "insert": 10}, 1000, 0, 1, "zipfian",
                                      seed=1, count=2000)
    selected = collections.Counter(k for op, k in items if op == "select")
    hottest = selected.most_common(1)[0][0]
    # YCSB's ScrambledZipfianGenerator over recordcount + expectednewkeys + 1 items,
    # expectednewkeys = operationcount * insertproportion * 2.0 (CoreWorkload's fudge factor).
    assert hottest == keys.fnv64(0) % (1000 + 2 * 200 + 1)


def test_latest_builds_its_generator_before_the_first_draw():
    import time
    items, _ = dataset.run_items({"select": 100}, 200_000, 0, 1, "latest", seed=1, count=10)
    started = time.perf_counter()
    next(items)
    first = time.perf_counter() - started
    lazy = keys.chooser("latest", random.Random(1))
    started = time.perf_counter()
    lazy(0, 200_000)
    building = time.perf_counter() - started
    # The first draw of the run's generator costs a draw, not zeta over 400,000 items.
    assert first < building / 5, (first, building)


def test_hashed_insert_order_keys_are_the_records_fnv_hashes():
    assert list(dataset.load_keys(6, 1, 2, hashed=True)) == [keys.fnv64(n) for n in (1, 3, 5)]
    window = dataset.Window(4, 0, 1, keys.chooser("uniform", random.Random(0)), hashed=True)
    assert window.key(2) == dataset.record_key(2, True) == keys.fnv64(2)
    first, second = window.next("insert"), window.next("insert")
    assert (first, second) == (keys.fnv64(4), keys.fnv64(5))
    window.ack(second)          # out of order: nothing new is readable yet
    assert window.acked == 4
    window.ack(first)
    assert window.acked == 6
    reads = {window.next("select") for _ in range(200)}
    assert reads == {keys.fnv64(n) for n in range(6)}


def test_hashed_insert_order_refuses_a_transaction_and_the_phases_workload():
    with pytest.raises(ValueError, match="consecutive keys"):
        dataset.run_items({"tx": 10, "select": 90}, 100, 0, 1, "uniform", 0, hashed=True)
    for overrides in ({"workload": "mix", "mix": {"tx": 10, "select": 90}},
                      {"workload": "phases"}):
        with pytest.raises(ValueError, match="insert-order hashed"):
            Config(insert_order="hashed", **overrides)
