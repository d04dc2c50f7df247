"""The benchmark's configuration: one dataclass and the command-line options that fill it.

``python -m bench`` and ``python -m bench.compare`` share these options; library callers
(``bench.perf``) build a :class:`Config` directly and pass it to :func:`bench.run.runner.run`.
"""
import argparse
import dataclasses
import math
import os
from typing import Dict, Optional

from bench.core import dataset, keys
from bench.core.values import parse_sizes

OPERATIONS = ("insert", "select", "update", "delete")
MIX_OPERATIONS = dataset.RUN_OPERATIONS
WORKLOADS = ("phases", "mix") + tuple(dataset.PRESETS)
DISTRIBUTIONS = ("uniform", "gaussian")     # what Locust's users draw keys with
KEY_DISTRIBUTIONS = keys.DISTRIBUTIONS
ARRIVALS = ("uniform", "poisson")
DRIVERS = ("gtarantool", "sync", "threads", "asynctnt", "asyncio-minimal", "vshard", "router",
           "router-threads")
SHARDED_DRIVERS = ("vshard", "router", "router-threads")
WAL_MODES = ("write", "fsync", "none")
PASSWORD_ENV = "TARANTOOL_PASSWORD"


@dataclasses.dataclass
class Config:
    """Everything one run needs; ``as_dict()`` goes into the JSON report (without the
    password, which no output holds)."""
    driver: str = "gtarantool"
    workload: str = "phases"
    procs: int = 1
    greenlets: int = 100
    ops: int = 100_000
    duration: Optional[float] = None
    warmup: float = 0.0             # seconds of a run phase's load, not measured, before it
    size: int = 1536                # or "LOW-HIGH", "SIZE:WEIGHT,...": bench.core.values
    mix: Dict[str, int] = dataclasses.field(
        default_factory=lambda: {op: 25 for op in OPERATIONS})
    keys: int = 10_000              # --records: loaded before the run phase of a mix
    distribution: str = "uniform"
    insert_order: str = "ordered"   # or "hashed": YCSB's insertorder (bench.core.dataset)
    seed: int = 0
    rate: Optional[float] = None    # open loop: requests/s over all processes
    arrivals: str = "uniform"
    call_function: str = dataset.CALL_FUNCTION
    tx_size: int = 4
    scan: int = 100
    page: int = 20
    lazy_errors: bool = False       # gtarantool.connect(lazy_errors=True)
    client_work: float = 0.0        # microseconds of client CPU per request (an app's own)
    host: Optional[str] = None
    port: Optional[int] = None
    hosts: Optional[str] = None     # "h1:p1,h2:p2": the replica set of --pool, or instances
    pool: bool = False
    instances: int = 1              # throwaway local instances (bench.targets.instances)
    shards: int = 0                 # a sharded cluster's replica sets (bench.targets.sharded)
    user: Optional[str] = None
    password: Optional[str] = dataclasses.field(default=None, repr=False)
    space: str = "bench"
    wal: str = "write"
    quiet: bool = False
    json: Optional[str] = None
    plot: Optional[str] = None
    hlog: Optional[str] = None
    profile: Optional[str] = None
    profile_clock: str = "cpu"
    profile_greenlets: bool = False
    otel: Optional[str] = None      # --otel: the sampler (core/otel.py); None: off

    def __post_init__(self):
        if self.shards and self.driver == "gtarantool":
            self.driver = "vshard"   # a sharded cluster's gevent client routes by itself
        checks = [
            (self.shards >= 0, "shards must be >= 0"),
            ((self.driver in SHARDED_DRIVERS) == bool(self.shards),
             "--driver vshard, router and router-threads drive a sharded cluster (--shards N), "
             "and only they do"),
            (not self.shards or not (self.pool or self.hosts or self.instances > 1),
             "--shards is not for --pool, --hosts or --instances"),
            (self.driver in DRIVERS, "driver must be one of %s" % ", ".join(DRIVERS)),
            (self.workload in WORKLOADS, "workload must be one of %s" % ", ".join(WORKLOADS)),
            (self.distribution in KEY_DISTRIBUTIONS,
             "distribution must be one of %s" % ", ".join(KEY_DISTRIBUTIONS)),
            (self.insert_order in dataset.INSERT_ORDERS,
             "insert order must be one of %s" % ", ".join(dataset.INSERT_ORDERS)),
            (self.insert_order == "ordered" or (self.workload != "phases"
                                                and not self.mix.get("tx")),
             "--insert-order hashed is for a mix or a preset without tx (a transaction "
             "writes records of consecutive keys)"),
            (self.rate is None or 0 < self.rate < math.inf, "rate must be > 0 and finite"),
            (self.arrivals in ARRIVALS, "arrivals must be one of %s" % ", ".join(ARRIVALS)),
            (self.tx_size >= 1 and self.scan >= 1 and self.page >= 1,
             "tx size, scan and page must be >= 1"),
            (self.keys >= 0, "records must be >= 0"),
            (0 <= self.client_work < math.inf, "client work must be >= 0 and finite"),
            (self.wal in WAL_MODES, "wal must be one of %s" % ", ".join(WAL_MODES)),
            (self.procs >= 1 and self.greenlets >= 1, "procs and greenlets must be >= 1"),
            (self.ops >= 1, "ops must be >= 1"),
            (self.duration is None or 0 < self.duration < math.inf,
             "duration must be > 0 and finite"),
            (0 <= self.warmup < math.inf, "warm-up must be >= 0 and finite"),
            (not self.warmup or self.workload != "phases",
             "--warmup is for a mix or a preset (a run phase), not for 'phases'"),
            (not self.pool or self.driver == "gtarantool", "--pool drives gtarantool only"),
            (not self.lazy_errors or self.driver == "gtarantool",
             "--lazy-errors is gtarantool's option"),
            (self.instances >= 1, "instances must be >= 1"),
            (self.instances == 1 or (self.host is None and self.hosts is None and not self.pool),
             "--instances starts local servers: not with --host, --hosts or --pool"),
            (set(self.mix) <= set(MIX_OPERATIONS) and sum(self.mix.values()) > 0
             and min(self.mix.values()) >= 0, "mix needs non-negative percentages of %s"
             % ", ".join(MIX_OPERATIONS)),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        parse_sizes(self.size)
        if self.workload != "phases":
            used = [op for op, n in self.mix.items() if n]
            dataset.check_supported(used, self.driver, self.pool)
            beyond = sorted(set(used) - set(OPERATIONS))
            if self.driver == "asyncio-minimal" and beyond:
                raise ValueError("the asyncio-minimal driver sends %s only, not %s"
                                 % (", ".join(OPERATIONS), ", ".join(beyond)))
            if self.shards and beyond:
                raise ValueError("a sharded cluster's drivers send %s only, not %s"
                                 % (", ".join(OPERATIONS), ", ".join(beyond)))

    @property
    def embedded(self):
        """True when the run starts its own throwaway server (no --host or --hosts given)."""
        return self.host is None and self.hosts is None

    @property
    def concurrency(self):
        """Requests in flight per process: the sync driver does one call at a time."""
        return 1 if self.driver == "sync" else self.greenlets

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)

    def as_dict(self):
        """Every field but the password, for reports."""
        values = dataclasses.asdict(self)
        del values["password"]
        return values


