"""One seed of the campaign: servers, clients, greenlets, faults, the history.

``Campaign(schedule, slack).run()`` starts the targets the schedule names
(``conn``: one server behind two Connections, one direct and one through a
``FaultProxy``; ``pool``: a three-member replica set behind a ConnectionPool;
``router``: two vshard replica sets behind a Router, 2.11+ only), runs
greenlets that loop over operations with unique ids, applies the schedule's
faults (forks included), heals everything, counts on every instance how many
times each id was applied and returns ``history.check``'s violations.

A write goes through ``chaos_write(id)``, which logs the application in
``chaos_log`` (its own transaction, with the caller's address) before it
inserts ``id`` into ``chaos_kv``: a second application stays in the log even
when the insert fails; or through an upsert of ``chaos_count`` that adds one
per application; or is a ``copy_from`` of 1..``MAX_ROWS`` rows into
``chaos_rows`` (insert mode; row ids ``op_id * ROWS_PER_OP + k``, unique
across the run and its children, with the row's bucket id; a trigger stores
the inserting caller's address in each row), or the same rows' inserts on a
pipeline (a connection's or a pool's), or one SQL INSERT of those rows (a
prepared statement on a connection, ``execute`` on a pool); or
``chaos_write(id)`` in an interactive transaction (a stream's BEGIN, the
call, COMMIT: 2.10+, whose servers run the MVCC engine); or, through a
Router, a ``map_callrw`` of ``chaos_map(id, buckets)`` (every master, or the
masters holding the buckets named), which logs in ``chaos_maps`` each run with
its replica set and which of those buckets it held.  A read calls
``chaos_echo(id)``.
Replies carry the id.
"""
import itertools
import json
import os
import random
import signal
import tempfile
import time
import traceback

import gevent
import gevent.event
import gevent.os
import tarantool
from tarantool.connection_pool import Mode

import gtarantool
from gtarantool.copy import copy_from, space_info
from gtarantool.testing.chaos import history as h
from gtarantool.testing.faults import FaultProxy
from gtarantool.testing.replicaset import ReplicaSet
from gtarantool.testing.server import TarantoolServer, binary_version

USER, PASSWORD = "test", "secret"
CHILD_BASE = 1 << 40   # a forked child's op ids: (k + 1) * CHILD_BASE + n
ROWS_PER_OP, MAX_ROWS = 8, 5   # a copy op's row ids: op_id * ROWS_PER_OP + k, k < MAX_ROWS
BUCKETS = 60
COPY_SPACE = "chaos_rows"
# (an interactive transaction yields between its requests: memtx needs MVCC)
TXN_CFG = {"memtx_use_mvcc_engine": True}

SCHEMA = """
local uuid = require('uuid')
local clock = require('clock')
local function chaos_origin()
    -- who applied a write: the caller's address, the port it reached and when
    -- (wall clock), so a forked child's socket is told from a parent's that
    -- reused its local port, before or at once towards another server
    local port = tostring(box.cfg.listen or ''):match(':(%d+)$') or ''
    return string.format('%s>%s@%.3f', box.session.peer() or '', port, clock.time())
end
local function chaos_schema()
    local log = box.schema.space.create('chaos_log', {if_not_exists = true})
    log:create_index('pk', {type = 'hash', parts = {1, 'string'}, if_not_exists = true})
    local kv = box.schema.space.create('chaos_kv', {if_not_exists = true})
    kv:create_index('pk', {parts = {1, 'unsigned'}, if_not_exists = true})
    local count = box.schema.space.create('chaos_count', {if_not_exists = true})
    count:create_index('pk', {parts = {1, 'unsigned'}, if_not_exists = true})
    local rows = box.schema.space.create('chaos_rows', {if_not_exists = true, format = {
        {name = 'id', type = 'unsigned'}, {name = 'bucket_id', type = 'unsigned'},
        {name = 'peer', type = 'string', is_nullable = true}}})
    rows:create_index('pk', {parts = {1, 'unsigned'}, if_not_exists = true})
    rows:create_index('bucket_id', {parts = {2, 'unsigned'}, unique = false,
                                    if_not_exists = true})
    local maps = box.schema.space.create('chaos_maps', {if_not_exists = true})
    maps:create_index('pk', {type = 'hash', parts = {1, 'string'}, if_not_exists = true})
end
if not box.info.ro then box.once('chaos-schema', chaos_schema) end
local function chaos_peer(old, new)
    -- (a row a bucket move or replication brings keeps its first caller's address;
    -- over an existing row it returns nothing: a returned tuple turns an insert
    -- into a replace, and the duplicate would go unseen)
    if old == nil and new ~= nil and new[3] == nil and box.session.type() == 'binary' then
        return new:update{{'=', 3, chaos_origin()}}
    end
end
require('fiber').create(function()
    -- (a replica gets the space from its master, maybe after this script ran)
    while box.space.chaos_rows == nil do require('fiber').sleep(0.05) end
    if #box.space.chaos_rows:before_replace() == 0 then
        box.space.chaos_rows:before_replace(chaos_peer)
    end
end)
function chaos_write(id)
    -- (its own transaction: a second application stays even when the insert fails)
    box.space.chaos_log:insert{uuid.str(), id, chaos_origin()}
    box.space.chaos_kv:insert{id}
    return id
end
function chaos_upsert(id)
    box.space.chaos_count:upsert({id, 1}, {{'+', 2, 1}})
    return id
end
local function chaos_replicaset()
    -- (box.info.cluster names the replica set before 3.0, box.info.replicaset since)
    return (box.info.replicaset or box.info.cluster).uuid
end
function chaos_map(id, buckets)
    -- a map's run (map_callrw's function): its replica set and which of the
    -- buckets the map named it holds, pinned by the map's ref meanwhile
    local held = setmetatable({}, {__serialize = 'array'})
    for _, b in ipairs(buckets or {}) do
        local t = box.space._bucket:get(b)
        if t ~= nil and (t[2] == 'active' or t[2] == 'pinned') then held[#held + 1] = b end
    end
    box.space.chaos_maps:insert{uuid.str(), id, chaos_origin(), chaos_replicaset(), held}
    return id
end
function chaos_echo(id) return id end
function chaos_facts()
    -- (on a vshard storage a row counts only in a bucket it holds: a row left in a
    -- bucket sent away, or in none, is lost to the readers the router sends)
    local held = nil
    if box.space._bucket ~= nil then
        held = {}
        for _, b in box.space._bucket:pairs() do
            if b[2] ~= 'sent' and b[2] ~= 'garbage' then held[b[1]] = true end
        end
    end
    local rows = {}
    for _, t in box.space.chaos_rows:pairs() do
        rows[#rows + 1] = {t[1], t[3] or '', held == nil or held[t[2]] == true}
    end
    -- (a storage names its replica set: the ones a full map must reach)
    return box.space.chaos_log:select(), box.space.chaos_count:select(), rows,
        box.space.chaos_maps:select(), held ~= nil and chaos_replicaset() or ''
end
"""
USER_LUA = """
if not box.info.ro then
    box.once('chaos-user', function()
        box.schema.user.create(%r, {password = %r, if_not_exists = true})
        box.schema.user.grant(%r, 'super', nil, nil, {if_not_exists = true})
    end)
end
""" % (USER, PASSWORD, USER)

