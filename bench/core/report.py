"""Text for people: the banner, one line per second, the final report and the compare table."""
from bench.core.config import MIX_OPERATIONS

PERCENTILES = ("p50", "p90", "p99", "p99.9", "max")


def _n(value, digits=0):
    """A number with thousands separators, or n/a."""
    if value is None:
        return "n/a"
    return "{:,.{}f}".format(value, digits)


def banner(config, server):
    where = "%s:%s (%s, Tarantool %s)" % (
        server["host"], server["port"],
        "embedded, wal %s" % server["wal"] if server["embedded"] else "existing server",
        server["version"])
    if config.duration is not None:
        amount = "%gs%s" % (config.duration, " per phase" if config.workload == "phases" else "")
    else:
        amount = "%s ops%s" % (_n(config.ops), " per phase" if config.workload == "phases" else "")
    if config.workload != "phases":
        workload = "%s: load %s records, then %s (%s keys)" % (
            config.workload, _n(config.keys),
            "/".join("%s %d%%" % (op, n) for op, n in config.mix.items() if n),
            config.distribution)
    else:
        workload = "phases insert, select, update, delete"
    if config.rate is not None:
        amount += ", open loop at %s ops/s (%s arrivals)" % (_n(config.rate), config.arrivals)
    return ("bench: driver %s, %d procs x %d concurrent, %s, %s, %s-byte payloads\n"
            "server: %s" % (config.driver, config.procs, config.concurrency, workload, amount,
                            config.size, where))


def second_line(t, phase, ops, errors, seconds, server_rps):
    """One progress line: counts in second ``t`` as rates over the ``seconds`` that ran."""
    parts = ["%s %s" % (op, _n(ops[op] / seconds)) for op in MIX_OPERATIONS if ops.get(op)]
    line = "[%4ds] %-6s %8s ops/s  (%s)" % (t, phase, _n(sum(ops.values()) / seconds),
                                           ", ".join(parts))
    if errors:
        line += "  errors/s: " + ", ".join("%s %s" % (k, _n(v / seconds))
                                           for k, v in sorted(errors.items()))
    if server_rps is not None:
        line += "  server %s rps" % _n(server_rps)
    return line


def _rows(results):
    """(label, figures) per reported row: one per phase, plus one per operation of a mix
    and one per operation that failed (``<op>-failed``: the failed requests' latency, as
    YCSB's READ-FAILED; the phase's and the operation's rows hold the successful ones')."""
    for phase in results["phases"]:
        yield phase["name"], phase
        failed = phase.get("failed") or {}
        if len(phase["operations"]) > 1 or failed or phase["name"] not in phase["operations"] \
                and phase["name"] != "load":
            for op, figures in phase["operations"].items():
                yield "  " + op, dict(figures, seconds=phase["seconds"])
                if op in failed:
                    yield "  %s-failed" % op, dict(failed[op], seconds=phase["seconds"])


def _ms(figures, percentile, width=8):
    """A latency figure, or ``-`` in a row without latency (no request succeeded)."""
    if figures is None or figures.get(percentile) is None:
        return "%*s" % (width, "-")
    return "%*.2f" % (width, figures[percentile])


def final(results):
    """The end-of-run report."""
    is_open = any("open_loop" in p for p in results["phases"])
    rows = list(_rows(results))
    w = max([8] + [len(label) for label, _ in rows])
    lines = ["", "%-*s %10s %8s %10s %8s %8s %8s %8s %8s  %s"
             % ((w, "op", "ops", "secs", "ops/s") + PERCENTILES + ("errors",)),
             "%-*s %10s %8s %10s %44s" % (w, "", "", "", "", "latency from the intended start, ms"
                                          if is_open else "latency, ms")]
    for label, f in rows:
        errors = ", ".join("%s %s" % (k, _n(v)) for k, v in sorted(f["errors"].items()))
        lines.append("%-*s %10s %8.2f %10s %s  %s" % (
            w, label, _n(f["ops"]), f["seconds"], _n(f["ops_per_sec"]),
            " ".join(_ms(f["latency_ms"], p) for p in PERCENTILES), errors or "-"))
    if any(p.get("failed") for p in results["phases"]):
        lines.append("%-*s latency of the requests that succeeded; a failed request's is in "
                     "its operation's -failed row" % (w, ""))
    for label, f in rows:
        if f.get("parts"):
            lines.append("%-*s %s" % (w, "", parts_note(label.strip(), f)))
    if is_open:
        lines += open_loop_lines(results)

    lines += ["", "%-8s %9s %10s %10s %10s %12s %28s" % (
        "op", "client", "ops per", "send/1k", "recv/1k", "server", "box.stat requests"),
        "%-8s %9s %10s %10s %10s %12s %28s" % (
        "", "CPU s", "CPU-sec", "ops", "ops", "CPU s", "(server = client?)")]
    for phase in results["phases"]:
        conn = phase["connection"] or {}
        server = phase["server"]
        counted = ", ".join("%s %s" % (op, _n(n)) for op, n in server["requests"].items() if n)
        lines.append("%-8s %9.2f %10s %10s %10s %12s %28s" % (
            phase["name"], phase["client_cpu_seconds"], _n(phase["ops_per_client_cpu_second"]),
            _n(conn.get("send_calls_per_1000_ops"), 1), _n(conn.get("recv_calls_per_1000_ops"), 1),
            _n(server["cpu_seconds"], 2),
            "%s %s" % (counted or "none", "= client" if server["match"] else "!= client")))
        for key, sent in sorted(conn.items()):
            if key.startswith("requests@"):   # --pool: what each instance got
                where = key.split("@")[1]
                counted = ", ".join("%s %s" % (k.split("@")[0].lower(), _n(v)) for k, v in
                                    sorted(server.get("instances", {}).items())
                                    if k.endswith("@" + where))
                lines.append("         %s: client requests %s; box.stat %s" % (
                    where, _n(sent), counted or "none"))
        if server.get("restarted"):
            lines.append("         the server restarted during the phase: its box.stat counts "
                         "started again from zero")
        elif not server["match"]:
            lines.append("         client answered %s, server errors %s vs client %s" % (
                server["client_requests"], server["errors"], server["client_errors"]))
            hint = feedback_hint(results["server"], server)
            if hint:
                lines.append("         " + hint)

    if results.get("gaps"):
        lines.append("")
    for gap in results.get("gaps", ()):
        lines.append("%-8s gap: seconds %d-%d (%d s) without an answered request; errors %s"
                     % (gap["phase"], gap["from"], gap["to"], gap["seconds"],
                        ", ".join("%s %s" % (k, _n(v)) for k, v in sorted(gap["errors"].items()))))

    totals = results["totals"]
    peak = max((sum(s["rps"].values()) for s in results["server_rps"]), default=None)
    lines += ["", "total: %s ops in %.2f s, %s ops/s, %s ops per client CPU-second, "
              "%s errors; server peak %s rps; server counts %s" % (
                  _n(totals["ops"]), totals["seconds"], _n(totals["ops_per_sec"]),
                  _n(totals["ops_per_client_cpu_second"]), _n(totals["errors"]), _n(peak),
                  "equal the client's" if totals["server_counts_match"]
                  else "DIFFER from the client's")]
    return "\n".join(lines)


