"""Every IPROTO request type, body key, iterator and error code the connector uses, each
defined once: tarantool-python's (``tarantool.const``) re-exported, the ones it
lacks defined here with Tarantool's names (``iproto_constants.h``, ``errcode.h``).
"""
from tarantool.const import (  # noqa: F401 - re-exported
    IPROTO_CHUNK,
    IPROTO_DATA,
    IPROTO_ERROR,
    IPROTO_ERROR_24,
    IPROTO_EXPR,
    IPROTO_FUNCTION_NAME,
    IPROTO_GREETING_SIZE,
    IPROTO_INDEX_ID,
    IPROTO_ITERATOR,
    IPROTO_KEY,
    IPROTO_LIMIT,
    IPROTO_METADATA,
    IPROTO_OFFSET,
    IPROTO_OPS,
    IPROTO_REQUEST_TYPE,
    IPROTO_SCHEMA_ID,
    IPROTO_SPACE_ID,
    IPROTO_SQL_BIND,
    IPROTO_SQL_TEXT,
    IPROTO_SYNC,
    IPROTO_TUPLE,
    ITERATOR_ALL,
    ITERATOR_BITSET_ALL_NOT_SET,
    ITERATOR_BITSET_ALL_SET,
    ITERATOR_BITSET_ANY_SET,
    ITERATOR_EQ,
    ITERATOR_GE,
    ITERATOR_GT,
    ITERATOR_LE,
    ITERATOR_LT,
    ITERATOR_NEIGHBOR,
    ITERATOR_OVERLAPS,
    ITERATOR_REQ,
    REQUEST_TYPE_CALL,
    REQUEST_TYPE_CALL16,
    REQUEST_TYPE_DELETE,
    REQUEST_TYPE_ERROR,
    REQUEST_TYPE_EVAL,
    REQUEST_TYPE_EXECUTE,
    REQUEST_TYPE_INSERT,
    REQUEST_TYPE_PING,
    REQUEST_TYPE_REPLACE,
    REQUEST_TYPE_SELECT,
    REQUEST_TYPE_UPDATE,
    REQUEST_TYPE_UPSERT,
)

# Request types tarantool.const lacks
IPROTO_PREPARE = 13
IPROTO_BEGIN = 14              # streams and transactions: 2.10+
IPROTO_COMMIT = 15
IPROTO_ROLLBACK = 16
IPROTO_WATCH = 74              # watchers: 2.10+
IPROTO_UNWATCH = 75
IPROTO_EVENT = 76              # a watcher's notification (sent by the server)
IPROTO_WATCH_ONCE = 77         # 3.0+

# Header and body keys tarantool.const lacks
IPROTO_STREAM_ID = 0x0a
IPROTO_FETCH_POSITION = 0x1f   # pagination: 2.11+
IPROTO_AFTER_POSITION = 0x2e
IPROTO_AFTER_TUPLE = 0x2f
IPROTO_BIND_METADATA = 0x33
IPROTO_BIND_COUNT = 0x34
IPROTO_POSITION = 0x35         # a reply's pagination position
IPROTO_STMT_ID = 0x43
IPROTO_TIMEOUT = 0x56
IPROTO_EVENT_KEY = 0x57
IPROTO_EVENT_DATA = 0x58
IPROTO_TXN_ISOLATION = 0x59

# Error codes (box.error)
ER_TUPLE_FOUND = 3              # a duplicate key
ER_READONLY = 7
ER_PROC_LUA = 32
ER_NO_SUCH_PROC = 33
ER_ACCESS_DENIED = 42
ER_WRONG_SCHEMA_VERSION = 109
ER_LOADING = 116
ER_SQL_EXECUTE = 159           # an SQL statement refused (a prepared one: "statement has expired")
ER_WRONG_QUERY_ID = 211         # no prepared statement has that id (in this session)
ER_UNCOMMITTED_FOREIGN_SYNC_TXNS = 214
ER_SYNC_QUEUE_UNCLAIMED = 227
ER_SYNC_QUEUE_FOREIGN = 228
