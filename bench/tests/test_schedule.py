"""The open-loop schedule: intended times at the rate, processes interleaved, Poisson gaps."""
import statistics

import pytest

from bench.core.openloop import Schedule, percentile


def test_uniform_count_and_spacing():
    s = Schedule(1000, 2, 1, count=5)
    times = list(s.begin(10.0))
    assert times == pytest.approx([10.001 + 0.002 * i for i in range(5)])
    assert s.end == pytest.approx(times[-1])


def test_processes_interleave():
    a = list(Schedule(1000, 2, 0, count=3).begin(0.0))
    b = list(Schedule(1000, 2, 1, count=3).begin(0.0))
    merged = sorted(a + b)
    assert merged == pytest.approx([0.001 * i for i in range(6)])


def test_duration_bound():
    s = Schedule(100, 1, 0, duration=1.0)
    times = list(s.begin(5.0))
    assert len(times) == 100 and times[-1] < 6.0 and s.end == 6.0


def test_poisson_rate_and_gaps():
    s = Schedule(10_000, 1, 0, arrivals="poisson", seed=3, count=20_000)
    times = list(s.begin(0.0))
    assert s.end == times[-1]
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert statistics.mean(gaps) == pytest.approx(1e-4, rel=0.03)
    # Exponential gaps: the standard deviation equals the mean.
    assert statistics.pstdev(gaps) == pytest.approx(1e-4, rel=0.05)


def test_bad_schedules():
    with pytest.raises(ValueError):
        Schedule(0, 1, 0, count=1)
    with pytest.raises(ValueError):
        Schedule(10, 1, 0, arrivals="bursty", count=1)
    with pytest.raises(ValueError):
        Schedule(10, 1, 0)


def test_percentile_of_buckets():
    assert percentile({1000: 98, 5000: 1, 9000: 1}, 99) == 5.0
    assert percentile({1000: 98, 5000: 1, 9000: 1}, 50) == 1.0
    assert percentile({}, 99) is None


def test_a_backlog_is_sent_for_a_bounded_time_after_the_schedule():
    """A server that died leaves every request failing slowly: the backlog left at the
    schedule's end is sent for at most DRAIN seconds (or the schedule's length), and
    what is left then is counted, not sent."""
    from bench.core.openloop import DRAIN, OpenPhase
    from bench.core.workloads import Phase

    now = [100.0]
    phase = OpenPhase(Phase("run", (("select", k) for k in range(10 ** 6))),
                      Schedule(100, 1, 0, duration=2.0), clock=lambda: now[0])
    phase.start()
    assert phase.take()[:2] == ("select", 0)
    now[0] = 102.5                      # the schedule ended: late, still sent
    assert phase.take() is not None and phase.late_at_end == 1
    now[0] = 102.0 + DRAIN + 0.1        # the drain's time is over
    assert phase.take() is None
    assert phase.taken == 2 and phase.dropped_at_end == 198
    assert phase.take() is None and phase.figures()["dropped_at_end"] == 198