SWITCH = """
local want, id, timeout = ...
local deadline = require('clock').monotonic() + timeout
while (box.info.vclock[id] or 0) < want do
    if require('clock').monotonic() > deadline then error('replica did not sync') end
    require('fiber').sleep(0.01)
end
box.cfg{read_only = false}
"""


def blocking(fn, *args):
    """Run ``fn`` in the hub's thread pool: a server start or an eval over
    tarantool-python blocks, and a blocked hub would stretch every call's time.
    Its exception is raised here (the pool would print it as unhandled)."""
    ok, value = gevent.get_hub().threadpool.apply(_capture, (fn, args))
    if not ok:
        raise value
    return value


def _capture(fn, args):
    try:
        return True, fn(*args)
    except Exception as exc:
        return False, exc


def parallel(fn, items):
    gevent.joinall([gevent.spawn(blocking, fn, item) for item in items], raise_error=True)


def _origin(peer):
    """``(local port, server port, wall time)`` of a write, from the origin
    ``chaos_origin()`` recorded ("host:port>server port@time"), or None."""
    try:
        address, rest = str(peer).split(">", 1)
        server, at = rest.split("@", 1)
        return int(address.rsplit(":", 1)[1]), int(server), float(at)
    except (IndexError, ValueError):
        return None


def _by_child(peer, child_sockets):
    """Whether the origin ``peer`` is a socket a forked child held then:
    ``child_sockets`` is [(local port, server port, opened after, closed before)]."""
    origin = _origin(peer)
    if origin is None:
        return False
    local, server, at = origin
    return any(local == lp and server == sp and since <= at <= until
               for lp, sp, since, until in child_sockets)


