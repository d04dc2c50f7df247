"""``python -m bench.locust_run`` (``make locust``): bench/locust/locustfile.py under
Locust, headless, with its counts checked against the server's.

Starts a throwaway server (or uses ``--host``), reads ``box.stat()`` before and
after a ``locust --processes P`` run, and prints Locust's counts per request
name beside the server's, each worker's gtarantool counters, and the checks:

- Locust's request count is the sum of the events the workers fired;
- the workers' connections sent exactly the requests their users started
  (fired events plus requests still in flight when users were stopped);
- the server counted exactly the requests the connections sent, once the
  requests every connect makes (schema load, auth) are taken off: that cost
  is measured here, with one connection, before the run.

Exits non-zero when Locust does or when a check fails.  Reports: Locust's
CSV files, HTML and JSON under ``--out``.

``--compare RUNS`` times this run against the same locustfile with a no-op
client and ``make bench``; ``--instructions N`` counts, under callgrind, the
user-space instructions per request of one Locust process and of its no-op:
exact, and unmoved by what else the host (or the server beside the client)
is doing.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import urllib.parse

from bench.core.config import (
    DISTRIBUTIONS,
    PASSWORD_ENV,
    Config,
    add_password_arguments,
    read_password,
)
from bench.core.workloads import Payloads
from bench.targets import SetupError, open_target
from gtarantool.testing.server import free_port

# box.stat() names of requests a client sends (EVAL is left out: the admin
# connection's own box.stat() and setup; 3.x also counts BEGIN/COMMIT of every
# statement, which are not requests).
REQUESTS = ("SELECT", "INSERT", "REPLACE", "UPDATE", "UPSERT", "DELETE", "CALL", "EXECUTE",
            "PREPARE", "AUTH", "ERROR")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))   # where ``bench`` imports from


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m bench.locust_run",
        description="Run bench/locust/locustfile.py headless under Locust and check its counts "
                    "against the server's box.stat(); other Locust options after --")
    parser.add_argument("-u", "--users", type=int, default=200)
    parser.add_argument("-p", "--procs", type=int, default=2, help="Locust --processes")
    parser.add_argument("-t", "--duration", default="30s", help="Locust --run-time")
    parser.add_argument("--host", help="an existing server, host:port (default: a "
                                       "throwaway local one)")
    parser.add_argument("--user")
    add_password_arguments(parser)
    parser.add_argument("--space", default="bench")
    parser.add_argument("--mix", default="insert=25,select=25,update=25,delete=25")
    parser.add_argument("--keys", type=int, default=Config().keys)
    parser.add_argument("--size", type=int, default=Config().size)
    parser.add_argument("--distribution", choices=DISTRIBUTIONS, default="uniform")
    parser.add_argument("--noop", action="store_true",
                        help="no Tarantool call (Locust's own ceiling); no server checks")
    parser.add_argument("--stop-timeout", default="10",
                        help="seconds users get to finish their request at the end")
    parser.add_argument("--out", default="locust-report",
                        help="directory for the CSV, HTML and JSON reports")
    parser.add_argument("--compare", type=int, metavar="RUNS",
                        help="instead of one run: RUNS rounds of this run, the same with "
                             "--noop and make bench's mix (PROCS x USERS/PROCS greenlets), "
                             "then medians of requests per client CPU second")
    parser.add_argument("--instructions", type=int, metavar="N",
                        help="instead of one run: instructions per request (callgrind) of "
                             "one Locust process with USERS/PROCS users and of its no-op, "
                             "counted over its requests N to 2N")
    parser.add_argument("locust_args", nargs="*", help="more Locust options (after --)")
    args = parser.parse_args(argv)
    try:
        args.password = read_password(args.password, args.password_file, args.user)
    except ValueError as exc:
        parser.error(str(exc))
    return args


def child_env(args):
    """The environment of the processes this one starts: the password goes to them in
    ``$TARANTOOL_PASSWORD``, never on a command line (which the process list shows and
    this command prints)."""
    env = dict(os.environ)
    env.pop(PASSWORD_ENV, None)
    if args.password:
        env[PASSWORD_ENV] = args.password
    return env


def _host_port(text):
    """``--host`` as (host, port): port 3301 when not given; (None, None) without it."""
    if not text:
        return None, None
    host, sep, port = text.rpartition(":")
    return (host, int(port)) if sep else (text, 3301)


def locust_url(target, user):
    """The ``--host`` URL of ``target``: without a password, which Locust's processes
    read from ``$TARANTOOL_PASSWORD`` (:func:`child_env`)."""
    auth = "%s@" % urllib.parse.quote(user, safe="") if user else ""
    return "tarantool://%s%s:%s" % (auth, target.host, target.port)


def connect_cost(target, user=None, password=None):
    """The server's counters one gtarantool connect (and close) moves."""
    import gtarantool
    before = target.stat()
    gtarantool.connect(target.host, target.port, user=user, password=password).close()
    after = target.stat()
    return {name: after[name] - before.get(name, 0) for name in after}


