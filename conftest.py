"""Rules for every test of the checkout (tests/ and bench/tests/) when ``CI`` is
set in the environment (``.ci/run`` sets it): a test marked ``timing`` (a
wall-clock bound, see tests/timing.py) runs once more before it counts as
failed, and a test marked ``needs_tool`` (a tool ``make install`` installs)
fails, instead of skipping, where the tool is missing."""
import os

import pytest


def in_ci():
    return bool(os.environ.get("CI"))


def pytest_configure(config):
    # (the rerun below is pytest-rerunfailures' flaky marker: without the plugin
    # a timing test would fail at its first overrun, silently stricter)
    if in_ci() and not config.pluginmanager.hasplugin("rerunfailures"):
        raise pytest.UsageError("CI is set: the timing tests' rerun needs "
                                "pytest-rerunfailures (pip install -e .[test])")


def pytest_collection_modifyitems(config, items):
    if in_ci():
        # A busy CI host overruns a wall-clock bound now and then: one more run,
        # with fresh function fixtures, before it counts as failed.
        for item in items:
            if item.get_closest_marker("timing") and not item.get_closest_marker("flaky"):
                item.add_marker(pytest.mark.flaky(reruns=1))


def pytest_runtest_setup(item):
    for mark in item.iter_markers("needs_tool"):
        if not mark.kwargs["available"]:
            message = "%s is missing (make install installs it)" % mark.kwargs["what"]
            if in_ci():
                pytest.fail("CI is set: " + message, pytrace=False)
            pytest.skip(message)
