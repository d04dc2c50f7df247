"""Wall-clock upper bounds in the tests.

The timeout guarantees (a caller fails within its timeout, at once on a dead
connection) are asserted as upper bounds on elapsed time; a loaded host
overruns them for reasons that say nothing about correctness.  Every such
bound is written as ``guarantee + slack(margin)`` (or ``slack(bound)`` where
the whole bound is margin), scaled by the environment variable
``GTARANTOOL_TIMING_SLACK`` (default 1), and its test carries the ``timing``
marker (which CI reruns once before it counts as failed: see conftest.py).
Lower bounds are never scaled.
"""
import os


def _factor():
    text = os.environ.get("GTARANTOOL_TIMING_SLACK", "").strip() or "1"
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value >= 1:   # (a factor below 1 would tighten what the library guarantees)
        raise ValueError("GTARANTOOL_TIMING_SLACK must be a number >= 1, not %r" % text)
    return value


SLACK = _factor()


def slack(seconds):
    """``seconds`` of allowance for a busy host, times ``GTARANTOOL_TIMING_SLACK``.

    :param seconds: the margin a test allows on an idle host
    :returns: the margin to assert with, in seconds
    """
    return seconds * SLACK
