"""python -m bench.copy on a tiny load: every kind of every shape (inserts, selects), the demo."""
import pytest

from bench.suites import copy, sweep


def test_bench_copy_prints_every_kind_against_the_raw_socket(capsys):
    assert copy.main(["--rows", "2000", "--runs", "1"]) == 0
    out = capsys.readouterr().out
    for shape in ("3col", "1536b"):
        table = out.split("%s rows" % shape, 1)[1].splitlines()[2:6]
        kinds = {line.split()[0]: line.split()[1:] for line in table}
        assert set(kinds) == {"raw", "pipeline", "copy_from", "cli"}
        assert kinds["raw"][1] == "1.00"
        assert all(int(kind[0].replace(",", "")) > 0 for kind in kinds.values())
        startup = out.split("%s rows" % shape, 1)[1].splitlines()[6]
        assert startup.startswith("  cli on an empty file (start-up, connection, exit): ")
        assert float(startup.split(": ")[1].split()[0]) > 0
        table = out.split("%s selects by key" % shape, 1)[1].splitlines()[2:6]
        kinds = {line.split()[0]: line.split()[1:] for line in table}
        assert set(kinds) == {"raw", "raw+decode", "pipeline", "select_many"}
        assert kinds["raw"][1] == "1.00"
        assert all(int(kind[0].replace(",", "")) > 0 for kind in kinds.values())


def test_the_demo_imports_the_generated_file_and_prints_the_summary(capsys):
    assert copy.main(["--demo", "3000", "--demo-procs", "1"]) == 0
    out = capsys.readouterr().out
    assert "3000 rows" in out
    assert "3,000 rows read, 3,000 written, 0 rejected" in out and "peak RSS" in out


def test_counts_below_one_are_refused_before_any_server_starts(capsys):
    for main, argv in ((copy.main, ["--runs", "0"]), (copy.main, ["--rows", "-5"]),
                       (copy.main, ["--demo", "0"]), (sweep.main, ["--size", "0"]),
                       (sweep.main, ["--runs", "0"]), (sweep.main, ["--levels", "0,10"])):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2   # (argparse's usage error)
        assert "expected a positive integer" in capsys.readouterr().err
