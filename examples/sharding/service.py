"""A service that shards by customer id: customers and their orders live on the
replica set that holds the customer's bucket, and gtarantool.Router sends each
call there directly (no Lua router on the way).

    python examples/sharding/service.py                       # a throwaway cluster
    python examples/sharding/service.py --router host:port    # an existing one

The throwaway cluster needs Tarantool 2.11+ (TARANTOOL=/path/to/tarantool) and
vshard (GTARANTOOL_ROCKS=a folder holding vshard/: a clone of tarantool/vshard); an
existing cluster needs ``storage.lua`` loaded on its storages.
"""
import argparse
import os

import gevent

import gtarantool

HERE = os.path.dirname(os.path.abspath(__file__))


class Customers:
    """The service's calls: each one routed by the customer's bucket."""

    def __init__(self, router):
        self.router = router

    def add(self, customer_id, name):
        bucket_id = self.router.bucket_id_mpcrc32(customer_id)
        return self.router.callrw(bucket_id, "customer_add", (bucket_id, customer_id, name),
                                  timeout=2)

    def order(self, order_id, customer_id, amount):
        # The order goes to its customer's bucket: both move together.
        bucket_id = self.router.bucket_id_mpcrc32(customer_id)
        return self.router.callrw(bucket_id, "order_add",
                                  (bucket_id, order_id, customer_id, amount), timeout=2)

    def get(self, customer_id):
        bucket_id = self.router.bucket_id_mpcrc32(customer_id)
        # A replica may answer: a read right after a write may not see it yet.
        return self.router.callbro(bucket_id, "customer_get", (customer_id,), timeout=2)

    def revenue(self):
        """Every replica set's share, summed (Ref-Map-Reduce over the masters)."""
        shares = self.router.map_callrw("revenue", timeout=5)
        return sum(values[0] for values in shares.values())


def run(router):
    service = Customers(router)

    def customer(customer_id):
        service.add(customer_id, "customer %d" % customer_id)
        for n in range(3):
            service.order(customer_id * 10 + n, customer_id, 100 + n)

    # Greenlets share each replica set's connections.
    gevent.joinall([gevent.spawn(customer, cid) for cid in range(1, 101)], raise_error=True)
    print("customer 42:", service.get(42))
    print("revenue:", service.revenue())
    for rs_id, rs in router.info()["replicasets"].items():
        print("replica set %s: %d buckets" % (rs["name"], rs["bucket_count"]))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--router", help="host:port of a Lua vshard router to read the "
                        "configuration from (default: start a throwaway cluster)")
    parser.add_argument("--user", default="storage")
    parser.add_argument("--password", default="secret")
    args = parser.parse_args()
    if args.router:
        host, _, port = args.router.rpartition(":")
        router = gtarantool.Router.from_router(host or "127.0.0.1", int(port), user=args.user,
                                               password=args.password)
        with router:
            run(router)
        return
    from gtarantool.testing.cluster import ShardedCluster, vshard_missing
    missing = vshard_missing()
    if missing:
        raise SystemExit(missing)
    with open(os.path.join(HERE, "storage.lua")) as f:
        storage_lua = f.read()
    with ShardedCluster(shards=2, storage_lua=storage_lua) as cluster:
        with gtarantool.Router(cluster.cfg, user=cluster.user,
                               password=cluster.password) as router:
            run(router)


if __name__ == "__main__":
    main()
