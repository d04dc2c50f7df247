"""The fault campaign's checker (gtarantool.testing.chaos): each promise it
checks is broken once in a synthetic history and must be flagged; a clean
history must pass.  Then the server side (a second application of an id is
counted even when its insert fails, a copied row sent twice is named) and one
short live run, whose report names the seed to replay."""
import re
import time

import gevent
import pytest

from gtarantool.copy import copy_from
from gtarantool.protocol.constants import ER_TUPLE_FOUND
from gtarantool.testing.chaos import history as h
from gtarantool.testing.chaos.__main__ import main
from gtarantool.testing.chaos.schedule import Schedule
from gtarantool.testing.chaos.workload import (
    BUCKETS,
    CHILD_BASE,
    ROWS_PER_OP,
    SCHEMA,
    USER_LUA,
    Campaign,
    ConnTarget,
    _settle,
    tally,
)
from gtarantool.testing.cluster import vshard_missing
from gtarantool.testing.server import TarantoolServer, binary_version

SLACK = 0.5


def op(op_id, kind="write_call", outcome="ok", start=10.0, took=0.1, bound=1.0, **fields):
    reply = op_id if outcome == "ok" and kind != "write_upsert" else None
    fields.setdefault("reply", reply)
    return h.Op(op_id, "conn", kind, start, bound, end=start + took, outcome=outcome, **fields)


def copy_op(op_id, *rows, outcome="ok", **fields):
    fields.setdefault("reply", None)
    done = op(op_id, kind="write_copy", outcome=outcome, **fields)
    done.rows = [h.Row(op_id * ROWS_PER_OP + k, *row) for k, row in enumerate(rows)]
    return done


def clean():
    """Acknowledged writes applied once, an unacknowledged one applied once, a
    refused one not applied, a read, a cancelled call within its own timer; a
    copy whose written row is present, whose row refused unapplied is absent
    and whose row that may have been applied is absent; a copy that raised
    "may have been applied" with one row present; a cancelled copy."""
    ops = [op(1), op(2, kind="write_upsert"), op(3, outcome="error", error="RequestTimeout"),
           op(4, outcome="error", error="DatabaseError", applied=False),
           op(5, kind="read_call"),
           op(6, outcome="cancelled", error="gevent.Timeout", bound=0.2, took=0.2),
           copy_op(7, (h.WRITTEN,), (h.REJECTED, False, None, "no route"),
                   (h.REJECTED, None, None, "RequestTimeout")),
           copy_op(8, (h.RAISED,), (h.RAISED,), outcome="error", error="CopyError"),
           copy_op(9, (h.PENDING,), outcome="cancelled", error="gevent.Timeout")]
    return h.History(ops), h.Facts({1: 1, 2: 1, 3: 1}, rows={7 * ROWS_PER_OP, 8 * ROWS_PER_OP})


def promises(history, facts):
    return [v.promise for v in h.check(history, facts, SLACK)]


def test_a_clean_history_breaks_no_promise():
    assert promises(*clean()) == []


def test_an_id_applied_twice_is_flagged():
    history, facts = clean()
    facts.applications[2] = 2
    assert promises(history, facts) == [h.DOUBLE]


def test_an_acknowledged_write_missing_everywhere_is_flagged():
    history, facts = clean()
    del facts.applications[1]
    assert promises(history, facts) == [h.LOST]


def test_an_error_that_says_not_applied_when_it_was_is_flagged():
    history, facts = clean()
    facts.applications[4] = 1
    assert promises(history, facts) == [h.LYING]


def test_an_error_that_may_have_been_applied_is_no_lie_either_way():
    history, facts = clean()
    del facts.applications[3]
    assert promises(history, facts) == []


def test_a_copied_row_reported_written_and_missing_everywhere_is_flagged():
    history, facts = clean()
    facts.rows.discard(7 * ROWS_PER_OP)
    (violation,) = h.check(history, facts, SLACK)
    assert violation.promise == h.LOST and "row %d" % (7 * ROWS_PER_OP) in violation.detail


