"""``--hlog FILE``: a run's latencies as an HdrHistogram interval log, the format that
HdrHistogram's ``HistogramLogProcessor`` and its plotters read (written with the
``hdrhistogram`` package's ``HistogramLogWriter``; ``HistogramLogReader`` reads it back).

One line per interval (``bench.core.recorder.INTERVAL`` seconds, cut at each phase's start
and end) and tag: the untagged lines hold every operation's latency, ``Tag=<op>`` lines
one operation's, and a second series of times (``Recorder.SERIES``) ``Tag=<series>`` and
``Tag=<series>.<op>``.  Time stamps are seconds since the first phase started, whose
wall-clock time the ``StartTime`` header gives.  Values are microseconds:
``HistogramLogProcessor -outputValueUnitRatio 1000`` reports milliseconds.
"""
import datetime

from hdrh.log import HistogramLogWriter


def write(path, start_epoch, intervals):
    """Write the log.

    :param path: the file to (over)write.
    :param start_epoch: ``time.time()`` when the first phase started.
    :param intervals: ``[(start, end, {tag or None: HdrHistogram}), ...]`` in time order,
        ``start`` and ``end`` in seconds since ``start_epoch``.
    """
    with open(path, "w") as f:
        writer = HistogramLogWriter(f)
        writer.output_log_format_version()
        # (the package's output_start_time cannot format its own line)
        writer.output_comment("[StartTime: %.3f (seconds since epoch), %s]" % (
            start_epoch, datetime.datetime.fromtimestamp(start_epoch).isoformat(" ")))
        writer.output_comment("[values in microseconds; the untagged lines: every "
                              "operation; Tag=<op>: one operation]")
        writer.output_legend()
        for start, end, tagged in intervals:
            for tag, hist in tagged.items():
                if tag is not None:
                    f.write("Tag=%s," % tag)   # the writer's line follows the tag
                # max_value_unit_ratio: the line's max column in milliseconds
                writer.output_interval_histogram(hist, start, end, 1000.0)
