"""Locust scenarios for tests/test_locust.py, each run in its own process
(``python -m tests.locust_cases CASE URL``): importing Locust monkey-patches
the whole interpreter, which the rest of the test session must not get.
Prints one JSON object: what the test checks."""
import json
import os
import sys

import gevent
import locust
from locust import constant, task
from locust.env import Environment
from locust.stats import StatsError

import gtarantool
import gtarantool.locust
from gtarantool.contrib import locust as glocust


def run(user_classes, url, users, seconds):
    """Run ``users`` users in this process for ``seconds``; the Environment."""
    env = Environment(user_classes=user_classes, host=url, events=locust.events)
    runner = env.create_local_runner()
    env.events.init.fire(environment=env, runner=runner, web_ui=None)
    runner.start(users, spawn_rate=users)
    gevent.sleep(seconds)
    runner.quit()
    return env


def connections_total(url):
    (host, port), = glocust.parse_host(url)[0]
    with gtarantool.connect(host, port, user="test", password="secret") as conn:
        return conn.eval("return box.stat.net().CONNECTIONS.total").data[0]


class Pinger(glocust.TarantoolUser):
    wait_time = constant(0)

    @task
    def ping(self):
        self.client.select("tester", 1)


class UserScoped(Pinger):
    connection_scope = "user"


def lazy_connect(url):
    """50 users start at once: one connection in this process; then 5 users
    with a connection each."""
    before = connections_total(url)
    env = run([Pinger], url, 50, 1.0)
    shared = {"opened": len(glocust._opened), "report": glocust.process_report(),
              "server_connections": connections_total(url) - before - 1,
              "failures": env.stats.total.num_failures}
    glocust._on_quitting(env)
    glocust._forget_after_fork()
    before = connections_total(url)
    env = run([UserScoped], url, 5, 1.0)
    return {"shared": shared, "user": {"opened": len(glocust._opened),
                                       "server_connections": connections_total(url) - before - 1,
                                       "closed": all(conn.is_closed() for conn, _, _ in
                                                     glocust._opened)}}


def fork(url):
    """A process connection opened in the parent, then a fork: the child
    opens its own and both work."""
    parent = glocust._process_connection(url, {})
    parent.ping()
    reader, writer = os.pipe()
    pid = gevent.fork()
    if pid == 0:
        try:
            child = glocust._process_connection(url, {})
            result = {"same": child is parent, "select": child.select("tester", 1).data == [],
                      "opened": len(glocust._opened)}
        except Exception as exc:
            result = {"error": repr(exc)}
        os.write(writer, json.dumps(result).encode())
        os._exit(0)
    os.close(writer)
    gevent.os.waitpid(pid, 0)
    child = json.loads(os.read(reader, 10000).decode())
    return {"child": child, "parent_ok": parent.ping(notime=True) == "Success"}


class Slow(glocust.TarantoolUser):
    wait_time = constant(0)
    # (a margin a loaded host keeps: only the slow call may time out)
    connection_options = {"request_timeout": 0.3}

    @task
    def slow(self):
        self.client.call("sleep_and_return", 1.0, 1)

    @task
    def refused(self):
        self.client.call("raise_error", "no")


class Expected(Slow):
    expected_errors = {555}
    seen = []   # what the tasks saw (an assert in a task would only be logged)

    @task
    def refused(self):
        reply = self.client.call("raise_error", "no")
        self.seen.append(["returned", reply.return_code, reply.return_message, reply.data == []])

    @task
    def unexpected(self):
        try:
            self.client.eval("box.error{code = 556, reason = 'no'}")
        except glocust.RequestFailed as exc:
            self.seen.append(["raised", exc.error.code, str(exc), None])
            raise


def naming(url):
    """Error rows: one per kind, whatever the sync ids and messages."""
    out = {}
    for cls in (Slow, Expected):
        env = run([cls], url, 10, 1.0)
        out[cls.__name__] = {
            "errors": sorted([e.method, e.name, StatsError.parse_error(
                e.error), e.occurrences] for e in env.stats.errors.values()),
            "requests": {e.name: [e.num_requests, e.num_failures]
                         for e in env.stats.entries.values()}}
        glocust._on_quitting(env)
        glocust._forget_after_fork()
    out["seen"] = sorted(set(map(tuple, Expected.seen)))
    return out


