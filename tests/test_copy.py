"""gtarantool.copy: copy_from/copy_to and the command line, against real servers."""
import base64
import codecs
import decimal
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid

import gevent
import pytest
from tarantool.msgpack_ext.types.datetime import Datetime

import gtarantool
from gtarantool.copy import CopyError, copy_from, copy_to, space_info
from gtarantool.copy.cli import main
from gtarantool.copy.formats import BadRow, Converter, Field
from gtarantool.testing.cluster import ShardedCluster, vshard_missing
from gtarantool.testing.replicaset import ReplicaSet
from gtarantool.testing.server import binary_version
from tests import children
from tests.conftest import PASSWORD, USER, _lua
from tests.timing import slack

VERSION = binary_version()
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

TYPES = [("id", "unsigned"), ("i", "integer"), ("n", "number"), ("d", "double"),
         ("s", "string"), ("b", "boolean"), ("dec", "decimal"), ("u", "uuid"),
         ("vb", "varbinary"), ("m", "map"), ("a", "array"), ("x", "any")]
if VERSION >= (2, 10):
    TYPES.append(("dt", "datetime"))


def _space(conn, name, fields, nullable=()):
    fmt = ", ".join("{name = '%s', type = '%s'%s}" % (n, t, ", is_nullable = true"
                                                       if n in nullable else "")
                    for n, t in fields)
    conn.eval("if box.space.%s then box.space.%s:drop() end "
              "box.schema.space.create('%s', {format = {%s}}):create_index('pk')"
              % (name, name, name, fmt))
    conn.flush_schema()


def _typed_rows(n):
    rows = []
    for k in range(n):
        # (doubles: the infinities too; any: a string that reads as JSON stays a string)
        row = [k, -k * 1000, k + 0.5 if k % 2 else k,
               (float("inf"), float("-inf"))[k % 2] if k % 7 == 3 else k / 3,
               "text %d, \"quoted\"\nline" % k,
               k % 2 == 0, decimal.Decimal("%d.%03d" % (k, k % 1000)), uuid.uuid4(),
               bytes([k % 256, 0, 255]), {"k": k, "nested": [1, "two"]}, [k, "a", None],
               ("free", "[1, 2]", k)[k % 3]]
        if VERSION >= (2, 10):
            row.append(Datetime(year=2024, month=1 + k % 12, day=1 + k % 28, hour=k % 24,
                                minute=5, sec=k % 60, nsec=k * 1000, tzoffset=180))
        rows.append(tuple(row))
    return rows


def _run(*argv):
    """The command line in this process (--procs 0 unless given): (status, stdout)."""
    import contextlib
    import io
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = main([str(a) for a in argv])
    return status, out.getvalue()


def _conn_args(server):
    return ["--host", server.host, "--port", server.port, "--user", USER]


@pytest.fixture(autouse=True)
def password(monkeypatch):
    monkeypatch.setenv("TARANTOOL_PASSWORD", PASSWORD)


@pytest.mark.parametrize("fmt", ["csv", "tsv", "jsonl"])
def test_every_field_type_round_trips_through_a_file(conn, server, tmp_path, fmt):
    _space(conn, "copy_types", TYPES)
    rows = _typed_rows(50)
    assert copy_from(conn, "copy_types", rows).written == 50
    before = conn.select("copy_types").data
    path = tmp_path / ("rows." + fmt)
    status, out = _run("to", path, "--space", "copy_types", "--format", fmt, "--header",
                       *_conn_args(server))
    assert status == 0 and "50 rows written" in out
    conn.eval("box.space.copy_types:truncate()")
    status, out = _run("from", path, "--space", "copy_types", "--format", fmt,
                       *(["--header"] if fmt != "jsonl" else []), "--procs", 0,
                       *_conn_args(server))
    assert status == 0, out
    assert "50 written, 0 rejected" in out
    assert conn.select("copy_types").data == before


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_null_in_an_any_field_that_is_not_nullable_round_trips(conn, server, tmp_path, fmt):
    """The server takes null in a field of type any, nullable or not."""
    _space(conn, "copy_any", [("id", "unsigned"), ("x", "any")])
    rows = [(1, None), (2, ""), (3, "null"), (4, [None])]
    assert copy_from(conn, "copy_any", rows).written == 4
    path = tmp_path / ("rows." + fmt)
    status, out = _run("to", path, "--space", "copy_any", "--format", fmt, *_conn_args(server))
    assert status == 0, out
    conn.eval("box.space.copy_any:truncate()")
    status, out = _run("from", path, "--space", "copy_any", "--format", fmt, "--procs", 0,
                       *_conn_args(server))
    assert status == 0 and "4 written, 0 rejected" in out, out
    assert [tuple(t) for t in conn.select("copy_any").data] == rows


def test_a_number_too_large_for_a_double_is_rejected_not_made_infinite(conn, server,
                                                                     tmp_path):
    _space(conn, "copy_dbl", [("id", "unsigned"), ("d", "double"), ("n", "number")])
    src, errors = tmp_path / "in.csv", tmp_path / "errors.csv"
    _write(src, ["1,1e400,0\n", "2,0,-1e400\n", "3,inf,-Infinity\n", "4,1.7e308,-1e308\n"])
    status, out = _run("from", src, "--space", "copy_dbl", "--procs", 0, "--errors", errors,
                       *_conn_args(server))
    assert status == 2 and "2 written, 2 rejected" in out, out
    assert errors.read_text() == "1,1e400,0\n2,0,-1e400\n"
    reasons = (tmp_path / "errors.csv.reasons").read_text().splitlines()
    assert reasons[0].startswith("row 1: field d (double): '1e400': out of range")
    assert reasons[1].startswith("row 2: field n (number): '-1e400': out of range")
    assert [tuple(t) for t in conn.select("copy_dbl").data] == [
        (3, float("inf"), float("-inf")), (4, 1.7e308, -1e308)]


def test_a_json_number_too_large_for_a_double_is_rejected_not_made_infinite(conn, server,
                                                                          tmp_path):
    _space(conn, "copy_dbl_json", [("id", "unsigned"), ("d", "double"), ("a", "any"),
                                   ("arr", "array")])
    src, errors = tmp_path / "in.jsonl", tmp_path / "errors.jsonl"
    _write(src, ['[1, 1e400, 0, []]\n', '[2, 0, "1e400", []]\n', '[3, 0, 0, [-1e400]]\n',
                 '[4, 1.5e308, "x", [2.5]]\n'])
    status, out = _run("from", src, "--space", "copy_dbl_json", "--format", "jsonl",
                       "--procs", 0, "--errors", errors, *_conn_args(server))
    assert status == 2 and "2 written, 2 rejected" in out, out
    reasons = (tmp_path / "errors.jsonl.reasons").read_text().splitlines()
    assert [r.split(":")[0] for r in reasons] == ["row 1", "row 3"], reasons
    assert all("out of range" in r for r in reasons), reasons
    # (a JSON string stays a string, whatever it spells)
    assert [tuple(t) for t in conn.select("copy_dbl_json").data] == [
        (2, 0.0, "1e400", []), (4, 1.5e308, "x", [2.5])]