def run_locust(args, url, out):
    prefix = os.path.join(out, "locust")
    report = os.path.join(out, "bench-report.json")
    if os.path.exists(report):
        os.remove(report)
    # The master and its --processes workers meet on a free port: on Locust's default
    # (5557) two runs on one host would share each other's workers.
    port = str(free_port())
    cmd = [sys.executable, "-m", "locust", "-f", os.path.join(HERE, "locustfile.py"),
           "--headless", "-u", str(args.users), "-r", str(args.users), "-t", args.duration,
           "--processes", str(args.procs), "--master-bind-port", port, "--master-port", port,
           "--stop-timeout", args.stop_timeout,
           "--host", url, "--csv", prefix, "--html", prefix + ".html",
           "--json-file", prefix, "--bench-report", report,
           "--bench-mix", args.mix, "--bench-keys", str(args.keys),
           "--bench-size", str(args.size), "--bench-distribution", args.distribution,
           "--bench-space", args.space]
    if args.noop:
        cmd.append("--bench-noop")
    print("$ " + " ".join(cmd), flush=True)
    code = subprocess.run(cmd + list(args.locust_args), cwd=ROOT, env=child_env(args)).returncode
    try:
        with open(report) as f:
            return code, json.load(f)
    except (OSError, ValueError):
        return code, None