class Methods(glocust.TarantoolUser):
    wait_time = constant(0.01)

    @task
    def steps(self):
        client = self.client
        with client.measure("good step"):
            client.space("tester").select(1)
            client.replace("kv", ("k", 1))
            client.upsert("kv", ("k", 1), [("+", 1, 1)])
            client.update("kv", "k", [("+", 1, 1)])
            client.delete("kv", "k")
            client.eval("return ...", 1)
            client.execute("SELECT 1")
            client.ping()
        with client.measure("bad step"):
            client.call("raise_error", "no")


def methods(url):
    """Every method's request name, and measure() steps."""
    env = run([Methods], url, 2, 1.0)
    return {"entries": sorted([e.method, e.name, e.num_requests > 0, e.num_failures > 0]
                              for e in env.stats.entries.values()),
            "errors": sorted([e.method, e.name, StatsError.parse_error(e.error)]
                             for e in env.stats.errors.values())}


class Tagged(Methods):
    def context(self):
        return {"tenant": "t1"}


def contexts(url):
    """Every request and step event carries the user's context(), which Locust's
    own listeners (run_single_user's PrintListener) take as an argument."""
    from locust import log
    from locust.debug import PrintListener
    env = Environment(user_classes=[Tagged], host=url, events=locust.events)
    seen = []
    listener = env.events.request.add_listener(lambda **kw: seen.append(kw.get("context")))
    printed = PrintListener(env)
    log.unhandled_greenlet_exception = False
    try:
        Tagged(env).steps()
    except glocust.RequestFailed:
        pass
    env.events.request.remove_listener(listener)
    env.events.request.remove_listener(printed.on_request)
    return {"events": len(seen), "contexts": sorted({repr(c) for c in seen}),
            "listener_failed": log.unhandled_greenlet_exception}


def killed_connect(url):
    """The user opening the process's connection is killed while it connects
    (a server that never greets): the user waiting for it, and a later one,
    try again (the server now refuses) instead of waiting forever."""
    import socket
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    silent = "tarantool://test@127.0.0.1:%d" % listener.getsockname()[1]
    first = gevent.spawn(glocust._process_connection, silent, {})
    gevent.sleep(0.1)
    waiting = gevent.spawn(glocust._process_connection, silent, {})
    gevent.sleep(0.1)
    first.kill()
    listener.close()
    out = {}
    for name, get in (("waiting", waiting.get),
                      ("later", lambda: glocust._process_connection(silent, {}))):
        try:
            with gevent.Timeout(3):
                get()
            out[name] = "connected"
        except gevent.Timeout:
            out[name] = "hung"
        except Exception as exc:   # noqa: BLE001
            out[name] = type(exc).__name__
    waiting.kill()
    return out


def selects(url):
    """Each instance's box.stat SELECT total."""
    counts = []
    for host, port in glocust.parse_host(url)[0]:
        with gtarantool.connect(host, port, user="test", password="secret") as conn:
            counts.append(conn.eval("return box.stat().SELECT.total").data[0])
    return counts


class PoolUser(Pinger):
    @task
    def ping_any(self):
        self.client.ping(notime=True, mode=gtarantool.Mode.ANY)


def pool(url):
    """Several instances in --host: one ConnectionPool per process, selects
    spread over the instances; then a pool none of whose instances answers."""
    before = selects(url)
    env = run([PoolUser], url, 10, 1.0)
    after = selects(url)
    out = {"opened": [type(conn).__name__ for conn, _, _ in glocust._opened],
           "selects": [b - a for a, b in zip(before, after)],
           "names": sorted(e.name for e in env.stats.entries.values()),
           "failures": env.stats.total.num_failures,
           "report": glocust.process_report()}
    glocust._on_quitting(env)
    glocust._forget_after_fork()
    dead = "tarantool://127.0.0.1:1,127.0.0.1:2"
    env = run([PoolUser], dead, 5, 1.0)
    out["dead"] = {"exit_code": env.process_exit_code,
                   "errors": [[e.name, e.error, e.occurrences] for e in env.stats.errors.values()]}
    return out


class Counting:
    """Counts Locust's pauses between its tasks: skipped (no hub pass) or slept."""
    counts = {"skipped": 0, "slept": 0}

    def _pause(self, seconds):
        Counting.counts["skipped" if self._replied and seconds <= 0 else "slept"] += 1
        super()._pause(seconds)


