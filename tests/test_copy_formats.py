"""gtarantool.copy.formats: values Tarantool cannot hold, quotes as the csv module
reads them, every field of a tuple exported, against real servers."""
import csv
import decimal
import io
import time

import pytest

from gtarantool.copy import copy_to
from gtarantool.copy.formats import Block, Converter, Exporter, Field, blocks, records
from gtarantool.testing.server import binary_version
from tests.conftest import PASSWORD
from tests.test_copy import _conn_args, _run, _space

VERSION = binary_version()


@pytest.fixture(autouse=True)
def password(monkeypatch):
    monkeypatch.setenv("TARANTOOL_PASSWORD", PASSWORD)


def _import(server, path, space, *options):
    """(status, stdout, {row number: reason}) of an import of ``path``."""
    errors = path.parent / (path.name + ".errors")
    status, out = _run("from", path, "--space", space, "--errors", errors, "--procs", 0,
                       *options, *_conn_args(server))
    reasons = {}
    if (path.parent / (errors.name + ".reasons")).exists():
        for line in (path.parent / (errors.name + ".reasons")).read_text().splitlines():
            row, _, reason = line.partition(": ")
            reasons[int(row.split()[1])] = reason
    return status, out, reasons


def test_decimals_a_tarantool_decimal_cannot_hold_are_rejected_by_their_field(
        conn, server, tmp_path):
    _space(conn, "copy_dec", [("id", "unsigned"), ("amount", "decimal")])
    values = ["1.5",
              "1" * 39,                          # the packer refuses it: the batch failed
              "1E-40",                           # the packer wrote 0, with a warning
              "0." + "0" * 43 + "12345",         # likewise
              "1." + "1" * 38,                   # 39 digits: rounded
              "9" * 38,                          # the most a decimal holds
              "0." + "9" * 38,                   # (the zero before the point not counted)
              "1.5" + "0" * 45,                  # zeros at the end say nothing: 1.5
              "-" + "9" * 37 + ".9"]
    src = tmp_path / "dec.csv"
    src.write_text("".join("%d,%s\n" % (k, v) for k, v in enumerate(values, 1)))
    status, out, reasons = _import(server, src, "copy_dec")
    assert status == 2 and "9 rows read, 5 written, 4 rejected" in out, out
    assert sorted(reasons) == [2, 3, 4, 5]
    assert reasons[2].startswith("field amount (decimal): '1111") and \
        "more than 38 digits before the decimal point" in reasons[2]
    assert "40 digits after the decimal point, more than the 38" in reasons[3]
    assert "48 digits after the decimal point" in reasons[4]
    assert "39 digits, more than the 38 a Tarantool decimal holds" in reasons[5]
    stored = {t[0]: t[1] for t in conn.select("copy_dec").data}
    assert stored == {1: decimal.Decimal("1.5"), 6: decimal.Decimal("9" * 38),
                      7: decimal.Decimal("0." + "9" * 38), 8: decimal.Decimal("1.5"),
                      9: decimal.Decimal("-" + "9" * 37 + ".9")}


def test_a_quote_inside_an_unquoted_value_is_text_as_the_csv_module_reads_it(
        conn, server, tmp_path):
    _space(conn, "copy_kv", [("id", "unsigned"), ("name", "string")])
    text = ('1,5" screen\n2,plain\n3,"a, b"\n4,"two\nlines"\n5,x"y"z\n6,"said ""hi"""\n'
            '7,a "b\n8,c" d\n9,"e"\n')
    src = tmp_path / "in.csv"
    src.write_text(text)
    status, out, reasons = _import(server, src, "copy_kv")
    assert status == 0 and reasons == {}, (out, reasons)
    expected = [[int(r[0]), r[1]] for r in csv.reader(io.StringIO(text), strict=True)]
    assert conn.select("copy_kv").data == expected
    assert expected[0] == [1, '5" screen'] and expected[3] == [4, "two\nlines"]


