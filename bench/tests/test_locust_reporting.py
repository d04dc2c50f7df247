"""bench/locust/reporting.py: the pace lines, and Locust's finer response-time
buckets switched on by fine_buckets() only (Locust itself in a child process:
importing it monkey-patches the interpreter)."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from bench.locust import reporting

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_pace_lines_say_when_the_server_set_the_pace():
    """The median worker's busy share; below 90% the workers waited for replies."""
    def lines(*shares):
        return reporting.pace_lines({str(i): {"busy": share} for i, share in enumerate(shares)})

    waiting = lines(0.4, 0.3, 0.9)
    assert waiting[0] == ("gtarantool: 3 worker processes busy 40% of the run "
                          "(median; running or waiting for a CPU)")
    assert "60% waiting for replies" in waiting[1] and len(waiting) == 2
    assert lines(0.96, 0.97, 0.95) == ["gtarantool: 3 worker processes busy 96% of the run "
                                       "(median; running or waiting for a CPU)"]
    assert lines(None) == []


CHILD = """
import json, sys
import locust.stats
import gtarantool.contrib.locust
from bench.locust import reporting
before = locust.stats.bucket_response_time.__module__
reporting.fine_buckets()
reporting.fine_buckets()
bucket = locust.stats.bucket_response_time
print(json.dumps({"before": before, "after": bucket.__module__,
                  "keys": [bucket(t) for t in (0.1234, 9.996, 12.34, 1234.5)]}))
"""


@pytest.mark.needs_tool(available=importlib.util.find_spec("locust") is not None,
                        what="locust (the locust extra)")
def test_fine_buckets_are_switched_on_by_a_call_not_by_an_import():
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                         timeout=120, check=True, cwd=ROOT)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["before"] == "locust.stats"
    assert got["after"] == "bench.locust.reporting"
    # 0.01 ms below 10 ms, 0.1 ms below 100 ms, then Locust's two significant digits.
    assert got["keys"] == [0.12, 10.0, 12.3, 1200]