def test_conversion_reasons_name_the_field_and_the_value():
    fields = [Field(n, t) for n, t in TYPES] + [Field("opt", "string", nullable=True)]
    conv = Converter(fields, [f.name for f in fields])
    good = ["1", "-2", "3.5", "4", "s", "true", "1.10", str(uuid.uuid4()),
            base64.b64encode(b"\x00").decode(), "{}", "[]", "x"]
    good += ["2024-02-29T10:00:00Z"] if VERSION >= (2, 10) else []
    assert conv.row(good + [""])[-1] is None
    cases = {"id": ("-1", "negative"), "i": ("1.5", "not an integer"),
             "n": ("abc", "not a number"), "b": ("maybe", "true/false"),
             "dec": ("1,5", "not a decimal"), "u": ("zz", "not a UUID"),
             "vb": ("!!", "base64"), "m": ("[1]", "JSON object"), "a": ("{", "not JSON")}
    for name, (value, reason) in cases.items():
        bad = list(good) + [""]
        bad[[f.name for f in fields].index(name)] = value
        with pytest.raises(BadRow, match="field %s .*%s" % (name, reason)):
            conv.row(bad)
    with pytest.raises(BadRow, match="cannot be null"):
        conv.row([""] + good[1:] + [""])
    with pytest.raises(BadRow, match="columns where"):
        conv.row(good)


def _write(path, lines, mode="w"):
    with open(path, mode) as f:
        for line in lines:
            f.write(line)


def test_bad_rows_and_duplicates_go_to_the_errors_file_and_exit_2(conn, server, tmp_path,
                                                                  reader):
    _space(conn, "copy_kv", [("id", "unsigned"), ("name", "string"), ("n", "integer")])
    conn.insert("copy_kv", (3, "taken", 0))
    src = tmp_path / "in.csv"
    lines = [b"id,name,n\n"] + [b"%d,name %d,%d\n" % (k, k, k) for k in range(10)]
    lines[2] = b"1,one,not-a-number\n"           # a bad number
    lines[5] = b"4,four\n"                       # a missing column
    lines[6] = b"5,caf\xe9,5\n"                  # a byte that is not UTF-8
    _write(src, lines, "wb")
    errors = tmp_path / "errors.csv"
    status, out = _run("from", src, "--space", "copy_kv", "--header", "--errors", errors,
                       "--procs", 0, *_conn_args(server))
    assert status == 2
    assert "10 rows read, 6 written, 4 rejected" in out
    assert errors.read_bytes() == b"".join([lines[0], lines[2], lines[4], lines[5], lines[6]])
    reasons = (tmp_path / "errors.csv.reasons").read_text().splitlines()
    assert reasons[0].startswith("row 2: field n (integer): 'not-a-number': not an integer")
    assert reasons[1].startswith("row 4: DatabaseError: Duplicate key") and "(code 3)" in reasons[1]
    assert reasons[2].startswith("row 5: 2 columns where 3 were expected")
    assert reasons[3].startswith("row 6: not UTF-8: byte 0xe9")
    assert sorted(t[0] for t in conn.select("copy_kv").data) == [0, 2, 3, 6, 7, 8, 9]
    assert conn.select("copy_kv", 3).data[0][1] == "taken"


def test_json_lines_that_are_neither_objects_nor_arrays_are_rejected(conn, server, tmp_path):
    _space(conn, "copy_kv", [("id", "unsigned"), ("name", "string"), ("n", "integer")])
    src = tmp_path / "in.jsonl"
    lines = [b'{"id": 1, "name": "a", "n": 1}\n', b"5\n", b'"text"\n', b"null\n",
             b'[2, "b", 2]\n', b'{"id": 3,\n']
    _write(src, lines, "wb")
    errors = tmp_path / "errors.jsonl"
    status, out = _run("from", src, "--space", "copy_kv", "--format", "jsonl", "--errors",
                       errors, "--procs", 0, *_conn_args(server))
    assert status == 2 and "6 rows read, 2 written, 4 rejected" in out, out
    assert errors.read_bytes() == b"".join(lines[1:4] + lines[5:])
    reasons = (tmp_path / "errors.jsonl.reasons").read_text().splitlines()
    assert reasons[0] == "row 2: a JSON line must be an object (by field name) or an array " \
        "(by column), not 5"
    assert reasons[2].endswith("not None")
    assert conn.select("copy_kv").data == [[1, "a", 1], [2, "b", 2]]


def test_chunks_cut_quoted_lines_and_windows_across_blocks(conn, server, tmp_path, reader,
                                                          monkeypatch):
    """Small blocks (the feeder's reads): records spanning lines, --skip-rows and
    --max-rows land anywhere in a block; each row is imported once, whole."""
    from gtarantool.copy import cli

    monkeypatch.setattr(cli, "BLOCK", 50)
    _space(conn, "copy_kv", [("id", "unsigned"), ("name", "string"), ("n", "integer")])
    names = {k: ('line %d\nand "more"' % k if k % 7 == 0 else "plain %d" % k)
             for k in range(300)}
    src = tmp_path / "in.csv"
    _write(src, ['%d,"%s",%d\n' % (k, names[k].replace('"', '""'), -k) if k % 7 == 0 or k % 5 == 0
                 else "%d,%s,%d\n" % (k, names[k], -k) for k in range(300)])
    status, out = _run("from", src, "--space", "copy_kv", "--skip-rows", 13, "--max-rows", 250,
                       "--chunk", 7, "--procs", 0, *_conn_args(server))
    assert status == 0 and "250 rows read, 250 written" in out and "rows 1-263 settled" in out
    assert conn.select("copy_kv").data == [[k, names[k], -k] for k in range(13, 263)]


def test_skip_and_max_rows_take_a_window(conn, server, tmp_path):
    _space(conn, "copy_kv", [("id", "unsigned"), ("name", "string"), ("n", "integer")])
    src = tmp_path / "in.tsv"
    _write(src, ["%d\tname %d\t%d\n" % (k, k, k) for k in range(100)])
    status, out = _run("from", src, "--space", "copy_kv", "--format", "tsv", "--skip-rows", 10,
                       "--max-rows", 25, "--chunk", 7, "--procs", 0, *_conn_args(server))
    assert status == 0 and "rows 1-35 settled" in out
    assert [t[0] for t in conn.select("copy_kv").data] == list(range(10, 35))
    # beyond the end: said, not "rows 1-1000 settled"
    status, out = _run("from", src, "--space", "copy_kv", "--format", "tsv", "--skip-rows", 1000,
                       "--procs", 0, *_conn_args(server))
    assert status == 0 and "rows 1-100 settled" in out, out
    assert "the input has 100 rows: --skip-rows 1000 skipped them all" in out


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_a_byte_order_mark_is_not_part_of_the_first_record(conn, server, tmp_path, fmt):
    """Spreadsheets save "CSV UTF-8" with a byte order mark and CRLF line ends."""
    _space(conn, "copy_kv", [("id", "unsigned"), ("name", "string"), ("n", "integer")])
    src = tmp_path / ("in." + fmt)
    if fmt == "csv":
        lines = [b"id,name,n\r\n", b"1,caf\xc3\xa9,-1\r\n", b"2,two,2\r\n"]
    else:
        lines = [b'{"id": 1, "name": "caf\xc3\xa9", "n": -1}\n',
                 b'{"id": 2, "name": "two", "n": 2}\n']
    _write(src, [codecs.BOM_UTF8 + lines[0]] + lines[1:], "wb")
    status, out = _run("from", src, "--space", "copy_kv", "--format", fmt, "--header",
                       "--procs", 0, *_conn_args(server))
    assert status == 0 and "2 rows read, 2 written, 0 rejected" in out, out
    assert conn.select("copy_kv").data == [[1, "caf\u00e9", -1], [2, "two", 2]]


