"""The bench's ``mix`` workload as a Locust scenario (``make locust``).

Each user draws operations by the ``--bench-mix`` percentages and keys from
``0..KEYS-1`` (uniform or gaussian), as ``bench.core.workloads.mix`` does, and
checks every tuple that comes back against the key's payload.  A duplicate key
on insert (error 3) counts as a success, as does a select, update or delete of
a key that is not there (an empty reply): the mix produces both by design.

``--bench-noop`` keeps everything but the Tarantool call (each request returns
a canned reply and fires Locust's event directly): Locust's own ceiling.
"""
import functools
import itertools
import json
import os
import random

from locust import constant, events, task
from locust.runners import MasterRunner, WorkerRunner

from bench.core import otel
from bench.core.config import DISTRIBUTIONS, Config, parse_mix
from bench.core.workloads import ER_TUPLE_FOUND, Payloads
from bench.drivers.clients import UPDATE_OPS
from bench.locust import reporting
from bench.targets.server import Target
from gtarantool.contrib.locust import REQUEST_TYPE, TarantoolUser, parse_host, worker_reports

# Response times to 0.01 ms below 10 ms, percentiles with two decimals.
reporting.fine_buckets()

_users = itertools.count()


@events.init_command_line_parser.add_listener
def _options(parser, **_kwargs):
    d = Config()
    group = parser.add_argument_group("bench workload (bench/locust/locustfile.py)")
    group.add_argument("--bench-mix", default="insert=25,select=25,update=25,delete=25",
                       help="operation percentages (default %(default)s)")
    group.add_argument("--bench-keys", type=int, default=d.keys, help="key range")
    group.add_argument("--bench-size", type=int, default=d.size, help="payload bytes")
    group.add_argument("--bench-distribution", choices=DISTRIBUTIONS, default=d.distribution)
    group.add_argument("--bench-seed", type=int, default=d.seed)
    group.add_argument("--bench-space", default=d.space)
    group.add_argument("--bench-noop", action="store_true",
                       help="no Tarantool call: measure Locust's own cost per request")
    group.add_argument("--bench-prepare", action="store_true",
                       help="create (or empty) the space when the test starts (the master "
                            "does it; bench.locust_run prepares it itself)")
    group.add_argument("--bench-otel", nargs="?", const="env", default=None,
                       choices=("env", "always_on", "always_off"), metavar="SAMPLER",
                       help="gtarantool's OpenTelemetry spans and metrics from every process "
                            "that sends requests, exported as the OTEL_* environment says "
                            "(as python -m bench --otel)")
    group.add_argument("--bench-report", metavar="FILE",
                       help="write Locust's counts and every worker's gtarantool counters "
                            "(JSON) here when the run ends (bench.locust_run reads it)")


@functools.lru_cache(maxsize=None)
def _payloads(size):
    return Payloads(size)   # one table per process, not per user


class Workload:
    """One user's draws: ``next()`` -> (operation, key)."""

    def __init__(self, options, index):
        rng = random.Random(options.bench_seed * 1_000_003 + os.getpid() * 1009 + index)
        mix = parse_mix(options.bench_mix)
        total = sum(mix.values())
        self.table = [op for op in mix for _ in range(round(1000 * mix[op] / total))]
        keys = options.bench_keys
        if options.bench_distribution == "uniform":
            self.key = lambda: int(rng.random() * keys)
        else:
            centre, sigma = (keys - 1) / 2, keys / 8
            self.key = lambda: min(keys - 1, max(0, int(rng.gauss(centre, sigma) + 0.5)))
        self.random = rng.random

    def next(self):
        return self.table[int(self.random() * len(self.table))], self.key()


class _Reply:
    def __init__(self, data):
        self.data = data


class NoopClient:
    """The client's interface without Tarantool: Locust's event per request."""

    def __init__(self, user, space, payloads):
        self._fire = user.environment.events.request.fire
        self._payloads = payloads
        self._names = {op: "%s %s" % (op, space) for op in ("insert", "select", "update",
                                                             "delete")}

    def _reply(self, name, key):
        self._fire(request_type=REQUEST_TYPE, name=name, response_time=0.0,
                   response_length=0, exception=None)
        return _Reply([(key, 0, self._payloads(key))])

    def insert(self, space, values):
        return self._reply(self._names["insert"], values[0])

    def select(self, space, key):
        return self._reply(self._names["select"], key)

    def update(self, space, key, ops):
        return self._reply(self._names["update"], key)

    def delete(self, space, key):
        return self._reply(self._names["delete"], key)


class BenchUser(TarantoolUser):
    wait_time = constant(0)
    expected_errors = {ER_TUPLE_FOUND}

    def on_start(self):
        options = self.environment.parsed_options
        self.space = options.bench_space
        self.payloads = _payloads(options.bench_size)
        self.workload = Workload(options, next(_users))
        if options.bench_noop:
            self.client = NoopClient(self, self.space, self.payloads)

    @task
    def request(self):
        op, key = self.workload.next()
        client, space = self.client, self.space
        if op == "insert":
            rows = client.insert(space, (key, 0, self.payloads(key))).data
        elif op == "select":
            rows = client.select(space, key).data
        elif op == "update":
            rows = client.update(space, key, UPDATE_OPS).data
        else:
            rows = client.delete(space, key).data
        # An empty reply is a missing key; a tuple must be the key's.
        if rows and (rows[0][0] != key or rows[0][2] != self.payloads(key)):
            raise AssertionError("%s %d returned %r..." % (op, key, str(rows[0])[:80]))


_otel_providers = []


@events.init.add_listener
def _instrument(environment, **_kwargs):
    sampler = getattr(environment.parsed_options, "bench_otel", None)
    if sampler is not None and not isinstance(environment.runner, MasterRunner):
        _otel_providers.extend(otel.instrument(sampler))


@events.quitting.add_listener
def _flush_telemetry(environment, **_kwargs):
    while _otel_providers:
        _otel_providers.pop().shutdown()


@events.test_start.add_listener
def _prepare(environment, **_kwargs):
    options = environment.parsed_options
    if not options.bench_prepare or isinstance(environment.runner, WorkerRunner):
        return
    addresses, user, password, _ = parse_host(environment.host)
    for host, port in addresses:
        target = Target(host, port, Config(user=user, password=password))
        try:
            target.prepare(options.bench_space)
        finally:
            target.close()


@events.quitting.add_listener
def _write_report(environment, **_kwargs):
    path = getattr(environment.parsed_options, "bench_report", None)
    if not path or isinstance(environment.runner, WorkerRunner):
        return
    entries = [{"type": e.method, "name": e.name, "requests": e.num_requests,
                "failures": e.num_failures} for e in environment.stats.entries.values()]
    with open(path, "w") as f:
        json.dump({"entries": entries, "workers": worker_reports(environment),
                   "exit_code": environment.process_exit_code}, f, indent=1)


@events.quitting.add_listener
def _print_summary(environment, **_kwargs):
    if not isinstance(environment.runner, WorkerRunner) and environment.stats.total.num_requests:
        print("\n".join(reporting.percentile_table(environment.stats)
                        + reporting.pace_lines(worker_reports(environment))), flush=True)