def test_records_are_cut_in_time_linear_in_the_file_whatever_its_quotes():
    # an unclosed quote at a field's start swallows the rest of the file (as the
    # csv module would): the lines are joined once, not copied line after line
    lines = [b'1,"open\n'] + [b"%d,value-%d-xxxxxxxxxxxxxxxxxxxxxxxx\n" % (k, k)
                              for k in range(2, 60002)]
    started = time.perf_counter()
    cut = list(records(iter(lines), "csv"))
    assert time.perf_counter() - started < 2.0
    assert cut == [b"".join(lines)]
    # a stray quote in an unquoted value opens nothing: every line a record
    lines[0] = b'1,5" screen\n'
    assert list(records(iter(lines), "csv")) == lines


@pytest.mark.parametrize("size", [1, 7, 64, 1 << 20])
def test_blocks_end_where_the_csv_module_ends_records(size):
    text = (b'1,5" screen\n2,"a\nb"\n3,x"y\n4,"c"\n5,d""e\n6,""""\n'
            b'7;"f\ng"\n8,"h\n""i""\nj"\n') * 3
    want = list(records(io.BytesIO(text), "csv"))
    assert len(want) == 27 == len(list(csv.reader(io.StringIO(text.decode()))))
    got = []
    for block in blocks(io.BytesIO(text), "csv", size=size):
        ends = [block.after(0, k) for k in range(1, block.count + 1)]
        got += [bytes(block.data[a:b]) for a, b in zip([0] + ends, ends)]
    assert got == want
    assert Block(text, "csv").count == 27
    # (the delimiter says where a field starts: with ';' only records 7's quote opens one)
    semi = list(csv.reader(io.StringIO(text.decode()), delimiter=";"))
    assert len(list(records(io.BytesIO(text), "csv", delimiter=";"))) == len(semi) == 33
    assert Block(text, "csv", delimiter=";").count == 33


def _with_extras(conn):
    _space(conn, "copy_wide", [("id", "unsigned"), ("name", "string"),
                               ("note", "string")], nullable=("note",))
    conn.eval("box.space.copy_wide:insert{1, 'a', 'n'} "
              "box.space.copy_wide:insert{2, 'b', box.NULL, 'extra', 99, {k = 1}} "
              "box.space.copy_wide:insert{3, 'c', 'n', box.NULL, '5'} "
              "if box.space.copy_bare then box.space.copy_bare:drop() end "
              "local s = box.schema.space.create('copy_bare') s:create_index('pk') "
              "s:insert{1, 'b', 2.5, {1, 'x'}} s:insert{2}")
    conn.flush_schema()


@pytest.mark.parametrize("fmt,header", [("csv", True), ("csv", False), ("tsv", True),
                                        ("jsonl", False)])
def test_an_export_writes_every_field_of_a_tuple(conn, server, tmp_path, fmt, header):
    _with_extras(conn)
    for space in ("copy_wide", "copy_bare"):
        before = conn.select(space).data
        path = tmp_path / ("%s.%s" % (space, fmt))
        options = ["--format", fmt] + (["--header"] if header else [])
        status, out = _run("to", path, "--space", space, *options, *_conn_args(server))
        assert status == 0, out
        conn.eval("box.space.%s:truncate()" % space)
        status, out, reasons = _import(server, path, space, *options)
        assert status == 0 and reasons == {}, (out, reasons, path.read_text())
        assert conn.select(space).data == before
    if fmt == "jsonl":
        assert '"field4":"extra","field5":99' in (tmp_path / "copy_wide.jsonl").read_text()


def test_fields_past_the_format_are_named_by_their_position(conn, server, tmp_path):
    _space(conn, "copy_wide", [("id", "unsigned"), ("name", "string")])
    src = tmp_path / "in.csv"
    src.write_text('id,field4,name\n1,"[1]",a\n2,,b\n')
    status, out, reasons = _import(server, src, "copy_wide", "--header")
    assert status == 0, (out, reasons)
    assert conn.select("copy_wide").data == [[1, "a", None, [1]], [2, "b", None, None]]
    # columns past the named ones only when every field of the format is named
    conv = Converter([Field("id", "unsigned"), Field("name", "string")], ["name", "id"])
    assert conv.row(["a", "1", "[2]", "x"]) == (1, "a", [2], "x")
    part = Converter([Field("id", "unsigned"), Field("n", "string", True)], ["id"])
    with pytest.raises(ValueError, match="2 columns where 1 were expected"):
        part.row(["1", "x"])
    with pytest.raises(ValueError, match="no field named field2"):
        Converter([Field("id", "unsigned"), Field("n", "string", True)]).row(
            {"id": 1, "field2": "x"})


