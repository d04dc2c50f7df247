"""A gevent WSGI service over Tarantool: one module-level connection and one
module-level pool, opened when the module is imported.

Under ``gunicorn --preload -k gevent`` or uWSGI's prefork (``--master
--processes N --gevent M``, the app loaded in the master) that import runs in
the master, and every worker inherits both objects: each worker's first
request opens that worker's own sockets (see docs/forks.rst); no worker ever
reads or writes another's.

Routes (JSON out; every reply names the worker's pid):

- ``GET /health``: ``{"pid": ...}``, without touching Tarantool
- ``GET /conn/<key>``, ``GET /pool/<key>``: the ``kv`` tuple of ``key``
  (the pool reads from any instance)
- ``PUT /conn/<key>``, ``PUT /pool/<key>``: body ``n`` (an unsigned integer):
  replace ``(key, n)`` (the pool writes to the master)

Settings, from the environment: ``TARANTOOL`` (``host:port`` of the
connection, default ``127.0.0.1:3301``), ``TARANTOOL_POOL`` (comma-separated
``host:port`` list, default ``TARANTOOL``), ``TARANTOOL_USER`` and
``TARANTOOL_PASSWORD``.  The ``kv`` space: ``{key: string, n: unsigned}``,
primary index on ``key`` (README.rst has the Lua).
"""
import json
import os

import gtarantool
from gtarantool import Mode


def _address(text):
    host, _, port = text.strip().rpartition(":")
    return {"host": host or "127.0.0.1", "port": int(port)}


ADDRESS = os.environ.get("TARANTOOL", "127.0.0.1:3301")
POOL = os.environ.get("TARANTOOL_POOL", ADDRESS)
USER = os.environ.get("TARANTOOL_USER") or None
PASSWORD = os.environ.get("TARANTOOL_PASSWORD") or None

# Opened at import: in the master under --preload / uWSGI's prefork.
conn = gtarantool.connect(**_address(ADDRESS), user=USER, password=PASSWORD,
                          request_timeout=5)
pool = gtarantool.ConnectionPool([_address(a) for a in POOL.split(",")], user=USER,
                                 password=PASSWORD, request_timeout=5, wait_timeout=5)


def _reply(start_response, status, payload):
    body = json.dumps(dict(payload, pid=os.getpid())).encode()
    start_response(status, [("Content-Type", "application/json"),
                            ("Content-Length", str(len(body)))])
    return [body]


def application(environ, start_response):
    method = environ["REQUEST_METHOD"]
    parts = environ.get("PATH_INFO", "").strip("/").split("/")
    if parts == ["health"]:
        return _reply(start_response, "200 OK", {})
    if len(parts) != 2 or parts[0] not in ("conn", "pool") or method not in ("GET", "PUT"):
        return _reply(start_response, "404 Not Found", {"error": "no such route"})
    via, key = parts
    try:
        if method == "PUT":
            size = int(environ.get("CONTENT_LENGTH") or 0)
            n = int(environ["wsgi.input"].read(size))
            if via == "conn":
                rows = conn.replace("kv", (key, n)).data
            else:
                rows = pool.replace("kv", (key, n)).data
        elif via == "conn":
            rows = conn.select("kv", key).data
        else:
            rows = pool.select("kv", key, mode=Mode.ANY).data
    except ValueError:
        return _reply(start_response, "400 Bad Request", {"error": "the body is not an integer"})
    except gtarantool.Error as exc:
        return _reply(start_response, "503 Service Unavailable",
                      {"error": "%s: %s" % (type(exc).__name__, exc)})
    return _reply(start_response, "200 OK", {"key": key, "rows": rows})