def test_a_copied_row_left_where_its_bucket_is_not_held_counts_as_lost():
    """On a vshard storage a row in a bucket sent away (or in none) is not
    where the router reads: absent, named as misplaced."""
    history, applied = clean()
    written = 7 * ROWS_PER_OP
    facts = tally([([], [], [(8 * ROWS_PER_OP, "", True), (written, "", False)])])
    facts.applications = applied.applications
    assert facts.misplaced == {written} and facts.rows == {8 * ROWS_PER_OP}
    (violation,) = h.check(history, facts, SLACK)
    assert violation.promise == h.LOST and "that holds its bucket" in violation.detail
    facts = tally([([], [], [(8 * ROWS_PER_OP, "", True), (written, "", False)]),
                   ([], [], [(written, "", True)])])
    assert facts.misplaced == set() and written in facts.rows


def test_a_copied_row_said_not_applied_but_present_is_flagged():
    history, facts = clean()
    facts.rows.update({7 * ROWS_PER_OP + 1, 8 * ROWS_PER_OP + 1})
    assert promises(history, facts) == [h.LYING]
    history.ops[-2].applied = history.ops[-2].rows[1].applied = False   # the copy raised
    assert promises(history, facts) == [h.LYING, h.LYING]


def test_a_copied_row_that_may_have_been_applied_is_no_lie_either_way():
    history, facts = clean()
    facts.rows.update({7 * ROWS_PER_OP + 2, 8 * ROWS_PER_OP + 1, 9 * ROWS_PER_OP})
    assert promises(history, facts) == []


def test_a_unique_row_refused_as_a_duplicate_was_sent_twice():
    history, facts = clean()
    history.ops.append(copy_op(10, (h.REJECTED, False, ER_TUPLE_FOUND, "Duplicate key")))
    facts.rows.add(10 * ROWS_PER_OP)
    assert promises(history, facts) == [h.DOUBLE]


def test_a_copy_report_that_leaves_a_row_out_is_flagged():
    history, facts = clean()
    history.ops.append(copy_op(10, (h.UNREPORTED,)))
    assert promises(history, facts) == [h.UNSETTLED]


def test_a_parents_copy_writing_rows_in_a_forked_child_is_flagged():
    """The child's copy of the call ends in CopiedCall, its rows not applied
    by the child (the parent's may have been: ``applied`` None); it must not
    end well, nor write a row, nor say a row the parent wrote was not applied."""
    history, facts = clean()
    history.ops.append(copy_op(7, (h.RAISED, None), (h.RAISED, None), outcome="error",
                               error="CopiedCall", applied=None, proc="child-1", copy=True))
    assert promises(history, facts) == []
    lying, facts = clean()
    lying.ops.append(copy_op(7, (h.RAISED, False), (h.RAISED, False), outcome="error",
                             error="CopiedCall", applied=False, proc="child-1", copy=True))
    assert promises(lying, facts) == [h.LYING]
    history.ops.append(copy_op(7, (h.WRITTEN,), proc="child-1", copy=True))
    assert promises(history, facts) == [h.CHILD, h.CHILD]


RS_A, RS_B = "replicaset-a", "replicaset-b"


def mapped():
    """A full map run on both replica sets; a map over buckets 3 and 40 run
    where each is held; one over bucket 3 run on its replica set alone; a map
    refused before it ran (applied False), run nowhere; two that may have run
    (applied None), one run on a replica set, one on both."""
    history, facts = clean()
    history.ops += [op(20, kind="write_map"), op(21, kind="write_map", buckets=[3, 40]),
                    op(22, kind="write_map", buckets=[3]),
                    op(23, kind="write_map", outcome="error", error="ShardingError",
                       applied=False),
                    op(24, kind="write_map", outcome="error", error="RequestTimeout"),
                    op(25, kind="write_map", outcome="error", error="StorageError")]
    facts.replicasets = {RS_A, RS_B}
    facts.maps = {20: [(RS_A, []), (RS_B, [])], 21: [(RS_A, [3]), (RS_B, [40])],
                  22: [(RS_B, [3])], 24: [(RS_A, [])], 25: [(RS_A, []), (RS_B, [])]}
    return history, facts


def test_a_map_runs_at_most_once_on_each_replica_set():
    assert promises(*mapped()) == []
    for op_id in (20, 22, 24):
        history, facts = mapped()
        facts.maps[op_id].append(facts.maps[op_id][0])
        (violation,) = h.check(history, facts, SLACK)
        assert violation.promise == h.DOUBLE and violation.op.id == op_id
        assert "2 times on" in violation.detail
    # (a forked child's copy of a map shares its id: named once)
    history, facts = mapped()
    history.ops.append(op(20, kind="write_map", outcome="error", error="CopiedCall",
                          proc="child-1", copy=True))
    assert promises(history, facts) == []
    facts.maps[20].append((RS_B, []))
    assert promises(history, facts) == [h.DOUBLE]