class Pauses(Counting, Pinger):
    pass


class Idle(Counting, glocust.TarantoolUser):
    wait_time = constant(0)

    @task
    def nothing(self):
        pass   # no request: every pause must still pass through the hub


class Patient(Counting, Pinger):
    wait_time = constant(0.1)


def pauses(url):
    """Locust's pause between tasks after each kind of task, and whether
    another greenlet (a ticker) still runs meanwhile."""
    out = {}
    for cls in (Pauses, Idle, Patient):
        Counting.counts = {"skipped": 0, "slept": 0}
        ticks = [0]

        def tick():
            while True:
                ticks[0] += 1
                gevent.sleep(0.001)
        ticker = gevent.spawn(tick)
        env = run([cls], url, 5, 0.5)
        ticker.kill()
        out[cls.__name__] = dict(Counting.counts, ticks=ticks[0],
                                 requests=env.stats.total.num_requests)
        glocust._on_quitting(env)
        glocust._forget_after_fork()
    return out


def pace(url):
    """A local run's own report: its busy share."""
    glocust._forget_after_fork()
    env = run([Pinger], url, 5, 0.5)
    report = glocust.worker_reports(env)["local"]
    glocust._forget_after_fork()
    return {"report": {key: report[key] for key in ("cpu_seconds", "wall_seconds",
                                                     "queued_seconds", "busy")}}


def imports(url):
    """What importing the integration (and its alias) did to Locust."""
    alias = gtarantool.locust
    return {"alias": sorted(name for name in alias.__all__
                            if getattr(alias, name) is getattr(glocust, name)),
            "all": sorted(glocust.__all__),
            "bucket_module": locust.stats.bucket_response_time.__module__,
            "percentile_module": locust.stats.StatsEntry.percentile.__module__}


class ShardedUser(glocust.TarantoolUser):
    """Calls through gtarantool.Router (tarantool+vshard://) on the storages of
    tests/test_sharding.py's cluster."""
    wait_time = constant(0)
    expected_errors = set()

    @task
    def put_get(self):
        router = self.client.connection
        key = id(self) % 100_000 + self.environment.runner.user_count
        bucket_id = router.bucket_id_mpcrc32(key)
        self.client.callro(bucket_id, "kv_get", (bucket_id, key), timeout=5)
        self.client.callbro(bucket_id, "kv_get", (bucket_id, key), timeout=5)
        try:
            self.client.callrw(bucket_id, "kv_fail", ("locust failure",), timeout=5)
        except glocust.RequestFailed:
            pass
        self.client.map_callrw("kv_count", timeout=5)


def vshard(url):
    """tarantool+vshard://: one Router per process; each call named by its function."""
    env = run([ShardedUser], url, 4, 1.0)
    out = {"opened": [type(conn).__name__ for conn, _, _ in glocust._opened],
           "entries": sorted([e.method, e.name, e.num_requests > 0, e.num_failures > 0]
                             for e in env.stats.entries.values()),
           "errors": sorted([e.name, StatsError.parse_error(e.error)]
                            for e in env.stats.errors.values()),
           "report": glocust.process_report()}
    glocust._on_quitting(env)
    return out


def url_options(url):
    """Options in the --host URL take the connection's types; a bad one is said."""
    sep = "&" if "?" in url else "?"
    _, _, _, options = glocust.parse_host(
        url + sep + "max_in_flight=10&lazy_errors=false&reconnect_max_attempts=2"
        "&request_timeout=1.5&strategy=x")
    bad = []
    for extra in ("max_in_flight=ten", "lazy_errors=maybe", "request_timeout=soon"):
        try:
            glocust.parse_host(url + sep + extra)
        except ValueError as exc:
            bad.append(str(exc))
    return {"options": options, "bad": bad}


ONE_SERVER = ("lazy_connect", "fork", "naming", "methods", "pauses", "pace", "imports",
              "url_options", "contexts", "killed_connect")


if __name__ == "__main__":
    # "all": every case that needs one server, in one process (Locust's import is slow)
    case, url = sys.argv[1:3]
    names = ONE_SERVER if case == "all" else [case]
    print(json.dumps({name: globals()[name](url) for name in names}), flush=True)
