"""``--profile DIR``: each worker process profiles itself; the parent prints a summary.

A worker profiles the connection's opening, every measured phase and the closing (so the
connection's reader and writer loops run start to end inside the profile) and pauses at the
barriers in between.  It writes ``DIR/<driver>-<workload>-p<i>.callgrind``, with
``--profile-greenlets`` one ``DIR/<driver>-<workload>-p<i>.<greenlet>.callgrind`` per
greenlet, and ``DIR/<driver>-<workload>-p<i>.json``: the operation count, clock and
per-greenlet costs that ``python -m bench.profile compare`` and :func:`summary` read.

With the CPU clock (default) a greenlet is charged for the CPU it uses; with the wall clock
time spent blocked counts too, at the barriers included, which shows where greenlets wait.
"""
import contextlib
import json
import os
import re

from bench.profiling.callgrind import Profile, short

TOP_FUNCTIONS = 15


def stem(config, index):
    return os.path.join(config.profile, "%s-%s-p%d" % (config.driver, config.workload, index))


class WorkerProfile:
    """One worker's profile; does nothing when ``config.profile`` is not set."""

    def __init__(self, config, index):
        self.config = config
        self.index = index
        self.ops = 0                               # operations run inside the profile
        self._profiler = None
        self._started = False
        if config.profile:
            from gtarantool.contrib.profiling import Profiler
            self._profiler = Profiler(config.profile_clock)

    @contextlib.contextmanager
    def section(self):
        """Profile the block (the first one starts the profile, later ones resume it)."""
        profiler = self._profiler
        if profiler is None:
            yield
            return
        if self._started:
            profiler.resume()
        else:
            profiler.start()
            self._started = True
        try:
            yield
        finally:
            profiler.pause()

    def save(self):
        """Write the callgrind file(s) and the JSON sidecar; return the paths written."""
        if not self._started:
            return []
        base = stem(self.config, self.index)
        os.makedirs(self.config.profile, exist_ok=True)
        paths = self._profiler.save(base + ".callgrind", self.config.profile_greenlets)
        meta = {
            "driver": self.config.driver,
            "workload": self.config.workload,
            "process": self.index,
            "clock": self.config.profile_clock,
            "ops": self.ops,
            "greenlets": [list(g) for g in self._profiler.greenlets()],
            "files": [os.path.basename(p) for p in paths],
        }
        with open(base + ".json", "w") as f:
            json.dump(meta, f, indent=1)
        return paths + [base + ".json"]


def summary(config):
    """The text printed after a profiled run: files, top functions by own cost, per-greenlet
    costs and socket calls per operation, over all worker processes."""
    profiles, metas = [], []
    for index in range(config.procs):
        base = stem(config, index)
        profiles.append(Profile(base + ".callgrind"))
        with open(base + ".json") as f:
            metas.append(json.load(f))
    ops = sum(m["ops"] for m in metas)
    unit = profiles[0].event
    total = sum(p.total for p in profiles)
    own, calls = {}, {}
    send = recv = 0
    for prof in profiles:
        for fn, cost in prof.own.items():
            own[fn] = own.get(fn, 0) + cost
        for fn, n in prof.calls().items():
            calls[fn] = calls.get(fn, 0) + n
        s, r = prof.socket_calls()
        send, recv = send + s, recv + r
    per_op = max(ops, 1)
    out = ["profiles (%s clock, open with kcachegrind):" % config.profile_clock]
    for index, meta in enumerate(metas):
        out.append("  %s.callgrind" % stem(config, index))
        if len(meta["files"]) > 1:
            out.append("  %s.<greenlet>.callgrind: %d greenlets"
                       % (stem(config, index), len(meta["files"]) - 1))
    out.append("%d operations, %d %s in total, %.1f per operation (yappi slows the run: "
               "throughput above is not comparable)" % (ops, total, unit, total / per_op))
    out.append("socket calls per operation: send %.4f, recv %.4f (%d and %d calls)"
               % (send / per_op, recv / per_op, send, recv))
    out.append("")
    out.append("top %d functions by own %s" % (TOP_FUNCTIONS, unit))
    out.append("  %6s  %10s  %10s  %s" % ("own%", "own/op", "calls", "function"))
    for fn, cost in sorted(own.items(), key=lambda item: (-item[1], item[0]))[:TOP_FUNCTIONS]:
        out.append("  %5.1f%%  %10.2f  %10d  %s" % (100.0 * cost / (total or 1), cost / per_op,
                                                   calls.get(fn, 0), short(fn)))
    kinds = {}                                     # (process, name with digits -> *)
    for meta in metas:
        for name, count, seconds, switches in meta["greenlets"]:
            row = kinds.setdefault((meta["process"], re.sub(r"\d+$", "*", name)), [0, 0.0, 0])
            row[0] += count
            row[1] += seconds
            row[2] += switches
    glet_total = sum(row[1] for row in kinds.values()) or 1
    out.append("")
    out.append("greenlets by %s time" % config.profile_clock)
    out.append("  %4s  %-28s  %9s  %10s  %6s  %9s" % ("proc", "greenlet", "greenlets", "seconds",
                                                    "share", "switches"))
    for (proc, name), (count, seconds, switches) in sorted(kinds.items(),
                                                           key=lambda kv: -kv[1][1]):
        out.append("  p%-3d  %-28s  %9d  %10.4f  %5.1f%%  %9d" % (
            proc, name[:28], count, seconds, 100.0 * seconds / glet_total, switches))
    return "\n".join(out)
