"""The ``--pool`` driver: a ``gtarantool.ConnectionPool`` per worker process over a
replica set (``bench.targets.replicaset``); selects go to read-only instances, writes to
the read-write one."""
from bench.core.hosts import parse_hosts
from bench.drivers.clients import GeventDriver, tarantool_calls


class PoolDriver(GeventDriver):
    """gtarantool.ConnectionPool: ``greenlets`` greenlets over one pool per process;
    selects on read-only instances, writes on the read-write one."""

    select_mode = "RO"   # a tarantool.Mode name

    def open(self):
        import gtarantool
        hosts = parse_hosts(self.host)
        self.pool = gtarantool.ConnectionPool(
            [{"host": h, "port": p} for h, p in hosts], user=self.config.user,
            password=self.config.password)
        # Each connection loads the space's schema before the measured phases.
        for instance in self.pool.pool.values():
            instance.conn.select(self.config.space, 0)
        self.calls = tarantool_calls(self.pool, self.config.space, self.payloads)
        pool, space, mode = self.pool, self.config.space, gtarantool.Mode[self.select_mode]
        self.calls["select"] = lambda key: pool.select(space, key, mode=mode).data
        self.copy_info = self._copy_info(self.pool)   # (a load goes to the master)

    def client(self):
        return self.pool

    def counters(self):
        """The connections' counters summed, and the requests each instance got
        (``requests@host:port``)."""
        total = {}
        for name, instance in self.pool.pool.items():
            for key, value in instance.conn.stats.as_dict().items():
                total[key] = max(total.get(key, 0), value) if key == "max_in_flight" \
                    else total.get(key, 0) + value
            total["requests@%s" % name] = instance.requests
        return total

    def close(self):
        self.pool.close()