def test_a_carriage_return_in_a_value_is_quoted_and_read_back(conn, server, tmp_path):
    _space(conn, "copy_kv", [("id", "unsigned"), ("name", "string")])
    values = ["cr\rhere", "crlf\r\nhere", "\r", "plain", "a,b"]
    for k, v in enumerate(values):
        conn.insert("copy_kv", (k, v))
    before = conn.select("copy_kv").data
    exporter = Exporter([Field("id", "unsigned"), Field("name", "string")], "csv")
    path = tmp_path / "out.csv"
    with open(path, "w", encoding="utf-8", newline="") as out:
        writer = exporter.writer(out)
        for tup in copy_to(conn, "copy_kv"):
            writer.writerow(exporter.record(tup))
    with open(path, newline="") as f:
        text = f.read()
    assert '"0","cr\rhere"\n' in text and "\n3,plain\n" in text   # (the rest as before)
    conn.eval("box.space.copy_kv:truncate()")
    status, out, reasons = _import(server, path, "copy_kv")
    assert status == 0 and reasons == {}, (out, reasons)
    assert conn.select("copy_kv").data == before


@pytest.mark.skipif(VERSION < (2, 3), reason="a number field takes a decimal from 2.3 on")
def test_a_decimal_in_a_number_field_comes_back_from_json_lines(conn, server, tmp_path):
    _space(conn, "copy_num", [("id", "unsigned"), ("n", "number")])
    conn.insert("copy_num", (1, decimal.Decimal("0.1")))
    conn.insert("copy_num", (2, 0.1))
    conn.insert("copy_num", (3, 7))
    before = conn.select("copy_num").data
    path = tmp_path / "num.jsonl"
    assert _run("to", path, "--space", "copy_num", "--format", "jsonl",
                *_conn_args(server))[0] == 0
    conn.eval("box.space.copy_num:truncate()")
    status, out, reasons = _import(server, path, "copy_num", "--format", "jsonl")
    assert status == 0, (out, reasons)
    after = conn.select("copy_num").data
    assert after == before and [type(t[1]) for t in after] == [decimal.Decimal, float, int]


def test_reasons_say_what_is_out_of_range_and_name_the_field(conn, server, tmp_path):
    fields = [("id", "unsigned"), ("i", "integer"), ("n", "number"), ("x", "any")]
    if VERSION >= (2, 10):
        fields.append(("dt", "datetime"))
    _space(conn, "copy_range", fields)
    dt = ",2024-01-02T00:00:00Z" if VERSION >= (2, 10) else ""
    rows = ["1,-5,5,7" + dt, "18446744073709551616,1,1,1" + dt,
            "3,-9223372036854775809,1,1" + dt, "4,1,18446744073709551616,1" + dt,
            '5,1,1,"{""a"": [18446744073709551616]}"' + dt, "18446744073709551615,1,1,1" + dt]
    if VERSION >= (2, 10):
        rows += ["7,1,1,1,2024-01-02T00:00:00+25:00", "8,1,1,1,2024-01-02T00:00:00+14:01",
                 "9,1,1,1,2024-01-02T00:00:00+05:75", "10,1,1,1,2024-01-02T00:00:00-12:00"]
    src = tmp_path / "in.csv"
    src.write_text("".join(r + "\n" for r in rows))
    status, out, reasons = _import(server, src, "copy_range")
    assert status == 2, out
    for row, field in ((2, "id (unsigned)"), (3, "i (integer)"), (4, "n (number)"),
                       (5, "x (any)")):
        assert reasons[row].startswith("field %s: " % field), reasons[row]
        assert "out of range: Tarantool's integers go from -2^63 to 2^64-1" in reasons[row]
    ids = [1, 18446744073709551615]
    if VERSION >= (2, 10):
        assert "offset +25:00 is out of range: Tarantool takes -12:00 to +14:00" in reasons[7]
        assert reasons[7].startswith("field dt (datetime)")
        assert "offset +14:01 is out of range" in reasons[8]
        assert "offset +05:75 has more than 59 minutes" in reasons[9]
        ids.append(10)
    assert sorted(reasons) == [2, 3, 4, 5] + ([7, 8, 9] if VERSION >= (2, 10) else [])
    assert sorted(t[0] for t in conn.select("copy_range").data) == sorted(ids)


