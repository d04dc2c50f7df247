"""python -m bench.tx on a tiny load: every line printed, or the version it needs."""
from bench.suites import tx
from gtarantool.testing.server import binary_version


def test_bench_tx_prints_every_kind_and_the_watcher_latency(capsys):
    code = tx.main(["-n", "200", "-g", "10", "-k", "4", "--runs", "1", "--events", "5"])
    out, err = capsys.readouterr()
    if binary_version() < (2, 10):
        assert code == 1 and "needs Tarantool 2.10+" in err
        return
    assert code == 0, err
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()[2:5]}
    assert set(rows) == {"plain", "stream", "tx"}
    assert rows["plain"][1] == "1.00" and rows["tx"][2] == "1.50"   # (4 + 2) / 4 requests
    assert "watcher: box.broadcast -> callback over 5 events" in out
