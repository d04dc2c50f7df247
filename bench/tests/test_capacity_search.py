"""The capacity search on a modelled server: the staircase, the bisection, the SLO."""
import pytest

from bench.suites import capacity
from bench.suites.capacity import Step, parse_slo, search


def model(limit, base_ms=0.5):
    """A server that holds ``limit`` ops/s: latency flat below it, growing above."""
    calls = []

    def measure(rate):
        calls.append(rate)
        over = max(0.0, rate / limit - 1)
        ms = base_ms + 1000 * over
        achieved = min(rate, limit * 1.01)
        return Step(rate=rate, achieved=achieved,
                    latency_ms={"p50": ms / 2, "p90": ms, "p99": ms, "p99.9": ms, "max": ms})
    return measure, calls


def test_parse_slo():
    assert parse_slo("p99=2ms") == capacity.Slo("p99", 2.0)
    assert parse_slo("p99.9<=500us").ms == pytest.approx(0.5)
    assert parse_slo("max=1s").ms == 1000.0
    assert str(parse_slo("p99=2")) == "p99 <= 2 ms"
    for bad in ("p98=2ms", "p99", "p99=-1ms", "99=2ms"):
        with pytest.raises(ValueError):
            parse_slo(bad)


@pytest.mark.parametrize("limit", [3_300, 47_000, 900])
def test_search_finds_the_limit_within_precision(limit):
    measure, calls = model(limit)
    steps, best = search(measure, parse_slo("p99=2ms"), start=1000, precision=0.05)
    assert best is not None and best.ok
    assert limit * 0.95 <= best.rate <= limit * 1.001
    stages = [s.stage for s in steps]
    assert stages[0] == "staircase" and "bisection" in stages
    assert len(steps) < 16


def test_search_when_the_first_step_breaks_goes_down():
    measure, _ = model(300)
    steps, best = search(measure, parse_slo("p99=2ms"), start=1000)
    assert best is not None and 280 <= best.rate <= 301
    assert steps[0].rate == 1000 and not steps[0].ok


def test_a_step_that_cannot_keep_up_breaks_it():
    step = Step(rate=1000, achieved=900, latency_ms={"p99": 0.1})
    assert not step.judge(parse_slo("p99=2ms"))


def test_budget_stops_new_steps():
    measure, calls = model(10 ** 9)
    ticks = iter(range(0, 1000, 10))
    steps, best = search(measure, parse_slo("p99=2ms"), budget=35,
                         clock=lambda: next(ticks))
    assert len(steps) == 3 and best.rate == 4000


def test_table_and_verdict():
    measure, _ = model(5000)
    slo = parse_slo("p99=2ms")
    steps, best = search(measure, slo)
    text = capacity.table(steps)
    assert "holds" in text and "broken" in text
    assert capacity.verdict(best, slo).startswith("capacity: ")
    assert capacity.verdict(best, slo).endswith("(SLO p99 <= 2 ms)")
    assert "none found" in capacity.verdict(None, slo)


def test_a_capacity_nothing_broke_is_a_lower_bound():
    measure, _ = model(10 ** 9)
    slo = parse_slo("p99=2ms")
    steps, best = search(measure, slo, max_rate=5000)
    assert capacity.verdict(best, slo, steps).endswith("at least: no step broke it")