class Target:
    """A set of servers, its clients and the faults it takes."""
    name = ""
    greenlets = 8
    bound = 1.0
    unsafe = ()   # kinds known to break a promise here, run only when asked
    pipelines = True   # its client makes pipelines (write_pipeline)
    sessions = True    # its client makes SQL and transactions (write_sql, write_txn)
    maps = False       # its client runs a function on every master (write_map)

    def __init__(self, campaign):
        self.c = campaign
        self.rt = campaign.schedule.request_timeout
        self.kinds = tuple(k for k in KINDS if (k not in self.unsafe or campaign.unsafe)
                           and (k != "write_pipeline" or self.pipelines)
                           and (k != "write_sql" or self.sessions)
                           and (k != "write_map" or self.maps)
                           and (k != "write_txn" or (self.sessions and transactions())))

    def instances(self):
        """Every server whose data the facts read."""
        raise NotImplementedError

    def read_space(self):
        """The copy space's format, read once (as a bulk loader reads it)."""
        if "write_copy" in self.kinds:
            self.info = space_info(self.client(0), COPY_SPACE)

    @property
    def copy_bound(self):
        """A copy of a few rows: a ping (within ``retry_timeout``) and the
        replies (within a call's bound), then at most one ``retry_timeout`` of
        sending rows proven not applied again, its last send likewise."""
        return 2 * (self.rt + self.bound)

    def copy(self, client, ids):
        """``copy_from`` of one row per id (with its bucket id) in insert mode."""
        return copy_from(client, COPY_SPACE, [(i, i % BUCKETS + 1) for i in ids],
                         mode="insert", retry_timeout=self.rt, info=self.info)

    @property
    def pipeline_bound(self):
        """A pipeline's wait: its ``request_timeout``."""
        return self.rt

    def pipeline(self, client, ids):
        """The inserts of one row per id on a pipeline: each one's result."""
        p = client.pipeline()
        for i in ids:
            p.insert(COPY_SPACE, (i, i % BUCKETS + 1))
        return p.results()

    @property
    def txn_bound(self):
        """A transaction's BEGIN, call and COMMIT: a call's bound each."""
        return 3 * self.bound

    def transaction(self, client, op_id):
        """``chaos_write(op_id)`` in an interactive transaction: its reply."""
        with client.transaction() as tx:
            return tx.call("chaos_write", op_id).data[0]

    @property
    def sql_bound(self):
        """One SQL statement: a call's."""
        return self.bound

    def sql(self, client, ids):
        """One SQL INSERT of a row per id (with its bucket id)."""
        client.execute(_insert_sql(len(ids)), _sql_params(ids))

    def label(self, n):
        """The client's name in the history."""
        return self.name

    def eval(self, srv, lua, *args):
        return self._evaluator(srv, lua, *args)

    def heal(self):
        for srv in self.instances():
            if srv.process is not None and srv.process.poll() is None:
                srv.signal(signal.SIGCONT)
        parallel(self._ensure_running, self.instances())

    @staticmethod
    def _ensure_running(srv):
        if srv.process is None or srv.process.poll() is not None:
            srv.start()

    def restart(self, srv, sig, down):
        """Signal ``srv`` (SIGTERM or SIGKILL), wait ``down`` seconds, start it."""
        if sig == signal.SIGKILL:
            blocking(srv.kill)
        else:
            srv.signal(sig)
            blocking(srv.process.wait)
        gevent.sleep(down)
        blocking(srv.start)

    def freeze(self, srv, seconds):
        srv.signal(signal.SIGSTOP)
        try:
            gevent.sleep(seconds)
        finally:
            if os.getpid() == self.c.pid:   # (not from a forked child's copy)
                srv.signal(signal.SIGCONT)

    def facts(self):
        """[(log rows, count rows, copied rows, map rows, replica set)] from
        every instance."""
        return [blocking(self.eval, srv, "return chaos_facts()") for srv in self.instances()]


class ConnTarget(Target):
    """One server; half the greenlets go through a fault proxy."""
    name = "conn"

    def start(self):
        self.server = TarantoolServer(USER_LUA + SCHEMA, cfg=TXN_CFG if transactions() else None)
        blocking(self.server.start)
        self.proxy = FaultProxy(self.server.host, self.server.port)
        # (the proxied one admits two requests at a time: callers queue for room)
        self.clients = [self.connect(self.server.port),
                        self.connect(self.proxy.port, max_in_flight=2)]
        self.bound = self.rt
        self.statements = {}

    @property
    def sql_bound(self):
        """Its statement's PREPARE (the first time on a client), then EXECUTE."""
        return 2 * self.bound

    def sql(self, client, ids):
        """A prepared INSERT of a row per id, one statement per client and row count."""
        key = (id(client), len(ids))
        stmt = self.statements.get(key)
        if stmt is None:
            stmt = self.statements[key] = client.prepare(_insert_sql(len(ids)))
        stmt.execute(_sql_params(ids))

    def connect(self, port, **options):
        return gtarantool.connect("127.0.0.1", port, user=USER, password=PASSWORD,
                                  request_timeout=self.rt, connection_timeout=self.rt,
                                  reconnect_max_attempts=3, reconnect_delay=0.1, **options)

    def instances(self):
        return [self.server]

    def _evaluator(self, srv, lua, *args):
        conn = tarantool.Connection(srv.host, srv.port, user=USER, password=PASSWORD,
                                    fetch_schema=False)
        try:
            return conn.eval(lua, list(args)).data
        finally:
            conn.close()

    def client(self, n):
        return self.clients[n % 2]

    def label(self, n):
        return ("conn", "conn-proxied")[n % 2]

    def do(self, client, kind, op_id):
        if kind == "write_call":
            return client.call("chaos_write", op_id).data[0]
        if kind == "write_upsert":
            client.upsert("chaos_count", (op_id, 1), [("+", 1, 1)])
            return None
        return client.call("chaos_echo", op_id).data[0]

    def fault(self, kind, p):
        srv = self.server
        if kind in ("sigterm_restart", "sigterm_down"):
            self.restart(srv, signal.SIGTERM, p["down"])
        elif kind == "kill9":
            self.restart(srv, signal.SIGKILL, p["down"])
        elif kind == "sigstop":
            self.freeze(srv, p["stopped"])
        elif kind == "partition":
            self.proxy.blackhole()
            gevent.sleep(p["length"])
            self.proxy.resume()
        elif kind == "delay":
            self.proxy.delay = p["delay"]
            gevent.sleep(p["length"])
            self.proxy.delay = 0.0
        elif kind == "reset":
            self.proxy.reset_all()

    def heal(self):
        self.proxy.resume()
        super().heal()

    def close(self):
        for client in getattr(self, "clients", ()):
            client.close()
        if getattr(self, "proxy", None) is not None:
            self.proxy.close()
        if getattr(self, "server", None) is not None:
            blocking(self.server.cleanup)