def test_rate_paces_the_import_and_progress_lines_follow_it(conn, server, tmp_path, capsys):
    _space(conn, "copy_kv", [("id", "unsigned"), ("name", "string"), ("n", "integer")])
    src = tmp_path / "in.csv"
    _write(src, ["%d,n,%d\n" % (k, k) for k in range(600)])
    started = time.monotonic()
    status, _ = _run("from", src, "--space", "copy_kv", "--rate", 1000, "--procs", 0,
                     "--progress-interval", 0.1, *_conn_args(server))
    assert status == 0
    assert time.monotonic() - started >= 0.55     # 600 rows at 1,000/s: 0.6 s at least
    assert len(conn.select("copy_kv").data) == 600
    lines = capsys.readouterr().err.splitlines()   # not a terminal: plain lines
    assert len(lines) >= 2 and all(" written, 0 rejected, " in line for line in lines)


def test_worker_processes_write_every_row_once(conn, server, tmp_path):
    _space(conn, "copy_kv", [("id", "unsigned"), ("name", "string"), ("n", "integer")])
    src = tmp_path / "in.jsonl"
    _write(src, [json.dumps({"id": k, "name": "n%d" % k, "n": k}) + "\n" for k in range(5000)]
           + ['{"id": 1, "name": "again", "n": 1}\n'])
    status, out = _run("from", src, "--space", "copy_kv", "--format", "jsonl", "--procs", 2,
                       "--chunk", 300, "--batch", 100, "--errors", tmp_path / "e.jsonl",
                       *_conn_args(server))
    assert status == 2 and "5,001 rows read, 5,000 written, 1 rejected" in out
    assert conn.eval("return box.space.copy_kv:count()").data[0] == 5000
    assert "again" in (tmp_path / "e.jsonl").read_text()


def test_copy_from_takes_dicts_and_reports_each_refusal(conn):
    _space(conn, "copy_kv", [("id", "unsigned"), ("name", "string"), ("n", "integer")],
           nullable=("n",))
    rows = [{"id": 1, "name": "a"}, (1, "dup", 1), {"id": 2, "nope": 1}, "text", [3, "c", 3]]
    report = copy_from(conn, "copy_kv", rows, batch=2)
    assert report.written == 2 and report.rows == 5 and report.settled == 5
    assert [(r.position, r.applied) for r in report.rejected] == [(1, False), (2, False),
                                                                   (3, False)]
    assert "Duplicate key" in report.rejected[0].reason
    assert report.rejected[1].reason == \
        "no field of the space is named 'nope' (it has id, name, n)"
    assert conn.select("copy_kv").data == [[1, "a"], [3, "c", 3]]


@pytest.mark.skipif(VERSION < (2, 10), reason="decimal fields: Tarantool 2.10+")
def test_decimals_are_written_as_they_are_or_rejected_with_the_reason(conn):
    """A decimal of more than 38 digits, or with more digits of scale than the
    packer keeps, is written exactly or rejected (the packer refuses the one
    and would write the other rounded, or 0): never changed, never the end
    of the copy; the rest of the batch is written once."""
    _space(conn, "copy_dec", [("id", "unsigned"), ("v", "decimal")])
    rows = [(1, decimal.Decimal("1.5")), (2, decimal.Decimal("1234567890" * 4 + "12")),
            (3, decimal.Decimal("1E-40")), (4, decimal.Decimal("-2"))]
    report = copy_from(conn, "copy_dec", rows)
    rejected = {r.position for r in report.rejected}
    assert rejected <= {1, 2} and report.settled == 4 and report.written == 4 - len(rejected)
    assert all(r.applied is False and "38 digits" in r.reason for r in report.rejected)
    assert conn.select("copy_dec").data == [list(row) for k, row in enumerate(rows)
                                            if k not in rejected]


@pytest.mark.usefixtures("reader")
def test_a_duplicate_in_the_middle_of_a_batch_is_rejected_alone(server):
    """The replies of a batch are checked only (no body kept for a success):
    a taken key in the middle of it is still reported in its place, with the
    server's reason and applied False, and every other row is written."""
    conn = gtarantool.connect(server.host, server.port, user=USER, password=PASSWORD)
    _space(conn, "copy_kv", [("id", "unsigned"), ("name", "string"), ("n", "integer")])
    rows = [(k, "n%d" % k, k) for k in range(3000)]
    rows[1500] = (700, "taken", 0)
    report = copy_from(conn, "copy_kv", rows, batch=1000)
    assert report.written == 2999 and report.rows == 3000 and report.settled == 3000
    assert [(r.position, r.applied) for r in report.rejected] == [(1500, False)]
    assert "Duplicate key" in report.rejected[0].reason and "(code 3)" in report.rejected[0].reason
    assert report.rejected[0].row == (700, "taken", 0)
    assert conn.eval("return box.space.copy_kv:count()").data == [2999]
    assert conn.select("copy_kv", 700).data == [[700, "n700", 700]]
    conn.close()


def test_upsert_assigns_the_fields_outside_the_key(conn):
    _space(conn, "copy_kv", [("id", "unsigned"), ("name", "string"), ("n", "integer")])
    copy_from(conn, "copy_kv", [(k, "old", k) for k in range(10)])
    report = copy_from(conn, "copy_kv", [(k, "new", -k) for k in range(5, 15)], mode="upsert")
    assert report.written == 10 and not report.rejected
    data = conn.select("copy_kv").data
    assert data[:5] == [[k, "old", k] for k in range(5)]
    assert data[5:] == [[k, "new", -k] for k in range(5, 15)]


@pytest.mark.parametrize("procs", [0, 2])
def test_an_upsert_of_some_columns_keeps_the_fields_they_leave_out(conn, server, tmp_path,
                                                                   procs):
    # (a field left out in the middle of the format was assigned null, one at the
    # end kept its value)
    _space(conn, "copy_some", [("id", "unsigned"), ("note", "string"), ("name", "string"),
                               ("n", "integer")], nullable=("note", "n"))
    conn.insert("copy_some", (1, "keep me", "a", 5))
    src = tmp_path / "in.csv"
    src.write_text("id,name\n1,b\n2,c\n")
    status, out = _run("from", src, "--space", "copy_some", "--header", "--mode", "upsert",
                       "--procs", procs, *_conn_args(server))
    assert status == 0, out
    assert conn.select("copy_some").data == [[1, "keep me", "b", 5], [2, None, "c"]]
    report = copy_from(conn, "copy_some", [(1, None, "d", 6)], mode="upsert",
                       assign=["name", 3])
    assert report.written == 1
    assert conn.select("copy_some", 1).data == [[1, "keep me", "d", 6]]
    with pytest.raises(ValueError, match="no field 'nope'"):
        copy_from(conn, "copy_some", [(1, None, "d", 6)], mode="upsert", assign=["nope"])


def test_copy_from_keeps_at_most_max_in_flight_rows_unanswered(conn):
    _space(conn, "copy_kv", [("id", "unsigned"), ("name", "string"), ("n", "integer")])
    ahead = []

    def rows():
        for k in range(3000):
            if k % 100 == 0:
                ahead.append(k - conn.eval("return box.space.copy_kv:count()").data[0])
            yield (k, "n", k)
    copy_from(conn, "copy_kv", rows(), batch=100, max_in_flight=500)
    assert max(ahead) <= 500 + 100


def test_copy_from_of_large_rows_keeps_its_batches_and_its_window_in_bytes(conn):
    """Rows of 100 KB: a batch is cut at about BATCH_BYTES (not 5,000 rows),
    and about WINDOW_BYTES at most wait for replies (not 20,000 rows)."""
    from gtarantool.copy import BATCH_BYTES, WINDOW_BYTES
    _space(conn, "copy_kv", [("id", "unsigned"), ("name", "string"), ("n", "integer")])
    size = 100_000
    per_batch = BATCH_BYTES // size
    ahead = []

    def rows():
        for k in range(400):
            if k % per_batch == 0:
                ahead.append(k - conn.eval("return box.space.copy_kv:count()").data[0])
            yield (k, "x" * size, k)
    sends = conn.stats.send_calls
    report = copy_from(conn, "copy_kv", rows())
    assert report.written == 400 and conn.eval("return box.space.copy_kv:len()").data[0] == 400
    assert max(ahead) * size <= WINDOW_BYTES + 2 * BATCH_BYTES
    assert conn.stats.send_calls - sends >= 400 // (per_batch + 1)


