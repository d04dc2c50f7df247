"""A Flask app over Tarantool, served by gunicorn's gevent workers.

::

    gunicorn --preload -k gevent -w 2 -b 127.0.0.1:8000 app:app

The connection is made at import, with ``connect_now=False``: under
``--preload`` the import runs in gunicorn's master, which then holds no socket;
each worker connects on its first request, and its greenlets share that one
connection.  ``request_timeout`` bounds every call (without it a call waits as
long as the server takes).

Routes (JSON): ``GET /health``; ``GET /carts/<user_id>``; ``PUT
/carts/<user_id>`` with the status as the body.  Settings: ``TARANTOOL``
(``host:port``, default ``127.0.0.1:3301``), ``TARANTOOL_USER`` and
``TARANTOOL_PASSWORD`` (default ``app`` / ``secret``).  The ``carts`` space and
the user: ``examples/quickstart/init.lua``.
"""
import os

from flask import Flask, jsonify, request

import gtarantool

host, _, port = os.environ.get("TARANTOOL", "127.0.0.1:3301").rpartition(":")
tnt = gtarantool.connect(host or "127.0.0.1", int(port),
                         user=os.environ.get("TARANTOOL_USER", "app"),
                         password=os.environ.get("TARANTOOL_PASSWORD", "secret"),
                         request_timeout=2.0, connect_now=False)

app = Flask(__name__)


@app.get("/health")
def health():
    return jsonify(pid=os.getpid())


@app.get("/carts/<int:user_id>")
def get_cart(user_id):
    rows = tnt.select("carts", user_id).data
    if not rows:
        return jsonify(error="no cart", pid=os.getpid()), 404
    return jsonify(user_id=rows[0][0], status=rows[0][1], pid=os.getpid())


@app.put("/carts/<int:user_id>")
def put_cart(user_id):
    status = request.get_data(as_text=True)
    row = tnt.replace("carts", (user_id, status))[0]
    return jsonify(user_id=row[0], status=row[1], pid=os.getpid())


@app.errorhandler(gtarantool.Error)
def tarantool_error(exc):
    # A timeout, a lost connection or a refusal: the client may retry later.
    return jsonify(error="%s: %s" % (type(exc).__name__, exc), pid=os.getpid()), 503