class PoolTarget(Target):
    """A master and two replicas behind a ConnectionPool."""
    name = "pool"

    def start(self):
        self.rs = ReplicaSet(USER_LUA + SCHEMA, replicas=2, user=USER, password=PASSWORD,
                             cfg=TXN_CFG if transactions() else None)
        blocking(self.rs.start)
        self.master = 0
        self.wait_timeout = self.rt
        self.bound = max(self.rt, self.wait_timeout)
        self.pool = gtarantool.ConnectionPool(
            self.rs.addrs, user=USER, password=PASSWORD, request_timeout=self.rt,
            wait_timeout=self.wait_timeout, connection_timeout=self.rt, refresh_delay=0.2,
            reconnect_max_attempts=3, reconnect_delay=0.1)

    @property
    def pipeline_bound(self):
        """Its instance picked (within ``wait_timeout``), then its wait."""
        return self.wait_timeout + self.rt

    @property
    def txn_bound(self):
        """Its master picked (within ``wait_timeout``), then BEGIN, call and COMMIT."""
        return self.wait_timeout + 3 * self.rt

    def sql(self, pool, ids):
        pool.execute(_insert_sql(len(ids)), _sql_params(ids), mode=Mode.RW)

    def instances(self):
        return self.rs.servers

    def _evaluator(self, srv, lua, *args):
        return self.rs.eval(srv, lua, *args)

    def client(self, n):
        return self.pool

    def do(self, pool, kind, op_id):
        if kind == "write_call":
            return pool.call("chaos_write", op_id, mode=Mode.RW).data[0]
        if kind == "write_upsert":
            pool.upsert("chaos_count", (op_id, 1), [("+", 1, 1)])
            return None
        return pool.call("chaos_echo", op_id, mode=Mode.ANY).data[0]

    def _restart_member(self, srv, sig, down):
        self.restart(srv, sig, down)
        blocking(self.rs.mesh, [srv])

    def fault(self, kind, p):
        servers = self.rs.servers
        if kind == "switchover":
            self.switchover((self.master + p["to"]) % len(servers), p["gap"], p["fork_in_gap"])
        elif kind == "kill9_master":
            self._restart_member(servers[self.master], signal.SIGKILL, p["down"])
        elif kind == "sigterm_restart":
            self._restart_member(servers[self.c.rng_for(kind).randrange(3)], signal.SIGTERM,
                                 p["down"])
        elif kind == "sigstop":
            self.freeze(servers[self.c.rng_for(kind).randrange(3)], p["stopped"])
        elif kind == "replicaset_down":
            parallel(lambda srv: srv.stop(), servers)
            gevent.sleep(p["down"])
            order = [servers[self.master]] + [s for s in servers if s is not servers[self.master]]
            for srv in order:
                blocking(srv.start)
            blocking(self.rs.mesh)

    def switchover(self, to, gap, fork_in_gap):
        """A planned switchover: the master turns read-only, ``gap`` seconds pass
        (a fork may happen then), the new one applies everything and turns writable."""
        servers = self.rs.servers
        old, new = servers[self.master], servers[to]
        for i, srv in enumerate(servers):
            srv.cfg["read_only"] = i != to
        blocking(self.eval, old, "box.cfg{read_only = true}")
        if fork_in_gap:
            gevent.sleep(gap / 2)   # (writes refused meanwhile wait for a master)
            self.c.fork(gap + 1.0, reserved=True)
            gevent.sleep(gap / 2)
        else:
            gevent.sleep(gap)
        want, old_id = blocking(self.eval, old, "return box.info.vclock[box.info.id] or 0, "
                                                "box.info.id")
        blocking(self.eval, new, SWITCH, want, old_id, 10)
        self.master = to

    def close(self):
        if getattr(self, "pool", None) is not None:
            self.pool.close()
        if getattr(self, "rs", None) is not None:
            blocking(self.rs.cleanup)