def test_an_acknowledged_map_ran_on_every_replica_set_it_had_to_reach():
    history, facts = mapped()
    facts.maps[20] = [(RS_A, [])]
    (violation,) = h.check(history, facts, SLACK)
    assert violation.promise == h.LOST and RS_B in violation.detail
    history, facts = mapped()
    facts.maps[21] = [(RS_A, [3])]
    (violation,) = h.check(history, facts, SLACK)
    assert violation.promise == h.LOST and "bucket(s) 40" in violation.detail
    history, facts = mapped()
    del facts.maps[22]
    assert promises(history, facts) == [h.LOST]
    # (a run where the bucket was not held covers nothing)
    facts.maps[22] = [(RS_A, [])]
    assert promises(history, facts) == [h.LOST]


def test_a_map_said_not_run_runs_nowhere():
    history, facts = mapped()
    facts.maps[23] = [(RS_B, [])]
    (violation,) = h.check(history, facts, SLACK)
    assert violation.promise == h.LYING and RS_B in violation.detail
    # (one that may have run: anything up to once on each)
    history, facts = mapped()
    del facts.maps[24], facts.maps[25]
    assert promises(history, facts) == []


def test_map_runs_count_once_across_replicas_and_name_their_replica_sets():
    runs = [("a", 20, "127.0.0.1:5000>3301@150.0", RS_A, []),
            ("b", 21, "127.0.0.1:6000>3301@150.0", RS_A, [3])]
    facts = tally([([], [], [], runs, RS_A), ([], [], [], runs[:1], RS_A),
                   ([], [], [], [("c", 20, "", RS_B, [])], RS_B),
                   ([], [], [], [], "")], CHILD_SOCKETS, copied={20, 21})
    assert facts.maps == {20: [(RS_A, []), (RS_B, [])], 21: [(RS_A, [3])]}
    assert facts.replicasets == {RS_A, RS_B} and facts.by_child == {21}
    assert facts.applications == {}


# A forked child's socket from local port 6000 to a server on 3301, open from
# 100.0 to 200.0 (wall times).
CHILD_SOCKETS = [(6000, 3301, 100.0, 200.0)]


def test_a_parents_row_written_over_a_childs_socket_is_flagged():
    rows = [(7 * ROWS_PER_OP, "127.0.0.1:5000>3301@150.0", True),
            (8 * ROWS_PER_OP, "127.0.0.1:6000>3301@150.0", True),
            (CHILD_BASE * ROWS_PER_OP + 1, "127.0.0.1:6000>3301@150.0", True)]
    facts = tally([([], [], rows), ([], [], rows[:1])], CHILD_SOCKETS, copied={7, 8})
    assert facts.rows == {r for r, _, _ in rows}
    assert facts.by_child == {8}
    history, applied = clean()
    facts.applications = applied.applications
    assert promises(history, facts) == [h.CHILD]


def test_a_call_longer_than_its_timeout_and_the_slack_is_flagged():
    history, facts = clean()
    history.ops.append(op(7, kind="read_call", took=1.0 + SLACK + 0.01))
    history.ops.append(op(8, kind="read_call", took=1.0 + SLACK - 0.01))
    assert promises(history, facts) == [h.OVERLONG]


def test_time_its_process_stalled_does_not_count_against_a_call():
    """A busy host stops the whole process: a call is held to its bound for
    the time its hub ran, and still flagged when that is too long."""
    history, facts = clean()
    history.ops.append(op(7, kind="read_call", start=10.0, took=2.0))
    facts.stalls["parent"] = [(9.0, 10.5), (11.5, 11.7), (13.0, 14.0)]
    assert promises(history, facts) == []
    history.ops.append(op(8, kind="read_call", start=10.0, took=2.5))
    (violation,) = h.check(history, facts, SLACK)
    assert violation.promise == h.OVERLONG and violation.op.id == 8
    assert "0.70s more while its process's hub stalled" in violation.detail


def test_a_cancelled_call_is_bounded_by_the_callers_own_timer():
    history, facts = clean()
    history.ops.append(op(7, outcome="cancelled", error="gevent.Timeout", bound=0.2, took=0.9))
    assert promises(history, facts) == [h.OVERLONG]


def test_a_reply_carrying_another_calls_id_is_flagged():
    history, facts = clean()
    history.ops.append(op(7, kind="read_call", reply=5))
    assert promises(history, facts) == [h.FOREIGN]


