"""No credential in any output: a password given by option, file or $TARANTOOL_PASSWORD
reaches the server (the runs authenticate) and none of what a bench run or a Locust run
prints or writes (JSON, plot, profiles, Locust's CSV, HTML and JSON) holds it."""
import importlib.util
import json
import os
import secrets
import subprocess
import sys

import pytest

from bench.core.config import PASSWORD_ENV, Config, read_password
from gtarantool.testing.server import TarantoolServer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
USER = "keeper"
SECRET = "pw-" + secrets.token_hex(8)
LUA = """
box.schema.user.create(%r, {password = %r})
box.schema.user.grant(%r, 'read,write,execute,create', 'universe')
""" % (USER, SECRET, USER)


@pytest.fixture(scope="module")
def server():
    with TarantoolServer(LUA) as srv:
        yield srv


def run(args, env=None, timeout=120):
    """A child process (bench forks its workers) with ``env`` added; (code, output)."""
    env = dict({k: v for k, v in os.environ.items() if k != PASSWORD_ENV}, **(env or {}))
    out = subprocess.run([sys.executable] + args, cwd=ROOT, env=env, timeout=timeout,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return out.returncode, out.stdout


def holding_secret(folder, skip=()):
    """The files under ``folder`` whose bytes hold the password."""
    found = []
    for base, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(base, name)
            if path not in skip:
                with open(path, "rb") as f:
                    if SECRET.encode() in f.read():
                        found.append(path)
    return found


@pytest.fixture
def password_file(tmp_path):
    path = tmp_path / "password"
    path.write_text(SECRET + "\n")
    return str(path)


def test_password_sources_and_their_order(tmp_path, password_file, monkeypatch):
    monkeypatch.setenv(PASSWORD_ENV, "from-env")
    assert read_password("opt", None, USER) == "opt"
    assert read_password(None, password_file, USER) == SECRET
    assert read_password(None, None, USER) == "from-env"
    assert read_password(None, None, None) is None          # guest has no password
    with pytest.raises(ValueError, match="give one of them"):
        read_password("opt", password_file, USER)
    with pytest.raises(ValueError, match="cannot read --password-file"):
        read_password(None, str(tmp_path / "missing"), USER)
    config = Config(user=USER, password=SECRET)
    assert SECRET not in repr(config) and "password" not in config.as_dict()


@pytest.mark.parametrize("source", ["option", "file", "environment"])
def test_bench_outputs_hold_no_password(server, tmp_path, password_file, source):
    out = tmp_path / "out"
    out.mkdir()
    args = ["-m", "bench", "--host", server.host, "--port", str(server.port), "--user", USER,
            "--procs", "1", "--greenlets", "5", "--ops", "400", "--json", str(out / "run.json"),
            "--plot", str(out / "run.png")]
    if importlib.util.find_spec("yappi") is not None:
        args += ["--profile", str(out / "profiles")]
    env = None
    if source == "option":
        args += ["--password", SECRET]
    elif source == "file":
        args += ["--password-file", password_file]
    else:
        env = {PASSWORD_ENV: SECRET}
    code, printed = run(args, env)
    assert code == 0, printed[-3000:]
    results = json.loads((out / "run.json").read_text())
    assert results["totals"]["ops"] == 1600 and results["totals"]["server_counts_match"]
    assert results["config"]["user"] == USER
    assert SECRET.encode() not in printed
    assert holding_secret(str(out)) == []
    assert len(os.listdir(out)) >= 2


@pytest.mark.needs_tool(available=importlib.util.find_spec("locust") is not None,
                        what="locust (the locust extra)")
def test_locust_outputs_hold_no_password(server, tmp_path, password_file):
    """make locust with --password-file, and Locust itself with the password in --host:
    its HTML report shows the host without it; the users still authenticate."""
    out = tmp_path / "run"
    code, printed = run(["-m", "bench.locust_run", "--host", "%s:%s" % (server.host, server.port),
                         "--user", USER, "--password-file", password_file, "-u", "4", "-p", "4",
                         "-t", "3s", "--out", str(out)])
    assert SECRET.encode() not in printed
    assert holding_secret(str(out)) == []
    report = json.loads((out / "bench-report.json").read_text())
    assert sum(e["requests"] for e in report["entries"] if e["type"] == "tarantool") > 0, \
        printed[-3000:]

    direct = tmp_path / "direct"
    direct.mkdir()
    url = "tarantool://%s:%s@%s:%s" % (USER, SECRET, server.host, server.port)
    code, printed = run(["-m", "locust", "-f", os.path.join(ROOT, "bench", "locust",
                                                           "locustfile.py"),
                         "--headless", "-u", "4", "-r", "4", "-t", "3s", "--host", url,
                         "--bench-prepare",
                         "--csv", str(direct / "locust"), "--html", str(direct / "locust.html"),
                         "--json-file", str(direct / "locust"),
                         "--bench-report", str(direct / "bench-report.json")])
    assert code == 0, printed[-3000:]
    assert SECRET.encode() not in printed
    assert holding_secret(str(direct)) == []
    html = (direct / "locust.html").read_text()
    assert "tarantool://%s@%s:%s" % (USER, server.host, server.port) in html
    stats = json.loads((direct / "locust.json").read_text())
    assert sum(row["num_requests"] for row in stats) > 0
    assert sum(row["num_failures"] for row in stats) == 0