class RouterTarget(Target):
    """Two vshard replica sets of two storages behind a Router."""
    name = "router"
    BUCKETS = BUCKETS
    pipelines = False
    sessions = False
    maps = True

    def start(self):
        from gtarantool.testing.cluster import ShardedCluster
        self.cluster = ShardedCluster(shards=2, replicas=1, bucket_count=self.BUCKETS,
                                      storage_lua=SCHEMA)
        blocking(self.cluster.start)
        self.bound = self.rt
        # (fetch_schema: copy_from through a Router reads the space's format)
        self.router = gtarantool.Router(self.cluster.cfg, timeout=self.rt,
                                        request_timeout=self.rt, connection_timeout=self.rt,
                                        refresh_delay=0.2,
                                        fetch_schema="write_copy" in self.kinds)

    def instances(self):
        return self.cluster.servers

    def _evaluator(self, srv, lua, *args):
        return self.cluster.eval(srv, lua, *args)

    def client(self, n):
        return self.router

    def do(self, router, kind, op_id):
        bucket = op_id % self.BUCKETS + 1
        if kind == "write_call":
            return router.callrw(bucket, "chaos_write", [op_id])
        if kind == "write_upsert":
            return router.callrw(bucket, "chaos_upsert", [op_id])
        return router.callro(bucket, "chaos_echo", [op_id])

    def map(self, router, op_id, buckets):
        """``map_callrw`` of ``chaos_map(op_id)``: over every master (``buckets``
        None) or the ones holding ``buckets``; the reply any master gave that
        is not ``op_id``, else ``op_id`` (None when none answered a value)."""
        results = router.map_callrw("chaos_map", [op_id, buckets or []], bucket_ids=buckets)
        values = [value for values in results.values() for value in values]
        return next((v for v in values if v != op_id), op_id if values else None)

    def fault(self, kind, p):
        rng = self.c.rng_for(kind)
        if kind == "bucket_move":
            source = self.cluster.shards[p["shard"]]
            dest = self.cluster.shards[1 - p["shard"]]
            owned = sorted(b for b, rs in blocking(self.cluster.buckets).items()
                           if rs == source.uuid)
            for bucket in rng.sample(owned, min(p["buckets"], len(owned))):
                try:
                    blocking(self.cluster.bucket_send, bucket, dest.uuid, 5)
                except Exception as exc:   # (a storage down meanwhile: the move is the fault)
                    self.c.note("bucket %d not moved: %s" % (bucket, str(exc)[:100]))
        elif kind == "switch_master":
            shard = self.cluster.shards[p["shard"]]
            master = blocking(lambda: shard.master)
            if master is not None:
                to = 1 - shard.servers.index(master)
                blocking(shard.switch_master, to)
        elif kind == "replicaset_down":
            shard = self.cluster.shards[rng.randrange(2)]
            parallel(lambda srv: srv.stop(), shard.servers)
            gevent.sleep(p["down"])
            parallel(lambda srv: srv.start(), shard.servers)
            blocking(shard.mesh)
        elif kind == "kill9":
            shard = self.cluster.shards[rng.randrange(2)]
            srv = shard.servers[rng.randrange(2)]
            self.restart(srv, signal.SIGKILL, p["down"])
            blocking(shard.mesh)

    def heal(self):
        super().heal()
        for shard in self.cluster.shards:
            blocking(shard.mesh)

    def close(self):
        if getattr(self, "router", None) is not None:
            self.router.close()
        if getattr(self, "cluster", None) is not None:
            blocking(self.cluster.cleanup)


TARGETS = {"conn": ConnTarget, "pool": PoolTarget, "router": RouterTarget}
KINDS = ("write_call", "write_upsert", "read_call", "write_copy", "write_pipeline",
         "write_sql", "write_txn", "write_map")


def transactions():
    """Whether the server runs interactive transactions (2.10+): an older
    server's campaign leaves write_txn out."""
    return binary_version() >= (2, 10)


def _insert_sql(n):
    return 'INSERT INTO "%s" ("id", "bucket_id") VALUES %s' % (
        COPY_SPACE, ", ".join(["(?, ?)"] * n))


def _sql_params(ids):
    return [v for i in ids for v in (i, i % BUCKETS + 1)]


