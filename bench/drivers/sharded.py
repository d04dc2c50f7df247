"""The drivers of a sharded cluster (``--shards``, ``bench.targets.sharded``): every
operation is a call of the bench's storage function on the replica set holding the key's
bucket (``bucket_id_mpcrc32`` of the key, as the application would compute it).

- ``vshard``: ``gtarantool.Router`` in each worker, configured from the Lua router at
  ``host:port``; ``greenlets`` greenlets over its pools (no Lua router on the way);
- ``router``: gtarantool, ``greenlets`` greenlets on one connection to the Lua router,
  calling ``vshard.router.callrw``/``callro`` there;
- ``router-threads``: tarantool-python the same way, ``greenlets`` threads with a
  connection each.
"""
import threading
import time

import tarantool

from bench.core.openloop import OpenPhase, serve_open
from bench.drivers.clients import GeventDriver, ThreadsDriver, serve

FUNCTIONS = {"insert": "bench_insert", "select": "bench_select", "update": "bench_update",
             "delete": "bench_delete"}
READS = ("select",)
TIMEOUT = 10.0   # seconds for one call, a bucket's moves included


def router_calls(conn, payloads, bucket_id):
    """op -> function(key) -> rows, through ``vshard.router.call*`` on the Lua router;
    an error the storage function raised is raised as the server's error."""
    def make(op):
        func, method = FUNCTIONS[op], ("vshard.router.callro" if op in READS
                                       else "vshard.router.callrw")
        # return_raw: the router forwards the storage's reply undecoded (vshard's way
        # for a proxy, and before 3.0 the only way binary fields stay binary).
        opts = {"timeout": TIMEOUT, "return_raw": True}

        def call(key):
            bucket = bucket_id(key)
            args = (bucket, key, payloads(key)) if op == "insert" else (bucket, key)
            data = conn.call(method, (bucket, func, args, opts)).data
            if data and data[0] is None and len(data) > 1:
                err = data[1]
                raise tarantool.error.DatabaseError(
                    err.get("code", 0) if isinstance(err, dict) else 0,
                    str(err.get("message", err) if isinstance(err, dict) else err))
            return data[0][0] if data and data[0] else None   # [the function's values]
        return call
    return {op: make(op) for op in FUNCTIONS}


class _Buckets:
    """The key's bucket as vshard's router computes it (``bucket_id_mpcrc32``)."""

    def __init__(self, bucket_count):
        from gtarantool.sharding import mpcrc32
        self.count, self.hash = bucket_count, mpcrc32

    def __call__(self, key):
        return self.hash(key) % self.count + 1


class VshardDriver(GeventDriver):
    """gtarantool.Router in the client: each call goes straight to its replica set."""

    copy_load = False   # (the load phase's inserts are calls of the storages' functions)

    def open(self):
        import gtarantool
        self.router = gtarantool.Router.from_router(self.host, self.port, user=self.config.user,
                                                    password=self.config.password,
                                                    timeout=TIMEOUT)
        self.server_error = gtarantool.StorageError
        router, payloads = self.router, self.payloads
        bucket_id = router.bucket_id_mpcrc32
        self.sent = {rs.name: 0 for rs in router.replicasets.values()}
        sent, route = self.sent, router.route

        def make(op):
            func = FUNCTIONS[op]
            method = router.callro if op in READS else router.callrw

            def call(key):
                bucket = bucket_id(key)
                sent[route(bucket).name] += 1
                args = (bucket, key, payloads(key)) if op == "insert" else (bucket, key)
                return method(bucket, func, args)
            return call
        self.calls = {op: make(op) for op in FUNCTIONS}

    def client(self):
        """The router (a sharded run sends the four operations only)."""
        return self.router

    def counters(self):
        """The connections' counters summed, and the requests sent to each replica set
        (``requests@rs``)."""
        total = {}
        for rs in self.router.replicasets.values():
            for instance in rs.pool.pool.values():
                for key, value in instance.conn.stats.as_dict().items():
                    total[key] = (max(total.get(key, 0), value) if key == "max_in_flight"
                                  else total.get(key, 0) + value)
        for name, n in self.sent.items():
            total["requests@" + name] = n
        return total

    def close(self):
        self.router.close()


class RouterDriver(GeventDriver):
    """gtarantool through the Lua router: ``vshard.router.callrw``/``callro`` there."""

    copy_load = False

    def open(self):
        super().open()
        bucket_count = self.conn.call("vshard.router.bucket_count").data[0]
        self.calls = router_calls(self.conn, self.payloads, _Buckets(bucket_count))


class RouterThreadsDriver(ThreadsDriver):
    """tarantool-python through the Lua router, a thread and a connection per request
    in flight."""

    def open(self):
        super().open()
        self.bucket_id = _Buckets(self.conns[0].call("vshard.router.bucket_count").data[0])

    def run(self, phase, recorder, started=None):
        lock = threading.Lock()

        def take():
            with lock:  # a generator must not be resumed by two threads at once
                return phase.take()
        def body(conn):
            calls = router_calls(conn, self.payloads, self.bucket_id)
            if isinstance(phase, OpenPhase):   # --rate: each request at its intended time
                return (serve_open, (take, recorder, calls, self.payloads, self.error_kind,
                                     time.sleep))
            return serve, (take, recorder, calls, self.payloads, self.server_error)
        threads = [threading.Thread(name="worker-%d" % i, target=target, args=args)
                   for i, (target, args) in enumerate(body(conn) for conn in self.conns)]
        if started is not None:
            started()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
