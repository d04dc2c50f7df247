"""The figures a capacity step is judged on, without a server: the achieved rate against
the schedule, per-second percentiles, arrivals apart from keys, value size weights."""
import random

import pytest

from bench.core import openloop
from bench.core.openloop import Schedule
from bench.core.values import parse_sizes
from bench.core.workloads import Payloads
from bench.run.runner import latency_ms


def worker_part(schedule, ops, last_send):
    schedule.begin(100.0)
    return {"counts": {"select": ops}, "last_send": last_send, "max_lag": 0.0,
            "open_loop": {"scheduled": ops, "late_at_end": 0,
                          "schedule_start": schedule.start, "schedule_end": schedule.end,
                          "period_end": schedule.period_end, "worker_rate": schedule.rate}}


@pytest.mark.parametrize("rate,procs,seconds", [(100, 4, 1.0), (330, 3, 0.7), (50, 1, 2.0)])
def test_a_worker_that_kept_up_achieved_its_schedule_exactly(rate, procs, seconds):
    # Short steps at low rates: the count's rounding must not read as falling behind.
    parts = []
    for index in range(procs):
        schedule = Schedule(rate, procs, index, duration=seconds)
        n = len(list(Schedule(rate, procs, index, duration=seconds).begin(100.0)))
        parts.append(worker_part(schedule, n, 100.0 + seconds * 0.99))
    ops = sum(sum(p["counts"].values()) for p in parts)
    figures, _, _ = openloop.phase_figures(parts, rate, "uniform", ops, seconds,
                                           lambda hist: latency_ms(hist))
    assert figures["achieved_rate"] == pytest.approx(figures["scheduled_rate"])
    assert figures["kept_up"]


def test_a_worker_that_fell_behind_achieved_less():
    schedule = Schedule(100, 1, 0, duration=1.0)
    part = worker_part(schedule, 100, 102.0)     # its last request left a second late
    figures, _, _ = openloop.phase_figures([part], 100, "uniform", 100, 2.0,
                                           lambda hist: latency_ms(hist))
    assert figures["achieved_rate"] == pytest.approx(50)
    assert not figures["kept_up"]


def test_per_second_percentiles_are_rounded_not_truncated():
    assert openloop._bucket(1999) == 2000
    assert openloop._bucket(1949) == 1900
    assert openloop._bucket(15_500) == 16_000
    assert openloop._bucket(99) == 99


def test_arrivals_and_keys_draw_from_different_streams():
    schedule = Schedule(1000, 1, 0, arrivals="poisson", seed=7, count=5)
    times = list(schedule.begin(0.0))
    gaps = [b - a for a, b in zip(times, times[1:])]
    keys = random.Random(7)
    assert gaps != [keys.expovariate(1000) for _ in gaps]


def test_weighted_sizes_keep_small_weights_exactly():
    sizes = parse_sizes("100:999,100000:1")
    payloads = Payloads("100:999,100000:1")
    large = sum(1 for p in payloads.table if len(p) == 100_000)
    assert large == 1 and len(payloads.table) == sizes.slots(Payloads.SPREAD) >= 1000
    assert large / len(payloads.table) == pytest.approx(0.001, rel=0.01)
    table = parse_sizes("100:70,1000:25,10000:5").table(251, random.Random(0))
    assert len(table) == 251
    assert abs(table.count(10000) - 251 * 0.05) < 1