def reconcile(report, before, after, cost):
    """Lines to print and whether every check passed."""
    lines, ok = [], True
    workers = report["workers"]
    entries = [e for e in report["entries"] if e["type"] == "tarantool" and e["name"] != "connect"]
    locust_requests = sum(e["requests"] for e in entries)
    locust_failures = sum(e["failures"] for e in entries)

    lines.append("gtarantool counters per worker process:")
    head = "  %-12s %5s %9s %9s %9s %7s %9s %9s %9s %9s %8s %8s %5s" % (
        "worker", "conns", "started", "reported", "in flight", "failed", "srv errs",
        "sent", "answered", "sends", "recvs", "cpu s", "busy")
    lines.append(head)
    totals = dict.fromkeys(("connections", "started", "reported", "in_flight_at_stop",
                            "failed", "server_errors", "requests", "responses",
                            "reconnects", "cpu_seconds"), 0)
    for name, w in sorted(workers.items()):
        c = w["connection"]
        busy = w.get("busy")
        lines.append("  %-12s %5d %9d %9d %9d %7d %9d %9d %9d %9d %8d %8.2f %5s" % (
            name[-12:], w["connections"], w["started"], w["reported"], w["in_flight_at_stop"],
            w["failed"], w["server_errors"], c.get("requests", 0), c.get("responses", 0),
            c.get("send_calls", 0), c.get("recv_calls", 0), w["cpu_seconds"] or 0,
            "-" if busy is None else "%.0f%%" % (100 * busy)))
        for key in totals:
            source = c if key in ("requests", "responses", "reconnects") else w
            totals[key] += source.get(key) or 0

    delta = {name: after[name] - before.get(name, 0) for name in REQUESTS if name in after}
    connects = totals["connections"] + totals["reconnects"]
    own = {name: delta[name] - connects * cost.get(name, 0) for name in delta}
    lines.append("box.stat() before -> after (minus %d connects x %s):"
                 % (connects, {k: v for k, v in cost.items() if v and k in REQUESTS}))
    by_type = {}
    for e in entries:
        kind = e["name"].split()[0].upper()
        by_type[kind] = by_type.get(kind, 0) + e["requests"]
    for name in sorted(delta):
        if delta[name] or name in by_type:
            lines.append("  %-8s %12d -> %12d  requests %9d   Locust %9s" % (
                name, before.get(name, 0), after[name], own[name],
                by_type.get(name, "") if name != "ERROR" else "-"))

    server_requests = sum(v for k, v in own.items() if k != "ERROR")
    in_flight = totals["in_flight_at_stop"]

    def check(label, good, detail):
        nonlocal ok
        ok = ok and good
        lines.append("  [%s] %s: %s" % ("ok" if good else "MISMATCH", label, detail))

    lines.append("checks:")
    check("Locust counted every event the workers fired", locust_requests == totals["reported"],
          "Locust %d requests (%d failures), workers fired %d"
          % (locust_requests, locust_failures, totals["reported"]))
    check("connections sent every request users started",
          totals["requests"] == totals["started"] == totals["reported"] + in_flight,
          "sent %d, started %d = fired %d + in flight at stop %d"
          % (totals["requests"], totals["started"], totals["reported"], in_flight))
    check("the server counted every request sent", server_requests == totals["requests"],
          "box.stat %d, sent %d" % (server_requests, totals["requests"]))
    check("server errors",
          abs(own.get("ERROR", 0) - totals["server_errors"]) <= in_flight,
          "box.stat ERROR %d, error replies seen %d (in flight at stop %d)"
          % (own.get("ERROR", 0), totals["server_errors"], in_flight))
    if in_flight == 0:
        mismatched = {k: (own.get(k, 0), n) for k, n in by_type.items() if own.get(k, 0) != n}
        check("per request type", not mismatched,
              "box.stat vs Locust equal" if not mismatched else repr(mismatched))
    if totals["cpu_seconds"]:
        lines.append("client: %d requests in %.2f worker CPU seconds: %.0f requests per CPU "
                     "second" % (locust_requests, totals["cpu_seconds"],
                                 locust_requests / totals["cpu_seconds"]))
    return lines, ok


def main(argv=None):
    args = parse_args(argv)
    if args.instructions:
        return instructions(args)
    if args.compare:
        return compare(args)
    os.makedirs(args.out, exist_ok=True)
    host, port = _host_port(args.host)
    config = Config(host=host, port=port, user=args.user, password=args.password,
                    space=args.space)
    try:
        with open_target(config) as target:
            target.prepare(args.space)
            url = locust_url(target, args.user)
            cost = connect_cost(target, args.user, args.password)
            before = target.stat()
            code, report = run_locust(args, url, args.out)
            after = target.stat()
    except SetupError as exc:
        print("locust_run: %s" % exc, file=sys.stderr)
        return 1
    if report is None:
        print("locust_run: Locust exited with %d and wrote no report" % code, file=sys.stderr)
        return code or 1
    if args.noop:
        lines, ok = reconcile_noop(report)
    else:
        lines, ok = reconcile(report, before, after, cost)
    print("\n".join(lines))
    print("reports: %s/locust_stats.csv, locust.html, locust.json" % args.out)
    if code:
        print("locust_run: Locust exited with %d" % code, file=sys.stderr)
        return code
    return 0 if ok else 1


def reconcile_noop(report):
    requests = sum(e["requests"] for e in report["entries"] if e["type"] == "tarantool")
    cpu = sum(w["cpu_seconds"] or 0 for w in report["workers"].values())
    lines = ["no-op client: %d requests" % requests]
    if cpu:
        lines.append("client: %d requests in %.2f worker CPU seconds: %.0f requests per CPU "
                     "second" % (requests, cpu, requests / cpu))
    return lines, True


