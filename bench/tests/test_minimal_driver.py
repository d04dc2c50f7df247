"""``--driver asyncio-minimal``: the small IPROTO client on plain asyncio sends what its
schedule says, every answer checked, and the server's counts agree."""
import asyncio
import json

import pytest

from bench.__main__ import main as bench_main
from bench.core.config import Config
from bench.drivers.minimal import Connection, ServerError, kind_of
from bench.suites.capacity import main as capacity_main


def run(server, tmp_path, *args):
    path = tmp_path / "out.json"
    assert bench_main(["--host", server.host, "--port", str(server.port), "--user", "test",
                       "--password", "secret", "--driver", "asyncio-minimal", "--workload",
                       "mix", "--records", "300", "--json", str(path), "-q", *args]) == 0
    return json.loads(path.read_text())


def test_open_loop_sends_its_schedule(server, tmp_path):
    rate = 500
    results = run(server, tmp_path, "--rate", str(rate), "--duration", "1", "--procs", "2",
                  "--greenlets", "8")
    load, phase = results["phases"]
    assert load["ops"] == 300
    assert phase["open_loop"]["scheduled"] == phase["ops"] == rate
    assert phase["errors"] == {} and phase["server"]["match"]
    assert sum(phase["server"]["requests"].values()) == phase["ops"]


def test_closed_loop_sends_its_count(server, tmp_path):
    results = run(server, tmp_path, "--ops", "400", "--mix", "select=50,update=50",
                  "--greenlets", "4")
    phase = results["phases"][1]
    assert phase["ops"] == 400 and phase["errors"] == {} and phase["server"]["match"]


def test_a_wrong_password_is_the_servers_error(server):
    async def connect():
        conn = Connection()
        try:
            await conn.connect(server.host, server.port, "test", "not the password")
        finally:
            await conn.close()
    with pytest.raises(ServerError):
        asyncio.run(connect())


def test_an_error_answer_fails_its_request_alone(server):
    async def requests():
        conn = Connection()
        await conn.connect(server.host, server.port, "test", "secret")
        try:
            # _vspace is a view: an insert into it is refused by the server.
            refused = conn.send(2, {0x10: 281, 0x21: [1]})
            answered = conn.send(1, {0x10: 281, 0x11: 0, 0x12: 1, 0x13: 0, 0x14: 0,
                                     0x20: [281]})
            return await asyncio.gather(refused, answered, return_exceptions=True)
        finally:
            await conn.close()
    refused, answered = asyncio.run(requests())
    assert isinstance(refused, ServerError)
    assert kind_of(refused) == "server_error_%d" % refused.code
    assert answered[0][0] == 281


def test_operations_beyond_the_four_are_refused():
    with pytest.raises(ValueError, match="asyncio-minimal"):
        Config(driver="asyncio-minimal", workload="mix", mix={"call": 100})


def test_capacity_searches_it_beside_another_driver(server, tmp_path, capsys):
    path = tmp_path / "capacity.json"
    code = capacity_main([
        "--host", server.host, "--port", str(server.port), "--user", "test",
        "--password", "secret", "--drivers", "asynctnt,asyncio-minimal", "--mix",
        "select=100", "--records", "100", "--greenlets", "10", "--slo", "p99=1s",
        "--start", "200", "--factor", "2", "--step", "0.5", "--samples", "0",
        "--warmup", "0.2", "--budget", "2", "--no-confirm", "--json", str(path)])
    assert code == 0
    searches = json.loads(path.read_text())["searches"]
    assert [s["driver"] for s in searches] == ["asynctnt", "asyncio-minimal"]
    assert all(s["capacity"] and s["steps"][0]["ok"] for s in searches)
