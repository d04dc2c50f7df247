"""Greenlet-aware profiles for kcachegrind, built on yappi (``pip install yappi``,
or the ``profile`` extra).

yappi runs with greenlet contexts and traces builtins (``socket.recv``, ``greenlet.switch``
...), without which time in C calls and switches skews the call tree.  With the CPU clock
(default) a greenlet is charged for the CPU it uses; with the wall clock its waits count
too, as time in ``greenlet.switch``.  Files are written in the callgrind format::

    from gtarantool.profiling import profile, profile_for

    with profile("/tmp/service.callgrind", per_greenlet=True):
        serve_some_requests()

    # or, from an admin endpoint: profile whatever runs in the next 30 seconds
    gevent.spawn(profile_for, 30, "/tmp/service.callgrind")

Open them with ``kcachegrind FILE`` (Debian package ``kcachegrind``) or read them with
``callgrind_annotate --inclusive=yes FILE``.  Calls already in progress when the profile
starts are not seen (the ``_read_loop`` of a connection opened earlier, say): their callees
appear as roots.  Calls still in progress when it stops count as zero.
"""
import contextlib
import os
import re
import sys
import threading
from collections import defaultdict, namedtuple

from greenlet import getcurrent

CLOCKS = ("cpu", "wall")
INSTALL_HINT = ("gtarantool.profiling needs yappi: pip install yappi (in a checkout, "
                "pip install '.[profile]' adds it)")

GreenletCost = namedtuple("GreenletCost", "name greenlets seconds switches")


def _yappi():
    try:
        import yappi
    except ImportError:
        raise ImportError(INSTALL_HINT) from None
    return yappi


def greenlet_name():
    """The name yappi records for the current greenlet: its ``name`` (gevent greenlets),
    ``hub`` for a gevent hub, the thread's name for a thread's main greenlet."""
    glet = getcurrent()
    if glet.parent is None:
        return threading.current_thread().name
    if type(glet).__name__ == "Hub":
        return "hub"
    name = getattr(glet, "name", None)
    return name if isinstance(name, str) and name else type(glet).__name__


class Profiler:
    """One process-wide yappi session: ``start()``, optionally ``pause()``/``resume()`` to
    leave gaps out, ``stop()``, then ``save()``.  yappi is global, so one at a time."""

    def __init__(self, clock="cpu"):
        if clock not in CLOCKS:
            raise ValueError("clock must be one of %s" % ", ".join(CLOCKS))
        self.clock = clock
        self.paths = []                            # what the last save() wrote
        self._yappi = _yappi()

    def start(self):
        """Clear previous stats and start profiling every thread and greenlet."""
        yappi = self._yappi
        if yappi.is_running():
            raise RuntimeError("a yappi profile is already running in this process")
        yappi.clear_stats()
        yappi.set_clock_type(self.clock)
        yappi.set_context_backend("greenlet")
        yappi.set_context_name_callback(greenlet_name)
        self.resume()

    def pause(self):
        """Stop collecting; calls in progress keep their place in the call tree."""
        self._yappi.stop()

    def resume(self):
        self._yappi.start(builtins=True)

    stop = pause

    def greenlets(self):
        """Profiled time per greenlet name (greenlets of one name summed), largest first, as
        :class:`GreenletCost` tuples.  The time is the sum of the greenlets' own function
        costs, so, unlike yappi's greenlet stats, it leaves out time while paused."""
        costs = [GreenletCost(name, len(ctxs), sum(f.own for f in funcs.values()),
                              sum(c.sched_count for c in ctxs))
                 for name, (ctxs, funcs) in self._by_name().items()]
        costs.sort(key=lambda c: (-c.seconds, c.name))
        return costs

    def save(self, path, per_greenlet=False):
        """Write all greenlets to ``path`` and, with ``per_greenlet``, the greenlets of each
        name to ``<path without .callgrind>.<name>.callgrind``; return the paths written."""
        desc = ["Clock: %s" % self.clock]
        _write_callgrind(_functions(self._yappi.get_func_stats()), path, self.clock,
                        desc + ["Greenlets: all"])
        written = [path]
        if per_greenlet:
            stem = path[:-len(".callgrind")] if path.endswith(".callgrind") else path
            for name, (ctxs, funcs) in sorted(self._by_name().items()):
                glet_path = "%s.%s.callgrind" % (stem, re.sub(r"[^\w.-]+", "_", name))
                _write_callgrind(funcs, glet_path, self.clock,
                                desc + ["Greenlet: %s (%d)" % (name, len(ctxs))])
                written.append(glet_path)
        self.paths = written
        return written

    def _by_name(self):
        """greenlet name -> (its yappi contexts, their functions merged)."""
        yappi = self._yappi
        out = {}
        for ctx in yappi.get_greenlet_stats():
            ctxs, funcs = out.setdefault(ctx.name, ([], {}))
            ctxs.append(ctx)
            _functions(yappi.get_func_stats(filter={"ctx_id": ctx.id}), funcs)
        return out


class _Function:
    __slots__ = ("module", "name", "lineno", "own", "inclusive", "calls")

    def __init__(self, stat):
        self.module, self.name, self.lineno = stat.module, stat.name, stat.lineno
        self.own = self.inclusive = 0.0
        self.calls = defaultdict(lambda: [0, 0.0])  # callee key -> [calls, inclusive seconds]


