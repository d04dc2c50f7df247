"""Which IPROTO features the connected server has, and the error when it lacks one.

Tarantool 2.10+ lists its features in its reply to IPROTO_ID (tarantool-python
sends it on connect and keeps the list in ``_server_features``); older servers
know no IPROTO_ID and have none of them.
"""
from tarantool.const import (
    IPROTO_FEATURE_PAGINATION,
    IPROTO_FEATURE_STREAMS,
    IPROTO_FEATURE_TRANSACTIONS,
    IPROTO_FEATURE_WATCH_ONCE,
    IPROTO_FEATURE_WATCHERS,
)

from gtarantool.errors import FeatureNotSupported

STREAMS = IPROTO_FEATURE_STREAMS
TRANSACTIONS = IPROTO_FEATURE_TRANSACTIONS
WATCHERS = IPROTO_FEATURE_WATCHERS
PAGINATION = IPROTO_FEATURE_PAGINATION
WATCH_ONCE = IPROTO_FEATURE_WATCH_ONCE

# feature -> (what it is called in errors, the first version that has it)
_NEEDS = {
    STREAMS: ("streams", "2.10"),
    TRANSACTIONS: ("interactive transactions", "2.10"),
    WATCHERS: ("watchers", "2.10"),
    PAGINATION: ("pagination", "2.11"),
    WATCH_ONCE: ("watch_once", "3.0"),
}


def server_version(conn):
    """The server's version as "major.minor.patch", from its greeting."""
    version = getattr(conn, "version_id", None)
    if not version:
        return "unknown"
    return "%d.%d.%d" % (version >> 16, (version >> 8) & 0xff, version & 0xff)


def require(conn, feature, deadline=None):
    """Raise FeatureNotSupported unless ``conn``'s server has ``feature``
    (connecting first when it never connected, by ``deadline``: the call's
    end, ``Connection._call_deadline()``; None: ``request_timeout`` from now)."""
    if not conn.connected or conn._transport is None:
        conn._reach(deadline)
    if feature not in (conn._server_features or ()):
        what, version = _NEEDS[feature]
        raise FeatureNotSupported("needs Tarantool %s+ (%s); server is %s"
                                  % (version, what, server_version(conn)))