def test_numbers_are_ascii_digits_without_underscores(conn, server, tmp_path):
    # (int(), float() and Decimal() take 1_000 and other scripts' digits: a file's
    # "1_000" or "٣" is no number, and a UUID or a datetime of them no value)
    fields = [("id", "unsigned"), ("i", "integer"), ("n", "number"), ("d", "double"),
              ("dec", "decimal"), ("u", "uuid")]
    if VERSION >= (2, 10):
        fields.append(("dt", "datetime"))
    _space(conn, "copy_digits", fields)
    u = "6f1c1f3e-0000-0000-0000-000000000001"
    dt = ",2024-01-02T00:00:00Z" if VERSION >= (2, 10) else ""
    good = ["1", "-2", "3.5", "4.5", "5.25", u]
    bad = {"id": ["1_000", "\u0663", "\uff15"], "i": ["-1_0", "-\u0663"],
           "n": ["1_0.5", "\u0663.\u0665", "1e1_0"], "d": ["1_000.5", "\u0663"],
           "dec": ["1_000", "\u0663"],
           # (uuid.UUID() reads this one shifted by a digit: 06f1c1f3-e000-...)
           "u": ["6f1c1f3e-0000-0000-0000-00000000000 ", "+f1c1f3e000000000000000000000001",
                 "6f1c1f3e00000000000000000000000\u0661"]}
    names = [n for n, _ in fields]
    rows, expected = [], {}
    for name, values in bad.items():
        for value in values:
            row = list(good)
            row[names.index(name)] = value
            if name != "id":
                row[0] = str(len(rows) + 10)
            rows.append(",".join(row) + dt)
            expected[len(rows)] = name
    if VERSION >= (2, 10):
        rows.append("99,1,1,1,1," + u + ",\u0662\u0660\u0662\u0664-01-02")
        expected[len(rows)] = "dt"
    rows.append("100,1,1,1,1,{%s}" % u + dt)    # (braces, as PostgreSQL takes them)
    src = tmp_path / "in.csv"
    src.write_text("".join(r + "\n" for r in rows), encoding="utf-8")
    for procs in (0, 2):
        conn.eval("box.space.copy_digits:truncate()")
        status, out, reasons = _import(server, src, "copy_digits", "--procs", procs)
        assert status == 2, out
        assert {row: reason.split(" ")[1] for row, reason in reasons.items()} == expected
        assert [t[0] for t in conn.select("copy_digits").data] == [100]


def test_a_json_lines_syntax_error_is_told_by_its_column(conn, server, tmp_path):
    _space(conn, "copy_kv", [("id", "unsigned"), ("name", "string")])
    src = tmp_path / "in.jsonl"
    src.write_text('{"id": 1, "name": "a"}\n{"id": 2, "name": "b"\n{"id" 3}\n')
    status, out, reasons = _import(server, src, "copy_kv", "--format", "jsonl")
    assert status == 2, out
    # (json's own "line 2 column 1" is the end of the record, after its newline)
    assert reasons == {2: "not JSON: Expecting ',' delimiter at the end of the line",
                       3: "not JSON: Expecting ':' delimiter at column 7"}


def test_a_number_of_thousands_of_digits_is_rejected_as_out_of_range(conn, server, tmp_path,
                                                                      reader):
    # (int() reads at most 4,300 digits: the plan's Python twin raised past it)
    _space(conn, "copy_long", [("id", "unsigned"), ("n", "integer")])
    src = tmp_path / "in.csv"
    src.write_text("1,1\n2,%s\n3,%s7\n4,-%s\n" % ("1" * 5000, "0" * 30, "9" * 25))
    status, out, reasons = _import(server, src, "copy_long")
    assert status == 2, out
    assert sorted(reasons) == [2, 4]
    for row in (2, 4):
        assert reasons[row].endswith("out of range: Tarantool's integers go from -2^63 to "
                                     "2^64-1"), reasons[row]
    assert conn.select("copy_long").data == [[1, 1], [3, 7]]