def read_password(password=None, password_file=None, user=None):
    """The password of ``--password``, else of ``--password-file`` (its first line), else of
    ``$TARANTOOL_PASSWORD`` when a user is named.

    :returns: the password, or None.
    :raises ValueError: both the option and the file are given, or the file cannot be read.
    """
    if password is not None and password_file is not None:
        raise ValueError("--password and --password-file: give one of them")
    if password_file is not None:
        try:
            with open(password_file) as f:
                return f.readline().rstrip("\r\n")
        except OSError as exc:
            raise ValueError("cannot read --password-file: %s" % exc) from None
    if password is None and user:
        return os.environ.get(PASSWORD_ENV) or None
    return password


def add_password_arguments(group):
    """``--password`` and ``--password-file`` (:func:`read_password` reads them)."""
    group.add_argument("--password",
                       help="its password (shows in the process list: better "
                            "--password-file or $%s)" % PASSWORD_ENV)
    group.add_argument("--password-file", metavar="FILE",
                       help="read the password from the first line of FILE")


def parse_mix(text, known=OPERATIONS):
    """``"insert=40,select=40,update=10,delete=10"`` -> dict; missing operations get 0."""
    mix = {op: 0 for op in OPERATIONS}
    for part in text.split(","):
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or name not in known:
            raise argparse.ArgumentTypeError("expected OP=PERCENT,... with OP in %s, got %r"
                                             % ("/".join(known), part))
        mix[name] = int(value)
    return mix


def parse_run_mix(text):
    """``parse_mix`` with every operation of a run phase (call, eval, execute, tx, scan)."""
    return parse_mix(text, MIX_OPERATIONS)


def parse_size(text):
    """``--size``: an int when it is one, else the text (a range or a weighted list)."""
    try:
        parse_sizes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return int(text) if text.strip().isdigit() else text.strip()


