"""``python -m bench.capacity`` against a server that holds a known rate: a Lua function
that serves one call at a time, each taking SERVICE seconds on the server's clock."""
import json

import pytest

from bench.suites.capacity import main as capacity_main
from gtarantool.testing.server import TarantoolServer

SERVICE = 0.0025            # seconds per call: the server holds 400 calls/s
# Past the limit the queue grows by (rate - 400)/s: at 440/s a 2 s step ends with 80
# calls queued, 200 ms, so an SLO of 100 ms breaks there and holds well below it,
# on a busy machine too.
LIMITED_LUA = """
box.schema.user.grant('guest', 'read,write,execute,create', 'universe')
local clock, fiber = require('clock'), require('fiber')
local free_at = 0
-- One call at a time, back to back on the clock: a fiber.sleep that overshoots delays
-- that call, not the ones after it, so the rate held is exactly 1 / SERVICE.
function limited(key)
    local now = clock.monotonic()
    local start = math.max(now, free_at)
    free_at = start + %r
    fiber.sleep(free_at - now)
    return box.space.bench:get(key)
end
""" % SERVICE


@pytest.mark.timing
def test_capacity_finds_a_servers_rate_limit(tmp_path, capsys):
    server = TarantoolServer(LIMITED_LUA)
    server.start()
    try:
        path, plot = tmp_path / "capacity.json", tmp_path / "capacity.png"
        code = capacity_main([
            "--host", server.host, "--port", str(server.port), "--workload", "mix",
            "--mix", "call=100", "--call", "limited", "--records", "100", "--greenlets", "50",
            "--slo", "p99=100ms", "--start", "300", "--step", "2", "--samples", "0",
            "--warmup", "0.2",
            "--precision", "0.05",
            "--json", str(path), "--plot", str(plot)])
    finally:
        server.cleanup()
    assert code == 0
    out = capsys.readouterr().out
    last = out.strip().splitlines()[-3]     # then "wrote ..." twice
    assert last.startswith("capacity: ") and last.endswith("(SLO p99 <= 100 ms)")
    result = json.loads(path.read_text())
    limit = 1 / SERVICE
    assert 0.9 * limit <= result["capacity"] <= 1.1 * limit, result["steps"]
    steps = result["steps"]
    assert [s["stage"] for s in steps[:2]] == ["staircase"] * 2
    assert any(not s["ok"] for s in steps) and any(s["stage"] == "bisection" for s in steps)
    # Past the limit the queue grows: latency from the intended start breaks the SLO.
    over = [s for s in steps if s["rate"] > 1.1 * limit]
    assert over and all(not s["ok"] for s in over)
    assert plot.stat().st_size > 0