class Campaign:
    """One seed: ``run()`` returns (history, facts, violations)."""

    def __init__(self, schedule, slack=1.0, log=print, unsafe=False):
        self.schedule = schedule
        self.slack = slack
        self.unsafe = unsafe   # run the kinds a target knows unsafe (Target.unsafe) too
        self.log = log
        self.history = h.History()
        self.stop = gevent.event.Event()
        self.ids = itertools.count(1)
        self.pid = os.getpid()
        self.cancel_share = 0.0
        self.children = []        # (pid, report path)
        self.injectors = []
        self.notes = []
        self._rngs = {}
        self.t0 = None

    def longest(self):
        """The longest bound of any call (a copy's, a pipeline's, a statement's
        and a transaction's included)."""
        return max(max(t.bound, t.copy_bound, t.pipeline_bound, t.sql_bound, t.txn_bound)
                   for t in self.targets.values())

    def rng_for(self, kind):
        """A seeded generator per fault kind, so a replay picks the same members."""
        if kind not in self._rngs:
            self._rngs[kind] = random.Random("%d-%s" % (self.schedule.seed, kind))
        return self._rngs[kind]

    def note(self, text):
        self.notes.append(text)

    # -- workload ------------------------------------------------------------------------

    def worker(self, target, n):
        me = os.getpid()
        rng = random.Random("%d-%s-%d" % (self.schedule.seed, target.name, n))
        client = target.client(n)
        while not self.stop.is_set() and os.getpid() == me:
            op = self.history.begin(new_op(next(self.ids), target, n, rng))
            self.call(target, client, op, rng)
            if os.getpid() != me:
                return   # (the copy of this greenlet in a forked child stops here)
            gevent.sleep(rng.uniform(0, 0.01))

    def call(self, target, client, op, rng):
        """Make ``op``'s call and record how it ended.  A call killed (its
        greenlet stopped from outside) keeps ``end`` None: it never returned."""
        cancel = rng.uniform(0.05, op.bound) if rng.random() < self.cancel_share else None
        timer = gevent.Timeout(cancel) if cancel else None
        try:
            if timer is not None:
                timer.start()
                op.bound = min(op.bound, cancel)
            if op.kind == "write_pipeline":
                failed = _settle_results(op, target.pipeline(client,
                                                             [row.id for row in op.rows]))
                if failed is not None:   # (the op as its first failed request)
                    _describe(op, failed)
                    return
            elif op.kind == "write_sql":   # (one statement: every row or none)
                target.sql(client, [row.id for row in op.rows])
                for row in op.rows:
                    row.state = h.WRITTEN
            elif op.rows:
                _settle(op, target.copy(client, [row.id for row in op.rows]))
            elif op.kind == "write_txn":
                op.reply = target.transaction(client, op.id)
            elif op.kind == "write_map":
                op.reply = target.map(client, op.id, op.buckets)
            else:
                op.reply = target.do(client, op.kind, op.id)
            op.outcome = "ok"
        except gevent.Timeout as exc:
            if exc is timer:
                op.outcome, op.error = "cancelled", "gevent.Timeout"
            else:   # (no other timer wraps the call: one of the library's escaped)
                self._failed(op, exc)
        except Exception as exc:
            self._failed(op, exc)
        finally:
            if op.outcome != "pending":
                op.end = time.monotonic()
            if timer is not None:
                timer.close()

    @staticmethod
    def _failed(op, exc):
        _describe(op, exc)
        report = getattr(exc, "report", None)   # (a CopyError's: the rows settled so far)
        rejected = {r.position: r for r in getattr(report, "rejected", ())}
        for k, row in enumerate(op.rows):
            if k in rejected:
                _rejected(row, rejected[k])
            else:
                row.state, row.applied = h.RAISED, op.applied

    # -- forks ---------------------------------------------------------------------------

    def fork(self, life, reserved=False):
        """Fork now (calls are in flight); the child keeps its hub running for
        ``life`` seconds with a workload of its own, then reports and exits.
        The schedule's own forks stop at one child; a fork in a switchover's gap
        (``reserved``) may add a second."""
        if os.getpid() != self.pid or len(self.children) >= (2 if reserved else 1):
            return
        index = len(self.children) + 1
        fd, path = tempfile.mkstemp(prefix="gtarantool-chaos-child-")
        os.close(fd)
        inflight = [op for op in self.history.ops if op.end is None]
        parent_sockets, forked_at = _local_sockets(), time.time()
        pid = gevent.fork()
        if pid:
            self.children.append((pid, path))
            return
        report = {"ops": [], "sockets": [], "stalls": [], "error": None}
        try:
            self.child(index, life, inflight, SocketLog(parent_sockets, forked_at), report)
        except BaseException:
            report["error"] = traceback.format_exc()
        finally:
            try:
                with open(path, "w") as f:
                    json.dump(report, f)
            finally:
                os._exit(0)

    def child(self, index, life, inflight, sockets, report):
        tag = "child-%d" % index
        ids = itertools.count(index * CHILD_BASE)
        ops = []

        def child_worker(target, client, n):
            rng = random.Random(index * 1000 + n)
            while not self.stop.is_set():
                op = new_op(next(ids), target, n, rng, proc=tag)
                ops.append(op)
                self.call(target, client, op, rng)
                gevent.sleep(rng.uniform(0, 0.01))

        # The parent's fault injectors must not go on here: copies of them would
        # restart the parent's servers a second time.
        gevent.killall([g for g in self.injectors + [self.meter.greenlet]
                        if g is not gevent.getcurrent()], block=False)
        meter = StallMeter()
        # (the copied Event: the child's own; setting it stops the copies' loops too)
        self.stop = gevent.event.Event()
        # The child's own calls go through the clients it inherited (their first
        # use here opens the child's own sockets), and one opened here.
        clients = [(t, t.client(n), n) for t in self.targets.values() for n in range(2)]
        conn_target = self.targets.get("conn")
        fresh = None
        if conn_target is not None:
            # (not connected yet: the server may be down; the first call connects)
            fresh = conn_target.connect(conn_target.server.port, connect_now=False)
            clients.append((conn_target, fresh, 2))
        own = [gevent.spawn(child_worker, *args) for args in clients]
        deadline = time.monotonic() + life
        while time.monotonic() < deadline:
            sockets.poll()
            gevent.sleep(0.02)
        self.stop.set()
        limit = time.monotonic() + self.longest() + self.slack
        while time.monotonic() < limit and any(op.end is None for op in inflight):
            sockets.poll()
            gevent.sleep(0.02)
        gevent.joinall(own, timeout=max(0.0, limit - time.monotonic()))
        gevent.killall(own, timeout=1)
        if fresh is not None:
            fresh.close()
        for op in inflight:
            op.copy, op.proc = True, tag
        report["ops"] = [h.asdict(op) for op in ops + inflight]
        report["sockets"] = sockets.windows()
        report["stalls"] = meter.stop()

    def reap(self):
        """Wait for the children: their ops, the sockets they opened (with when)
        and their hubs' stalls by child."""
        ops, sockets, stalls = [], [], {}
        for pid, path in self.children:
            try:
                with gevent.Timeout(30):
                    gevent.os.waitpid(pid, 0)
            except gevent.Timeout:
                os.kill(pid, signal.SIGKILL)
                gevent.os.waitpid(pid, 0)
            try:
                with open(path) as f:
                    report = json.load(f)
            except (OSError, ValueError):
                report = {"ops": [], "sockets": [], "stalls": [],
                          "error": "the child left no report"}
            finally:
                if os.path.exists(path):
                    os.unlink(path)
            if report.get("error"):
                self.note("child %d failed: %s" % (pid, report["error"]))
            ops.extend(h.Op.from_dict(fields) for fields in report["ops"])
            sockets.extend(tuple(s) for s in report["sockets"])
            stalls["child-%d" % (len(stalls) + 1)] = [tuple(s) for s in report["stalls"]]
        return ops, sockets, stalls

    # -- faults --------------------------------------------------------------------------

    def injector(self, target_name, faults):
        target = self.targets.get(target_name)
        for fault in faults:
            gevent.sleep(max(0.0, self.t0 + fault.at - time.monotonic()))
            if os.getpid() != self.pid:
                return
            self.note("ran at %5.2fs: %s" % (time.monotonic() - self.t0, fault))
            try:
                if target_name == "process":
                    self.process_fault(fault)
                else:
                    target.fault(fault.kind, fault.params)
            except Exception as exc:
                if os.getpid() != self.pid:
                    return
                self.note("fault %s failed: %s" % (fault, exc))

    def process_fault(self, fault):
        p = fault.params
        if fault.kind == "fork":
            self.fork(p["life"])
        elif fault.kind == "timeouts":
            self.cancel_share = p["share"]
            gevent.sleep(p["length"])
            self.cancel_share = 0.0

    # -- the run -------------------------------------------------------------------------

    def run(self):
        s = self.schedule
        self.targets = {}
        try:
            for name in s.targets:
                if name in TARGETS:
                    self.targets[name] = TARGETS[name](self)
            gevent.joinall([gevent.spawn(t.start) for t in self.targets.values()],
                           raise_error=True)
            for t in self.targets.values():
                t.read_space()
            self.t0 = time.monotonic()
            self.meter = StallMeter()
            workers = [gevent.spawn(self.worker, t, n)
                       for t in self.targets.values() for n in range(t.greenlets)]
            self.injectors = [gevent.spawn(self.injector, name,
                                           [f for f in s.faults if f.target == name])
                              for name in s.targets]
            injectors = self.injectors
            gevent.sleep(s.duration)
            while os.getpid() != self.pid:
                # (this greenlet's copy in a forked child: the child reports and exits
                # from the greenlet that forked; it must not heal or stop the servers)
                gevent.sleep(3600)
            self.stop.set()
            gevent.joinall(injectors)
            for t in self.targets.values():
                t.heal()
            # (a negative slack, which makes every call overlong, still waits
            # for the calls: only the verdict takes it)
            limit = self.longest() + max(self.slack, 0.0)
            gevent.joinall(workers, timeout=limit)
            # Stopped before the servers are read: a call that ended while they
            # were would be an acknowledged write the facts cannot hold.  Its
            # op keeps no end, and the verdict names it hung.
            gevent.killall([w for w in workers if not w.dead], timeout=5)
            child_ops, child_sockets, stalls = self.reap()
            self.history.extend(child_ops)
            facts = self.facts(child_sockets, {op.id for op in child_ops if op.copy})
            facts.stalls = dict(stalls, parent=self.meter.stop())
            return self.history, facts, h.check(self.history, facts, self.slack)
        finally:
            if getattr(self, "meter", None) is not None:
                self.meter.stop()
            for t in self.targets.values():
                try:
                    t.close()
                except Exception as exc:
                    self.note("closing %s: %s" % (t.name, exc))

    def facts(self, child_sockets, copied):
        return tally([rows for t in self.targets.values() for rows in t.facts()],
                     child_sockets, copied)


