"""Read callgrind profiles and compare two of them side by side.

``python -m bench.profile compare A.callgrind B.callgrind [--ops N [N]] [--top K]`` prints
the total cost per operation, socket send/recv calls per operation and the top functions by
own cost of each.  The operation count of a file comes from ``--ops`` (one number for both,
or one each) or else from the JSON sidecar the bench writes next to each per-process
profile (``X.callgrind`` -> ``X.json``, key ``ops``).

The parser reads the subset of the callgrind format that yappi and gtarantool.profiling
write (``fl``/``fn``/``cfl``/``cfn``/``calls`` with name compression, one cost column per
position) and takes the first event column.
"""
import argparse
import json
import os
import re
import sys
from collections import defaultdict

SEND_CALLS = ("send", "sendall", "sendto", "sendmsg")
RECV_CALLS = ("recv", "recv_into", "recvfrom", "recvfrom_into", "recvmsg")
# The transport reads and writes its socket's descriptor with os.readv/os.write.
FD_CALLS = {"write": "send", "writev": "send", "read": "recv", "readv": "recv"}
SOCKET_METHOD = re.compile(r"<method '(\w+)' of '_socket\.socket' objects>")


class Profile:
    """One callgrind file: ``own[fn]`` self cost and ``arcs[caller, callee] = [calls, cost]``,
    a function being ``(file, name)``; ``total`` from ``totals:``/``summary:`` or summed."""

    def __init__(self, path):
        self.path = path
        self.event = None
        self.desc = []
        self.own = defaultdict(int)
        self.arcs = defaultdict(lambda: [0, 0])
        self.total = None
        self._read(path)
        if self.total is None:
            self.total = sum(self.own.values())

    def _read(self, path):
        names = {"fl": {}, "fn": {}}
        positions = 1
        fl = fn = cfl = cfn = None
        pending_calls = None

        def name(kind, value):
            m = re.match(r"\((\d+)\)\s*(.*)$", value)
            if not m:
                return value
            if m.group(2):
                names[kind][m.group(1)] = m.group(2)
            return names[kind][m.group(1)]

        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                key, sep, value = line.partition("=")
                if sep and key in ("fl", "fi", "fe", "fn", "cfl", "cfi", "cfn"):
                    if key == "fl":
                        fl = name("fl", value)
                    elif key == "fn":
                        fn = (fl, name("fn", value))
                    elif key in ("cfl", "cfi"):
                        cfl = name("fl", value)
                    elif key == "cfn":
                        cfn = (cfl if cfl is not None else fl, name("fn", value))
                        cfl = None
                    else:                          # fi/fe: inlined code, same function
                        name("fl", value)
                    continue
                if line.startswith("calls="):
                    pending_calls = int(line[6:].split()[0])
                    continue
                if line[0].isdigit() or line[0] in "+-*":
                    fields = line.split()
                    cost = int(fields[positions]) if len(fields) > positions else 0
                    if pending_calls is not None:
                        arc = self.arcs[fn, cfn]
                        arc[0] += pending_calls
                        arc[1] += cost
                        pending_calls = None
                    else:
                        self.own[fn] += cost
                    continue
                head, _, rest = line.partition(":")
                rest = rest.strip()
                if head == "events":
                    self.event = rest.split()[0]
                elif head == "positions":
                    positions = len(rest.split())
                elif head == "desc":
                    self.desc.append(rest)
                elif head in ("totals", "summary"):
                    self.total = int(rest.split()[0])

    def calls(self):
        """fn -> times called, summed over its callers."""
        out = defaultdict(int)
        for (_, callee), (calls, _) in self.arcs.items():
            out[callee] += calls
        return out

    def inclusive(self):
        """fn -> inclusive cost as kcachegrind computes it: the cost of the calls into it
        from other functions, or for a root its own cost plus its calls out."""
        incoming = defaultdict(int)
        outgoing = defaultdict(int)
        for (caller, callee), (_, cost) in self.arcs.items():
            if caller != callee:
                incoming[callee] += cost
                outgoing[caller] += cost
        functions = set(self.own) | set(incoming)
        return {fn: incoming[fn] if fn in incoming else self.own[fn] + outgoing[fn]
                for fn in functions}

    def socket_calls(self):
        """(send family, recv family) calls on sockets and their descriptors,
        counted from the call arcs."""
        send = recv = 0
        for fn, n in self.calls().items():
            m = SOCKET_METHOD.search(fn[1])
            family = FD_CALLS.get(fn[1]) if fn[0] == "posix" else None
            if (m and m.group(1) in SEND_CALLS) or family == "send":
                send += n
            elif (m and m.group(1) in RECV_CALLS) or family == "recv":
                recv += n
        return send, recv

    def top(self, k):
        """The ``k`` functions with the largest own cost: [(fn, own, calls)]."""
        calls = self.calls()
        ranked = sorted(self.own.items(), key=lambda item: (-item[1], item[0]))[:k]
        return [(fn, own, calls.get(fn, 0)) for fn, own in ranked]