@pytest.mark.skipif(VERSION < (3, 0), reason="field defaults are Tarantool 3.0+")
@pytest.mark.parametrize("procs", [0, 2])
def test_fields_with_a_default_may_be_left_out_or_null(conn, server, tmp_path, procs):
    conn.eval("if box.space.copy_dflt then box.space.copy_dflt:drop() end "
              "box.schema.space.create('copy_dflt', {format = {{name = 'id', type = 'unsigned'}, "
              "{name = 'st', type = 'string', default = 'new'}, "
              "{name = 'q', type = 'integer', default = 7}}}):create_index('pk')")
    conn.flush_schema()
    left_out = tmp_path / "left_out.csv"
    left_out.write_text("id\n1\n2\n")
    status, out, reasons = _import(server, left_out, "copy_dflt", "--header", "--procs", procs)
    assert (status, reasons) == (0, {}), out
    nulls = tmp_path / "nulls.csv"
    # (the null text in a string field that is not nullable is the empty string)
    nulls.write_text("id,st,q\n3,,\n4,x,5\n")
    status, out, reasons = _import(server, nulls, "copy_dflt", "--header", "--procs", procs)
    assert (status, reasons) == (0, {}), out
    lines = tmp_path / "in.jsonl"
    lines.write_text('{"id": 5}\n{"id": 6, "st": null, "q": null}\n')
    status, out, reasons = _import(server, lines, "copy_dflt", "--format", "jsonl",
                                   "--procs", procs)
    assert (status, reasons) == (0, {}), out
    assert conn.select("copy_dflt").data == [[1, "new", 7], [2, "new", 7], [3, "", 7],
                                             [4, "x", 5], [5, "new", 7], [6, "new", 7]]


@pytest.mark.parametrize("fmt", ["csv", "tsv"])
def test_a_value_past_128_kib_with_quotes_or_newlines_round_trips(conn, server, tmp_path, fmt):
    # (the csv module refuses a value past 128 KiB: such a value, read by it when
    # it holds a doubled quote or spans lines, was rejected, "field larger than
    # field limit")
    _space(conn, "copy_big", [("id", "unsigned"), ("s", "string")])
    values = ['say "x", ' * 20000, "line\n" * 40000, "plain" * 40000]
    for k, value in enumerate(values):
        conn.insert("copy_big", (k, value))
    out = tmp_path / ("out." + fmt)
    status, said = _run("to", out, "--space", "copy_big", "--format", fmt, *_conn_args(server))
    assert status == 0, said
    conn.eval("box.space.copy_big:truncate()")
    for procs in (0, 2):
        status, said, reasons = _import(server, out, "copy_big", "--format", fmt,
                                        "--mode", "replace", "--procs", procs)
        assert (status, reasons) == (0, {}), said
        assert conn.select("copy_big").data == [[k, v] for k, v in enumerate(values)]


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_a_map_with_a_binary_key_is_exported_with_the_key_as_text(conn, server, tmp_path, fmt):
    # (json takes no default for a key: the export stopped, "keys must be str, ...")
    _space(conn, "copy_keys", [("id", "unsigned"), ("m", "map"), ("x", "any")])
    conn.insert("copy_keys", (1, {"a": 1}, None))
    conn.insert("copy_keys", (2, {b"bin": 1, 5: [{b"\x00": 2}]}, {b"k": decimal.Decimal("1.5")}))
    out = tmp_path / ("out." + fmt)
    status, said = _run("to", out, "--space", "copy_keys", "--format", fmt, *_conn_args(server))
    assert status == 0, said
    conn.eval("box.space.copy_keys:truncate()")
    status, said, reasons = _import(server, out, "copy_keys", "--format", fmt)
    assert (status, reasons) == (0, {}), said
    assert conn.select("copy_keys").data == [[1, {"a": 1}, None],
                                             [2, {"Ymlu": 1, "5": [{"AA==": 2}]}, {"aw==": "1.5"}]]