def new_op(op_id, target, n, rng, proc="parent"):
    """The next op of greenlet ``n`` on ``target``: its kind and, for a copy,
    its rows drawn from ``rng``."""
    kind = rng.choice(target.kinds)
    copy = kind in h.COPY_KINDS
    bound = (target.pipeline_bound if kind == "write_pipeline"
             else target.sql_bound if kind == "write_sql"
             else target.copy_bound if copy
             else target.txn_bound if kind == "write_txn" else target.bound)
    op = h.Op(op_id, target.label(n), kind, time.monotonic(), bound, proc=proc)
    if copy:
        op.rows = [h.Row(op_id * ROWS_PER_OP + k) for k in range(rng.randint(1, MAX_ROWS))]
    elif kind in h.MAP_KINDS and rng.random() < 0.5:   # (else a full map)
        op.buckets = sorted(rng.sample(range(1, BUCKETS + 1), rng.randint(1, 3)))
    return op


def _settle(op, report):
    """Each row's state by the copy's report: rejected with its reason, or
    written when the report accounts for every row."""
    rejected = {r.position: r for r in report.rejected}
    complete = report.written + len(rejected) == len(op.rows)
    for k, row in enumerate(op.rows):
        if k in rejected:
            _rejected(row, rejected[k])
        else:
            row.state = h.WRITTEN if complete else h.UNREPORTED