@pytest.mark.parametrize("page", [1, 7, 1000])
def test_copy_to_pages_through_a_non_unique_index(conn, page):
    _space(conn, "copy_kv", [("id", "unsigned"), ("name", "string"), ("n", "integer")])
    conn.eval("box.space.copy_kv:create_index('by_n', {parts = {'n'}, unique = false})")
    copy_from(conn, "copy_kv", [(k, "n", k % 5) for k in range(40)])
    everything = conn.select("copy_kv", index="by_n").data
    assert list(copy_to(conn, "copy_kv", index="by_n", page=page)) == everything
    assert list(copy_to(conn, "copy_kv", index="by_n", key=3, iterator="GE", page=page)) == \
        conn.select("copy_kv", 3, index="by_n", iterator="GE").data
    assert list(copy_to(conn, "copy_kv", index="by_n", key=2, page=page)) == \
        conn.select("copy_kv", 2, index="by_n").data
    assert list(copy_to(conn, "copy_kv", index="by_n", key=2, iterator="LE", page=page)) == \
        conn.select("copy_kv", 2, index="by_n", iterator="LE").data


def test_rows_that_raise_midway_stop_the_copy_with_its_report(conn):
    """An exception from the caller's rows ends copy_from with a CopyError
    whose ``__cause__`` it is and whose report settles what was sent before
    (written or rejected): skipping ``settled`` rows resumes the copy."""
    _space(conn, "copy_kv", [("id", "unsigned"), ("name", "string"), ("n", "integer")])
    conn.insert("copy_kv", (5, "taken", 0))

    def rows():
        for k in range(3000):
            if k == 2500:
                raise RuntimeError("the source broke")
            yield (k, "r", k)

    with pytest.raises(CopyError, match="the source broke") as err:
        copy_from(conn, "copy_kv", rows(), batch=100)
    report = err.value.report
    assert isinstance(err.value.__cause__, RuntimeError)
    assert [r.position for r in report.rejected] == [5]
    assert 2000 <= report.settled <= 2500 and report.written == report.settled - 1
    assert conn.eval("return box.space.copy_kv:len()").data[0] == report.settled
    rest = copy_from(conn, "copy_kv", [(k, "r", k) for k in range(report.settled, 3000)],
                     first=report.settled)
    assert rest.written == 3000 - report.settled and not rest.rejected


@pytest.mark.parametrize("page", [1, 7, 1000])
def test_copy_to_reads_a_hash_index_whole(conn, page):
    """A HASH index has no position and no order: it is read in the hash's
    order, each page after the last key read, every tuple once."""
    conn.eval("if box.space.copy_hash then box.space.copy_hash:drop() end "
              "box.schema.space.create('copy_hash'):create_index('pk', {type = 'hash'})")
    conn.flush_schema()
    copy_from(conn, "copy_hash", [(k, "v%d" % k) for k in range(50)])
    assert sorted(copy_to(conn, "copy_hash", page=page)) == [[k, "v%d" % k] for k in range(50)]
    assert list(copy_to(conn, "copy_hash", key=7, page=page)) == [[7, "v7"]]
    with pytest.raises(ValueError, match="HASH index"):
        list(copy_to(conn, "copy_hash", key=7, iterator="LE", page=page))


def test_copy_to_of_a_frozen_server_ends_within_its_timeout(fresh_server):
    conn = gtarantool.connect(fresh_server.host, fresh_server.port, user=USER,
                              password=PASSWORD)
    try:
        rows = copy_to(conn, "kv", page=1, timeout=0.5)
        conn.replace("kv", ("frozen-1", 1))
        conn.replace("kv", ("frozen-2", 2))
        assert next(rows)[0] == "frozen-1"
        os.kill(fresh_server.pid, signal.SIGSTOP)
        started = time.monotonic()
        try:
            with pytest.raises(gtarantool.RequestTimeout):
                list(rows)
        finally:
            os.kill(fresh_server.pid, signal.SIGCONT)
        assert time.monotonic() - started < 0.5 + slack(1.0)
    finally:
        conn.close()


def test_unknown_space_and_mode_are_refused(conn):
    with pytest.raises(ValueError, match="no space"):
        copy_from(conn, "copy_nothing", [(1,)])
    with pytest.raises(ValueError, match="mode"):
        copy_from(conn, "tester", [(1,)], mode="merge")
    for page in (0, -1, 1.5):   # (a page of 0 read nothing, again and again)
        with pytest.raises(ValueError, match="page must be a positive int"):
            next(copy_to(conn, "tester", page=page))


def test_the_command_line_says_why_it_cannot_start(conn, server, tmp_path, capsys):
    """A missing input, a space or a server that is not there: a line that says
    so and exit status 1, not a traceback."""
    status, _ = _run("from", tmp_path / "missing.csv", "--space", "tester", *_conn_args(server))
    assert status == 1
    assert "cannot read %s: No such file or directory" % (tmp_path / "missing.csv") \
        in capsys.readouterr().err
    src = tmp_path / "in.csv"
    _write(src, ["1,a\n"])
    status, out = _run("from", src, "--space", "copy_nothing", "--procs", 0,
                       *_conn_args(server))
    assert status == 1 and "no row settled; stopped: cannot start: ValueError: no space" in out
    status, out = _run("from", src, "--space", "copy_nothing", "--procs", 1,
                       *_conn_args(server))
    assert status == 1 and "stopped: cannot start: ValueError: no space" in out, out
    status, out = _run("to", tmp_path / "out.csv", "--space", "copy_nothing",
                       *_conn_args(server))
    assert status == 1 and "0 rows written to %s; stopped: ValueError: no space" \
        % (tmp_path / "out.csv") in out, out
    with socket.socket() as free:   # a port nothing listens on
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    status, out = _run("to", tmp_path / "out.csv", "--space", "tester", "--host", "127.0.0.1",
                       "--port", port, "--user", USER)
    assert status == 1 and "0 rows written" in out and "stopped: NetworkError" in out, out
    status, out = _run("from", src, "--space", "tester", "--password-file", tmp_path / "none",
                       "--procs", 0, *_conn_args(server))
    assert status == 1 and "cannot start: FileNotFoundError" in out, out
    status, _ = _run("from", src, "--space", "tester", "--errors", tmp_path / "no" / "e.csv",
                     *_conn_args(server))
    assert status == 1
    assert "cannot write the errors file %s" % (tmp_path / "no" / "e.csv") \
        in capsys.readouterr().err
    _space(conn, "copy_kv", [("id", "unsigned"), ("name", "string"), ("n", "integer")])
    _write(src, ["id,name,name\n", "1,a,b\n"])
    status, out = _run("from", src, "--space", "copy_kv", "--header", "--procs", 0,
                       *_conn_args(server))
    assert status == 1 and "more than one column is named name" in out, out
    assert conn.select("copy_kv").data == []
    for bad, said in ((["--delimiter", ";;"], "--delimiter must be one character"),
                      (["--quote", ","], r"the delimiter \(','\) and --quote must differ"),
                      (["--procs", -1], "--procs must be at least 0, not -1"),
                      (["--rate", "nan"], "--rate must be positive and finite, not nan"),
                      (["--rate", "inf"], "--rate must be positive and finite, not inf")):
        with pytest.raises(SystemExit, match=said):
            _run("from", src, "--space", "tester", "--delimiter", ",", *bad,
                 *_conn_args(server))
    with pytest.raises(SystemExit, match="delimiter .* and --quote must differ"):
        _run("from", src, "--space", "tester", "--quote", ",", *_conn_args(server))   # (default)