def test_a_call_that_never_returned_is_flagged():
    history, facts = clean()
    history.ops.append(h.Op(7, "pool", "read_call", 10.0, 1.0))
    assert promises(history, facts) == [h.HUNG]


def test_a_parents_call_completed_in_a_forked_child_is_flagged():
    history, facts = clean()
    history.ops.append(op(1, proc="child-1", copy=True))
    assert promises(history, facts) == [h.CHILD]
    history, facts = clean()
    facts.by_child.add(3)
    assert promises(history, facts) == [h.CHILD]


def test_a_copy_in_the_child_may_not_say_the_parents_applied_write_was_not_applied():
    """The parent's call goes on and applies the write: its copy in the child
    says "may have been applied" (CopiedCall, ``applied`` None), never False,
    which would invite a second send from the child."""
    history, facts = clean()
    history.ops.append(op(1, outcome="error", error="CopiedCall", applied=None,
                          proc="child-1", copy=True))
    assert promises(history, facts) == []
    history.ops.append(op(1, outcome="error", error="ConnectionClosed", applied=False,
                          proc="child-1", copy=True))
    assert promises(history, facts) == [h.LYING]


def test_an_error_outside_the_librarys_classes_is_flagged():
    history, facts = clean()
    history.ops.append(op(7, kind="read_call", outcome="error", error="RuntimeError",
                          library_error=False))
    assert promises(history, facts) == [h.STRAY]


def test_a_protocol_error_is_flagged_as_the_servers_send_valid_frames():
    history, facts = clean()
    history.ops.append(op(7, kind="read_call", outcome="error", error="ProtocolError"))
    assert promises(history, facts) == [h.GARBLED]


def test_a_history_survives_its_json_form():
    history, facts = clean()
    again = h.History.loads(history.dumps())
    assert again.ops == history.ops
    assert isinstance(again.ops[6].rows[0], h.Row)


def test_a_local_port_a_child_used_names_it_only_at_its_server_and_time():
    """The kernel hands a closed socket's local port to the next connection,
    and shares one among connections to different servers: a parent's write
    over such a port is not the child's."""
    log = [("a", 1, "127.0.0.1:6000>3301@50.0"),    # before the child's socket opened
           ("b", 2, "127.0.0.1:6000>3301@250.0"),   # after it closed
           ("c", 3, "127.0.0.1:6000>3302@150.0"),   # at once, towards another server
           ("d", 4, "127.0.0.1:6000>3301@150.0"),   # over it, but not in flight at the fork
           ("e", 5, "127.0.0.1:6000>3301@150.0"),   # over it, copied into the child
           ("f", 6, "127.0.0.1:6000")]              # no origin recorded
    facts = tally([(log, [])], CHILD_SOCKETS, copied={1, 2, 3, 5, 6})
    assert facts.by_child == {5}


def test_replicated_rows_count_once_and_counters_as_their_largest_value():
    log = [("a", 1, "127.0.0.1:5000>3301@150.0"), ("b", 1, "127.0.0.1:5001>3301@150.0"),
           ("c", 2, "127.0.0.1:6000>3301@150.0")]
    facts = tally([(log, [(9, 1)]), (log[:2], [(9, 2)])], CHILD_SOCKETS, copied={1, 2})
    assert facts.applications == {1: 2, 2: 1, 9: 2}
    assert facts.by_child == {2}


def test_the_same_seed_draws_the_same_schedule():
    first = Schedule(11, 8.0, ["conn", "pool", "router"])
    assert str(first) == str(Schedule(11, 8.0, ["conn", "pool", "router"]))
    assert str(first) != str(Schedule(12, 8.0, ["conn", "pool", "router"]))
    forks = [f for f in Schedule(5, 100.0, ["conn"]).faults if f.kind == "fork"]
    assert len(forks) <= 1
    assert all(f.at <= 8.0 * 0.75 for f in first.faults)


