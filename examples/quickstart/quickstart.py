"""The quick start: 10,000 greenlets share one connection.

Run ``tarantool init.lua`` in this directory first (it creates the ``carts``
space and the user ``app``), then ``python quickstart.py``.  ``TARANTOOL``
(``host:port``, default ``127.0.0.1:3301``) names another server.
"""
from gevent import monkey

monkey.patch_all()   # optional: the connection uses gevent's sockets anyway

import os

import gevent

import gtarantool

host, _, port = os.environ.get("TARANTOOL", "127.0.0.1:3301").rpartition(":")
tnt = gtarantool.connect(host or "127.0.0.1", int(port), user="app", password="secret",
                         request_timeout=2.0)


def handle(user_id):
    tnt.replace("carts", (user_id, "active"))
    return tnt.select("carts", user_id)[0]


jobs = [gevent.spawn(handle, i) for i in range(10000)]
gevent.joinall(jobs, raise_error=True)
print(jobs[42].value)   # [42, 'active']
print(tnt.stats)        # Stats(requests=20004, responses=20004, send_calls=85, ...)
tnt.close()