# -- interrupted imports ------------------------------------------------------------------

def _cli(*argv):
    return subprocess.Popen([sys.executable, "-m", "gtarantool.copy"] + [str(a) for a in argv],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, TARANTOOL_PASSWORD=PASSWORD))


def _resume_point(out, err=""):
    assert "--skip-rows" in out, (out, err)
    return int(out.rsplit("--skip-rows ", 1)[1].split()[0])


def test_a_worker_answering_much_while_sent_much_does_not_stall(conn, server, tmp_path):
    """Chunks and answers (rejected rows, as they were) larger than a pipe holds: the
    worker takes the chunk being written to it before it answers, so neither
    process waits for the other to read."""
    _space(conn, "copy_kv", [("id", "unsigned"), ("name", "string"), ("n", "integer")])
    src = tmp_path / "in.csv"
    pad = "p" * 1500
    _write(src, ["x%d,%s,%d\n" % (k, pad, k) for k in range(3000)])
    proc = _cli("from", src, "--space", "copy_kv", "--procs", 1, "--chunk", 1000,
                "--errors", tmp_path / "e.csv", *_conn_args(server))
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 2, (out, err)
    assert "3,000 rows read, 0 written, 3,000 rejected" in out
    assert (tmp_path / "e.csv").read_bytes() == src.read_bytes()


@pytest.mark.parametrize("how", ["graceful", "kill"])
def test_an_interrupted_import_resumes_with_skip_rows(fresh_server, tmp_path, how):
    srv = fresh_server
    conn = gtarantool.connect(srv.host, srv.port, user=USER, password=PASSWORD)
    _space(conn, "copy_kv", [("id", "unsigned"), ("name", "string"), ("n", "integer")])
    conn.close()
    total = 10000
    src = tmp_path / "in.csv"
    _write(src, ["%d,n%d,%d\n" % (k, k, k) for k in range(total)])
    args = ["--space", "copy_kv", "--host", srv.host, "--port", srv.port, "--user", USER,
            "--mode", "replace", "--procs", 1, "--chunk", 500, "--errors", tmp_path / "err.csv"]
    proc = _cli("from", src, "--rate", 5000, "--retry-timeout", 1, *args)
    watch = gtarantool.connect(srv.host, srv.port, user=USER, password=PASSWORD)
    while watch.eval("return box.space.copy_kv:count()").data[0] < 2000:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    watch.close()
    if how == "kill":     # and stays away past --retry-timeout: the import stops
        srv.kill()
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 1, (out, err)
        srv.start()
    else:                 # and comes back: the import goes on
        srv.stop()
        srv.start()
        out, err = proc.communicate(timeout=60)
        assert proc.returncode in (0, 2), (out, err)
    first_run = (out, err)   # (what a failure below shows: the summary it resumed from)
    if proc.returncode == 1:
        # As the manual says: every row before the resume point was written or
        # is in the errors file ("it may have been written": a batch in flight
        # when the server died), which is imported again after the resume.
        resume = _resume_point(out, err)
        assert 0 < resume < total
        proc = _cli("from", src, "--skip-rows", resume, *args[:-2],
                    "--errors", tmp_path / "resumed.csv")
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, (out, err)
        if (tmp_path / "err.csv").exists() and (tmp_path / "err.csv").stat().st_size:
            again = _cli("from", tmp_path / "err.csv", *args[:-2], "--errors",
                         tmp_path / "again.csv")
            again_out, again_err = again.communicate(timeout=60)
            assert again.returncode == 0, (again_out, again_err)
    elif proc.returncode == 2:   # rows that may have been written: replaced from the errors file
        assert "--skip-rows" not in out, out
        proc = _cli("from", tmp_path / "err.csv", *args[:-2], "--errors", tmp_path / "again.csv")
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, (out, err)
    assert "--skip-rows" not in out
    conn = gtarantool.connect(srv.host, srv.port, user=USER, password=PASSWORD)
    try:
        keys = [t[0] for t in conn.select("copy_kv").data]
        missing = sorted(set(range(total)) - set(keys))
        assert keys == list(range(total)), (missing[:3], len(missing), first_run, out, err)
    finally:
        conn.close()


def test_a_pool_target_follows_a_switchover(tmp_path):
    with ReplicaSet(_lua(), replicas=1, user=USER, password=PASSWORD) as rs:
        admin = gtarantool.connect(rs.master.host, rs.master.port, user=USER, password=PASSWORD)
        _space(admin, "copy_kv", [("id", "unsigned"), ("name", "string"), ("n", "integer")])
        admin.close()
        rs.wait_synced()
        pool = gtarantool.ConnectionPool(rs.addrs, user=USER, password=PASSWORD,
                                         refresh_delay=0.1)
        total = 30000
        switched = []

        def rows():
            for k in range(total):
                if k == 10000:
                    rs.eval(rs.master, "box.cfg{read_only = true}")
                    rs.wait_caught_up(rs.replicas[0], rs.master)
                    rs.promote(rs.replicas[0])
                    switched.append(k)
                yield (k, "n", k)
        try:
            report = copy_from(pool, "copy_kv", rows(), batch=500, max_in_flight=5000)
        finally:
            pool.close()
        assert switched and report.written == total and not report.rejected
        new = gtarantool.connect(rs.replicas[0].host, rs.replicas[0].port, user=USER,
                                 password=PASSWORD)
        try:
            assert [t[0] for t in new.select("copy_kv").data] == list(range(total))
        finally:
            new.close()


def test_copy_to_a_pool_reads_the_master_not_a_lagging_replica():
    with ReplicaSet(_lua(), replicas=1, user=USER, password=PASSWORD) as rs:
        admin = gtarantool.connect(rs.master.host, rs.master.port, user=USER, password=PASSWORD)
        _space(admin, "copy_kv", [("id", "unsigned"), ("name", "string"), ("n", "integer")])
        copy_from(admin, "copy_kv", [(k, "n", k) for k in range(100)])
        rs.wait_synced()
        rs.eval(rs.replicas[0], "box.cfg{replication = {}}")   # it stops following
        copy_from(admin, "copy_kv", [(k, "n", k) for k in range(100, 200)])
        admin.close()
        pool = gtarantool.ConnectionPool(rs.addrs, user=USER, password=PASSWORD)
        try:
            assert [t[0] for t in copy_to(pool, "copy_kv")] == list(range(200))
        finally:
            pool.close()


def test_a_dead_server_stops_copy_from_with_the_rows_settled(fresh_server):
    srv = fresh_server
    conn = gtarantool.connect(srv.host, srv.port, user=USER, password=PASSWORD,
                              reconnect_delay=0.05)
    _space(conn, "copy_kv", [("id", "unsigned"), ("name", "string"), ("n", "integer")])
    info = space_info(conn, "copy_kv")

    def rows():
        for k in range(20000):
            if k == 5000:
                srv.kill()
            yield (k, "n", k)
    with pytest.raises(CopyError) as caught:
        copy_from(conn, "copy_kv", rows(), batch=500, retry_timeout=0.5, info=info)
    report = caught.value.report
    srv.start()
    written = len(conn.select("copy_kv").data)
    conn.close()
    assert report.settled <= written <= 5000 + 500


# -- a vshard cluster -----------------------------------------------------------------------