def sidecar(path):
    """The JSON the bench writes next to a per-process profile, or None."""
    stem = path[:-len(".callgrind")] if path.endswith(".callgrind") else path
    try:
        with open(stem + ".json") as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def short(fn, width=58):
    """``Class.method (file.py)``, cut from the left to ``width`` characters."""
    path, name = fn
    text = name if path in (None, "builtins") else "%s (%s)" % (name, os.path.basename(path))
    return text if len(text) <= width else "..." + text[-(width - 3):]


def compare(a, b, ops_a, ops_b, top=15):
    """The side-by-side table of profiles ``a`` and ``b`` (:class:`Profile`) as text."""
    unit = a.event or "cost"
    rows = [("", os.path.basename(a.path), os.path.basename(b.path))]
    rows.append(("operations", "%d" % ops_a, "%d" % ops_b))
    rows.append(("total %s" % unit, "%d" % a.total, "%d" % b.total))
    rows.append(("%s per operation" % unit, "%.1f" % (a.total / ops_a), "%.1f" % (b.total / ops_b)))
    (sa, ra), (sb, rb) = a.socket_calls(), b.socket_calls()
    rows.append(("socket send calls", "%d" % sa, "%d" % sb))
    rows.append(("socket recv calls", "%d" % ra, "%d" % rb))
    rows.append(("send calls per operation", "%.4f" % (sa / ops_a), "%.4f" % (sb / ops_b)))
    rows.append(("recv calls per operation", "%.4f" % (ra / ops_a), "%.4f" % (rb / ops_b)))
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    w2 = max(len(r[2]) for r in rows)
    out = ["%-*s  %*s  %*s" % (w0, r[0], w1, r[1], w2, r[2]) for r in rows]
    for label, prof, ops in (("A", a, ops_a), ("B", b, ops_b)):
        out.append("")
        out.append("top %d functions of %s (%s) by own %s" % (top, label,
                                                             os.path.basename(prof.path), unit))
        out.append("  %6s  %10s  %10s  %9s  %s" % ("own%", "own/op", "calls", "calls/op",
                                                  "function"))
        for fn, own, calls in prof.top(top):
            out.append("  %5.1f%%  %10.2f  %10d  %9.3f  %s" % (
                100.0 * own / (prof.total or 1), own / ops, calls, calls / ops, short(fn)))
    return "\n".join(out)


def _ops(path, given):
    if given is not None:
        return given
    meta = sidecar(path)
    if meta is None or not meta.get("ops"):
        raise SystemExit("no operation count for %s: give --ops or keep the .json the bench "
                         "writes next to it" % path)
    return meta["ops"]


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.profile",
                                     description="Compare callgrind profiles.")
    sub = parser.add_subparsers(dest="command", required=True)
    cmp_ = sub.add_parser("compare", help="two profiles side by side")
    cmp_.add_argument("a", metavar="A.callgrind")
    cmp_.add_argument("b", metavar="B.callgrind")
    cmp_.add_argument("--ops", type=int, nargs="+", metavar="N",
                      help="operations in each profile: one number for both or one each "
                           "(default: 'ops' from A.json and B.json next to the files)")
    cmp_.add_argument("--top", type=int, default=15, help="functions listed per profile")
    args = parser.parse_args(argv)
    if args.ops is not None and (len(args.ops) > 2 or min(args.ops) < 1):
        parser.error("--ops takes one or two positive numbers")
    given = (args.ops or [None]) * (2 if not args.ops or len(args.ops) == 1 else 1)
    ops_a, ops_b = _ops(args.a, given[0]), _ops(args.b, given[1])
    print(compare(Profile(args.a), Profile(args.b), ops_a, ops_b, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