def test_a_second_application_is_counted_even_when_its_insert_fails():
    """And a copied row sent a second time comes back as a duplicate, which
    the checker names; the caller's address is kept with each copied row."""
    with TarantoolServer(USER_LUA + SCHEMA) as server:
        target = ConnTarget.__new__(ConnTarget)
        target.rt = 1.0
        conn = target.connect(server.port)
        try:
            assert conn.call("chaos_write", 5).data == [5]
            with pytest.raises(Exception, match="Duplicate key"):
                conn.call("chaos_write", 5)
            conn.upsert("chaos_count", (6, 1), [("+", 1, 1)])
            conn.upsert("chaos_count", (6, 1), [("+", 1, 1)])
            first, again = copy_op(7, (), ()), copy_op(8, ())
            _settle(first, copy_from(conn, "chaos_rows", [(r.id, 1) for r in first.rows]))
            again.rows[0].id = first.rows[1].id
            _settle(again, copy_from(conn, "chaos_rows", [(again.rows[0].id, 1)]))
            port = conn.eval("return box.session.peer()").data[0].rsplit(":", 1)[1]
            facts = tally([tuple(conn.eval("return chaos_facts()").data)],
                          [(int(port), server.port, 0.0, time.time() + 1.0)], copied={5, 7})
        finally:
            conn.close()
    assert facts.applications == {5: 2, 6: 2}
    assert facts.rows == {r.id for r in first.rows} and facts.by_child == {5, 7}
    assert [r.state for r in first.rows + again.rows] == [h.WRITTEN, h.WRITTEN, h.REJECTED]
    facts.by_child.clear()
    history = h.History([op(5), op(6, kind="write_upsert"), first, again])
    assert promises(history, facts) == [h.DOUBLE, h.DOUBLE, h.DOUBLE]


def test_a_live_run_records_a_history_and_names_its_seed_when_it_fails(capsys):
    """A slack of minus a minute makes every call overlong: the run must fail
    and say how to replay it."""
    assert main(["--seed", "3", "--duration", "1.5", "--targets", "conn",
                 "--slack", "-60"]) == 1
    out = capsys.readouterr().out
    assert "VIOLATION %s" % h.OVERLONG in out
    # (the promises about data held, bulk copies' rows included; a negative
    # slack leaves calls no time to end, so only the time promises break)
    for promise in (h.DOUBLE, h.LOST, h.LYING, h.FOREIGN, h.CHILD, h.STRAY, h.GARBLED,
                    h.UNSETTLED):
        assert promise not in out
    assert re.search(r"copied rows \([^)]*written [1-9]", out)
    assert "replay: make chaos SEED=3 DURATION=1.5" in out
    assert gevent.getcurrent().dead is False


def test_a_live_run_writes_with_sql_and_in_transactions_too():
    """Every API that sends a write is in the campaign: besides calls, upserts,
    copies and pipelines, an SQL INSERT (a prepared statement on a
    connection, execute on a pool) and, on 2.10+, a write in an interactive
    transaction, each ending written and breaking no promise with no fault."""
    schedule = Schedule(7, 1.0, ["conn", "pool"])
    schedule.faults = []
    history, facts, violations = Campaign(schedule, slack=5.0, log=lambda *a: None).run()
    assert violations == []
    done = {}
    for op in history.ops:
        if op.outcome == "ok":
            key = (op.client.split("-")[0], op.kind)   # (conn-proxied counts as conn)
            done[key] = done.get(key, 0) + 1
    wanted = ["write_sql"] + ["write_txn"] * (binary_version() >= (2, 10))
    for client in ("conn", "pool"):
        for kind in wanted:
            assert done.get((client, kind)), (client, kind, sorted(done))
    assert any(op.kind == "write_sql" and len(op.rows) > 1 and op.outcome == "ok"
               for op in history.ops)



@pytest.mark.skipif(vshard_missing() is not None, reason=str(vshard_missing()))
def test_a_live_run_maps_over_every_master_and_over_buckets():
    """A Router's map_callrw is in the campaign: a full map and a map over
    buckets, each run once on every replica set it reaches, with no fault."""
    schedule = Schedule(7, 1.0, ["router"])
    schedule.faults = []
    history, facts, violations = Campaign(schedule, slack=5.0, log=lambda *a: None).run()
    assert violations == []
    maps = [op for op in history.ops if op.kind == "write_map" and op.outcome == "ok"]
    assert any(op.buckets is None for op in maps)
    assert any(op.buckets and len(op.buckets) > 1 for op in maps)
    assert len(facts.replicasets) == 2
    for op in maps:
        runs = facts.maps[op.id]
        assert len(runs) == (2 if op.buckets is None else len({rs for rs, _ in runs}))
        if op.buckets:
            assert sorted(b for _, held in runs for b in held) == op.buckets
            assert all(1 <= b <= BUCKETS for b in op.buckets)