STORAGE = """
if not box.info.ro then box.once('copy', function()
    local s = box.schema.space.create('customers', {format = {
        {name = 'id', type = 'unsigned'}, {name = 'bucket_id', type = 'unsigned'},
        {name = 'name', type = 'string'}}})
    s:create_index('pk', {parts = {'id'}})
    s:create_index('bucket_id', {parts = {'bucket_id'}, unique = false})
end) end
"""


@pytest.mark.skipif(vshard_missing() is not None, reason=str(vshard_missing()))
def test_a_router_target_writes_each_row_on_its_buckets_owner(tmp_path):
    with ShardedCluster(shards=2, storage_lua=STORAGE) as cluster:
        router = gtarantool.Router(cluster.cfg, user=cluster.user, password=cluster.password,
                                   fetch_schema=True)
        try:
            rows = [(k, None, "customer %d" % k) for k in range(3000)]
            report = copy_from(router, "customers", rows,
                               bucket_id=lambda row: router.bucket_id_mpcrc32(row[0]))
            assert report.written == 3000 and not report.rejected
            cfg = tmp_path / "cfg.json"
            cfg.write_text(json.dumps(cluster.cfg))
            src = tmp_path / "more.csv"
            _write(src, ["%d,%d,more %d\n" % (k, router.bucket_id_mpcrc32(k), k)
                         for k in range(3000, 4000)])
            env_password = tmp_path / "password"
            env_password.write_text(cluster.password)
            status, out = _run("from", src, "--space", "customers", "--sharding", cfg,
                               "--user", cluster.user, "--password-file", env_password,
                               "--procs", 0)
            assert status == 0, out
            exported = list(copy_to(router, "customers"))
        finally:
            router.close()
        out_file = tmp_path / "out.jsonl"
        status, out = _run("to", out_file, "--space", "customers", "--format", "jsonl",
                           "--router", "%s:%s" % (cluster.router.host, cluster.router.port),
                           "--user", cluster.user, "--password-file", env_password)
        assert status == 0 and "4,000 rows written" in out
        assert sorted(json.loads(line)["id"] for line in out_file.open()) == list(range(4000))
        seen = 0
        for shard in cluster.shards:
            master = shard.servers[0]
            owned = set(cluster.eval(master, "local ids = {} for _, b in "
                                     "box.space._bucket:pairs() do ids[#ids + 1] = b[1] end "
                                     "return ids")[0])
            tuples = cluster.eval(master, "return box.space.customers:select()")[0]
            assert tuples and all(t[1] in owned for t in tuples)
            assert all(t[1] == router_bucket(cluster, t[0]) for t in tuples[:50])
            seen += len(tuples)
        assert seen == 4000 and len(exported) == 4000


def router_bucket(cluster, key):
    return cluster.eval(cluster.router, "return vshard.router.bucket_id_mpcrc32(...)", key)[0]


# a read through vshard.storage.call (the Router's read path), on every storage
STORAGE_READ = STORAGE + """
rawset(_G, 'customer_get', function(id) return box.space.customers:get(id) end)
"""
needs_vshard = pytest.mark.skipif(vshard_missing() is not None, reason=str(vshard_missing()))


@pytest.fixture(scope="module")
def sharded():
    """One cluster for the tests below (each its own keys and buckets)."""
    with ShardedCluster(shards=2, storage_lua=STORAGE_READ) as cluster:
        router = gtarantool.Router(cluster.cfg, user=cluster.user, password=cluster.password,
                                   fetch_schema=True)
        try:
            yield cluster, router
        finally:
            router.close()


def _stored(cluster, rs_uuid, key):
    found = cluster.eval(cluster.shard(rs_uuid).master,
                         "return box.space.customers:get(...)", key)
    return found[0] if found else None


@needs_vshard
def test_a_row_of_a_bucket_moved_after_the_router_learnt_its_owner_lands_on_the_new_one(
        sharded):
    cluster, router = sharded
    bucket = 7
    assert copy_from(router, "customers", [(101, bucket, "first")]).written == 1
    old = cluster.buckets()[bucket]
    new = next(shard.uuid for shard in cluster.shards if shard.uuid != old)
    assert cluster.bucket_send(bucket, new)
    assert router.route(bucket).id == old   # the router's map is stale
    report = copy_from(router, "customers", [(102, bucket, "second")])
    assert report.written == 1 and not report.rejected
    assert router.callro(bucket, "customer_get", [102]) == [102, bucket, "second"]
    assert _stored(cluster, new, 102) == [102, bucket, "second"]
    assert _stored(cluster, old, 102) is None
    assert router.route(bucket).id == new


LOCK = """
local b = ...
local storage = vshard.storage
if not storage.internal.bucket_refs[b] then assert(storage.bucket_refro(b)) end
storage.internal.bucket_refs[b].rw_lock = true
"""
UNLOCK = """
local b = ...
vshard.storage.internal.bucket_refs[b].rw_lock = false
"""


@needs_vshard
def test_rows_of_a_locked_bucket_wait_for_it_or_are_rejected_unwritten(sharded):
    cluster, router = sharded
    locked, free = 11, 12
    owner = cluster.buckets()[locked]
    master = cluster.shard(owner).master
    router.route(locked)
    cluster.eval(master, LOCK, locked)
    rows = [(201, locked, "a"), (202, free, "b"), (203, locked, "c")]
    report = copy_from(router, "customers", rows, retry_timeout=0.3)
    assert report.written == 1
    assert [(r.position, r.applied) for r in report.rejected] == [(0, False), (2, False)]
    assert all("BUCKET_IS_LOCKED" in r.reason or "code 22" in r.reason
               for r in report.rejected), report.rejected
    assert _stored(cluster, owner, 201) is None and _stored(cluster, owner, 203) is None

    unlocker = gevent.spawn_later(0.3, cluster.eval, master, UNLOCK, locked)
    try:
        report = copy_from(router, "customers", rows, mode="replace", retry_timeout=10)
    finally:
        unlocker.join(5)
        unlocker.kill()
    assert report.written == 3 and not report.rejected
    assert router.callro(locked, "customer_get", [203]) == [203, locked, "c"]


# a bucket's _bucket record set without vshard's triggers (status None: deleted)
MARK = """
local id, status, dest = ...
box.space._bucket:run_triggers(false)
local ok, err = pcall(function()
    if status == nil then box.space._bucket:delete(id)
    elseif box.space._bucket:get(id) == nil then box.space._bucket:insert{id, status, dest}
    else box.space._bucket:update(id, {{'=', 2, status}, {'=', 3, dest}}) end
end)
box.space._bucket:run_triggers(true)
if not ok then error(err) end
"""


def _in_transit(cluster, first):
    """Bucket ``first`` or the next, marked sending on its replica set and
    receiving on the other, and a router that has not discovered it:
    ``(src, dst, bucket, router)``."""
    src, dst = cluster.shards
    bucket = first if cluster.buckets()[first] == src.uuid else first + 1
    if cluster.buckets()[bucket] != src.uuid:
        src, dst = dst, src
    router = gtarantool.Router(cluster.cfg, user=cluster.user, password=cluster.password,
                               fetch_schema=True, discovery_mode="off")
    cluster.eval(src.master, MARK, bucket, "sending", dst.uuid)
    cluster.eval(dst.master, MARK, bucket, "receiving", src.uuid)
    return src, dst, bucket, router