def positive_int(text):
    """An argparse type: an int of at least 1 (a count of runs, rows, requests)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError("expected a positive integer, got %r" % (text,))
    return value


def add_arguments(parser, driver=True):
    """Add every run option to ``parser``; ``driver=False`` for ``bench.compare``."""
    d = Config()
    run = parser.add_argument_group("load")
    if driver:
        run.add_argument("--driver", choices=DRIVERS, default=d.driver,
                         help="client under test: gtarantool (G greenlets, one connection per "
                              "process), sync (tarantool-python, one call at a time), threads "
                              "(tarantool-python, G threads with a connection each), asynctnt "
                              "(G asyncio tasks on one connection, uvloop when installed), "
                              "asyncio-minimal (a small IPROTO client on plain asyncio: one "
                              "scheduler, at most G requests in flight) (default %(default)s)")
    run.add_argument("-p", "--procs", type=int, default=d.procs,
                     help="worker processes, started together at a barrier (default %(default)s)")
    run.add_argument("-g", "--greenlets", type=int, default=d.greenlets,
                     help="concurrent requests per process: greenlets, threads or tasks; "
                          "the sync driver always uses 1 (default %(default)s)")
    run.add_argument("-n", "--ops", type=int, default=d.ops,
                     help="operations in total over all processes, per phase for 'phases' "
                          "(default %(default)s)")
    run.add_argument("-d", "--duration", type=float, default=None,
                     help="seconds instead of a count: per phase for 'phases', for the whole "
                          "run for 'mix'")
    run.add_argument("--warmup", type=float, default=d.warmup, metavar="SECONDS",
                     help="a mix or preset: SECONDS of the run phase's own load (its rate, "
                          "its keys) before it, reported as the phase 'warmup' and not in "
                          "the run's figures (default %(default)g)")
    run.add_argument("-s", "--size", type=parse_size, default=None,
                     help="payload bytes per tuple: BYTES, a range LOW-HIGH or a weighted "
                          "list BYTES:WEIGHT,... (default %d; %d for a YCSB preset, its ten "
                          "fields of 100 bytes)" % (d.size, dataset.YCSB_RECORD_BYTES))
    run.add_argument("-w", "--workload", choices=WORKLOADS, default=d.workload,
                     help="phases: insert, then select, update, delete, OPS each; "
                          "mix: a load phase of --records, then a run phase in --mix "
                          "percentages; ycsb-a ... ycsb-f: YCSB's core workloads "
                          "(docs/loadgen.rst) (default %(default)s)")
    run.add_argument("--mix", type=parse_run_mix, default=None, metavar="OP=PCT,...",
                     help="percentages of the run phase, OP one of %s (default "
                          "insert=25,select=25,update=25,delete=25, or the preset's)"
                          % ", ".join(MIX_OPERATIONS))
    run.add_argument("--records", "--keys", dest="keys", type=int, default=d.keys, metavar="N",
                     help="records the load phase of a mix or preset inserts "
                          "(default %(default)s)")
    run.add_argument("--distribution", choices=KEY_DISTRIBUTIONS, default=None,
                     help="key choice of the run phase: %s (default uniform, or the "
                          "preset's)" % ", ".join(KEY_DISTRIBUTIONS))
    run.add_argument("--insert-order", choices=dataset.INSERT_ORDERS, default=None,
                     help="keys in record order, or each record's key its number's FNV "
                          "hash, as YCSB's insertorder=hashed (default hashed for a YCSB "
                          "preset, YCSB's default; ordered otherwise)")
    run.add_argument("--rate", type=float, default=None,
                     help="open loop: this many requests per second over all processes, "
                          "each at its intended time; latency counts from then "
                          "(default: closed loop, as fast as the greenlets go)")
    run.add_argument("--arrivals", choices=ARRIVALS, default=d.arrivals,
                     help="with --rate: evenly spaced, or a Poisson process "
                          "(default %(default)s)")
    run.add_argument("--call", dest="call_function", default=d.call_function, metavar="NAME",
                     help="Lua function the call operation calls with the key "
                          "(default %(default)s, which the bench defines)")
    run.add_argument("--tx-size", type=int, default=d.tx_size,
                     help="updates per transaction of the tx operation (default %(default)s)")
    run.add_argument("--scan", type=int, default=d.scan,
                     help="records a scan reads (default %(default)s)")
    run.add_argument("--page", type=int, default=d.page,
                     help="records per select of a scan (default %(default)s)")
    run.add_argument("--seed", type=int, default=d.seed,
                     help="random seed; worker i uses SEED+i (default %(default)s)")
    run.add_argument("--client-work", type=float, default=d.client_work, metavar="US",
                     help="with --rate: CPU microseconds the client spends after each "
                          "answer, as an application does with what it reads (default 0)")
    run.add_argument("--lazy-errors", action="store_true",
                     help="gtarantool: open the connection with lazy_errors=True (a server "
                          "error's message decoded only when read; the mix's duplicate keys)")

    srv = parser.add_argument_group("server (default: a throwaway local tarantool)")
    srv.add_argument("--host", help="drive this existing server instead of starting one "
                          "(127.0.0.1 when only --port is given)")
    srv.add_argument("--port", type=int, help="its port (default 3301 with --host)")
    srv.add_argument("--pool", action="store_true",
                     help="drive a replica set through gtarantool.ConnectionPool: selects on "
                          "read-only instances, writes on the read-write one (a throwaway "
                          "master and two replicas unless --hosts is given)")
    srv.add_argument("--hosts", metavar="H:P,H:P,...",
                     help="the replica set's instances, with --pool; without it, independent "
                          "instances: worker process i drives instance i %% N")
    srv.add_argument("--instances", type=int, default=d.instances,
                     help="start this many throwaway local instances; worker process i drives "
                          "instance i %% N (default %(default)s)")
    srv.add_argument("--shards", type=int, default=d.shards, metavar="N",
                     help="a sharded cluster: N throwaway replica sets (a master and a replica "
                          "each) and a Lua router (Tarantool 2.11+, vshard), or with --host the "
                          "existing Lua router's cluster; the driver is vshard (routing in the "
                          "client), router or router-threads (through the Lua router)")
    srv.add_argument("--user", help="user name on the existing server (default guest)")
    add_password_arguments(srv)
    srv.add_argument("--space", default=d.space,
                     help="space to use; created when missing and allowed (default %(default)s)")
    srv.add_argument("--wal", choices=WAL_MODES, default=d.wal,
                     help="wal_mode of the embedded server (default %(default)s)")

    out = parser.add_argument_group("output")
    out.add_argument("-q", "--quiet", action="store_true",
                     help="no per-second lines while running")
    out.add_argument("--json", metavar="FILE",
                     help="write every figure, the per-second series and the configuration")
    out.add_argument("--plot", metavar="FILE.png",
                     help="draw throughput and latency percentiles (p50, p99, p99.9) over "
                          "time, and the latency distribution (needs matplotlib)")
    out.add_argument("--hlog", metavar="FILE",
                     help="write the latencies as an HdrHistogram interval log (what "
                          "HistogramLogProcessor reads; values in microseconds)")

    prof = parser.add_argument_group("profiling")
    prof.add_argument("--profile", metavar="DIR",
                      help="write one yappi profile per worker process into DIR")
    prof.add_argument("--profile-clock", choices=("cpu", "wall"), default=d.profile_clock,
                      help="yappi clock (default %(default)s)")
    prof.add_argument("--profile-greenlets", action="store_true",
                      help="also one profile per greenlet")

    otel = parser.add_argument_group("OpenTelemetry")
    otel.add_argument("--otel", nargs="?", const="env", default=None,
                      choices=("env", "always_on", "always_off"), metavar="SAMPLER",
                      help="gtarantool's spans and metrics from every worker, exported as "
                           "OTEL_TRACES_EXPORTER, OTEL_METRICS_EXPORTER and OTEL_EXPORTER_OTLP_* "
                           "say (OTLP when installed); SAMPLER: env (OTEL_TRACES_SAMPLER, the "
                           "default), always_on or always_off")


def from_args(args, **overrides):
    """Build a Config from parsed arguments (fields missing from ``args`` keep defaults)."""
    names = {f.name for f in dataclasses.fields(Config)}
    values = {k: v for k, v in vars(args).items() if k in names}
    values.update(overrides)
    preset = dataset.PRESETS.get(values.get("workload"))
    if values.get("mix") is None:
        values["mix"] = dict(preset[0]) if preset else Config().mix
    if values.get("distribution") is None:
        values["distribution"] = preset[1] if preset else Config().distribution
    if values.get("insert_order") is None:
        # YCSB's insertorder is hashed unless told otherwise (a tx writes consecutive keys).
        values["insert_order"] = "hashed" if preset and not values["mix"].get("tx") \
            else Config().insert_order
    if values.get("size") is None:
        # YCSB's records: fieldcount 10 of fieldlength 100 (CoreWorkload's defaults).
        values["size"] = dataset.YCSB_RECORD_BYTES if preset else Config().size
    if "password" not in overrides:
        values["password"] = read_password(values.get("password"),
                                           getattr(args, "password_file", None),
                                           values.get("user"))
    if values.get("port") is not None and values.get("host") is None:
        values["host"] = "127.0.0.1"
    if values.get("host") is not None and values.get("port") is None:
        values["port"] = 3301
    return Config(**values)
