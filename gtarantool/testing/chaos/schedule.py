"""A seeded fault schedule: the same seed gives the same faults at the same
offsets with the same parameters, whatever the host does meanwhile.

``Schedule(seed, duration, targets)`` draws ``faults``, a list of ``Fault``
(``at`` seconds after the workload starts, ``kind``, ``target``, ``params``),
sorted by time; ``str(schedule)`` prints it for a replay report.
"""
import random
from dataclasses import dataclass, field
from typing import Any, Dict, List, Sequence

# The faults each target can take: the standalone server behind a Connection
# (direct and through a fault proxy), the replica set behind a ConnectionPool,
# the vshard cluster behind a Router; "process" faults act on the client.
FAULTS = {
    "conn": ("sigterm_restart", "sigterm_down", "kill9", "sigstop", "partition", "delay",
             "reset"),
    "pool": ("switchover", "kill9_master", "sigterm_restart", "replicaset_down", "sigstop"),
    "router": ("bucket_move", "switch_master", "replicaset_down", "kill9"),
    "process": ("fork", "timeouts"),
}


@dataclass
class Fault:
    at: float
    kind: str
    target: str
    params: Dict[str, Any] = field(default_factory=dict)

    def __str__(self):
        extra = " ".join("%s=%s" % (k, round(v, 2) if isinstance(v, float) else v)
                         for k, v in sorted(self.params.items()))
        return "%6.2fs %-7s %s %s" % (self.at, self.target, self.kind, extra)


class Schedule:
    """The faults of ``seed`` over ``duration`` seconds for ``targets``.

    :param seed: any int; equal seeds give equal schedules.
    :param duration: seconds of workload the faults fall in (the last one
        leaves a quarter of it for the clients to recover).
    :param targets: which of ``FAULTS``' keys take part ("process" always does).
    """

    def __init__(self, seed: int, duration: float, targets: Sequence[str]):
        self.seed = seed
        self.duration = duration
        self.targets = [t for t in FAULTS if t in targets or t == "process"]
        rng = random.Random(seed)
        self.request_timeout = rng.choice((0.5, 1.0, 2.0))
        self.faults: List[Fault] = []
        for target in self.targets:
            # One fault every ~1.5 s per target, in the first three quarters.
            count = max(1, int(duration / 1.5))
            forks = 0
            for _ in range(count):
                kind = rng.choice(FAULTS[target])
                if kind == "fork":
                    forks += 1
                    if forks > 1:   # one child here; a switchover's gap may fork another
                        kind = "timeouts"
                at = rng.uniform(0.2, duration * 0.75)
                self.faults.append(Fault(at, kind, target, self._params(rng, kind)))
        self.faults.sort(key=lambda f: (f.at, f.target))

    def _params(self, rng, kind):
        rt = self.request_timeout
        if kind in ("sigterm_restart", "kill9", "kill9_master", "replicaset_down"):
            return {"down": rng.uniform(0.1, 2 * rt)}
        if kind == "sigterm_down":   # stays down past several timeouts
            return {"down": rng.uniform(2 * rt, 4 * rt)}
        if kind == "sigstop":
            return {"stopped": rng.uniform(0.1, 2 * rt)}
        if kind == "partition":
            return {"length": rng.uniform(0.1, 2 * rt)}
        if kind == "delay":
            return {"delay": rng.uniform(0.05, rt), "length": rng.uniform(0.5, 2 * rt)}
        if kind == "switchover":
            # gap: seconds with no writable instance; a fork may fall in its middle.
            return {"gap": rng.uniform(0.1, 1.5), "fork_in_gap": rng.random() < 0.5,
                    "to": rng.randrange(1, 3)}
        if kind == "switch_master":
            return {"shard": rng.randrange(2)}
        if kind == "bucket_move":
            return {"buckets": rng.randrange(1, 6), "shard": rng.randrange(2)}
        if kind == "fork":
            return {"life": rng.uniform(0.5, 2.0)}
        if kind == "timeouts":
            return {"share": rng.uniform(0.1, 0.5), "length": rng.uniform(0.5, 2.0)}
        return {}

    def __str__(self):
        head = "seed %d: %d faults over %.1fs, request_timeout %.1fs" % (
            self.seed, len(self.faults), self.duration, self.request_timeout)
        return "\n".join([head] + ["  " + str(f) for f in self.faults])