@needs_vshard
def test_a_row_whose_bucket_is_in_transit_when_read_waits_for_it(sharded):
    """A row read while its bucket is unknown to the router and being sent (no
    replica set holds it active, so it cannot be routed) is routed again until
    retry_timeout, as a row refused for its bucket is: it was rejected at once,
    'no route'."""
    cluster, _ = sharded
    src, dst, bucket, router = _in_transit(cluster, 41)

    def arrived():
        cluster.eval(src.master, MARK, bucket, "active", None)
        cluster.eval(dst.master, MARK, bucket, None, None)

    sender = gevent.spawn_later(0.5, arrived)
    try:
        report = copy_from(router, "customers", [(501, bucket, "a"), (502, bucket, "b")],
                           retry_timeout=10)
    finally:
        sender.join(5)
        router.close()
    assert report.written == 2 and not report.rejected, report.rejected
    assert _stored(cluster, src.uuid, 502) == [502, bucket, "b"]

    router = gtarantool.Router(cluster.cfg, user=cluster.user, password=cluster.password,
                               fetch_schema=True, discovery_mode="off")
    cluster.eval(src.master, MARK, bucket, "sending", dst.uuid)
    cluster.eval(dst.master, MARK, bucket, "receiving", src.uuid)
    try:
        report = copy_from(router, "customers", [(503, bucket, "c")], retry_timeout=0.3)
    finally:
        arrived()
        router.close()
    assert report.written == 0
    assert [(r.position, r.applied) for r in report.rejected] == [(0, False)]
    assert "NO_ROUTE_TO_BUCKET" in report.rejected[0].reason \
        or "code 9" in report.rejected[0].reason, report.rejected
    assert _stored(cluster, src.uuid, 503) is None


@needs_vshard
def test_a_forked_childs_copy_of_rows_waiting_for_their_bucket_sends_and_settles_nothing(
        sharded):
    """A Router's copy whose rows wait for a bucket in transit when the process
    forks goes on in the parent only: the child's copy raised nothing of its
    own, it gave the rows up at its retry_timeout as refused, not applied, and
    returned that report as its outcome, while the parent's copy could write
    them."""
    from gtarantool.transport import CopiedCall

    cluster, _ = sharded
    src, dst, bucket, router = _in_transit(cluster, 43)
    parent = os.getpid()
    try:
        copying = gevent.spawn(copy_from, router, "customers", [(601, bucket, "a")],
                               retry_timeout=0.6)
        gevent.sleep(0.2)   # (its row waits for the bucket: routed again every pause)
        pid = children.fork()
        copying.join(5)
        if os.getpid() != parent:   # the child: report by exit status only
            os._exit(0 if isinstance(copying.exception, CopiedCall) else 2)
        report = copying.get(timeout=5)
        status = children.wait(pid)
    finally:
        if os.getpid() == parent:
            cluster.eval(src.master, MARK, bucket, "active", None)
            cluster.eval(dst.master, MARK, bucket, None, None)
            router.close()
    assert os.WEXITSTATUS(status) == 0
    assert [(r.position, r.applied) for r in report.rejected] == [(0, False)]
    assert _stored(cluster, src.uuid, 601) is None


@needs_vshard
def test_a_row_the_bucket_id_function_raises_for_is_rejected_alone(sharded):
    """The caller's bucket_id function raising (a KeyError, not only a
    ValueError) rejects that row, not sent: the exception escaped copy_from
    with the rows before unsettled and no report."""
    cluster, router = sharded
    buckets = {601: 21, 603: 21}
    rows = [(601, None, "a"), (602, None, "b"), (603, None, "c")]
    report = copy_from(router, "customers", rows, bucket_id=lambda row: buckets[row[0]])
    assert report.written == 2 and report.settled == 3
    assert [(r.position, r.applied) for r in report.rejected] == [(1, False)]
    assert "KeyError" in report.rejected[0].reason
    assert router.callro(21, "customer_get", [603]) == [603, 21, "c"]


@needs_vshard
def test_a_router_reads_the_spaces_format_from_any_instance(sharded):
    """The format is on every storage: with no replica set writable (masters
    read-only, as while a router learns the roles), space_info through a
    Router still reads it (it raised PoolTopologyError at once)."""
    cluster, router = sharded
    masters = [shard.master for shard in cluster.shards]
    try:
        for master in masters:
            cluster.eval(master, "box.cfg{read_only = true}")
        deadline = time.monotonic() + 10
        while any(info["role"] == "master" for rs in router.replicasets.values()
                  for info in rs.pool.info().values()):
            assert time.monotonic() < deadline, "the router's pools saw no read-only master"
            gevent.sleep(0.05)
        info = space_info(router, "customers")
        assert [f.name for f in info.fields][:3] == ["id", "bucket_id", "name"]
    finally:
        for master in masters:
            cluster.eval(master, "box.cfg{read_only = false}")


@needs_vshard
def test_duplicates_through_a_router_are_rejected_row_by_row(sharded):
    cluster, router = sharded
    assert copy_from(router, "customers", [(305, 20, "taken")]).written == 1
    rows = [(k, 20, "row %d" % k) for k in range(300, 310)]
    rows.append((305, 20, "again"))
    report = copy_from(router, "customers", rows)
    assert report.written == 9
    assert [(r.position, r.applied) for r in report.rejected] == [(5, False), (10, False)]
    assert all("Duplicate key" in r.reason for r in report.rejected), report.rejected
    assert router.callro(20, "customer_get", [305]) == [305, 20, "taken"]
    report = copy_from(router, "customers", [(305, 20, "upserted"), (340, 20, "new")],
                       mode="upsert")
    assert report.written == 2 and not report.rejected
    assert router.callro(20, "customer_get", [305]) == [305, 20, "upserted"]
    assert router.callro(20, "customer_get", [340]) == [340, 20, "new"]


@needs_vshard
def test_a_user_without_execute_on_universe_gets_a_clear_error(sharded):
    cluster, router = sharded
    for shard in cluster.shards:
        cluster.eval(shard.master, """box.session.su('admin', function()
            box.schema.user.create('loader', {password = 'secret'})
            box.schema.user.grant('loader', 'read,write', 'space', 'customers')
            for _, f in ipairs({'call', 'buckets_discovery', 'bucket_stat'}) do
                box.schema.user.grant('loader', 'execute', 'function', 'vshard.storage.' .. f)
            end
        end)""")
    limited = gtarantool.Router(cluster.cfg, user="loader", password="secret",
                                fetch_schema=True)
    try:
        with pytest.raises(CopyError, match="'execute' on 'universe'") as info:
            copy_from(limited, "customers", [(401, 30, "a")])
    finally:
        limited.close()
    assert [(r.position, r.applied) for r in info.value.report.rejected] == [(0, False)]


def test_the_console_script_is_declared():
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        assert 'gtarantool-copy = "gtarantool.copy.cli:main"' in f.read()


def test_a_greenlet_can_run_copy_from_beside_others(conn):
    _space(conn, "copy_kv", [("id", "unsigned"), ("name", "string"), ("n", "integer")])
    pings = []
    ticker = gevent.spawn(lambda: [pings.append(conn.ping()) or gevent.sleep(0.001)
                                   for _ in range(20)])
    report = copy_from(conn, "copy_kv", [(k, "n", k) for k in range(20000)])
    ticker.join(5)
    ticker.kill()
    assert report.written == 20000 and len(pings) == 20


def _first_then(then):
    """Ten rows, ``then()`` while the input is asked for the next, ten more."""
    yield from ((k, "first") for k in range(10))
    then()
    yield from ((k, "second") for k in range(10, 20))


