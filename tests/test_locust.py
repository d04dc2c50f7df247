"""gtarantool.contrib.locust (and its alias gtarantool.locust) against real servers.

Locust runs in child processes only (tests/locust_cases.py, the locust
command): importing it monkey-patches the interpreter, which the rest of the
session must not get."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from gtarantool.testing.server import TarantoolServer

from .conftest import PASSWORD, USER, _lua, needs_tool

# (importorskip would import Locust here)
pytestmark = needs_tool(importlib.util.find_spec("locust") is not None,
                        "locust (the locust extra: pip install -e .[locust])")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable


def case(name, *servers):
    url = "tarantool://%s:%s@%s" % (USER, PASSWORD, ",".join(
        "%s:%s" % (server.host, server.port) for server in servers))
    out = subprocess.run([PY, "-m", "tests.locust_cases", name, url], cwd=ROOT, timeout=120,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def cases(server):
    """The results of every one-server case of tests/locust_cases.py, run once."""
    return case("all", server)


def test_lazy_connect_one_connection_per_process(cases):
    """50 users starting together share one connection (connect yields: a
    plain lazy check would open one each); connection_scope="user" opens one
    per user and closes them when the test stops."""
    got = cases["lazy_connect"]
    shared = got["shared"]
    assert shared["opened"] == 1 and shared["server_connections"] == 1, shared
    assert shared["failures"] == 0 and shared["report"]["reported"] > 0
    assert got["user"] == {"opened": 5, "server_connections": 5, "closed": True}


def test_url_options_take_the_connections_types(cases):
    got = cases["url_options"]
    assert got["options"] == {"max_in_flight": 10, "lazy_errors": False,
                              "reconnect_max_attempts": 2, "request_timeout": 1.5,
                              "strategy": "x"}
    assert got["bad"] == ["--host option max_in_flight='ten': expected an integer",
                          "--host option lazy_errors='maybe': expected true or false",
                          "--host option request_timeout='soon': expected a number"]


def test_fork_child_opens_its_own_connection(cases):
    got = cases["fork"]
    assert got == {"child": {"same": False, "select": True, "opened": 1}, "parent_ok": True}


def test_error_names_are_stable(cases):
    """Timeouts (whose messages carry sync ids) and server errors each make one
    row in Locust's error table; an expected error code counts as a success."""
    got = cases["naming"]
    slow = got["Slow"]
    assert [row[:3] for row in slow["errors"]] == [
        ["tarantool", "call raise_error", "DatabaseError(555)"],
        ["tarantool", "call sleep_and_return", "RequestTimeout"]], slow
    assert all(row[3] >= 2 for row in slow["errors"])
    expected = got["Expected"]
    assert [row[:3] for row in expected["errors"]] == [
        ["tarantool", "call sleep_and_return", "RequestTimeout"],
        ["tarantool", "eval box.error{code = 556, reason = 'no'}", "DatabaseError(556)"]], expected
    requests, failures = expected["requests"]["call raise_error"]
    assert requests > 0 and failures == 0
    # An expected code returned the error reply; another raised RequestFailed
    # with the server's error and a stable text.
    assert got["seen"] == [
        ["raised", 556, "eval box.error{code = 556, reason = 'no'}: DatabaseError(556)", None],
        ["returned", 555, "no", True]]


def test_pause_after_a_reply_is_no_second_hub_pass(cases):
    """With wait_time 0, a task whose request got a reply (it went through the
    hub for it) goes on without Locust's gevent.sleep(0); a task with no
    request still sleeps (or the worker would spin), as does a non-zero
    wait_time; other greenlets keep running throughout."""
    got = cases["pauses"]
    busy = got["Pauses"]
    assert busy["requests"] > 50 and busy["slept"] <= 5 + busy["requests"] // 100, busy
    assert busy["skipped"] >= busy["requests"] - 5, busy
    assert busy["ticks"] > 10, busy   # the ticker ran while users pinged
    idle = got["Idle"]
    assert idle["requests"] == 0 and idle["skipped"] == 0 and idle["slept"] > 50, idle
    assert idle["ticks"] > 10, idle
    patient = got["Patient"]
    # 5 users, 0.5 s, 0.1 s between tasks: at most 6 requests each.
    assert 5 <= patient["requests"] <= 30 and patient["skipped"] == 0, patient
    assert patient["slept"] >= patient["requests"] - 5, patient


def test_methods_and_steps(cases):
    got = cases["methods"]
    assert got["entries"] == [
        ["step", "bad step", True, True], ["step", "good step", True, False],
        ["tarantool", "call raise_error", True, True],
        ["tarantool", "delete kv", True, False], ["tarantool", "eval return ...", True, False],
        ["tarantool", "execute SELECT 1", True, False], ["tarantool", "ping", True, False],
        ["tarantool", "replace kv", True, False], ["tarantool", "select tester", True, False],
        ["tarantool", "update kv", True, False], ["tarantool", "upsert kv", True, False]]
    assert got["errors"] == [["step", "bad step", "DatabaseError(555)"],
                             ["tarantool", "call raise_error", "DatabaseError(555)"]]


def test_request_events_carry_the_user_s_context(cases):
    """Each event has the context argument Locust's own listeners require."""
    got = cases["contexts"]
    assert got == {"events": 11, "contexts": ["{'tenant': 't1'}"], "listener_failed": False}


def test_a_connect_killed_midway_leaves_no_user_waiting_for_it(cases):
    assert cases["killed_connect"] == {"waiting": "NetworkError", "later": "NetworkError"}


def test_several_instances_share_one_pool_per_process(server):
    """--host with two instances: a gtarantool.ConnectionPool per process (the
    instances are independent: both read-write), its selects spread over both;
    a pool with no instance answering stops the run like a dead server."""
    other = TarantoolServer(_lua())
    other.start()
    try:
        got = case("pool", server, other)["pool"]
    finally:
        other.cleanup()
    assert got["opened"] == ["ConnectionPool"]
    assert all(n > 0 for n in got["selects"]), got
    assert got["names"] == ["ping", "select tester"] and got["failures"] == 0
    assert got["dead"]["exit_code"] == 1
    assert [e[:2] for e in got["dead"]["errors"]] == [["connect", "NetworkError: none of the 2 "
                                                       "instances answered"]], got["dead"]


def test_process_report_says_how_busy_the_process_was(cases):
    """A process's busy share: its CPU seconds and seconds waiting for a CPU over
    the run's wall-clock seconds."""
    report = cases["pace"]["report"]
    assert 0 < report["busy"] <= 1 and report["queued_seconds"] >= 0
    assert report["busy"] == pytest.approx(
        min(1, (report["cpu_seconds"] + report["queued_seconds"]) / report["wall_seconds"]))


def test_import_leaves_locust_statistics_alone_and_the_alias_is_the_module(cases):
    """Importing the integration (or gtarantool.locust) keeps Locust's own
    response-time buckets and percentile rows; the alias gives the same objects."""
    got = cases["imports"]
    assert got["bucket_module"] == "locust.stats"
    assert got["percentile_module"] == "locust.stats"
    assert got["alias"] == got["all"] and "TarantoolUser" in got["all"]