def parts_note(label, figures):
    """What a row's latency holds beyond its own requests: ``select: latency of 1,523
    requests, 1,020 of them rmw's selects (ops counts the select operations)``."""
    return "%s: latency of %s requests, %s (ops counts the %s operations)" % (
        label, _n(figures["samples"]),
        ", ".join("%s of them %s's %ss" % (_n(n), whole, label.replace("-failed", ""))
                  for whole, n in sorted(figures["parts"].items())),
        label)


def open_loop_lines(results):
    """Service times and whether each open-loop phase kept its rate."""
    rows = list(_rows(results))
    w = max([8] + [len(label) for label, _ in rows])
    lines = ["", "%-*s %10s %8s %10s %8s %8s %8s %8s %8s  %s" % (
        (w, "op", "target", "", "achieved") + PERCENTILES + ("schedule",)),
        "%-*s %10s %8s %10s %44s" % (w, "", "ops/s", "", "ops/s",
                                     "service time (from the send), ms")]
    for label, f in rows:
        service = f.get("service_time_ms")
        if not service:
            continue
        loop = f.get("open_loop") or {}
        if loop:
            note = ("kept up" if loop["kept_up"] else
                    "could not keep up: backlog %s at the end, sends up to %.1f ms late"
                    % (_n(loop["backlog_at_end"]), loop["max_send_lag_ms"]))
            if loop.get("dropped_at_end"):
                note += "; %s never sent (the backlog's time ran out)" % _n(
                    loop["dropped_at_end"])
            target, achieved = _n(loop["target_rate"]), _n(loop["achieved_rate"])
        else:
            note, target, achieved = "", "", _n(f["ops_per_sec"])
        lines.append("%-*s %10s %8s %10s %s  %s" % (
            w, label, target, "", achieved,
            " ".join(_ms(service, p) for p in PERCENTILES), note))
    return lines


def feedback_hint(target, server):
    """Why the server counted more selects than the client sent, when it may be
    its own: with ``feedback_enabled`` (the default) 2.11 and 3.x select once a
    minute."""
    extra = server["requests"].get("select", 0) - server["client_requests"].get("select", 0)
    if target.get("feedback") and 0 < extra:
        return ("the server's feedback daemon is on (box.cfg.feedback_enabled): on 2.11 "
                "and 3.x it selects once a minute, and box.stat counts those; %d more "
                "select%s than sent" % (extra, "" if extra == 1 else "s"))
    return None


def compare_table(runs):
    """The article's table: a row per operation, a column group per driver."""
    drivers = list(runs)
    # Open loop: p99 from the intended start, then the service time's p99 beside it.
    is_open = any("open_loop" in p for r in runs.values() for p in r["phases"])
    width = 43 if is_open else 35
    by_driver = {name: dict(_rows(results)) for name, results in runs.items()}
    # every driver's rows, in the first's order (a -failed row: where a driver failed)
    labels = list(dict.fromkeys(label for rows in by_driver.values() for label in rows))
    w = max([9] + [len(label) + 1 for label in labels])
    head1 = "%-*s" % (w, "") + "".join(" | %-*s" % (width, name) for name in drivers)
    head2 = "%-*s" % (w, "op") + (" | %9s %7s %9s %7s" % ("ops/s", "secs", "ops/CPUs", "p99 ms")
                                  + (" %7s" % "svc p99" if is_open else "")) * len(drivers)
    lines = [head1, head2, "-" * len(head2)]
    for label in labels:
        cells = []
        for name in drivers:
            f = by_driver[name].get(label)
            if f is None:
                cells.append(" | %*s" % (width, "n/a"))
                continue
            cells.append(" | %9s %7.2f %9s %s" % (
                _n(f["ops_per_sec"]), f["seconds"], _n(f.get("ops_per_client_cpu_second")),
                _ms(f["latency_ms"], "p99", 7)))
            if is_open:
                cells.append(" " + _ms(f.get("service_time_ms"), "p99", 7))
        lines.append("%-*s" % (w, label) + "".join(cells))
    return "\n".join(lines)
