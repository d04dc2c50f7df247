"""``python -m gtarantool.testing.chaos``: run seeded fault schedules and check
their histories; exit status 1 when any seed breaks a promise.

    python -m gtarantool.testing.chaos --seeds 5 --duration 6     # seeds 1..5
    python -m gtarantool.testing.chaos --seed 17                  # replay seed 17
"""
import argparse
import collections
import logging
import os
import sys
import time

from gtarantool.testing.chaos.schedule import FAULTS, Schedule
from gtarantool.testing.chaos.workload import TARGETS, Campaign
from gtarantool.testing.cluster import vshard_missing
from gtarantool.testing.server import binary_version, find_binary


def slack_factor():
    text = os.environ.get("GTARANTOOL_TIMING_SLACK", "").strip() or "1"
    return max(1.0, float(text))


def run_seed(seed, duration, targets, slack, verbose=False, unsafe=False):
    """Run one seed; print its summary (and, on failure, its schedule and how
    to replay it); return the violations."""
    schedule = Schedule(seed, duration, targets)
    campaign = Campaign(schedule, slack, unsafe=unsafe)
    started = time.monotonic()
    history, facts, violations = campaign.run()
    outcomes = collections.Counter(
        op.outcome if op.outcome != "error" else op.error for op in history.ops)
    rows = collections.Counter(
        row.state if row.state != "rejected" else "rejected applied=%r" % row.applied
        for op in history.ops for row in op.rows)
    print("seed %d: %d ops in %.1fs (%s), copied rows (%s), %d faults, %d violation(s)"
          % (seed, len(history.ops), time.monotonic() - started,
             ", ".join("%s %d" % kv for kv in outcomes.most_common()),
             ", ".join("%s %d" % kv for kv in rows.most_common()) or "none",
             len(schedule.faults), len(violations)), flush=True)
    if violations or verbose:
        print(schedule)
        for note in campaign.notes:
            print("  note: %s" % note)
        for proc, stalls in sorted(facts.stalls.items()):
            if stalls:
                print("  %s's hub stalled %d time(s) over 0.1s, the longest %.2fs"
                      % (proc, len(stalls), max(b - a for a, b in stalls)))
        examples = {}
        for op in history.ops:
            if op.outcome == "error":
                examples.setdefault(op.error, op)
        for name, op in sorted(examples.items()):
            print("  error %s (applied=%r): %s" % (name, op.applied, op.detail))
    if violations:
        shown = collections.Counter()
        for v in violations:
            shown[v.promise] += 1
            if shown[v.promise] <= 5:
                print("  VIOLATION %s" % v)
        for promise, n in shown.items():
            if n > 5:
                print("  ... %d more: %s" % (n - 5, promise))
        server = os.environ.get("TARANTOOL")
        print("  replay: %s" % replay(seed, duration, server, unsafe), flush=True)
    return violations


def replay(seed, duration, server, unsafe):
    if unsafe:
        return "python -m gtarantool.testing.chaos --seed %d --duration %g --unsafe%s" % (
            seed, duration, " --server %s" % server if server else "")
    return "make chaos SEED=%d DURATION=%g%s" % (
        seed, duration, " TARANTOOL=%s" % server if server else "")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=5, help="run seeds FIRST..FIRST+N-1")
    p.add_argument("--first", type=int, default=1, help="the first seed of --seeds")
    p.add_argument("--seed", type=int, help="run (replay) this seed only")
    p.add_argument("--duration", type=float, default=6.0, help="seconds of workload per seed")
    p.add_argument("--slack", type=float, default=1.0,
                   help="seconds a call may run past its timeout (times "
                        "GTARANTOOL_TIMING_SLACK)")
    p.add_argument("--targets", default="conn,pool,router",
                   help="which clients: conn, pool, router (router: Tarantool 2.11+ only)")
    p.add_argument("--server", help="the tarantool binary (default: $TARANTOOL, or PATH's)")
    p.add_argument("--verbose", action="store_true", help="print every schedule")
    p.add_argument("--unsafe", action="store_true",
                   help="run the operations a target lists as known to get wrong too "
                        "(Target.unsafe)")
    args = p.parse_args(argv)
    # (the library logs every failed reconnect; faults make many, the summary says enough)
    logging.getLogger("gtarantool").setLevel(logging.ERROR)
    if args.server:
        os.environ["TARANTOOL"] = args.server
    targets = [t for t in args.targets.split(",") if t]
    unknown = [t for t in targets if t not in FAULTS or t == "process"]
    if unknown:
        p.error("unknown target(s) %s" % ", ".join(unknown))
    if "router" in targets and vshard_missing():
        print("router: left out: %s" % vshard_missing())
        targets.remove("router")
    for name in targets:
        if TARGETS[name].unsafe and not args.unsafe:
            print("%s: %s left out (known to break a promise; --unsafe runs them)"
                  % (name, ", ".join(TARGETS[name].unsafe)))
    seeds = [args.seed] if args.seed is not None else range(args.first,
                                                            args.first + args.seeds)
    print("chaos: %s (%s), targets %s, %gs per seed, slack %.1fs" % (
        find_binary(), ".".join(map(str, binary_version())), ",".join(targets),
        args.duration, args.slack * slack_factor()), flush=True)
    failed = []
    for seed in seeds:
        if run_seed(seed, args.duration, targets, args.slack * slack_factor(), args.verbose,
                    args.unsafe):
            failed.append(seed)
    print("chaos: %d schedule(s), %d failed%s" % (
        len(seeds), len(failed), ": seeds %s" % " ".join(map(str, failed)) if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
