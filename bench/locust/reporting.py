"""The load generator's reporting under Locust: response times to 0.01 ms,
percentile tables with two decimals and the lines on what set a run's pace.

:func:`fine_buckets` switches the finer response-time buckets on (the
locustfile calls it); :func:`percentile_table` and :func:`pace_lines` only
format what they are given.  Importing this module imports no Locust.
"""
import statistics

_locust_bucket = None   # Locust's own bucket_response_time, once fine_buckets() replaced it


def bucket_response_time(response_time):
    """Locust's histogram key for a response time in ms: 0.01 ms steps below
    10 ms, 0.1 ms below 100 ms, then Locust's own two significant digits."""
    # (int() + 0.5 rather than round(x, 2): cheaper, and it runs twice per request)
    if response_time < 10:
        return int(response_time * 100 + 0.5) / 100
    if response_time < 100:
        return int(response_time * 10 + 0.5) / 10
    return _locust_bucket(response_time)


def _percentile_fields(self, stats_entry, use_current=False):
    """Locust's CSV percentile columns, to 0.01 ms instead of whole ms."""
    if not stats_entry.num_requests:
        return self.percentiles_na
    if use_current and stats_entry.use_response_times_cache:
        get = stats_entry.get_current_response_time_percentile
    else:
        get = stats_entry.get_response_time_percentile
    return [round(get(p) or 0, 2) for p in self.percentiles_to_report]


def _percentile_line(self):
    """Locust's console percentile row, to 0.01 ms instead of whole ms."""
    import locust.stats as stats  # (imported by whoever switched the buckets on)
    if not self.num_requests:
        raise ValueError("Can't calculate percentile on url with no successful requests")
    # (As Locust's: the first column is the first percentile, the last the count.)
    columns = ["%8.2f"] + ["%6.2f"] * (len(stats.PERCENTILES_TO_REPORT) - 1) + ["%6d"]
    return ("%%-%ds %%-%ds " % (stats.STATS_TYPE_WIDTH, stats.STATS_NAME_WIDTH)
            + " ".join(columns)) % (
        self.method or "", self.name,
        *[self.get_response_time_percentile(p) for p in stats.PERCENTILES_TO_REPORT],
        self.num_requests)


def fine_buckets():
    """Make Locust keep response times to 0.01 ms below 10 ms (its
    ``locust.stats.bucket_response_time`` rounds to whole milliseconds) and
    write its console and CSV percentiles with two decimals.  Call it before
    the run starts (a locustfile's module level); calling it again changes
    nothing."""
    global _locust_bucket
    # Locust is imported here, by the caller's choice: importing it
    # monkey-patches the interpreter.
    import locust.stats
    if locust.stats.bucket_response_time is bucket_response_time:
        return
    _locust_bucket = locust.stats.bucket_response_time
    locust.stats.bucket_response_time = bucket_response_time
    locust.stats.StatsCSV._percentile_fields = _percentile_fields
    locust.stats.StatsEntry.percentile = _percentile_line


def percentile_table(stats, percentiles=(0.5, 0.9, 0.99, 0.999, 1.0)):
    """Lines of response-time percentiles in ms with two decimals, per request
    name and in total (Locust's console table rounds to whole ms).

    :param stats: Locust's ``RequestStats`` (``environment.stats``).
    :param percentiles: the columns, as fractions (1.0: the maximum).
    :returns: a list of lines."""
    head = "%-40s %9s %8s " % ("Name", "# reqs", "avg") + " ".join(
        "%8s" % ("p%g" % (p * 100) if p < 1 else "max") for p in percentiles)
    lines = ["Response time percentiles (ms)", head, "-" * len(head)]
    entries = sorted(stats.entries.values(), key=lambda e: (e.method or "", e.name))
    for entry in entries + [stats.total]:
        if not entry.num_requests:
            continue
        name = ("%s %s" % (entry.method, entry.name)) if entry.method else entry.name
        lines.append("%-40s %9d %8.2f " % (name[:40], entry.num_requests,
                                           entry.avg_response_time)
                     + " ".join("%8.2f" % entry.get_response_time_percentile(p)
                                for p in percentiles))
    return lines


def pace_lines(reports, busy_below=0.9):
    """Lines on what set a run's pace: the median worker's ``busy`` share and,
    below ``busy_below``, that the workers spent the rest waiting for replies
    (the server or the network limited the run, not the load generator).

    :param reports: ``gtarantool.contrib.locust.worker_reports(environment)``.
    :param busy_below: the share under which the server is said to set the pace.
    :returns: a list of lines (empty when no report says how busy it was)."""
    shares = [r["busy"] for r in reports.values() if r.get("busy") is not None]
    if not shares:
        return []
    busy = statistics.median(shares)
    lines = ["gtarantool: %d worker process%s busy %.0f%% of the run (median; running or "
             "waiting for a CPU)" % (len(shares), "es" if len(shares) > 1 else "", 100 * busy)]
    if busy < busy_below:
        lines.append("  and %.0f%% waiting for replies: the server (or the network) set the "
                     "pace, not the load generator" % (100 * (1 - busy)))
    return lines

