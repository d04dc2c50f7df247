"""What a run writes beside its report: the HdrHistogram interval log (``--hlog``, read back
with the hdrhistogram package's HistogramLogReader), the JSON's short intervals and
percentile curves, and the plot's panels."""
import collections
import json
import struct
import time

from hdrh.log import HistogramLogReader

from bench.__main__ import main as bench_main
from bench.core.config import Config
from bench.core.recorder import INTERVAL, Recorder, new_histogram
from bench.run import runner
from bench.suites.compare import main as compare_main

SMALL = dict(procs=2, greenlets=10, size=256, quiet=True)


def read_log(path):
    """[(tag, start, end, histogram)] of every line, and the log's StartTime."""
    reader = HistogramLogReader(path, new_histogram())
    lines = []
    while True:
        hist = reader.get_next_interval_histogram()
        if hist is None:
            break
        lines.append((hist.get_tag(), hist.get_start_time_stamp() / 1000,
                      hist.get_end_time_stamp() / 1000, hist))
    start = reader.get_start_time_sec()
    reader.close()
    return lines, start


def test_hlog_holds_every_request_by_interval_and_operation(tmp_path):
    path = str(tmp_path / "run.hlog")
    started = time.time()
    results = runner.run(Config(workload="mix", duration=1.0, hlog=path, **SMALL))
    lines, start = read_log(path)
    assert started - 1 <= start <= time.time()
    phases = results["phases"]   # (the mix's load phase, then the mix)
    untagged = [line for line in lines if line[0] is None]
    # a second of intervals of INTERVAL seconds, each within the run and in time order
    assert len([line for line in untagged if line[1] >= phases[-1]["start"]]) >= 1.0 / INTERVAL
    assert all(0 <= s < e and e - s <= INTERVAL + 1e-3 for _, s, e, _ in untagged)
    assert [s for _, s, _, _ in untagged] == sorted(s for _, s, _, _ in untagged)
    whole = new_histogram()
    for _, _, _, hist in untagged:
        whole.add(hist)
    assert whole.get_total_count() == results["totals"]["ops"]
    # the log's histograms are the report's
    assert whole.get_max_value() / 1000 == max(p["latency_ms"]["max"] for p in phases)
    by_op = collections.Counter()
    for tag, _, _, hist in lines:
        if tag is not None:
            by_op[tag] += hist.get_total_count()
    assert by_op == sum((collections.Counter({op: f["ops"] for op, f in p["operations"].items()})
                         for p in phases), collections.Counter())


def test_json_intervals_and_percentile_curves(tmp_path):
    out = tmp_path / "run.json"
    assert bench_main(["--workload", "mix", "--duration", "1", "--procs", "2",
                       "--greenlets", "10", "-q", "--json", str(out)]) == 0
    results = json.loads(out.read_text())
    intervals = results["intervals"]
    assert results["interval_seconds"] == INTERVAL
    assert len(intervals) >= 1.0 / INTERVAL
    assert sum(i["ops"] for i in intervals) == results["totals"]["ops"]
    assert all(sum(i["operations"].values()) == i["ops"] for i in intervals)
    assert all(0 < i["seconds"] <= INTERVAL + 1e-3 for i in intervals)
    assert all(i["latency_ms"]["p50"] <= i["latency_ms"]["p99"] <= i["latency_ms"]["p99.9"]
               <= i["latency_ms"]["max"] for i in intervals)
    curve = results["phases"][0]["percentiles_ms"]["latency"]
    percentiles = [p for p, _ in curve]
    assert percentiles[0] == 0 and percentiles[-1] == 100 and 99.99 < percentiles[-2] < 100
    assert [ms for _, ms in curve] == sorted(ms for _, ms in curve)
    assert curve[-1][1] == results["phases"][0]["latency_ms"]["max"]


def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


def test_plot_has_a_row_per_run(tmp_path):
    one, two = str(tmp_path / "one.png"), str(tmp_path / "two.png")
    assert bench_main(["--ops", "2000", "--procs", "1", "--greenlets", "10", "-q",
                       "--plot", one]) == 0
    assert compare_main(["--drivers", "gtarantool,sync", "--ops", "1000", "--procs", "1",
                         "--greenlets", "10", "-q", "--plot", two,
                         "--hlog", str(tmp_path / "c.hlog")]) == 0
    (w1, h1), (w2, h2) = png_size(one), png_size(two)
    assert w1 == w2 and h2 == 2 * h1
    for driver in ("gtarantool", "sync"):
        lines, _ = read_log(str(tmp_path / ("c-%s.hlog" % driver)))
        assert sum(h.get_total_count() for tag, _, _, h in lines if tag is None) == 4000


class TwoSeries(Recorder):
    """A recorder with a second series of times, as an open-loop driver keeps one."""
    SERIES = ("latency", "service_time")

    def __init__(self, phase, send):
        super().__init__(phase, send)
        self.service_time = collections.defaultdict(dict)

    def record(self, op, t0, t1, error, sent=None):
        if sent is not None:
            us = int((t1 - sent) * 1e6)
            self.service_time[op][us] = self.service_time[op].get(us, 0) + 1
        super().record(op, t0, t1, error)


def test_a_second_series_goes_through_histograms_and_intervals():
    recorder = TwoSeries("mix", lambda message: None)
    for n in range(100):   # (times a binary fraction apart: whole microseconds)
        recorder.record("select", 1.0, 1.5, None, sent=1.25)
    recorder.flush(time.monotonic() + 1)
    histograms = recorder.histograms()
    assert set(histograms) == {"latency", "service_time"}
    (index, by_series), = recorder.intervals()
    assert set(by_series) == {"latency", "service_time"}
    assert recorder.merged("service_time")["select"] == {250000: 100}
    assert recorder.merged()["select"] == {500000: 100}