def _functions(stats, into=None):
    """Add yappi function stats to ``into`` (full name -> :class:`_Function`)."""
    funcs = {} if into is None else into
    for stat in stats:
        func = funcs.get(stat.full_name)
        if func is None:
            func = funcs[stat.full_name] = _Function(stat)
        func.own += stat.tsub
        func.inclusive += stat.ttot
        for child in stat.children:
            call = func.calls[child.full_name]
            call[0] += child.ncall
            call[1] += child.ttot
    return funcs


@contextlib.contextmanager
def profile(path, clock="cpu", per_greenlet=False):
    """Profile the block and save it to ``path`` (see :meth:`Profiler.save`), also when the
    block raises.  Yields the :class:`Profiler`.

    :param path: the callgrind file to write.
    :param clock: ``"cpu"`` (CPU time per greenlet) or ``"wall"`` (time blocked included).
    :param per_greenlet: also write one file per greenlet name beside ``path``.
    :raises OSError: ``path``'s directory cannot be written (before the block
        runs; a failure to save after a block that raised leaves its exception)."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.access(folder, os.W_OK) or os.path.isdir(path):
        raise OSError("cannot write the profile %s" % (path,))
    profiler = Profiler(clock)
    profiler.start()
    try:
        yield profiler
    except BaseException:
        profiler.stop()
        try:
            profiler.save(path, per_greenlet)
        except OSError as exc:   # (the block's exception is the one to see)
            sys.stderr.write("gtarantool.profiling: the profile was not saved: %s\n" % exc)
        raise
    profiler.stop()
    profiler.save(path, per_greenlet)


def profile_for(seconds, path, clock="cpu", per_greenlet=False):
    """Profile whatever the other greenlets do for ``seconds`` (this one sleeps), save it
    and return the paths written.  Run it in its own greenlet to keep serving meanwhile.

    :param seconds: how long to profile.
    :param path: the callgrind file to write.
    :param clock: ``"cpu"`` or ``"wall"``, as :func:`profile`'s.
    :param per_greenlet: also write one file per greenlet name.
    :returns: the paths of the files written."""
    import gevent
    with profile(path, clock, per_greenlet) as profiler:
        gevent.sleep(seconds)
    return profiler.paths


def _write_callgrind(funcs, path, clock="cpu", desc=()):
    """Write functions (full name -> :class:`_Function`) as a callgrind file, costs in
    microseconds.

    Calls of a function to itself are left out and the calls into a function are capped at
    its own inclusive time (yappi counts the time of a recursion once, but each recursive
    caller's share of it in full), so no inclusive cost exceeds the total."""
    us = {key: (round(f.own * 1e6), round(f.inclusive * 1e6)) for key, f in funcs.items()}
    total = sum(own for own, _ in us.values())
    arcs = {}                                      # caller -> [[callee, calls, cost]]
    incoming = defaultdict(int)
    for key, func in funcs.items():
        arcs[key] = [[callee, calls, round(seconds * 1e6)]
                     for callee, (calls, seconds) in func.calls.items()
                     if callee != key and callee in funcs]
        for callee, _, cost in arcs[key]:
            incoming[callee] += cost
    for key, (own, inclusive) in us.items():
        if key not in incoming:                    # a root: its calls fit in its inclusive
            _scale(arcs[key], max(0, min(inclusive, total) - own))
    for calls in arcs.values():
        for arc in calls:
            cap = min(us[arc[0]][1], total)
            if incoming[arc[0]] > cap:
                arc[2] = arc[2] * cap // incoming[arc[0]]
    names = _function_names(funcs)
    event, label = ("CPU_us", "CPU") if clock == "cpu" else ("Wall_us", "Wall")
    lines = ["# callgrind format", "version: 1",
             "creator: gtarantool.profiling (yappi %s)" % _yappi_version(),
             # the program alone: its arguments may hold a password
             "pid: %d" % os.getpid(), "cmd: %s" % (sys.argv[0] if sys.argv else ""),
             "part: 1"]
    lines += ["desc: %s" % d for d in desc]
    lines += ["positions: line",
              "event: %s : %s time in microseconds" % (event, label),
              "events: %s" % event, ""]
    ids = {"fl": {}, "fn": {}}

    def ref(kind, key, label):
        table = ids[kind]
        if key in table:
            return "(%d)" % table[key]
        table[key] = len(table) + 1
        return "(%d) %s" % (table[key], label)

    for key in sorted(funcs, key=lambda k: (funcs[k].module, funcs[k].lineno, names[k])):
        func = funcs[key]
        lines.append("fl=" + ref("fl", func.module, func.module))
        lines.append("fn=" + ref("fn", key, names[key]))
        lines.append("%d %d" % (func.lineno, us[key][0]))
        for callee, calls, cost in arcs[key]:
            target = funcs[callee]
            lines.append("cfl=" + ref("fl", target.module, target.module))
            lines.append("cfn=" + ref("fn", callee, names[callee]))
            lines.append("calls=%d %d" % (calls, target.lineno))
            lines.append("%d %d" % (func.lineno, cost))
        lines.append("")
    lines.append("totals: %d" % total)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def _scale(calls, budget):
    spent = sum(arc[2] for arc in calls)
    if spent > budget:
        for arc in calls:
            arc[2] = arc[2] * budget // spent


def _function_names(funcs):
    """key -> function name, ``name:line`` where a file has two functions of that name."""
    count = defaultdict(int)
    for f in funcs.values():
        count[f.module, f.name] += 1
    return {key: f.name if count[f.module, f.name] == 1 else "%s:%d" % (f.name, f.lineno)
            for key, f in funcs.items()}


def _yappi_version():
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("yappi")
    except PackageNotFoundError:                # yappi importable without its metadata
        return "unknown"