def _rate(cmd, report, env):
    """Run ``cmd``; from the JSON it writes, requests per client CPU second,
    the share of them the server answered with an error and the median
    worker's busy share (both None for make bench, which does not say)."""
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    with open(report) as f:
        data = json.load(f)
    if "totals" in data:   # make bench
        return data["totals"]["ops_per_client_cpu_second"], None, None
    return report_rate(data)


def report_rate(data):
    """``_rate``'s figures from a --bench-report file."""
    workers = data["workers"].values()
    requests = sum(e["requests"] for e in data["entries"] if e["type"] == "tarantool")
    errors = sum(w.get("server_errors", 0) for w in workers)
    busy = [w["busy"] for w in workers if w.get("busy") is not None]
    return (requests / sum(w["cpu_seconds"] for w in workers),
            errors / requests if requests else 0.0,
            statistics.median(busy) if busy else None)


def round_shares(rates):
    """gtarantool's share of the client CPU per request in each round: a
    round's Locust run and its no-op ran back to back, on the host as it was
    then, so their ratio is steadier than the ratio of separate medians."""
    return [1 - real / noop for real, noop in zip(rates["locust"], rates["locust --noop"])]


def compare(args):
    """Alternating rounds of: this Locust run, the same with --noop, make bench's
    mix at the same processes and concurrency; medians, and gtarantool's share
    of the client CPU per request (1 - noop cost / cost) per round and its
    median."""
    out = os.path.join(args.out, "compare")
    os.makedirs(out, exist_ok=True)
    seconds = float(args.duration.rstrip("s"))
    base = [sys.executable, "-m", "bench.locust_run", "-u", str(args.users), "-p",
            str(args.procs), "-t", args.duration, "--space", args.space, "--mix", args.mix,
            "--keys", str(args.keys), "--size", str(args.size), "--distribution",
            args.distribution, "--stop-timeout", args.stop_timeout, "--out", out]
    for name in ("host", "user"):
        if getattr(args, name):
            base += ["--" + name, getattr(args, name)]
    kinds = {
        "locust": base,
        "locust --noop": base + ["--noop"],
        "make bench": [sys.executable, "-m", "bench", "--workload", "mix", "-q",
                       "--procs", str(args.procs), "--greenlets",
                       str(max(1, args.users // args.procs)), "--duration", str(seconds),
                       "--mix", args.mix, "--keys", str(args.keys), "--size", str(args.size),
                       "--json", os.path.join(out, "bench.json")]
                      + (["--host", _host_port(args.host)[0], "--port",
                          str(_host_port(args.host)[1])] if args.host else [])
                      + (["--user", args.user] if args.user else []),
    }
    rates = {kind: [] for kind in kinds}
    busy = {kind: [] for kind in kinds}
    errors = []   # the Locust runs' share of server errors (the mix's duplicate inserts)
    for round_ in range(args.compare):
        for kind, cmd in kinds.items():
            report = os.path.join(out, "bench.json" if kind == "make bench"
                                  else "bench-report.json")
            rate, error_share, busy_now = _rate(cmd, report, child_env(args))
            rates[kind].append(rate)
            if kind == "locust":
                errors.append(error_share)
            if busy_now is not None:
                busy[kind].append(busy_now)
            print("round %d: %-13s %8.0f requests per client CPU second%s"
                  % (round_ + 1, kind, rates[kind][-1],
                     "" if busy_now is None else ", workers busy %.0f%%" % (100 * busy_now)),
                  flush=True)
    median = {kind: statistics.median(values) for kind, values in rates.items()}
    print("medians of %d rounds (%d users, %d processes, %s each):" % (
        args.compare, args.users, args.procs, args.duration))
    for kind, value in median.items():
        print("  %-13s %8.0f requests per client CPU second, %5.1f us per request"
              % (kind, value, 1e6 / value))
    shares = round_shares(rates)
    print("gtarantool's share of Locust's client CPU per request: %.0f%% (median of the "
          "rounds' %s; %.0f%% from the medians above); Locust run vs make bench: %.2fx the "
          "CPU per request" % (100 * statistics.median(shares),
                               ", ".join("%.0f%%" % (100 * x) for x in shares),
                               100 * (1 - median["locust"] / median["locust --noop"]),
                               median["make bench"] / median["locust"]))
    print("server errors (expected ones included) in the Locust runs: %.1f%% of requests "
          "(median); each costs the client several times a success"
          % (100 * statistics.median(errors)))
    if busy["locust"] and busy["locust --noop"]:
        print("workers busy: %.0f%% in the Locust runs, %.0f%% in the no-op's (medians); where "
              "the first is well below the second the server set the Locust runs' pace, and "
              "the share includes what waiting on it costs the workers" % (
                  100 * statistics.median(busy["locust"]),
                  100 * statistics.median(busy["locust --noop"])))
    return 0


# -- instructions per request ---------------------------------------------------

FILL_LIMIT = 1_000_000   # keys: above it the mix finds almost none (nothing to fill)


def fill_half(target, space, keys, size):
    """Empty ``space`` and put every other key of ``0..keys-1`` in it (with the
    locustfile's payloads): the share of keys that the mix's equal inserts and
    deletes keep there, so that duplicate inserts come at their usual rate."""
    target.prepare(space)
    if keys > FILL_LIMIT:
        return
    payloads = Payloads(size)   # (as bench/locust/locustfile.py makes them)
    for key in range(0, keys, 2):
        target.admin.replace(space, (key, 0, payloads(key)))


def count(args, n, url, noop):
    """(instructions, requests) of one counted process under callgrind."""
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
               sys.executable, "-m", "bench.locust.counted", str(n), url,
               "-u", str(args.users), "-p", str(args.procs), "--space", args.space,
               "--mix", args.mix, "--keys", str(args.keys), "--size", str(args.size),
               "--distribution", args.distribution] + (["--noop"] if noop else [])
    try:
        run = subprocess.run(command, capture_output=True, text=True, cwd=ROOT,
                             env=child_env(args))
    except FileNotFoundError:
        raise SystemExit("--instructions needs valgrind (make install puts it in)") from None
    collected = re.search(r"Collected : (\d+)", run.stderr)
    requests = re.search(r"^requests (\d+)$", run.stdout, re.M)
    if run.returncode or not collected or not requests:
        raise SystemExit("callgrind run failed: %s\n%s" % (" ".join(command),
                                                            run.stderr[-2000:]))
    return int(collected.group(1)), int(requests.group(1))


def per_request(first, second):
    """Instructions per request between two counted runs: ``(instructions,
    requests)`` each; start-up and connecting cancel out."""
    return (second[0] - first[0]) / (second[1] - first[1])


def instructions(args):
    """Instructions per request of the Locust run and of its no-op, and
    gtarantool's share of them."""
    host, port = _host_port(args.host)
    config = Config(host=host, port=port, user=args.user, password=args.password,
                    space=args.space)
    counts = {}
    try:
        with open_target(config) as target:
            url = locust_url(target, args.user)
            for kind, noop in (("locust", False), ("locust --noop", True)):
                runs = []
                for n in (args.instructions, 2 * args.instructions):
                    fill_half(target, args.space, args.keys, args.size)
                    runs.append(count(args, n, url, noop))
                counts[kind] = per_request(*runs)
    except SetupError as exc:
        print("locust_run: %s" % exc, file=sys.stderr)
        return 1
    print("instructions per request (callgrind, user space; one Locust process, %d users, "
          "its requests %s to %s):" % (
              max(1, args.users // args.procs), "{:,}".format(args.instructions),
              "{:,}".format(2 * args.instructions)))
    for kind, value in counts.items():
        print("  %-13s %10s" % (kind, "{:,.0f}".format(value)))
    print("gtarantool's share of Locust's instructions per request: %.0f%%"
          % (100 * (1 - counts["locust --noop"] / counts["locust"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