@pytest.mark.parametrize("moment", ["reading the input", "its replies in"])
def test_a_forked_childs_copy_of_a_running_copy_sends_nothing(conn, moment):
    """A copy running at a fork goes on in the parent only: the child's copy
    of it raises CopiedCall instead of sending the rest of the input, sending
    again the rows whose replies the parent reads (a second application, in
    replace mode a silent one) or taking the replies that came before the fork
    as its own outcome."""
    from gtarantool.transport import CopiedCall

    _space(conn, "copy_kv", [("id", "unsigned"), ("name", "string")])
    parent, forked = os.getpid(), []
    if moment == "reading the input":   # (the fork falls in the middle: batch 1 in flight)
        rows = _first_then(lambda: gevent.sleep(0.3))
    else:   # (the copy forks itself once the replies of its one batch are in)
        rows = _first_then(lambda: gevent.sleep(0.2) or forked.append(children.fork()))
        rows = (row for row in rows if row[1] == "first")
    copying = gevent.spawn(copy_from, conn, "copy_kv", rows, batch=10)
    if moment == "reading the input":
        gevent.sleep(0.1)
        forked.append(children.fork())
    copying.join(5)
    if os.getpid() != parent:   # the child: report by exit status only
        os._exit(0 if isinstance(copying.exception, CopiedCall) else 2)
    report = copying.get(timeout=5)
    status = children.wait(forked[0])
    assert os.WEXITSTATUS(status) == 0
    second = [[k, "second"] for k in range(10, 20)] if moment == "reading the input" else []
    assert report.written == 10 + len(second) and report.rejected == []
    assert sorted(conn.select("copy_kv").data) == [[k, "first"] for k in range(10)] + second


def _guide_csv():
    """The CSV file docs/copy.rst shows, as the guide prints it."""
    with open(os.path.join(ROOT, "docs", "copy.rst"), encoding="utf-8") as f:
        text = f.read()
    block = text.split("``customers.csv``::\n\n", 1)[1].split("\n\n", 1)[0]
    return "".join(line[4:] + "\n" for line in block.splitlines()).encode()


@pytest.mark.skipif(VERSION < (2, 10), reason="the guide's datetime field needs Tarantool 2.10+")
def test_the_guides_dataset_imports_as_the_guide_says(conn, server, tmp_path):
    _space(conn, "customers", [("id", "unsigned"), ("name", "string"), ("email", "string"),
                               ("city", "string"), ("signup", "datetime"),
                               ("balance", "decimal"), ("active", "boolean"),
                               ("tags", "array"), ("note", "string")], nullable=("note",))
    src = tmp_path / "customers.csv"
    src.write_bytes(_guide_csv())
    errors = tmp_path / "rejected.csv"
    status, out = _run("from", src, "--space", "customers", "--header", "--errors", errors,
                       "--procs", 0, *_conn_args(server))
    assert status == 2 and "4 rows read, 2 written, 2 rejected" in out
    assert (tmp_path / "rejected.csv.reasons").read_text() == (
        "row 3: field signup (datetime): '2024-02-30T08:00:00Z': day is out of range for month\n"
        "row 4: field balance (decimal): 'n/a': not a decimal number\n")
    bruno = conn.select("customers", 2).data[0]
    assert bruno[8] == 'called twice, "no reply"' and bruno[5] == decimal.Decimal("0")
    ana = conn.select("customers", 1).data[0]
    assert ana[7] == ["vip"] and ana[8:] in ([], [None])


@pytest.mark.parametrize("fmt", ["csv", "tsv"])
def test_records_without_quotes_parse_as_the_csv_module_parses_them(fmt, monkeypatch):
    """parse() splits records with no quote and no carriage return itself: what
    it gives (rows, or each record's reason) is what csv.reader's path gives."""
    import io
    import random

    from gtarantool.copy import formats

    options = formats.dialect(fmt)
    options.pop("lineterminator")
    rng = random.Random(7)
    alphabet = ["a", "1", ",", "\t", '"', "\n", "\r", " ", "é", "\x00"]
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(30)))
        raws = list(formats.records(io.BytesIO(text.encode()), fmt))
        if rng.random() < 0.05 and raws:
            raws[0] = b"\xff" + raws[0]   # not UTF-8
        got = formats.parse(raws, fmt, options)
        with monkeypatch.context() as m:
            m.setattr(formats, "_unquoted", lambda raws, options: None)
            expected = formats.parse(raws, fmt, options)
        assert [str(r) if isinstance(r, BadRow) else r for r in got] == \
            [str(r) if isinstance(r, BadRow) else r for r in expected], raws


def test_blocks_cut_records_as_records_does_whatever_the_block_size():
    import io
    import random

    from gtarantool.copy.formats import blocks, records, split_records

    rng = random.Random(11)
    for _ in range(500):
        lines = [rng.choice([b"1,a\n", b'2,"x\n', b'y",3\n', b"\n", b'"q"\n', b'a""b\n',
                             b'{"k": 1}\n'])
                 for _ in range(rng.randrange(40))]
        if lines and lines[-1] != b"\n" and rng.random() < 0.3:
            lines[-1] = lines[-1].rstrip(b"\n")   # a last line with no newline
        fmt = rng.choice(["csv", "tsv", "jsonl"])
        expected = list(records(lines, fmt))
        got = []
        for block in blocks(io.BytesIO(b"".join(lines)), fmt, size=rng.randrange(1, 30)):
            cut = split_records(block.data, fmt)
            assert len(cut) == block.count
            at = 0
            for k in range(1, block.count + 1):   # after(): where the k-th record ends
                at += len(cut[k - 1])
                assert block.after(0, k) == at
                first = rng.randrange(k)
                assert block.after(block.after(0, first), k - first) == at
            got += cut
        assert got == expected, lines


def test_the_plan_gives_what_row_gives(reader):
    """line_rows/record_rows (C, or their Python twins) give a record's tuple
    only where row() gives that same tuple; None where row() must decide."""
    import random

    from gtarantool.copy.formats import dialect, parse

    rng = random.Random(3)
    fields = [Field("id", "unsigned"), Field("i", "integer"), Field("n", "number"),
              Field("d", "double"), Field("b", "boolean"), Field("s", "string"),
              Field("o", "integer", nullable=True), Field("dec", "decimal"),
              Field("x", "any", nullable=True)]
    conv = Converter(fields)
    texts = ["0", "7", "-3", "+5", " 5", "1_0", "18446744073709551616", "1.5", "1e400", "",
             "true", "Off", "é", "abc", "NULL", "[1]", '"q"', "-0", "5.", "1e3", '"a,b"',
             '"x""y"', 'a"b', '"7"', '""']
    options = dialect("csv")
    options.pop("lineterminator")
    plain = {"unsigned": ["0", "7", "18446744073709551615"], "integer": ["-3", "0", "7"],
             "number": ["1.5", "7", "-0", "5.", "1e3"], "double": ["1.5", "7", "1e3"],
             "boolean": ["true", "Off", "y"], "string": ["abc", "é", ""],
             "decimal": ["1.5", "7"], "any": ["[1]", "abc", ""]}
    lines = [",".join(rng.choice(plain[f.type] if rng.random() < 0.9 else texts)
                      for f in fields).encode() + rng.choice([b"\n", b"\n", b"\r\n", b"\r\r\n"])
             for _ in range(3000)]
    got = conv.line_rows(b"".join(lines), len(lines), ",", '"')
    records = parse(lines, "csv", options)
    parsed = conv.record_rows(records)
    taken = 0
    for line, record, tup, other in zip(lines, records, got, parsed):
        body = line[:-2] if line.endswith(b"\r\n") else line[:-1]
        if b'"' not in line and b"\r" not in body:   # (else the csv module's to parse)
            assert repr(other) == repr(tup), line
        for t in (tup, other):
            if t is not None:
                taken += 1
                assert repr(t) == repr(conv.row(record)), line
    assert 0 < taken < 2 * len(lines)


def test_an_export_of_a_type_no_format_writes_is_refused():
    from gtarantool.copy.formats import Exporter
    with pytest.raises(ValueError, match=r"no format writes d \(interval\)"):
        Exporter([Field("id", "unsigned"), Field("d", "interval")])