def _describe(op, exc):
    op.outcome, op.error = "error", type(exc).__name__
    op.applied = getattr(exc, "applied", None)
    op.library_error = isinstance(exc, tarantool.error.Error)
    op.detail = str(exc)[:160]



def _settle_results(op, results):
    """Each row's state by its pipeline result: written (a reply), or refused
    or failed with the exception's ``applied``.  Returns the first exception,
    None when every row was written."""
    first = None
    for row, result in zip(op.rows, results):
        if isinstance(result, BaseException):
            code = result.code if isinstance(result, tarantool.error.DatabaseError) else None
            row.state, row.applied = h.REJECTED, getattr(result, "applied", None)
            row.code = code if isinstance(code, int) else None
            row.reason = ("%s: %s" % (type(result).__name__, result))[:160]
            if first is None:
                first = result
        else:
            row.state = h.WRITTEN
    return first


def _rejected(row, rejected):
    code = getattr(rejected.error, "code", None)
    row.state, row.applied = h.REJECTED, rejected.applied
    row.code = code if isinstance(code, int) else None
    row.reason = rejected.reason[:160]


def tally(replies, child_sockets=(), copied=()):
    """``Facts`` from ``chaos_facts()``'s replies (log rows, count rows and, when
    given, copied rows, map rows and the instance's vshard replica set), one
    per instance: a log row (a map row) counts once however many instances
    hold its copy, a counter counts as its largest value on any instance, and
    a copied row is present when any instance holds it.

    :param replies: [(log rows, count rows[, copied rows[, map rows, replica
        set or '']])], one per instance.
    :param child_sockets: the sockets forked children opened, as
        [(local port, server port, opened after, closed before)] (wall times).
    :param copied: ids of the parent's ops a child held copies of (the calls in
        flight when it forked: no other parent call can reach a child's socket).
    :returns: a ``history.Facts``.
    """
    facts = h.Facts()
    logs, counts, maps = {}, {}, {}
    for reply in replies:
        log_rows, count_rows = reply[0], reply[1]
        for key, op_id, peer in log_rows:
            logs[key] = (op_id, peer)
        for key, op_id, peer, rs, held in (reply[3] if len(reply) > 3 else ()):
            maps[key] = (op_id, peer, rs, list(held or ()))
        if len(reply) > 4 and reply[4]:
            facts.replicasets.add(reply[4])
        for op_id, count in count_rows:
            counts[op_id] = max(count, counts.get(op_id, 0))
        for row_id, peer, held in (reply[2] if len(reply) > 2 else ()):
            if not held:
                facts.misplaced.add(row_id)
                continue
            facts.rows.add(row_id)
            if row_id // ROWS_PER_OP in copied and _by_child(peer, child_sockets):
                facts.by_child.add(row_id // ROWS_PER_OP)
    for op_id, peer in logs.values():
        facts.applications[op_id] = facts.applications.get(op_id, 0) + 1
        if op_id in copied and _by_child(peer, child_sockets):
            facts.by_child.add(op_id)
    for op_id, count in counts.items():
        facts.applications[op_id] = facts.applications.get(op_id, 0) + count
    for op_id, peer, rs, held in maps.values():
        facts.maps.setdefault(op_id, []).append((rs, held))
        if op_id in copied and _by_child(peer, child_sockets):
            facts.by_child.add(op_id)
    facts.misplaced -= facts.rows
    return facts


class StallMeter:
    """Records when this process's hub ran no greenlet for over ``threshold``
    seconds (a blocking call, a busy host): ``stalls`` is [(start, end)]."""

    def __init__(self, threshold=0.1, tick=0.01):
        self.threshold, self.tick = threshold, tick
        self.stalls = []
        self.greenlet = gevent.spawn(self._run)

    def _run(self):
        last = time.monotonic()
        while True:
            gevent.sleep(self.tick)
            now = time.monotonic()
            if now - last > self.threshold + self.tick:
                self.stalls.append((last + self.tick, now))
            last = now

    def stop(self):
        self.greenlet.kill(block=False)
        return self.stalls


def _local_sockets():
    """``{(local port, remote port)}`` of this process's TCP connections."""
    import psutil
    proc = psutil.Process()
    listing = getattr(proc, "net_connections", None) or proc.connections
    return {(c.laddr.port, c.raddr.port) for c in listing(kind="tcp") if c.raddr}


class SocketLog:
    """When a forked child held each TCP connection it opened: a local port is
    reused, by the parent after the child closed it or at once towards
    another server, so a write's origin names the child only when its ports
    and its time match one of these windows."""

    def __init__(self, inherited, forked_at):
        self.inherited = inherited
        self.open = {}      # (local, remote) -> opened after (the poll before it was seen)
        self.closed = []    # (local, remote, opened after, closed before)
        self.last = forked_at

    def poll(self):
        now = time.time()
        current = _local_sockets() - self.inherited
        for pair in current:
            self.open.setdefault(pair, self.last)
        for pair in [p for p in self.open if p not in current]:
            self.closed.append(pair + (self.open.pop(pair), now))
        self.last = now

    def windows(self):
        """[(local port, remote port, opened after, closed before)]: a socket
        still open is counted open until now and a little after (the child
        closes it as it exits)."""
        self.poll()
        until = time.time() + 1.0
        return self.closed + [pair + (since, until) for pair, since in self.open.items()]
