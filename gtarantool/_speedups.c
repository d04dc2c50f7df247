/* The hot paths of transport.py in C, for what nearly every request does:
 * Requester (below) sends a request and waits, as TransportState.request; and
 * the reader's inner loop, what transport.Transport._cut does, written out in
 * Python there.
 *
 * The boundary with transport.py: a transport is a TransportCore (below),
 * whose fields hold the state the C paths share with the Python code (read
 * here as struct fields, never looked up by name), whose request method is
 * the transport's, and whose rare paths go back to Python through the hooks
 * listed in TRANSPORT_HOOKS (documented methods of transport.Transport).
 *
 *
 * ReplyCutter(pending, ready, unpackb, options, response_type, sink_type,
 * pushes_type, defer_after=64).cut(data, pos, end, limit, wake) takes the
 * whole frames of data[pos:end], one after another, while each is a reply
 * whose header it reads (see read_header): Tarantool writes every reply in
 * one of
 *
 *     0xce len32 | 0x83 0x00 0xce code32 0x01 0xcf sync64 0x05 0xce schema32 | body
 *     0xce len32 | 0x83 0x00 0xce code32 0x01 0xcf sync64 0x05 0xcf schema64 | body
 *
 * (up to 2.9, and since 2.10), checked byte by byte; any other map of
 * msgpack uints is parsed (widths, key order, extra keys).  It answers a
 * request in `pending` (sync -> waiter) whose waiter is a greenlet or a
 * sink_type (transport.ReplySink).  For a greenlet it pops the
 * waiter, decodes the body as unpackb(body, use_list=, raw=,
 * strict_map_key=False, ext_hook=) does (options gives the three; it calls
 * unpackb only for what its own decoder declines, see Reader), and appends
 * (waiter, value) to `ready`: value is the response_type object for an OK
 * reply whose body is a map, otherwise the tuple (sync, code, schema version,
 * body or the exception decoding it raised, None), where an error reply's
 * body stays bytes (protocol.make_response decodes it when it is read;
 * decode_error() below is how).  After the first defer_after replies of one
 * cut(), an OK reply is queued as a RawReply (its body's bytes) instead,
 * decoded by finish(raw) when its caller takes it (Requester does): a read
 * brings hundreds of replies at 1,000 greenlets, and decoded at once they were
 * alive when the cyclic GC ran (which their own allocations set off), were
 * promoted, and set off full collections, which dominate the client's CPU at
 * 10,000 greenlets.  A RawReply holds ints and bytes only: the GC does not
 * track it.  (The Python twin decodes every reply as it takes it.)  For a
 * sink (a SinkCore, below) it stores (code, schema version, body bytes) in
 * sink.replies[sync] and appends (sink, None) to `wake` when sink.outstanding
 * comes down to 0; for a checking sink, the same in its owner, except that a
 * success (code 0) is stored as CHECKED: nothing of its body is copied.  It stops at
 * the first frame it does not take (a header read_header does not read, too
 * long, incomplete, a push, a sync not in `pending`, a pushes_type waiter) and returns where that
 * frame starts and how many replies it stored in sinks without a wake-up:
 * the Python code decides about the rest.  receive_lone(fd, buffer, limit)
 * is a lone request's receive: one read, and the reply taken when the read
 * brought exactly one that cut() would hand to a greenlet; LoneReader (below),
 * the read watcher's callback, makes that receive and switches to the caller.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#if PY_VERSION_HEX < 0x030A0000
/* setup.py marks the extension optional: older Pythons build without it
 * and run transport.py's and protocol.py's Python paths. */
#error "needs Python 3.10 or later (Py_NewRef, PyModule_AddObjectRef)"
#endif
#include <structmember.h>
#include <stdint.h>
#include <errno.h>
#include <sys/uio.h>
#include <unistd.h>
#include <pthread.h>

#define HEADER_SIZE 28          /* length prefix and header, 2.6's layout above */
#define HEADER_SIZE_64 32       /* the same, with the schema version as uint64 (2.10+) */
#define IPROTO_CHUNK 0x80
#define IPROTO_TYPE_ERROR 0x8000   /* and above: an error reply (0x8000 | error code) */
#define IPROTO_DATA 0x30
#define REQUEST_HEADER_SIZE 24    /* a request's length prefix and header */

/* Bumped in the child of every fork(): os.fork's, multiprocessing's, or one
 * made from C without Python's at-fork hooks (uWSGI's prefork), since
 * pthread_atfork's child handlers run for all of them.  A Requester and a
 * LoneReader keep the value their transport was opened under and leave a
 * call made under another to the Python method, which gives the parent's
 * socket up without touching it (Transport._inherited).  Only the forking
 * thread runs in the child when it is written. */
static unsigned long fork_generation;
static int fork_handler_installed;

static void
after_fork_in_child(void)
{
    fork_generation++;
}

static PyObject *unpack_kwnames, *data_key, *zero, *one,
    *empty_tuple, *str_switch, *str_popleft, *str_requests, *str_send_calls,
    *str_bytes_out, *str_max_in_flight,
    *unpack_escaped_kwnames, *str_backslashreplace,
    *str_handle_error,
    *str_recv_calls, *str_bytes_in, *str_responses;

/* The hooks: the methods of a transport (transport.Transport) that the C
 * paths call for what they hand back to the Python code, by these names (see
 * TransportCore below; the module's TRANSPORT_HOOKS lists them, and
 * transport.TransportState.HOOKS must match it). */
enum { H_REQUEST_GENERAL, H_FORGET, H_SWITCHED_EARLY, H_AFTER_SEND, H_FLUSH_EARLY,
       H_AFTER_LONE_RECEIVE, H_HAND_ON, H_FLUSH, N_HOOKS };
static const char *hook_names[N_HOOKS] = {
    "request_general", "forget", "switched_early", "after_send", "flush_early",
    "after_lone_receive", "hand_on", "flush"};
static PyObject *hooks[N_HOOKS];   /* their interned names */

/* ResponseCore: the fields of a response (protocol.responses.Response and
 * its siblings derive from it; from their Python twin,
 * protocol.responses.ResponseFields, without a compiler), each a member of
 * the name tarantool-python's Response gives it, set here as struct fields:
 *
 *     conn  _sync  _code  _body  _schema_version  _return_code  _data  _size
 *
 * (_size: the reply's bytes on the wire, set by the reader's fast paths), and
 * `data`, _data read-only: tarantool-python's property, read on nearly every
 * reply, as a member (no Python call).  A body that is only {IPROTO_DATA:
 * rows} (nearly every reply's) is kept as `rows`, and _body makes the map
 * when first read: most callers read data, never the body.
 * Anything else a response holds (an error's _return_message ...) is an
 * ordinary attribute of the Python class. */
typedef struct {
    PyObject_HEAD
    PyObject *conn, *sync, *code, *body, *schema_version, *return_code, *data, *size;
    PyObject *rows;   /* the body's one value, while body is NULL (see above) */
} ResponseCore;

#define RESPONSE_MEMBER(name, field) \
    {name, T_OBJECT_EX, offsetof(ResponseCore, field), 0, NULL}

static PyMemberDef ResponseCore_members[] = {
    RESPONSE_MEMBER("conn", conn),
    RESPONSE_MEMBER("_sync", sync),
    RESPONSE_MEMBER("_code", code),
    RESPONSE_MEMBER("_schema_version", schema_version),
    RESPONSE_MEMBER("_return_code", return_code),
    RESPONSE_MEMBER("_data", data),
    RESPONSE_MEMBER("_size", size),
    {"data", T_OBJECT_EX, offsetof(ResponseCore, data), READONLY,
     "Contains the list of tuples for SELECT, REPLACE and DELETE requests and arbitrary "
     "data for CALL."},
    {NULL}
};

static int
ResponseCore_traverse(ResponseCore *self, visitproc visit, void *arg)
{
    Py_VISIT(self->conn);
    Py_VISIT(self->sync);
    Py_VISIT(self->code);
    Py_VISIT(self->body);
    Py_VISIT(self->schema_version);
    Py_VISIT(self->return_code);
    Py_VISIT(self->data);
    Py_VISIT(self->size);
    Py_VISIT(self->rows);
    return 0;
}

static int
ResponseCore_clear(ResponseCore *self)
{
    Py_CLEAR(self->conn);
    Py_CLEAR(self->sync);
    Py_CLEAR(self->code);
    Py_CLEAR(self->body);
    Py_CLEAR(self->schema_version);
    Py_CLEAR(self->return_code);
    Py_CLEAR(self->data);
    Py_CLEAR(self->size);
    Py_CLEAR(self->rows);
    return 0;
}

/* _body: the body map, made from `rows` when first read */
static PyObject *
ResponseCore_get_body(ResponseCore *self, void *closure)
{
    if (self->body == NULL && self->rows != NULL) {
        PyObject *body = PyDict_New();

        if (body == NULL || PyDict_SetItem(body, data_key, self->rows) < 0) {
            Py_XDECREF(body);
            return NULL;
        }
        self->body = body;
        Py_CLEAR(self->rows);
    }
    if (self->body == NULL) {
        PyErr_Format(PyExc_AttributeError, "'%.200s' object has no attribute '_body'",
                     Py_TYPE(self)->tp_name);
        return NULL;
    }
    return Py_NewRef(self->body);
}

static int
ResponseCore_set_body(ResponseCore *self, PyObject *value, void *closure)
{
    if (value == NULL && self->body == NULL && self->rows == NULL) {
        PyErr_Format(PyExc_AttributeError, "'%.200s' object has no attribute '_body'",
                     Py_TYPE(self)->tp_name);
        return -1;
    }
    Py_CLEAR(self->rows);
    Py_XSETREF(self->body, Py_XNewRef(value));
    return 0;
}

static PyGetSetDef ResponseCore_getset[] = {
    {"_body", (getter)ResponseCore_get_body, (setter)ResponseCore_set_body, NULL, NULL},
    {NULL}
};

static void
ResponseCore_dealloc(ResponseCore *self)
{
    PyObject_GC_UnTrack(self);
    ResponseCore_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject ResponseCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gtarantool._speedups.ResponseCore",
    .tp_basicsize = sizeof(ResponseCore),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The fields of a response (see ResponseCore in _speedups.c); "
              "protocol.responses.Response derives from it.",
    .tp_new = PyType_GenericNew,
    .tp_members = ResponseCore_members,
    .tp_getset = ResponseCore_getset,
    .tp_traverse = (traverseproc)ResponseCore_traverse,
    .tp_clear = (inquiry)ResponseCore_clear,
    .tp_dealloc = (destructor)ResponseCore_dealloc,
};

/* How bodies are decoded and OK replies built: a ReplyCutter's own references,
 * or responses()'s borrowed arguments. */
typedef struct {
    PyObject *unpackb, *use_list, *raw, *ext_hook;
    PyTypeObject *response_type;   /* a ResponseCore subtype */
} Decoding;

typedef struct {
    PyObject_HEAD
    PyObject *pending;          /* dict */
    PyObject *ready_append;     /* bound deque.append */
    PyObject *sink_type, *pushes_type;
    Decoding decoding;
    /* the last reply's schema version and size as ints, which the next reply
     * most often shares: no allocation per reply for them */
    PyObject *schema, *size;
    uint64_t schema_value;
    Py_ssize_t size_value;
    Py_ssize_t defer_after;     /* replies of one cut() decoded as they are taken */
} ReplyCutter;

/* defer_after's default: the rest of a cut()'s OK replies are left to their callers */
#define DEFER_AFTER 64

/* An OK reply to a caller's greenlet, queued undecoded (see the top). */
typedef struct {
    PyObject_HEAD
    PyObject *sync, *schema, *size;   /* ints */
    PyObject *body;                   /* bytes */
} RawReply;

static void
RawReply_dealloc(RawReply *self)
{
    Py_XDECREF(self->sync);
    Py_XDECREF(self->schema);
    Py_XDECREF(self->size);
    Py_XDECREF(self->body);
    PyObject_Free(self);
}

static PyTypeObject RawReplyType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gtarantool._speedups.RawReply",
    .tp_basicsize = sizeof(RawReply),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An OK reply's body, undecoded: ReplyCutter.finish(raw) decodes it.",
    .tp_dealloc = (destructor)RawReply_dealloc,
};

/* SinkCore: the fields of a sink (transport.ReplySink derives from it; from
 * its Python twin, transport.SinkFields, without a compiler), where a
 * pipeline's replies go, each a member of the same name, set here as struct
 * fields:
 *
 *     syncs        list: the requests' syncs, in order
 *     replies      dict: sync -> (code, schema version, body bytes), CHECKED
 *                  or the exception that request failed with
 *     outstanding  int: replies still awaited
 *     waiter       the gevent Waiter of the greenlet waiting for them, or None
 *     owner        None, or the sink whose requests this one checks: a
 *                  request registered under it gets CHECKED in its owner's
 *                  replies for a success (code 0, nothing of the body kept),
 *                  and its reply as any other's for an error; its owner's
 *                  outstanding and waiter count
 *
 * CHECKED (the module's, equal to transport.CHECKED) is (0, None, b""). */
typedef struct {
    PyObject_HEAD
    PyObject *syncs, *replies, *outstanding, *waiter, *owner;
} SinkCore;

static PyObject *checked_reply;   /* CHECKED */

#define SINK_MEMBER(name, field) \
    {name, T_OBJECT_EX, offsetof(SinkCore, field), 0, NULL}

static PyMemberDef SinkCore_members[] = {
    SINK_MEMBER("syncs", syncs),
    SINK_MEMBER("replies", replies),
    SINK_MEMBER("outstanding", outstanding),
    SINK_MEMBER("waiter", waiter),
    SINK_MEMBER("owner", owner),
    {NULL}
};

static int
SinkCore_traverse(SinkCore *self, visitproc visit, void *arg)
{
    Py_VISIT(self->syncs);
    Py_VISIT(self->replies);
    Py_VISIT(self->outstanding);
    Py_VISIT(self->waiter);
    Py_VISIT(self->owner);
    return 0;
}

static int
SinkCore_clear(SinkCore *self)
{
    Py_CLEAR(self->syncs);
    Py_CLEAR(self->replies);
    Py_CLEAR(self->outstanding);
    Py_CLEAR(self->waiter);
    Py_CLEAR(self->owner);
    return 0;
}

static void
SinkCore_dealloc(SinkCore *self)
{
    PyObject_GC_UnTrack(self);
    SinkCore_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject SinkCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gtarantool._speedups.SinkCore",
    .tp_basicsize = sizeof(SinkCore),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The fields of a sink (see SinkCore in _speedups.c); "
              "transport.ReplySink derives from it.",
    .tp_new = PyType_GenericNew,
    .tp_members = SinkCore_members,
    .tp_traverse = (traverseproc)SinkCore_traverse,
    .tp_clear = (inquiry)SinkCore_clear,
    .tp_dealloc = (destructor)SinkCore_dealloc,
};

/* The field `value` of a SinkCore (borrowed), or NULL with the AttributeError
 * an unset slot raises. */
static PyObject *
sink_field(PyObject *sink, PyObject *value, const char *name)
{
    if (value == NULL)
        PyErr_Format(PyExc_AttributeError, "'%.100s' object has no attribute '%s'",
                     Py_TYPE(sink)->tp_name, name);
    return value;
}

static inline uint32_t
be32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static inline uint64_t
be64(const unsigned char *p)
{
    return ((uint64_t)be32(p) << 32) | be32(p + 4);
}

/* Every object's fields are set once, by __init__, and stay while it lives:
 * a method keeps using them across calls that run Python (an ext_hook, a
 * switch), so a second __init__ is refused; before the first, methods raise. */
static int
initialised(PyObject *self, const void *field, int want)
{
    if ((field != NULL) == want)
        return 1;
    PyErr_Format(want ? PyExc_TypeError : PyExc_RuntimeError,
                 want ? "%.100s object was not initialised (its __init__ was not called)"
                      : "%.100s object is initialised already", Py_TYPE(self)->tp_name);
    return 0;
}

/* msgpack, decoded as msgpack.unpackb(data, use_list=, raw=,
 * strict_map_key=False) decodes it, for the types replies are made of (with
 * `escape`, as unpackb(..., unicode_errors="backslashreplace")).  It
 * declines (NULL, no error set) whatever it does not decode exactly as unpackb
 * would: ext types (ext_hook's), anything malformed or truncated, invalid
 * UTF-8 (without `escape`), unhashable map keys, nesting deeper than
 * MAX_DEPTH; decode_body then calls unpackb, which decides.  (unpackb's call
 * costs as much as decoding a small body: its keyword arguments and its
 * context, per call.) */
#define MAX_DEPTH 256

typedef struct {
    const unsigned char *p, *end;
    int use_list, raw, escape;
    /* with escape: the last string escaped and the bytes it came from */
    PyObject *escaped;
    const unsigned char *escaped_from;
    Py_ssize_t escaped_size;
} Reader;

static PyObject *read_object(Reader *r, int depth);

static inline int
have(const Reader *r, Py_ssize_t n)
{
    return r->end - r->p >= n;
}

static inline uint16_t
be16(const unsigned char *p)
{
    return (uint16_t)((p[0] << 8) | p[1]);
}

/* The length in the next `width` bytes (1, 2 or 4), -1 when they are not there. */
static Py_ssize_t
read_length(Reader *r, int width)
{
    Py_ssize_t n;

    if (!have(r, width))
        return -1;
    n = width == 1 ? r->p[0] : width == 2 ? be16(r->p) : (Py_ssize_t)be32(r->p);
    r->p += width;
    return n;
}

/* An error reply's string with bytes past ASCII, as
 * bytes.decode("utf-8", "backslashreplace") makes it, without its cost: that
 * error handler is a Python call per bad byte, and an error message quoting
 * binary fields has hundreds.  backslashreplace writes "\xNN"
 * for each byte of each invalid sequence, and an invalid sequence's bytes
 * after the first are continuation bytes, which never start a valid one: so
 * decoding a valid sequence where one starts and escaping the byte where none
 * does, one byte at a time, writes the same. */

/* The length of the valid UTF-8 sequence at p (1 to 4, as CPython's decoder
 * takes them: no overlong forms, surrogates or code points past U+10FFFF)
 * and its code point in *c, or 0. */
static inline int
utf8_char(const unsigned char *p, const unsigned char *end, Py_UCS4 *c)
{
#define CONT(i) ((p[i] & 0xc0) == 0x80)
    unsigned char b = p[0];

    if (b < 0x80) {
        *c = b;
        return 1;
    }
    if (b < 0xc2)
        return 0;
    if (b < 0xe0) {
        if (end - p < 2 || !CONT(1))
            return 0;
        *c = ((Py_UCS4)(b & 0x1f) << 6) | (p[1] & 0x3f);
        return 2;
    }
    if (b < 0xf0) {
        if (end - p < 3 || !CONT(1) || !CONT(2) || (b == 0xe0 && p[1] < 0xa0)
                || (b == 0xed && p[1] > 0x9f))
            return 0;
        *c = ((Py_UCS4)(b & 0x0f) << 12) | ((Py_UCS4)(p[1] & 0x3f) << 6) | (p[2] & 0x3f);
        return 3;
    }
    if (b < 0xf5) {
        if (end - p < 4 || !CONT(1) || !CONT(2) || !CONT(3) || (b == 0xf0 && p[1] < 0x90)
                || (b == 0xf4 && p[1] > 0x8f))
            return 0;
        *c = ((Py_UCS4)(b & 0x07) << 18) | ((Py_UCS4)(p[1] & 0x3f) << 12)
             | ((Py_UCS4)(p[2] & 0x3f) << 6) | (p[3] & 0x3f);
        return 4;
    }
    return 0;
#undef CONT
}

/* One pass, into a buffer of 4 * n code points (what n bytes escape to at
 * most), then into a string as wide as the widest of them.  (A 2.10+
 * duplicate-key error quotes both tuples, ~2 KB per reply with random bytes
 * fields; a pass to size the string first cost as much again.) */
static PyObject *
escaped_utf8(const unsigned char *p, Py_ssize_t n)
{
    static const char hex[] = "0123456789abcdef";
    const unsigned char *end = p + n;
    Py_UCS4 *buf, *o, c, maxchar = 0;
    Py_ssize_t i, size;
    PyObject *out;
    int len;

    if (n > PY_SSIZE_T_MAX / (4 * (Py_ssize_t)sizeof(Py_UCS4)) - 1)
        return PyErr_NoMemory();
    buf = PyMem_Malloc((4 * n + 1) * sizeof(Py_UCS4));
    if (buf == NULL)
        return PyErr_NoMemory();
    o = buf;
    while (p < end) {
        if (*p < 0x80) {
            *o++ = *p++;
            continue;
        }
        len = utf8_char(p, end, &c);
        if (len) {
            *o++ = c;
            if (c > maxchar)
                maxchar = c;
            p += len;
        } else {
            o[0] = '\\';
            o[1] = 'x';
            o[2] = hex[*p >> 4];
            o[3] = hex[*p & 0xf];
            o += 4;
            p++;
        }
    }
    size = o - buf;
    out = PyUnicode_New(size, maxchar);   /* (maxchar 0: ASCII) */
    if (out != NULL) {
        switch (PyUnicode_KIND(out)) {
        case PyUnicode_1BYTE_KIND: {
            Py_UCS1 *d = PyUnicode_1BYTE_DATA(out);
            for (i = 0; i < size; i++)
                d[i] = (Py_UCS1)buf[i];
            break;
        }
        case PyUnicode_2BYTE_KIND: {
            Py_UCS2 *d = PyUnicode_2BYTE_DATA(out);
            for (i = 0; i < size; i++)
                d[i] = (Py_UCS2)buf[i];
            break;
        }
        default:
            memcpy(PyUnicode_4BYTE_DATA(out), buf, size * sizeof(Py_UCS4));
        }
    }
    PyMem_Free(buf);
    return out;
}

/* Whether n bytes at p are all ASCII (8 at a time). */
static int
is_ascii(const unsigned char *p, Py_ssize_t n)
{
    uint64_t word, any = 0;
    Py_ssize_t i = 0;

    for (; i + 8 <= n; i += 8) {
        memcpy(&word, p + i, 8);
        any |= word;
    }
    for (; i < n; i++)
        any |= p[i];
    return (any & UINT64_C(0x8080808080808080)) == 0;
}

static PyObject *
read_str(Reader *r, Py_ssize_t n)
{
    PyObject *s;

    if (n < 0 || !have(r, n))
        return NULL;
    if (r->raw) {
        s = PyBytes_FromStringAndSize((const char *)r->p, n);
    } else if (r->escaped != NULL && n == r->escaped_size
               && memcmp(r->p, r->escaped_from, n) == 0) {
        /* An error's message comes twice (alone and in the error stack):
         * the second is the first's string again. */
        s = Py_NewRef(r->escaped);
    } else {
        if (!r->escape || is_ascii(r->p, n)) {
            s = PyUnicode_DecodeUTF8((const char *)r->p, n, NULL);
        } else {
            /* (Valid UTF-8 too: escaping changes nothing in it.) */
            s = escaped_utf8(r->p, n);
            if (s != NULL) {
                Py_XSETREF(r->escaped, Py_NewRef(s));
                r->escaped_from = r->p;
                r->escaped_size = n;
            }
        }
    }
    r->p += n;
    return s;
}

static PyObject *
read_bin(Reader *r, Py_ssize_t n)
{
    PyObject *b;

    if (n < 0 || !have(r, n))
        return NULL;
    b = PyBytes_FromStringAndSize((const char *)r->p, n);
    r->p += n;
    return b;
}

static PyObject *
read_array(Reader *r, Py_ssize_t n, int depth)
{
    PyObject *seq, *item;
    Py_ssize_t i;

    if (n < 0 || !have(r, n) || depth >= MAX_DEPTH)   /* each item takes a byte at least */
        return NULL;
    seq = r->use_list ? PyList_New(n) : PyTuple_New(n);
    if (seq == NULL)
        return NULL;
    for (i = 0; i < n; i++) {
        item = read_object(r, depth + 1);
        if (item == NULL) {
            Py_DECREF(seq);
            return NULL;
        }
        if (r->use_list)
            PyList_SET_ITEM(seq, i, item);
        else
            PyTuple_SET_ITEM(seq, i, item);
    }
    return seq;
}

static PyObject *
read_map(Reader *r, Py_ssize_t n, int depth)
{
    PyObject *map, *key, *value;
    Py_ssize_t i;

    if (n < 0 || !have(r, 2 * n) || depth >= MAX_DEPTH)
        return NULL;
    map = PyDict_New();
    if (map == NULL)
        return NULL;
    for (i = 0; i < n; i++) {
        key = read_object(r, depth + 1);
        if (key == NULL)
            goto fail;
        if (PyUnicode_CheckExact(key))
            PyUnicode_InternInPlace(&key);   /* as unpackb does */
        value = read_object(r, depth + 1);
        if (value == NULL) {
            Py_DECREF(key);
            goto fail;
        }
        if (PyDict_SetItem(map, key, value) < 0) {
            Py_DECREF(key);
            Py_DECREF(value);
            goto fail;
        }
        Py_DECREF(key);
        Py_DECREF(value);
    }
    return map;
fail:
    Py_DECREF(map);
    return NULL;
}

/* The next object (new reference), or NULL (declined, maybe with an error set). */
static PyObject *
read_object(Reader *r, int depth)
{
    const unsigned char *p;
    unsigned char b;
    uint32_t bits32;
    uint64_t bits64;
    float f;
    double d;

    if (!have(r, 1))
        return NULL;
    b = *r->p++;
    if (b <= 0x7f)
        return PyLong_FromLong(b);
    if (b >= 0xe0)
        return PyLong_FromLong((signed char)b);
    if (b >= 0xa0 && b <= 0xbf)
        return read_str(r, b & 0x1f);
    if (b >= 0x90 && b <= 0x9f)
        return read_array(r, b & 0x0f, depth);
    if (b <= 0x8f)
        return read_map(r, b & 0x0f, depth);
    p = r->p;
    switch (b) {
    case 0xc0:
        Py_RETURN_NONE;
    case 0xc2:
        Py_RETURN_FALSE;
    case 0xc3:
        Py_RETURN_TRUE;
    case 0xc4:
        return read_bin(r, read_length(r, 1));
    case 0xc5:
        return read_bin(r, read_length(r, 2));
    case 0xc6:
        return read_bin(r, read_length(r, 4));
    case 0xca:
        if (!have(r, 4))
            return NULL;
        bits32 = be32(p);
        memcpy(&f, &bits32, 4);
        r->p += 4;
        return PyFloat_FromDouble(f);
    case 0xcb:
        if (!have(r, 8))
            return NULL;
        bits64 = be64(p);
        memcpy(&d, &bits64, 8);
        r->p += 8;
        return PyFloat_FromDouble(d);
    case 0xcc:
        if (!have(r, 1))
            return NULL;
        r->p += 1;
        return PyLong_FromLong(p[0]);
    case 0xcd:
        if (!have(r, 2))
            return NULL;
        r->p += 2;
        return PyLong_FromLong(be16(p));
    case 0xce:
        if (!have(r, 4))
            return NULL;
        r->p += 4;
        return PyLong_FromUnsignedLong(be32(p));
    case 0xcf:
        if (!have(r, 8))
            return NULL;
        r->p += 8;
        return PyLong_FromUnsignedLongLong(be64(p));
    case 0xd0:
        if (!have(r, 1))
            return NULL;
        r->p += 1;
        return PyLong_FromLong((int8_t)p[0]);
    case 0xd1:
        if (!have(r, 2))
            return NULL;
        r->p += 2;
        return PyLong_FromLong((int16_t)be16(p));
    case 0xd2:
        if (!have(r, 4))
            return NULL;
        r->p += 4;
        return PyLong_FromLong((int32_t)be32(p));
    case 0xd3:
        if (!have(r, 8))
            return NULL;
        r->p += 8;
        return PyLong_FromLongLong((int64_t)be64(p));
    case 0xd9:
        return read_str(r, read_length(r, 1));
    case 0xda:
        return read_str(r, read_length(r, 2));
    case 0xdb:
        return read_str(r, read_length(r, 4));
    case 0xdc:
        return read_array(r, read_length(r, 2), depth);
    case 0xdd:
        return read_array(r, read_length(r, 4), depth);
    case 0xde:
        return read_map(r, read_length(r, 2), depth);
    case 0xdf:
        return read_map(r, read_length(r, 4), depth);
    default:   /* ext types, 0xc1 */
        return NULL;
    }
}

/* The decoded body (new reference), or NULL with the error decoding it
 * raised.  `error`: an error reply's body, decoded with
 * unicode_errors="backslashreplace" (since 2.10 messages quote tuples, bytes
 * fields as they are). */
static PyObject *
unpack_body(const Decoding *d, const unsigned char *start, Py_ssize_t size, int error)
{
    PyObject *view, *body;
    PyObject *args[6];

    if (size == 0)
        return PyDict_New();
    {
        Reader r = {start, start + size, PyObject_IsTrue(d->use_list), PyObject_IsTrue(d->raw),
                    error, NULL, NULL, 0};
        body = r.use_list < 0 || r.raw < 0 ? NULL : read_object(&r, 0);
        Py_XDECREF(r.escaped);
        if (body != NULL && r.p == r.end)
            return body;
        Py_XDECREF(body);   /* bytes after it: unpackb says how that fails */
        if (PyErr_Occurred())
            PyErr_Clear();
    }
    view = PyMemoryView_FromMemory((char *)start, size, PyBUF_READ);
    if (view == NULL)
        return NULL;
    args[0] = view;
    args[1] = d->use_list;
    args[2] = d->raw;
    args[3] = Py_False;
    args[4] = d->ext_hook;
    args[5] = str_backslashreplace;
    body = PyObject_Vectorcall(d->unpackb, args, 1,
                               error ? unpack_escaped_kwnames : unpack_kwnames);
    Py_DECREF(view);
    return body;
}

/* unpack_body's body, the exception decoding it raised (traceback dropped),
 * or NULL with an error set for anything that is not an Exception
 * (KeyboardInterrupt, ...), which must propagate. */
static PyObject *
decode_body(const Decoding *d, const unsigned char *start, Py_ssize_t size, int error)
{
    PyObject *body, *type, *value, *tb;

    body = unpack_body(d, start, size, error);
    if (body != NULL || !PyErr_ExceptionMatches(PyExc_Exception))
        return body;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
    if (value != NULL)
        PyException_SetTraceback(value, Py_None);
    return value;
}

/* Where a `type` object keeps its attribute `name` when that is one of its
 * __slots__ (a writable object member): the offset, else 0.  Only a
 * descriptor of the type's own layout counts (one of its bases', inside its
 * size): any object could be put on the class under the name, another
 * class's slot descriptor too. */
static Py_ssize_t
member_offset(PyTypeObject *type, PyObject *name)
{
    /* on the class, a slot's attribute is its member descriptor */
    PyObject *descr = PyObject_GetAttr((PyObject *)type, name);
    Py_ssize_t offset = 0;

    if (descr == NULL) {
        PyErr_Clear();
        return 0;
    }
    if (Py_IS_TYPE(descr, &PyMemberDescr_Type) && PyType_IsSubtype(type, PyDescr_TYPE(descr))) {
        PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
        if (member->type == T_OBJECT_EX && !(member->flags & READONLY)
                && member->offset >= (Py_ssize_t)sizeof(PyObject)
                && member->offset <= type->tp_basicsize - (Py_ssize_t)sizeof(PyObject *))
            offset = member->offset;
    }
    Py_DECREF(descr);
    return offset;
}

/* 0 when `type` can be a Decoding's response_type (a ResponseCore subtype
 * that makes objects), else -1 with a TypeError. */
static int
check_response_type(PyObject *type)
{
    if (!PyType_Check(type) || !PyType_IsSubtype((PyTypeObject *)type, &ResponseCoreType)) {
        PyErr_Format(PyExc_TypeError, "response_type must be a subclass of ResponseCore, "
                     "not %.100R", type);
        return -1;
    }
    if (((PyTypeObject *)type)->tp_new == NULL) {
        PyErr_Format(PyExc_TypeError, "cannot create '%.100s' objects",
                     ((PyTypeObject *)type)->tp_name);
        return -1;
    }
    return 0;
}

/* An OK reply's body when it is the map {IPROTO_DATA: rows}, nearly every
 * reply's: rows (new reference), decoded as unpack_body decodes them; else
 * NULL, no error set (the body goes the general way, which says what fails). */
static PyObject *
data_only(const Decoding *d, const unsigned char *start, Py_ssize_t size)
{
    PyObject *rows;

    if (size < 3 || start[0] != 0x81 || start[1] != IPROTO_DATA)
        return NULL;
    {
        Reader r = {start + 2, start + size, PyObject_IsTrue(d->use_list),
                    PyObject_IsTrue(d->raw), 0, NULL, NULL, 0};
        rows = r.use_list < 0 || r.raw < 0 ? NULL : read_object(&r, 1);
        if (rows != NULL && r.p == r.end)
            return rows;
    }
    Py_XDECREF(rows);
    PyErr_Clear();
    return NULL;
}

/* protocol.ok_response, without conn (the caller sets it), for the decoded
 * `body` map, or (body NULL) for a body that is {IPROTO_DATA: rows}; `size`,
 * the frame's bytes, goes to _size when there is one (else unset). */
static PyObject *
ok_response(const Decoding *d, PyObject *sync, PyObject *schema, PyObject *body,
            PyObject *rows, PyObject *size)
{
    PyObject *resp, *data;

    resp = d->response_type->tp_new(d->response_type, empty_tuple, NULL);
    if (resp == NULL)
        return NULL;
    if (!PyObject_TypeCheck(resp, &ResponseCoreType)) {
        PyErr_Format(PyExc_TypeError, "%.100s() made a %.100s object, not a ResponseCore",
                     d->response_type->tp_name, Py_TYPE(resp)->tp_name);
        goto fail;
    }
    if (body != NULL) {
        rows = PyDict_GetItemWithError(body, data_key);   /* borrowed */
        if (rows == NULL && PyErr_Occurred())
            goto fail;
    }
    if (rows == NULL || rows == Py_None) {   /* (tarantool-python's: no data) */
        data = Py_NewRef(Py_None);
    } else if (PyList_Check(rows) || PyTuple_Check(rows)) {
        data = Py_NewRef(rows);
    } else {
        Py_INCREF(rows);   /* PyList_New may collect garbage, whose finalizers run Python */
        data = PyList_New(1);
        if (data == NULL) {
            Py_DECREF(rows);
            goto fail;
        }
        PyList_SET_ITEM(data, 0, rows);
    }
    {
        ResponseCore *r = (ResponseCore *)resp;

        Py_XSETREF(r->data, data);
        Py_XSETREF(r->sync, Py_NewRef(sync));
        Py_XSETREF(r->code, Py_NewRef(zero));
        if (body != NULL)
            Py_XSETREF(r->body, Py_NewRef(body));
        else
            Py_XSETREF(r->rows, Py_NewRef(rows));
        Py_XSETREF(r->schema_version, Py_NewRef(schema));
        Py_XSETREF(r->return_code, Py_NewRef(zero));
        if (size != NULL)
            Py_XSETREF(r->size, Py_NewRef(size));
    }
    return resp;
fail:
    Py_DECREF(resp);
    return NULL;
}

/* A reply frame's length prefix and header, as read_header finds them. */
typedef struct {
    uint64_t length;            /* the length prefix's value */
    Py_ssize_t prefix;          /* its size */
    Py_ssize_t head;            /* where the body starts, from the frame's start */
    uint64_t code, sync, schema;
} Header;

/* The msgpack uint at *p, before end, in any width: 1, or 0 when it is
 * something else or not all there. */
static inline int
read_uint(const unsigned char **p, const unsigned char *end, uint64_t *value)
{
    const unsigned char *q = *p;

    if (q >= end)
        return 0;
    if (*q <= 0x7f) {
        *value = *q;
        *p = q + 1;
        return 1;
    }
    switch (*q) {
    case 0xcc:
        if (end - q < 2)
            return 0;
        *value = q[1];
        *p = q + 2;
        return 1;
    case 0xcd:
        if (end - q < 3)
            return 0;
        *value = be16(q + 1);
        *p = q + 3;
        return 1;
    case 0xce:
        if (end - q < 5)
            return 0;
        *value = be32(q + 1);
        *p = q + 5;
        return 1;
    case 0xcf:
        if (end - q < 9)
            return 0;
        *value = be64(q + 1);
        *p = q + 9;
        return 1;
    default:
        return 0;
    }
}

#define HAS_CODE 1
#define HAS_SYNC 2
#define HAS_SCHEMA 4

/* The header of the frame at p (end - p bytes of it here): 1 with h filled
 * when the length prefix and header are whole, within the frame, and the
 * header is a map of uints to uints with the code (0), the sync (1) and the
 * schema version (5) once each, other keys skipped (IPROTO_STREAM_ID 0x0a,
 * ... whatever a later server adds); 0 for anything else, which the Python
 * code parses the general way (and fails the connection for when it is
 * malformed): an IPROTO_EVENT's header, which has no schema version, too.
 * As transport._reply_header, its Python twin. */
static int
read_header(const unsigned char *p, const unsigned char *end, Header *h)
{
    const unsigned char *q = p, *frame_end;
    uint64_t key, value;
    Py_ssize_t n;
    int seen = 0, field;

    /* Tarantool's layouts (the frame's header, not what follows, checked here) */
    if (end - p >= HEADER_SIZE && p[0] == 0xce && p[5] == 0x83 && p[6] == 0x00 && p[7] == 0xce
            && p[12] == 0x01 && p[13] == 0xcf && p[22] == 0x05) {
        h->length = be32(p + 1);
        h->prefix = 5;
        h->code = be32(p + 8);
        h->sync = be64(p + 14);
        if (p[23] == 0xce) {
            h->schema = be32(p + 24);
            h->head = HEADER_SIZE;
            return 1;
        }
        if (p[23] == 0xcf && end - p >= HEADER_SIZE_64) {
            h->schema = be64(p + 24);
            h->head = HEADER_SIZE_64;
            return 1;
        }
    }
    if (!read_uint(&q, end, &h->length))
        return 0;
    h->prefix = q - p;
    /* the header must end within the frame */
    frame_end = (uint64_t)(end - q) < h->length ? end : q + h->length;
    if (q >= frame_end)
        return 0;
    if (*q >= 0x80 && *q <= 0x8f) {
        n = *q++ & 0x0f;
    } else if (*q == 0xde && frame_end - q >= 3) {
        n = be16(q + 1);
        q += 3;
    } else {
        return 0;
    }
    while (n-- > 0) {
        if (!read_uint(&q, frame_end, &key) || !read_uint(&q, frame_end, &value))
            return 0;
        switch (key) {
        case 0x00:
            field = HAS_CODE;
            h->code = value;
            break;
        case 0x01:
            field = HAS_SYNC;
            h->sync = value;
            break;
        case 0x05:
            field = HAS_SCHEMA;
            h->schema = value;
            break;
        default:
            continue;
        }
        if (seen & field)   /* a repeated key: the general way says which counts */
            return 0;
        seen |= field;
    }
    if (seen != (HAS_CODE | HAS_SYNC | HAS_SCHEMA))
        return 0;
    h->head = q - p;
    return 1;
}

/* (code, schema version, body bytes): a reply as a pipeline's sink keeps it
 * (new reference, or NULL with an exception set).  Two ints and bytes:
 * untracked, as the collector's first pass would untrack it, so that
 * thousands of them keep the replies dict untracked too, out of every young
 * collection's scan. */
static PyObject *
reply_tuple(const Header *h, const unsigned char *body, Py_ssize_t body_size)
{
    PyObject *value = PyTuple_New(3), *item;

    if (value == NULL)
        return NULL;
    PyObject_GC_UnTrack(value);
    if ((item = PyLong_FromUnsignedLongLong(h->code)) == NULL)
        goto fail;
    PyTuple_SET_ITEM(value, 0, item);
    if ((item = PyLong_FromUnsignedLongLong(h->schema)) == NULL)
        goto fail;
    PyTuple_SET_ITEM(value, 1, item);
    if ((item = PyBytes_FromStringAndSize((const char *)body, body_size)) == NULL)
        goto fail;
    PyTuple_SET_ITEM(value, 2, item);
    return value;
fail:
    Py_DECREF(value);
    return NULL;
}

/* Store the reply `h` for `waiter` (a SinkCore: a sink, or a checking one,
 * whose replies go to its owner): 1 when that was the last its sink awaited,
 * 0, or -1 with an exception set; *target: the sink that got it (a new
 * reference, unless -1). */
static int
store(PyObject *waiter, PyObject *sync, const Header *h, const unsigned char *body,
      Py_ssize_t body_size, PyObject **target)
{
    SinkCore *sink = (SinkCore *)waiter;
    PyObject *value, *replies, *outstanding, *left;
    int stored, last = -1, checking = 0;

    if (sink->owner != NULL && sink->owner != Py_None) {
        if (!PyObject_TypeCheck(sink->owner, &SinkCoreType)) {
            PyErr_Format(PyExc_TypeError, "a sink's owner must be a sink, not %.100s",
                         Py_TYPE(sink->owner)->tp_name);
            return -1;
        }
        checking = 1;
        sink = (SinkCore *)sink->owner;
    }
    /* Each field read after whatever could run Python (a collection's
     * finalizers, a replies mapping's __setitem__) and held while it is used */
    Py_INCREF(sink);
    if (checking && h->code == 0)   /* a success: its code is all that is kept */
        value = Py_NewRef(checked_reply);
    else {
        value = reply_tuple(h, body, body_size);
    }
    if (value == NULL)
        goto done;
    replies = sink_field((PyObject *)sink, sink->replies, "replies");
    if (replies == NULL) {
        Py_DECREF(value);
        goto done;
    }
    Py_INCREF(replies);
    stored = PyDict_CheckExact(replies) ? PyDict_SetItem(replies, sync, value)
                                        : PyObject_SetItem(replies, sync, value);
    Py_DECREF(replies);
    Py_DECREF(value);
    if (stored < 0)
        goto done;
    outstanding = sink_field((PyObject *)sink, sink->outstanding, "outstanding");
    if (outstanding == NULL)
        goto done;
    /* outstanding -= 1; outstanding <= 0, as Python does it: any int, no
     * overflow (an exact int of a C long's range, nearly always, in C) */
    Py_INCREF(outstanding);
    if (PyLong_CheckExact(outstanding)) {
        int overflow;
        long value = PyLong_AsLongAndOverflow(outstanding, &overflow);

        if (!overflow && value > LONG_MIN) {
            left = PyLong_FromLong(value - 1);
            last = value - 1 <= 0;
        } else {
            left = NULL;
        }
    } else {
        left = NULL;
    }
    if (left == NULL && !PyErr_Occurred()) {
        left = PyNumber_Subtract(outstanding, one);
        last = left == NULL ? -1 : PyObject_RichCompareBool(left, zero, Py_LE);
    }
    Py_DECREF(outstanding);
    if (left == NULL) {
        last = -1;
        goto done;
    }
    if (last < 0) {
        Py_DECREF(left);
        goto done;
    }
    Py_XSETREF(sink->outstanding, left);
    *target = Py_NewRef(sink);
done:
    Py_DECREF(sink);
    return last;
}

/* The reply's size on the wire as an int (the last one's, most often). */
static PyObject *
reply_size(ReplyCutter *self, const Header *h)
{
    Py_ssize_t n = h->prefix + (Py_ssize_t)h->length;

    if (self->size == NULL || self->size_value != n) {
        PyObject *size = PyLong_FromSsize_t(n);

        if (size == NULL)
            return NULL;
        Py_XSETREF(self->size, size);
        self->size_value = n;
    }
    return Py_NewRef(self->size);
}

/* An OK reply's body, `n` bytes at `start`, as its caller gets it: the
 * response object for a body that is a map, else the tuple (sync, 0, schema
 * version, body or the exception decoding it raised, None). */
static PyObject *
ok_reply(ReplyCutter *self, PyObject *sync, PyObject *schema, PyObject *size,
         const unsigned char *start, Py_ssize_t n)
{
    PyObject *rows = data_only(&self->decoding, start, n), *body, *value;

    if (rows != NULL) {
        value = ok_response(&self->decoding, sync, schema, NULL, rows, size);
        Py_DECREF(rows);
        return value;
    }
    body = decode_body(&self->decoding, start, n, 0);
    if (body == NULL)
        return NULL;
    if (PyDict_CheckExact(body))
        value = ok_response(&self->decoding, sync, schema, body, NULL, size);
    else
        value = PyTuple_Pack(5, sync, zero, schema, body, Py_None);
    Py_DECREF(body);
    return value;
}

/* Queue the reply `h` (whose waiter is already popped); `defer`: an OK reply
 * as a RawReply. */
static int
take(ReplyCutter *self, PyObject *waiter, PyObject *sync, const Header *h,
     const unsigned char *start, Py_ssize_t body_size, int defer)
{
    PyObject *code = NULL, *schema = NULL, *body = NULL, *value = NULL, *size = NULL, *pair,
        *res;
    int ok = -1;

    if (self->schema == NULL || self->schema_value != h->schema) {
        schema = PyLong_FromUnsignedLongLong(h->schema);
        if (schema == NULL)
            goto done;
        Py_XSETREF(self->schema, schema);
        self->schema_value = h->schema;
    }
    schema = Py_NewRef(self->schema);
    if (h->code == 0) {
        size = reply_size(self, h);
        if (size == NULL)
            goto done;
        if (defer) {
            RawReply *raw;

            if ((body = PyBytes_FromStringAndSize((const char *)start, body_size)) == NULL
                    || (raw = PyObject_New(RawReply, &RawReplyType)) == NULL)
                goto done;
            raw->sync = Py_NewRef(sync);
            raw->schema = Py_NewRef(schema);
            raw->size = Py_NewRef(size);
            raw->body = Py_NewRef(body);
            value = (PyObject *)raw;
        } else {
            value = ok_reply(self, sync, schema, size, start, body_size);
        }
    } else {
        if (h->code >= IPROTO_TYPE_ERROR)
            /* an error's decoded when read: most callers test only the code */
            body = PyBytes_FromStringAndSize((const char *)start, body_size);
        else
            body = decode_body(&self->decoding, start, body_size, 0);
        if (body == NULL)
            goto done;
        code = PyLong_FromUnsignedLongLong(h->code);
        if (code == NULL)
            goto done;
        value = PyTuple_Pack(5, sync, code, schema, body, Py_None);
    }
    if (value == NULL)
        goto done;
    pair = PyTuple_Pack(2, waiter, value);
    if (pair == NULL)
        goto done;
    res = PyObject_CallOneArg(self->ready_append, pair);
    Py_DECREF(pair);
    if (res == NULL)
        goto done;
    Py_DECREF(res);
    ok = 0;
done:
    Py_XDECREF(size);
    Py_XDECREF(code);
    Py_XDECREF(schema);
    Py_XDECREF(body);
    Py_XDECREF(value);
    return ok;
}

/* pending.pop(sync, None) in one lookup: the waiter (new reference), or NULL,
 * with an exception set when the dict raised one (a waiter is never None). */
static PyObject *
pop_pending(PyObject *pending, PyObject *sync)
{
    PyObject *waiter;

#if PY_VERSION_HEX >= 0x030D0000
    if (PyDict_Pop(pending, sync, &waiter) <= 0)
        return NULL;
#else
    waiter = _PyDict_Pop(pending, sync, Py_None);
    if (waiter == Py_None) {
        Py_DECREF(waiter);
        return NULL;
    }
#endif
    return waiter;
}

static PyObject *
ReplyCutter_cut(ReplyCutter *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer buffer;
    Py_ssize_t pos, end, limit, stored = 0, taken = 0;
    const unsigned char *data;
    PyObject *wake;

    if (!initialised((PyObject *)self, self->pending, 1))
        return NULL;
    if (nargs != 5 || !PyList_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "cut(data, pos, end, limit, wake list)");
        return NULL;
    }
    wake = args[4];
    pos = PyLong_AsSsize_t(args[1]);
    end = PyLong_AsSsize_t(args[2]);
    limit = PyLong_AsSsize_t(args[3]);
    if ((pos == -1 || end == -1 || limit == -1) && PyErr_Occurred())
        return NULL;
    /* Held until the end: the buffer cannot be resized under the views. */
    if (PyObject_GetBuffer(args[0], &buffer, PyBUF_SIMPLE) < 0)
        return NULL;
    data = buffer.buf;
    if (end > buffer.len)
        end = buffer.len;
    if (pos < 0)
        pos = 0;
    while (pos < end) {
        const unsigned char *p = data + pos;
        PyObject *sync, *waiter;
        Py_ssize_t stop, body_size;
        Header h;

        if (!read_header(p, data + end, &h) || h.length > (uint64_t)limit
                || (uint64_t)(h.head - h.prefix) > h.length)
            break;
        stop = pos + h.prefix + (Py_ssize_t)h.length;
        if (stop > end || h.code == IPROTO_CHUNK)
            break;
        body_size = stop - pos - h.head;
        sync = PyLong_FromUnsignedLongLong(h.sync);
        if (sync == NULL)
            goto error;
        waiter = pop_pending(self->pending, sync);
        if (waiter == NULL || (PyObject *)Py_TYPE(waiter) == self->pushes_type) {
            /* (a push's waiter stays: Python's _cut takes what comes for it) */
            int failed = waiter != NULL ? PyDict_SetItem(self->pending, sync, waiter) < 0
                                        : PyErr_Occurred() != NULL;
            Py_XDECREF(waiter);
            Py_DECREF(sync);
            if (failed)
                goto error;
            break;
        }
        if ((PyObject *)Py_TYPE(waiter) == self->sink_type) {
            PyObject *target = NULL;
            int last = store(waiter, sync, &h, p + h.head, body_size, &target);
            if (last < 0)
                goto fail;
            if (last) {
                PyObject *pair = PyTuple_Pack(2, target, Py_None);
                Py_DECREF(target);
                if (pair == NULL || PyList_Append(wake, pair) < 0) {
                    Py_XDECREF(pair);
                    goto fail;
                }
                Py_DECREF(pair);
            } else {
                Py_DECREF(target);
                stored++;
            }
        } else if (take(self, waiter, sync, &h, p + h.head, body_size,
                        ++taken > self->defer_after) < 0) {
            goto fail;
        }
        Py_DECREF(waiter);
        Py_DECREF(sync);
        pos = stop;
        continue;
fail:
        Py_DECREF(waiter);
        Py_DECREF(sync);
        goto error;
    }
    PyBuffer_Release(&buffer);
    return Py_BuildValue("(nn)", pos, stored);
error:
    PyBuffer_Release(&buffer);
    return NULL;
}

/* receive_lone(fd, buffer, limit): transport.Transport._receive_lone, its
 * Python twin.  One non-blocking read into the empty read buffer; when the
 * bytes are exactly one whole reply that cut() would hand to a caller's
 * greenlet, it is taken as cut() takes it.  Returns (bytes received, taken),
 * None when there was nothing to read; raises OSError when the read fails. */
/* One receive into `buffer` for a lone request (see the top): 1 with
 * *received and *taken set, 0 when there was nothing to read, -1 with an
 * exception set. */
static int
receive_lone(ReplyCutter *self, long fd, PyObject *buffer_obj, Py_ssize_t limit,
             Py_ssize_t *received_out, int *taken_out)
{
    Py_buffer buffer;
    Py_ssize_t received;
    const unsigned char *data;
    int taken = 0;
    Header h;

    if (fd < 0 || fd > INT_MAX) {
        PyErr_SetString(PyExc_ValueError, "bad file descriptor");
        return -1;
    }
    if (PyObject_GetBuffer(buffer_obj, &buffer, PyBUF_WRITABLE) < 0)
        return -1;
    do {
        received = read((int)fd, buffer.buf, (size_t)buffer.len);
    } while (received < 0 && errno == EINTR && !PyErr_CheckSignals());
    if (received < 0) {
        PyBuffer_Release(&buffer);
        if (PyErr_Occurred())   /* a signal handler raised */
            return -1;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return 0;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    data = buffer.buf;
    if (read_header(data, data + received, &h) && h.length <= (uint64_t)limit
            && (uint64_t)(h.head - h.prefix) <= h.length
            && h.prefix + (Py_ssize_t)h.length == received && h.code != IPROTO_CHUNK) {
        PyObject *sync = PyLong_FromUnsignedLongLong(h.sync), *waiter;

        if (sync == NULL)
            goto error;
        waiter = pop_pending(self->pending, sync);
        if (waiter != NULL && (PyObject *)Py_TYPE(waiter) != self->sink_type
                && (PyObject *)Py_TYPE(waiter) != self->pushes_type) {
            taken = take(self, waiter, sync, &h, data + h.head, received - h.head, 0) < 0
                ? -1 : 1;
        } else if (waiter != NULL && PyDict_SetItem(self->pending, sync, waiter) < 0) {
            taken = -1;   /* (put back: the reader takes a sink's or a push's reply) */
        }
        Py_XDECREF(waiter);
        Py_DECREF(sync);
        if (taken < 0 || PyErr_Occurred())
            goto error;
    }
    PyBuffer_Release(&buffer);
    *received_out = received;
    *taken_out = taken;
    return 1;
error:
    PyBuffer_Release(&buffer);
    return -1;
}

static PyObject *
ReplyCutter_receive_lone(ReplyCutter *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t received, limit;
    long fd;
    int taken, got;

    if (!initialised((PyObject *)self, self->pending, 1))
        return NULL;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "receive_lone(fd, buffer, limit)");
        return NULL;
    }
    fd = PyLong_AsLong(args[0]);
    limit = PyLong_AsSsize_t(args[2]);
    if ((fd == -1 || limit == -1) && PyErr_Occurred())
        return NULL;
    got = receive_lone(self, fd, args[1], limit, &received, &taken);
    if (got < 0)
        return NULL;
    if (got == 0)
        Py_RETURN_NONE;
    return Py_BuildValue("(nO)", received, taken ? Py_True : Py_False);
}

/* finish(raw): the RawReply `raw` as its caller gets it (see the top). */
static PyObject *
finish(ReplyCutter *self, PyObject *raw)
{
    RawReply *r = (RawReply *)raw;

    return ok_reply(self, r->sync, r->schema, r->size,
                    (const unsigned char *)PyBytes_AS_STRING(r->body), PyBytes_GET_SIZE(r->body));
}

static PyObject *
ReplyCutter_finish(ReplyCutter *self, PyObject *raw)
{
    if (!initialised((PyObject *)self, self->pending, 1))
        return NULL;
    if (!Py_IS_TYPE(raw, &RawReplyType)) {
        PyErr_Format(PyExc_TypeError, "finish() takes a RawReply, not %.100s",
                     Py_TYPE(raw)->tp_name);
        return NULL;
    }
    return finish(self, raw);
}

static int
ReplyCutter_init(ReplyCutter *self, PyObject *args, PyObject *kwds)
{
    PyObject *pending, *ready, *unpackb, *options, *response_type, *sink_type, *pushes_type,
        *ready_append;
    Decoding decoding = {NULL};
    Py_ssize_t defer_after = DEFER_AFTER;
    static char *names[] = {"pending", "ready", "unpackb", "options", "response_type",
                            "sink_type", "pushes_type", "defer_after", NULL};

    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!OOO!O!O!O!|n:ReplyCutter", names,
                                     &PyDict_Type, &pending, &ready, &unpackb,
                                     &PyTuple_Type, &options, &PyType_Type, &response_type,
                                     &PyType_Type, &sink_type, &PyType_Type, &pushes_type,
                                     &defer_after)
            || !initialised((PyObject *)self, self->pending, 0))
        return -1;
    if (defer_after < 0) {
        PyErr_SetString(PyExc_ValueError, "defer_after must not be negative");
        return -1;
    }
    if (PyTuple_GET_SIZE(options) != 3) {
        PyErr_SetString(PyExc_TypeError, "options must be (use_list, raw, ext_hook)");
        return -1;
    }
    /* What runs Python first (getattr), then the fields, all at once */
    if (check_response_type(response_type) < 0)
        return -1;
    if (!PyType_IsSubtype((PyTypeObject *)sink_type, &SinkCoreType)) {
        PyErr_Format(PyExc_TypeError, "sink_type must be a subclass of SinkCore, not %.100R",
                     sink_type);
        return -1;
    }
    decoding.response_type = (PyTypeObject *)response_type;
    ready_append = PyObject_GetAttrString(ready, "append");
    if (ready_append == NULL)
        return -1;
    if (!initialised((PyObject *)self, self->pending, 0)) {
        Py_DECREF(ready_append);
        return -1;
    }
    self->ready_append = ready_append;
    self->decoding = decoding;
    Py_INCREF(response_type);
    self->decoding.unpackb = Py_NewRef(unpackb);
    self->decoding.use_list = Py_NewRef(PyTuple_GET_ITEM(options, 0));
    self->decoding.raw = Py_NewRef(PyTuple_GET_ITEM(options, 1));
    self->decoding.ext_hook = Py_NewRef(PyTuple_GET_ITEM(options, 2));
    self->sink_type = Py_NewRef(sink_type);
    self->pushes_type = Py_NewRef(pushes_type);
    self->defer_after = defer_after;
    self->pending = Py_NewRef(pending);
    return 0;
}

static int
ReplyCutter_traverse(ReplyCutter *self, visitproc visit, void *arg)
{
    Py_VISIT(self->pending);
    Py_VISIT(self->ready_append);
    Py_VISIT(self->decoding.unpackb);
    Py_VISIT(self->decoding.use_list);
    Py_VISIT(self->decoding.raw);
    Py_VISIT(self->decoding.ext_hook);
    Py_VISIT(self->decoding.response_type);
    Py_VISIT(self->sink_type);
    Py_VISIT(self->pushes_type);
    return 0;
}

static int
ReplyCutter_clear(ReplyCutter *self)
{
    Py_CLEAR(self->pending);
    Py_CLEAR(self->ready_append);
    Py_CLEAR(self->decoding.unpackb);
    Py_CLEAR(self->decoding.use_list);
    Py_CLEAR(self->decoding.raw);
    Py_CLEAR(self->decoding.ext_hook);
    Py_CLEAR(self->decoding.response_type);
    Py_CLEAR(self->sink_type);
    Py_CLEAR(self->pushes_type);
    Py_CLEAR(self->schema);
    Py_CLEAR(self->size);
    return 0;
}

static void
ReplyCutter_dealloc(ReplyCutter *self)
{
    PyObject_GC_UnTrack(self);
    ReplyCutter_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef ReplyCutter_methods[] = {
    {"cut", (PyCFunction)(void (*)(void))ReplyCutter_cut, METH_FASTCALL,
     "cut(data, pos, end, limit, wake) -> (where the first frame not taken starts, "
     "replies stored in sinks without a wake-up)"},
    {"receive_lone", (PyCFunction)(void (*)(void))ReplyCutter_receive_lone, METH_FASTCALL,
     "receive_lone(fd, buffer, limit) -> (bytes received, whether they were one reply, "
     "taken), or None when there was nothing to read"},
    {"finish", (PyCFunction)ReplyCutter_finish, METH_O,
     "finish(raw) -> the RawReply as its caller gets it (a response, or the tuple cut() "
     "queues for a body that is not a map)"},
    {NULL, NULL, 0, NULL}
};

static PyTypeObject ReplyCutterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gtarantool._speedups.ReplyCutter",
    .tp_basicsize = sizeof(ReplyCutter),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The reader's loop over reply frames (see the top of _speedups.c).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)ReplyCutter_init,
    .tp_traverse = (traverseproc)ReplyCutter_traverse,
    .tp_clear = (inquiry)ReplyCutter_clear,
    .tp_dealloc = (destructor)ReplyCutter_dealloc,
    .tp_methods = ReplyCutter_methods,
};

/* TransportCore: the state of a transport that the C paths share with the
 * Python code, kept in this object rather than looked up on it by name.
 * transport.Transport derives from it (from its Python twin,
 * transport.TransportState, when the package is built without a compiler);
 * each field is a member of the same name, read and written by the Python
 * code as an ordinary attribute and by the C code as a struct field:
 *
 *     _pending            dict: sync -> waiting greenlet, ReplySink or _Pushes
 *     _ready              deque of (greenlet, reply): callers to wake, in order
 *     _wbuf               list of frames for the writer, two entries per request
 *     _queue              deque of Waiters: callers in line for max_in_flight
 *     _hub                the gevent hub the transport runs in
 *     _reader             the reader greenlet
 *     _rbuf               bytearray: the read buffer
 *     stats               transport.Stats: the counters
 *     _fd                 int: the socket's descriptor
 *     _rlen               int: bytes of an incomplete frame at _rbuf's front
 *     _waking             true while callers in _ready are being woken
 *     _flush_due          true while whoever woke the callers sends what they queue
 *     max_response_size   int: the longest reply frame accepted
 *     _requester          the Requester that runs request() in C, or None
 *
 * A field never set raises AttributeError, as an unset __slots__ entry does;
 * the C paths check each field's type where they use it.  tests/test_speedups.py
 * checks that the twin declares the same names.
 *
 * Its method request(sync, code, schema_version, body) is the transport's:
 * the Requester's (below) when _requester is one, else the Python code's,
 * the hook request_general(sync, code, schema_version, body) (the twin's
 * request, transport.TransportState.request). */
typedef struct {
    PyObject_HEAD
    PyObject *pending, *ready, *wbuf, *queue, *hub, *reader, *rbuf, *stats, *fd, *rlen,
        *waking, *flush_due, *max_response_size, *requester;
} TransportCore;

static PyTypeObject RequesterType;
static PyObject *Requester_request(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

/* The transport's request (see above). */
static PyObject *
TransportCore_request(TransportCore *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *call[5];

    if (self->requester != NULL && Py_IS_TYPE(self->requester, &RequesterType))
        return Requester_request(self->requester, args, nargs);
    if (nargs > 4) {
        PyErr_SetString(PyExc_TypeError, "request(sync, code, schema_version, body)");
        return NULL;
    }
    call[0] = (PyObject *)self;
    memcpy(call + 1, args, nargs * sizeof(PyObject *));
    return PyObject_VectorcallMethod(hooks[H_REQUEST_GENERAL], call, nargs + 1, NULL);
}

static PyMethodDef TransportCore_methods[] = {
    {"request", (PyCFunction)(void (*)(void))TransportCore_request, METH_FASTCALL,
     "request(sync, code, schema_version, body) -> the reply (see Transport.request)"},
    {NULL, NULL, 0, NULL}
};

#define CORE_MEMBER(name, field) \
    {name, T_OBJECT_EX, offsetof(TransportCore, field), 0, NULL}

static PyMemberDef TransportCore_members[] = {
    CORE_MEMBER("_pending", pending),
    CORE_MEMBER("_ready", ready),
    CORE_MEMBER("_wbuf", wbuf),
    CORE_MEMBER("_queue", queue),
    CORE_MEMBER("_hub", hub),
    CORE_MEMBER("_reader", reader),
    CORE_MEMBER("_rbuf", rbuf),
    CORE_MEMBER("stats", stats),
    CORE_MEMBER("_fd", fd),
    CORE_MEMBER("_rlen", rlen),
    CORE_MEMBER("_waking", waking),
    CORE_MEMBER("_flush_due", flush_due),
    CORE_MEMBER("max_response_size", max_response_size),
    CORE_MEMBER("_requester", requester),
    {NULL}
};

static int
TransportCore_traverse(TransportCore *self, visitproc visit, void *arg)
{
    Py_VISIT(self->pending);
    Py_VISIT(self->ready);
    Py_VISIT(self->wbuf);
    Py_VISIT(self->queue);
    Py_VISIT(self->hub);
    Py_VISIT(self->reader);
    Py_VISIT(self->rbuf);
    Py_VISIT(self->stats);
    Py_VISIT(self->fd);
    Py_VISIT(self->rlen);
    Py_VISIT(self->waking);
    Py_VISIT(self->flush_due);
    Py_VISIT(self->max_response_size);
    Py_VISIT(self->requester);
    return 0;
}

static int
TransportCore_clear(TransportCore *self)
{
    Py_CLEAR(self->pending);
    Py_CLEAR(self->ready);
    Py_CLEAR(self->wbuf);
    Py_CLEAR(self->queue);
    Py_CLEAR(self->hub);
    Py_CLEAR(self->reader);
    Py_CLEAR(self->rbuf);
    Py_CLEAR(self->stats);
    Py_CLEAR(self->fd);
    Py_CLEAR(self->rlen);
    Py_CLEAR(self->waking);
    Py_CLEAR(self->flush_due);
    Py_CLEAR(self->max_response_size);
    Py_CLEAR(self->requester);
    return 0;
}

static void
TransportCore_dealloc(TransportCore *self)
{
    PyObject_GC_UnTrack(self);
    TransportCore_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject TransportCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gtarantool._speedups.TransportCore",
    .tp_basicsize = sizeof(TransportCore),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The state a transport shares with the C paths (see TransportCore in "
              "_speedups.c); transport.Transport derives from it.",
    .tp_new = PyType_GenericNew,
    .tp_members = TransportCore_members,
    .tp_methods = TransportCore_methods,
    .tp_traverse = (traverseproc)TransportCore_traverse,
    .tp_clear = (inquiry)TransportCore_clear,
    .tp_dealloc = (destructor)TransportCore_dealloc,
};

/* The field `value` of a TransportCore (borrowed), or NULL with the
 * AttributeError an unset slot raises. */
static PyObject *
core_field(PyObject *core, PyObject *value, const char *name)
{
    if (value == NULL)
        PyErr_Format(PyExc_AttributeError, "'%.100s' object has no attribute '%s'",
                     Py_TYPE(core)->tp_name, name);
    return value;
}

#define CORE(obj) ((TransportCore *)(obj))
#define FIELD(obj, field, name) core_field((obj), CORE(obj)->field, (name))

/* The true value of a field: 1, 0, or -1 with an exception set. */
static int
core_flag(PyObject *core, PyObject *value, const char *name)
{
    if (core_field(core, value, name) == NULL)
        return -1;
    return PyObject_IsTrue(value);
}

/* Set a flag field to True or False. */
static void
core_set_flag(PyObject **field, int value)
{
    Py_XSETREF(*field, Py_NewRef(value ? Py_True : Py_False));
}

/* A Stats object's counters (transport.Stats) that the C paths add to, and
 * where its type keeps them: their __slots__ are written in place, anything
 * else goes through update(). */
enum { C_REQUESTS, C_RESPONSES, C_SEND_CALLS, C_RECV_CALLS, C_BYTES_OUT, C_BYTES_IN,
       C_MAX_IN_FLIGHT, N_COUNTERS };

typedef struct {
    PyObject *type;             /* the type the offsets are for, or NULL */
    Py_ssize_t offset[N_COUNTERS];
} Counters;

static PyObject **counter_names[N_COUNTERS] = {&str_requests, &str_responses, &str_send_calls,
                                               &str_recv_calls, &str_bytes_out, &str_bytes_in,
                                               &str_max_in_flight};

/* Requester(transport, slow, wakeup_set, getcurrent, max_in_flight,
 * flush_every, cutter, lead_up_to=0).request(sync, code, schema_version, body) is
 * transport.Transport.request for the requests nearly every caller makes: an
 * int code below 128, a bytes body, ints that fit the header, a free slot and
 * a live transport (stop() not called: Transport._fail calls it when it sets
 * transport.error) in the process that opened it (see fork_generation).  It
 * frames the header, queues header and body for the writer (a lone request,
 * or the first of a batch of at most lead_up_to woken callers with nothing
 * at the server: sends them, as send_now below),
 * registers the current greenlet under its sync (every flush_every requests
 * queued, calls transport.flush_early()) and switches away (to
 * the next caller whose reply is in, or to the hub) until its reply is taken
 * from `ready` (a RawReply finished by `cutter`, the transport's ReplyCutter
 * or None).  Any other call goes to slow(transport, sync, code,
 * schema_version, body), the Python method, unchanged; so do the rare ends:
 * transport.forget(sync, greenlet) when the switch raises (a timeout, a
 * kill), transport.switched_early(sync, greenlet) when it returns with no
 * reply. */
typedef struct {
    PyObject_HEAD
    PyObject *transport, *slow;
    PyObject *pending;          /* dict: sync -> waiter */
    PyObject *ready;            /* deque of (greenlet, reply) */
    PyObject *ready_popleft;    /* its bound popleft */
    PyObject *wbuf;             /* list of frames for the writer */
    PyObject *wakeup_set;       /* bound Event.set: the writer's wake-up */
    PyObject *hub, *hub_switch, *getcurrent;
    Py_ssize_t max_in_flight;
    Py_ssize_t flush_entries;   /* wbuf entries (two per request) between early flushes */
    Py_ssize_t lead_up_to;      /* the most woken callers whose first request leads */
    PyObject *cutter;           /* the ReplyCutter that finishes RawReplies, or None */
    Counters counters;          /* transport.stats's */
    int stopped;                /* the transport died: every call goes to slow() */
    unsigned long generation;   /* fork_generation when made: another goes to slow() */
} Requester;

static inline void
put_be32(unsigned char *p, uint32_t v)
{
    p[0] = v >> 24;
    p[1] = v >> 16;
    p[2] = v >> 8;
    p[3] = v;
}

/* Transport.request's rule for a request with nothing of ours at the server
 * and nothing queued: sent at once when no other caller is about to run
 * (`others` is how many are), or when they are few (the batch they make, this
 * caller included, at most lead_up_to). */
static inline int
leads(Py_ssize_t others, Py_ssize_t lead_up_to)
{
    return others == 0 || (others > 0 && others < lead_up_to);
}

/* The request header as Transport.request packs it (_REQUEST_HEADER). */
static PyObject *
request_header(uint32_t code, unsigned long long sync, uint32_t schema, Py_ssize_t body_size)
{
    PyObject *header = PyBytes_FromStringAndSize(NULL, REQUEST_HEADER_SIZE);
    unsigned char *p;

    if (header == NULL)
        return NULL;
    p = (unsigned char *)PyBytes_AS_STRING(header);
    p[0] = 0xce;
    put_be32(p + 1, (uint32_t)(REQUEST_HEADER_SIZE - 5 + body_size));
    p[5] = 0x83;
    p[6] = 0x00;
    p[7] = (unsigned char)code;
    p[8] = 0x01;
    p[9] = 0xcf;
    put_be32(p + 10, (uint32_t)(sync >> 32));
    put_be32(p + 14, (uint32_t)sync);
    p[18] = 0x05;
    p[19] = 0xce;
    put_be32(p + 20, schema);
    return header;
}

/* The first greenlet in `ready` (borrowed; it stays referenced from there),
 * NULL when there is none. */
static PyObject *
first_ready(Requester *self)
{
    PyObject *first, *glet = NULL;

    if (PyObject_Size(self->ready) <= 0)
        return NULL;
    first = PySequence_GetItem(self->ready, 0);
    if (first == NULL) {
        PyErr_Clear();
        return NULL;
    }
    if (PyTuple_CheckExact(first) && PyTuple_GET_SIZE(first) == 2)
        glet = PyTuple_GET_ITEM(first, 0);
    Py_DECREF(first);
    return glet;
}

/* obj.name += n, or obj.name = max(obj.name, n) when `highest`. */
static int
update(PyObject *obj, PyObject *name, Py_ssize_t n, int highest)
{
    PyObject *old = PyObject_GetAttr(obj, name), *new;
    Py_ssize_t value;
    int res;

    if (old == NULL)
        return -1;
    value = PyLong_AsSsize_t(old);
    Py_DECREF(old);
    if (value == -1 && PyErr_Occurred())
        return -1;
    if (highest && value >= n)
        return 0;
    new = PyLong_FromSsize_t(highest ? n : value + n);
    if (new == NULL)
        return -1;
    res = PyObject_SetAttr(obj, name, new);
    Py_DECREF(new);
    return res;
}

/* update(stats, <counter `which`>, n, highest). */
static int
count(Counters *c, PyObject *stats, int which, Py_ssize_t n, int highest)
{
    PyObject **slot, *new;
    Py_ssize_t value;

    if ((PyObject *)Py_TYPE(stats) != c->type) {
        int i;
        Py_XSETREF(c->type, Py_NewRef((PyObject *)Py_TYPE(stats)));
        for (i = 0; i < N_COUNTERS; i++)
            c->offset[i] = member_offset(Py_TYPE(stats), *counter_names[i]);
    }
    slot = c->offset[which] ? (PyObject **)((char *)stats + c->offset[which]) : NULL;
    if (slot == NULL || *slot == NULL || !PyLong_CheckExact(*slot))
        return update(stats, *counter_names[which], n, highest);
    value = PyLong_AsSsize_t(*slot);
    if (value == -1 && PyErr_Occurred())
        return -1;
    if (highest && value >= n)
        return 0;
    new = PyLong_FromSsize_t(highest ? n : value + n);
    if (new == NULL)
        return -1;
    Py_SETREF(*slot, new);
    return 0;
}

/* Transport._send_now: one non-blocking writev of header and body from the
 * caller's greenlet.  The common end (all sent) is counted here; the others
 * (part sent, none, an error) go to transport.after_send(header, body, sent).
 * 0, or -1 with an exception set. */
static int
send_now(Requester *self, PyObject *header, PyObject *body)
{
    PyObject *fd_obj, *stats, *sent_obj, *res;
    struct iovec iov[2];
    Py_ssize_t total, sent;
    long fd;
    int ok;

    fd_obj = FIELD(self->transport, fd, "_fd");
    if (fd_obj == NULL)
        return -1;
    fd = PyLong_AsLong(fd_obj);
    if (fd == -1 && PyErr_Occurred())
        return -1;
    iov[0].iov_base = PyBytes_AS_STRING(header);
    iov[0].iov_len = PyBytes_GET_SIZE(header);
    iov[1].iov_base = PyBytes_AS_STRING(body);
    iov[1].iov_len = PyBytes_GET_SIZE(body);
    total = PyBytes_GET_SIZE(header) + PyBytes_GET_SIZE(body);
    do {
        sent = writev((int)fd, iov, 2);
    } while (sent < 0 && errno == EINTR && !PyErr_CheckSignals());
    if (sent < 0 && PyErr_Occurred())
        return -1;
    if (sent == total) {
        stats = Py_XNewRef(FIELD(self->transport, stats, "stats"));
        if (stats == NULL)
            return -1;
        ok = count(&self->counters, stats, C_SEND_CALLS, 1, 0) < 0
            || count(&self->counters, stats, C_BYTES_OUT, sent, 0) < 0
            || count(&self->counters, stats, C_REQUESTS, 1, 0) < 0
            || count(&self->counters, stats, C_MAX_IN_FLIGHT, PyDict_GET_SIZE(self->pending),
                     1) < 0;
        Py_DECREF(stats);
        return ok ? -1 : 0;
    }
    if (sent >= 0) {
        sent_obj = PyLong_FromSsize_t(sent);
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        sent_obj = PyLong_FromLong(0);
    } else {   /* the OSError os.writev would raise */
        PyObject *type, *tb;
        PyErr_SetFromErrno(PyExc_OSError);
        PyErr_Fetch(&type, &sent_obj, &tb);
        PyErr_NormalizeException(&type, &sent_obj, &tb);
        Py_XDECREF(type);
        Py_XDECREF(tb);
    }
    if (sent_obj == NULL)
        return -1;
    res = PyObject_CallMethodObjArgs(self->transport, hooks[H_AFTER_SEND], header, body, sent_obj, NULL);
    Py_DECREF(sent_obj);
    if (res == NULL)
        return -1;
    Py_DECREF(res);
    return 0;
}

static PyObject *
Requester_request(PyObject *requester, PyObject *const *args, Py_ssize_t nargs)
{
    Requester *self = (Requester *)requester;
    PyObject *sync, *body, *header, *current, *next, *res, *item, *value;
    unsigned long long sync_value;
    unsigned long schema_value;
    long code_value;
    Py_ssize_t queued;
    int alone;
    PyObject *slow_args[5];

    if (!initialised((PyObject *)self, self->pending, 1))
        return NULL;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "request(sync, code, schema_version, body)");
        return NULL;
    }
    sync = args[0];
    body = args[3];
    if (!PyLong_CheckExact(sync) || !PyLong_CheckExact(args[1]) || !PyLong_CheckExact(args[2])
            || !PyBytes_CheckExact(body)
            || PyBytes_GET_SIZE(body) > 0xffffffffLL - (REQUEST_HEADER_SIZE - 5)
            || PyDict_GET_SIZE(self->pending) >= self->max_in_flight || self->stopped
            || self->generation != fork_generation)
        goto slow;
    code_value = PyLong_AsLong(args[1]);
    sync_value = PyLong_AsUnsignedLongLong(sync);
    schema_value = PyLong_AsUnsignedLong(args[2]);
    if (PyErr_Occurred()) {   /* out of range: the Python method says how */
        PyErr_Clear();
        goto slow;
    }
    if (code_value < 0 || code_value > 127 || schema_value > 0xffffffffUL)
        goto slow;

    header = request_header((uint32_t)code_value, sync_value, (uint32_t)schema_value,
                            PyBytes_GET_SIZE(body));
    if (header == NULL)
        return NULL;
    alone = PyDict_GET_SIZE(self->pending) == 0;
    current = PyObject_CallNoArgs(self->getcurrent);
    if (current == NULL) {
        Py_DECREF(header);
        return NULL;
    }
    if (PyDict_SetItem(self->pending, sync, current) < 0) {
        Py_DECREF(header);
        Py_DECREF(current);
        return NULL;
    }
    /* A lone request, or the one that leads a small batch, is sent by its
     * caller (see Transport.request), the rest queued for the writer. */
    queued = PyList_GET_SIZE(self->wbuf);
    if (alone && queued == 0 && leads(PyObject_Size(self->ready), self->lead_up_to)) {
        int sent = send_now(self, header, body);
        Py_DECREF(header);
        if (sent < 0)
            goto unregister;
    } else {
        if (queued == 0) {
            /* the writer is woken unless a flush is due (Transport.flush) */
            int due = core_flag(self->transport, CORE(self->transport)->flush_due,
                                "_flush_due");
            if (due < 0) {
                Py_DECREF(header);
                goto unregister;
            }
            if (!due) {
                res = PyObject_CallNoArgs(self->wakeup_set);
                if (res == NULL) {
                    Py_DECREF(header);
                    goto unregister;
                }
                Py_DECREF(res);
            }
            queued = PyList_GET_SIZE(self->wbuf);   /* (Python ran) */
        }
        if (PyList_Append(self->wbuf, header) < 0) {
            Py_DECREF(header);
            goto unregister;
        }
        Py_DECREF(header);
        if (PyList_Append(self->wbuf, body) < 0) {   /* two entries per request, or none */
            PyList_SetSlice(self->wbuf, queued, queued + 1, NULL);
            goto unregister;
        }
        if (PyList_GET_SIZE(self->wbuf) % self->flush_entries == 0) {
            /* queued and registered: a failed send fails the transport, and so this caller */
            res = PyObject_CallMethodNoArgs(self->transport, hooks[H_FLUSH_EARLY]);
            if (res == NULL)
                goto forget;
            Py_DECREF(res);
        }
    }

    /* Wake the next caller whose reply is in (it takes its reply itself) or
     * let the hub run; see Transport.request. */
    next = current != self->hub ? first_ready(self) : NULL;
    if (next != NULL) {
        Py_INCREF(next);   /* it takes its entry from `ready`, and may end, before we run */
        res = PyObject_CallMethodNoArgs(next, str_switch);
        Py_DECREF(next);
    } else {
        res = PyObject_CallNoArgs(self->hub_switch);
    }
    if (res == NULL)
        goto forget;
    Py_DECREF(res);
    /* (A copy in a forked child may wake with a reply the parent read before
     * the fork: the hook raises CopiedCall for it.) */
    if (first_ready(self) != current || self->generation != fork_generation) {
        res = PyObject_CallMethodObjArgs(self->transport, hooks[H_SWITCHED_EARLY], sync, current,
                                         NULL);
        Py_DECREF(current);
        return res;
    }
    Py_DECREF(current);
    item = PyObject_CallNoArgs(self->ready_popleft);
    if (item == NULL)
        return NULL;
    value = PyTuple_GET_ITEM(item, 1);
    if (Py_IS_TYPE(value, &RawReplyType) && Py_IS_TYPE(self->cutter, &ReplyCutterType))
        value = finish((ReplyCutter *)self->cutter, value);
    else
        Py_INCREF(value);
    Py_DECREF(item);
    return value;

forget:   /* a timeout, a kill (or a failed early flush): forget the request, then raise */
    {
        PyObject *type, *exc, *tb;
        PyErr_Fetch(&type, &exc, &tb);
        res = PyObject_CallMethodObjArgs(self->transport, hooks[H_FORGET], sync, current, NULL);
        Py_DECREF(current);
        if (res == NULL) {   /* raise what forget raised, in the context of the first */
            PyObject *type2, *exc2, *tb2;
            PyErr_NormalizeException(&type, &exc, &tb);
            if (tb != NULL)
                PyException_SetTraceback(exc, tb);
            PyErr_Fetch(&type2, &exc2, &tb2);
            PyErr_NormalizeException(&type2, &exc2, &tb2);
            PyException_SetContext(exc2, exc);   /* steals exc */
            Py_XDECREF(type);
            Py_XDECREF(tb);
            PyErr_Restore(type2, exc2, tb2);
            return NULL;
        }
        Py_DECREF(res);
        PyErr_Restore(type, exc, tb);
        return NULL;
    }

unregister:   /* nothing sent or queued for it: no reply to wait for */
    {
        PyObject *type, *exc, *tb;
        PyErr_Fetch(&type, &exc, &tb);
        if (PyDict_DelItem(self->pending, sync) < 0)
            PyErr_Clear();
        PyErr_Restore(type, exc, tb);
    }
    Py_DECREF(current);
    return NULL;

slow:
    slow_args[0] = self->transport;
    memcpy(slow_args + 1, args, 4 * sizeof(PyObject *));
    return PyObject_Vectorcall(self->slow, slow_args, 5, NULL);
}

static int
Requester_init(Requester *self, PyObject *args, PyObject *kwds)
{
    PyObject *transport, *slow, *pending, *ready, *wbuf, *wakeup_set, *hub, *getcurrent,
        *cutter;
    Py_ssize_t max_in_flight, flush_every, lead_up_to = 0;
    static char *names[] = {"transport", "slow", "wakeup_set", "getcurrent", "max_in_flight",
                            "flush_every", "cutter", "lead_up_to", NULL};

    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!OOOnnO|n:Requester", names,
                                     &TransportCoreType, &transport, &slow, &wakeup_set,
                                     &getcurrent, &max_in_flight, &flush_every, &cutter,
                                     &lead_up_to)
            || !initialised((PyObject *)self, self->pending, 0))
        return -1;
    if (cutter != Py_None && !Py_IS_TYPE(cutter, &ReplyCutterType)) {
        PyErr_SetString(PyExc_TypeError, "cutter must be a ReplyCutter or None");
        return -1;
    }
    if (flush_every < 1 || flush_every > PY_SSIZE_T_MAX / 2) {
        PyErr_SetString(PyExc_ValueError, "flush_every must be a positive number of requests");
        return -1;
    }
    /* the transport's containers, read once: they stay for its life */
    if ((pending = FIELD(transport, pending, "_pending")) == NULL
            || (ready = FIELD(transport, ready, "_ready")) == NULL
            || (wbuf = FIELD(transport, wbuf, "_wbuf")) == NULL
            || (hub = FIELD(transport, hub, "_hub")) == NULL)
        return -1;
    if (!PyDict_CheckExact(pending) || !PyList_CheckExact(wbuf)) {
        PyErr_SetString(PyExc_TypeError,
                        "Requester: the transport's _pending must be a dict, its _wbuf a list");
        return -1;
    }
    /* (getattr runs Python, which may replace the fields: hold them meanwhile) */
    Py_INCREF(pending);
    Py_INCREF(ready);
    Py_INCREF(wbuf);
    Py_INCREF(hub);
    Py_XSETREF(self->hub_switch, PyObject_GetAttr(hub, str_switch));
    if (self->hub_switch == NULL)
        goto error;
    Py_XSETREF(self->ready_popleft, PyObject_GetAttr(ready, str_popleft));
    if (self->ready_popleft == NULL)
        goto error;
    Py_XSETREF(self->transport, Py_NewRef(transport));
    Py_XSETREF(self->slow, Py_NewRef(slow));
    Py_XSETREF(self->ready, ready);
    Py_XSETREF(self->wbuf, wbuf);
    Py_XSETREF(self->wakeup_set, Py_NewRef(wakeup_set));
    Py_XSETREF(self->hub, hub);
    Py_XSETREF(self->getcurrent, Py_NewRef(getcurrent));
    Py_XSETREF(self->cutter, Py_NewRef(cutter));
    self->max_in_flight = max_in_flight;
    self->flush_entries = 2 * flush_every;
    self->lead_up_to = lead_up_to;
    self->generation = fork_generation;
    Py_XSETREF(self->pending, pending);   /* last: request() checks it */
    return 0;
error:
    Py_DECREF(pending);
    Py_DECREF(ready);
    Py_DECREF(wbuf);
    Py_DECREF(hub);
    return -1;
}

static int
Requester_traverse(Requester *self, visitproc visit, void *arg)
{
    Py_VISIT(self->transport);
    Py_VISIT(self->slow);
    Py_VISIT(self->pending);
    Py_VISIT(self->ready);
    Py_VISIT(self->ready_popleft);
    Py_VISIT(self->wbuf);
    Py_VISIT(self->wakeup_set);
    Py_VISIT(self->hub);
    Py_VISIT(self->hub_switch);
    Py_VISIT(self->getcurrent);
    Py_VISIT(self->cutter);
    Py_VISIT(self->counters.type);
    return 0;
}

static int
Requester_clear(Requester *self)
{
    Py_CLEAR(self->transport);
    Py_CLEAR(self->slow);
    Py_CLEAR(self->pending);
    Py_CLEAR(self->ready);
    Py_CLEAR(self->ready_popleft);
    Py_CLEAR(self->wbuf);
    Py_CLEAR(self->wakeup_set);
    Py_CLEAR(self->hub);
    Py_CLEAR(self->hub_switch);
    Py_CLEAR(self->getcurrent);
    Py_CLEAR(self->cutter);
    Py_CLEAR(self->counters.type);
    return 0;
}

static void
Requester_dealloc(Requester *self)
{
    PyObject_GC_UnTrack(self);
    Requester_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
Requester_stop(Requester *self, PyObject *unused)
{
    self->stopped = 1;
    Py_RETURN_NONE;
}

static PyMethodDef Requester_methods[] = {
    {"request", (PyCFunction)(void (*)(void))Requester_request, METH_FASTCALL,
     "request(sync, code, schema_version, body) -> the reply (see Transport.request)"},
    {"stop", (PyCFunction)Requester_stop, METH_NOARGS,
     "stop(): the transport died; from now on every request goes to the Python method"},
    {NULL, NULL, 0, NULL}
};

static PyTypeObject RequesterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gtarantool._speedups.Requester",
    .tp_basicsize = sizeof(Requester),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The caller's side of Transport.request (see Requester in _speedups.c).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Requester_init,
    .tp_traverse = (traverseproc)Requester_traverse,
    .tp_clear = (inquiry)Requester_clear,
    .tp_dealloc = (destructor)Requester_dealloc,
    .tp_methods = Requester_methods,
};

/* LoneReader(transport, slow, cutter)() is transport.Transport._readable, the
 * read watcher's callback in the hub, for what it nearly always does with one
 * greenlet's requests in sequence: one receive (cutter's receive_lone) that
 * brings exactly the reply of the one request in flight, counted in
 * transport.stats, and a switch straight to its caller (Transport.hand_on).
 * With anything buffered, queued or being woken, or in a process forked since
 * (see fork_generation), it calls slow(transport),
 * the Python method, instead; a receive that is not one whole reply goes on
 * in Python (transport.after_lone_receive, then hand_on), and an error goes to
 * the reader greenlet as there.  The transport's _ready, _queue, _wbuf, stats,
 * _reader, _hub and _fd are read once, by __init__ (they stay for its life);
 * _rlen, _waking, _rbuf and max_response_size at each call. */
typedef struct {
    PyObject_HEAD
    PyObject *transport, *slow, *cutter;
    PyObject *ready, *queue;    /* deques: callers to wake, callers in line */
    PyObject *wbuf, *stats, *reader, *hub;
    Counters counters;
    long fd;
    unsigned long generation;   /* fork_generation when made: another goes to slow() */
} LoneReader;

static int
LoneReader_init(LoneReader *self, PyObject *args, PyObject *kwds)
{
    static char *names[] = {"transport", "slow", "cutter", NULL};
    PyObject **fields[] = {&self->ready, &self->queue, &self->wbuf, &self->stats, &self->reader,
                           &self->hub};
    static const char *field_names[] = {"_ready", "_queue", "_wbuf", "stats", "_reader", "_hub"};
    PyObject *transport, *slow, *cutter, *fd;
    TransportCore *core;
    size_t i;

    if (!initialised((PyObject *)self, self->transport, 0))
        return -1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!OO!:LoneReader", names, &TransportCoreType,
                                     &transport, &slow, &ReplyCutterType, &cutter))
        return -1;
    core = CORE(transport);
    {
        PyObject *values[] = {core->ready, core->queue, core->wbuf, core->stats, core->reader,
                              core->hub};
        for (i = 0; i < sizeof(fields) / sizeof(fields[0]); i++)
            if (core_field(transport, values[i], field_names[i]) == NULL)
                return -1;
        fd = FIELD(transport, fd, "_fd");
        if (fd == NULL)
            return -1;
        self->fd = PyLong_AsLong(fd);
        if (self->fd == -1 && PyErr_Occurred())
            return -1;
        for (i = 0; i < sizeof(fields) / sizeof(fields[0]); i++)
            Py_XSETREF(*fields[i], Py_NewRef(values[i]));
    }
    if (!PyList_CheckExact(self->wbuf)) {
        PyErr_SetString(PyExc_TypeError, "LoneReader: transport._wbuf must be a list");
        return -1;
    }
    Py_XSETREF(self->slow, Py_NewRef(slow));
    Py_XSETREF(self->cutter, Py_NewRef(cutter));
    self->generation = fork_generation;
    self->transport = Py_NewRef(transport);   /* last: initialised() looks at it */
    return 0;
}

/* The exception raised: to the reader greenlet, which fails the transport
 * (Transport._readable's except clause). */
static PyObject *
to_reader(LoneReader *self)
{
    PyObject *type, *exc, *tb, *res;

    PyErr_Fetch(&type, &exc, &tb);
    PyErr_NormalizeException(&type, &exc, &tb);
    if (tb != NULL)
        PyException_SetTraceback(exc, tb);
    res = PyObject_CallMethodOneArg(self->reader, str_switch, exc);
    Py_XDECREF(type);
    Py_XDECREF(exc);
    Py_XDECREF(tb);
    return res;
}

/* Transport.hand_on(False) with the one reply in `ready`: switch to its caller. */
static PyObject *
hand_on_lone(LoneReader *self)
{
    PyObject *first, *waiting, *res;

    first = PySequence_GetItem(self->ready, 0);
    if (first == NULL)
        return NULL;
    if (!PyTuple_CheckExact(first) || PyTuple_GET_SIZE(first) != 2) {
        Py_DECREF(first);
        PyErr_SetString(PyExc_TypeError, "LoneReader: ready holds (greenlet, reply) pairs");
        return NULL;
    }
    waiting = Py_NewRef(PyTuple_GET_ITEM(first, 0));
    Py_DECREF(first);
    core_set_flag(&CORE(self->transport)->flush_due, 1);
    res = PyObject_CallMethodNoArgs(waiting, str_switch);
    if (res == NULL) {   /* as gevent's Waiter: a greenlet that died raising */
        PyObject *type, *exc, *tb;
        PyErr_Fetch(&type, &exc, &tb);
        PyErr_NormalizeException(&type, &exc, &tb);
        res = PyObject_CallMethodObjArgs(self->hub, str_handle_error, waiting,
                                         type ? type : Py_None, exc ? exc : Py_None,
                                         tb ? tb : Py_None, NULL);
        Py_XDECREF(type);
        Py_XDECREF(exc);
        Py_XDECREF(tb);
        if (res == NULL)
            goto error;
    }
    Py_DECREF(res);
    core_set_flag(&CORE(self->transport)->flush_due, 0);
    if (PyObject_Size(self->ready) > 0) {
        PyObject *glet;
        first = PySequence_GetItem(self->ready, 0);
        if (first == NULL)
            goto error;
        glet = PyTuple_CheckExact(first) && PyTuple_GET_SIZE(first) == 2
            ? PyTuple_GET_ITEM(first, 0) : NULL;
        Py_DECREF(first);
        if (glet == waiting) {   /* it did not take its reply (it was dead) */
            res = PyObject_CallMethodNoArgs(self->ready, str_popleft);
            if (res == NULL)
                goto error;
            Py_DECREF(res);
        }
    }
    Py_DECREF(waiting);
    if (PyList_GET_SIZE(self->wbuf) > 0)
        return PyObject_CallMethodNoArgs(self->transport, hooks[H_FLUSH]);
    Py_RETURN_NONE;
error:
    Py_DECREF(waiting);
    return NULL;
}

static PyObject *
LoneReader_call(LoneReader *self, PyObject *args, PyObject *kwds)
{
    PyObject *rbuf, *limit_obj, *more, *res;
    TransportCore *core;
    Py_ssize_t received, limit;
    int busy, taken, got;

    if (!initialised((PyObject *)self, self->transport, 1))
        return NULL;
    if (PyTuple_GET_SIZE(args) != 0 || (kwds != NULL && PyDict_GET_SIZE(kwds) != 0)) {
        PyErr_SetString(PyExc_TypeError, "LoneReader() takes no arguments");
        return NULL;
    }
    if (self->generation != fork_generation)   /* a forked child: no receive here */
        return PyObject_CallOneArg(self->slow, self->transport);
    core = CORE(self->transport);
    busy = core_flag(self->transport, core->rlen, "_rlen");
    if (busy == 0)
        busy = PyObject_Size(self->ready) != 0 || PyObject_Size(self->queue) != 0;
    if (busy == 0)
        busy = core_flag(self->transport, core->waking, "_waking");
    if (busy < 0)
        return NULL;
    if (busy)
        return PyObject_CallOneArg(self->slow, self->transport);

    rbuf = Py_XNewRef(FIELD(self->transport, rbuf, "_rbuf"));
    if (rbuf == NULL)
        return to_reader(self);
    limit_obj = FIELD(self->transport, max_response_size, "max_response_size");
    limit = limit_obj == NULL ? -1 : PyLong_AsSsize_t(limit_obj);
    if (limit == -1 && PyErr_Occurred()) {
        Py_DECREF(rbuf);
        return to_reader(self);
    }
    got = receive_lone((ReplyCutter *)self->cutter, self->fd, rbuf, limit, &received, &taken);
    Py_DECREF(rbuf);
    if (got < 0)
        return to_reader(self);
    if (got == 0)
        Py_RETURN_NONE;
    if (received == 0 || !taken) {   /* the rest of _read_lone, then _readable's */
        PyObject *received_obj = PyLong_FromSsize_t(received);
        if (received_obj == NULL)
            return to_reader(self);
        more = PyObject_CallMethodObjArgs(self->transport, hooks[H_AFTER_LONE_RECEIVE], received_obj,
                                          taken ? Py_True : Py_False, NULL);
        Py_DECREF(received_obj);
        if (more == NULL)
            return to_reader(self);
        res = PyObject_CallMethodOneArg(self->transport, hooks[H_HAND_ON], more);
        Py_DECREF(more);
        return res;
    }
    if (count(&self->counters, self->stats, C_RECV_CALLS, 1, 0) < 0
            || count(&self->counters, self->stats, C_BYTES_IN, received, 0) < 0
            || count(&self->counters, self->stats, C_RESPONSES, 1, 0) < 0)
        return to_reader(self);
    if (PyObject_Size(self->ready) != 1)   /* (decoding ran Python: an ext_hook) */
        return PyObject_CallMethodOneArg(self->transport, hooks[H_HAND_ON], Py_False);
    return hand_on_lone(self);
}

static int
LoneReader_traverse(LoneReader *self, visitproc visit, void *arg)
{
    Py_VISIT(self->transport);
    Py_VISIT(self->slow);
    Py_VISIT(self->cutter);
    Py_VISIT(self->ready);
    Py_VISIT(self->queue);
    Py_VISIT(self->wbuf);
    Py_VISIT(self->stats);
    Py_VISIT(self->reader);
    Py_VISIT(self->hub);
    Py_VISIT(self->counters.type);
    return 0;
}

static int
LoneReader_clear(LoneReader *self)
{
    Py_CLEAR(self->transport);
    Py_CLEAR(self->slow);
    Py_CLEAR(self->cutter);
    Py_CLEAR(self->ready);
    Py_CLEAR(self->queue);
    Py_CLEAR(self->wbuf);
    Py_CLEAR(self->stats);
    Py_CLEAR(self->reader);
    Py_CLEAR(self->hub);
    Py_CLEAR(self->counters.type);
    return 0;
}

static void
LoneReader_dealloc(LoneReader *self)
{
    PyObject_GC_UnTrack(self);
    LoneReader_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject LoneReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gtarantool._speedups.LoneReader",
    .tp_basicsize = sizeof(LoneReader),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The read watcher's callback, Transport._readable (see LoneReader in _speedups.c).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)LoneReader_init,
    .tp_call = (ternaryfunc)LoneReader_call,
    .tp_traverse = (traverseproc)LoneReader_traverse,
    .tp_clear = (inquiry)LoneReader_clear,
    .tp_dealloc = (destructor)LoneReader_dealloc,
};

static int
is_zero(PyObject *number)
{
    int overflow;
    return PyLong_CheckExact(number) && PyLong_AsLongAndOverflow(number, &overflow) == 0
        && !overflow;
}

/* responses(conn, syncs, replies, unpackb, options, response_type, general):
 * protocol.responses for a pipeline's replies (sync -> (code, schema version,
 * body bytes) or an exception).  An OK reply whose body decodes to a map
 * becomes a response_type object here; anything else is general(sync, value). */
static PyObject *
responses(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *conn, *syncs, *replies, *general, *options, *out;
    Decoding d;
    Py_ssize_t i, n;

    if (nargs != 7 || !PyList_Check(args[1]) || !PyDict_Check(args[2])
            || !PyTuple_Check(args[4]) || PyTuple_GET_SIZE(args[4]) != 3
            || !PyType_Check(args[5])) {
        PyErr_SetString(PyExc_TypeError, "responses(conn, syncs list, replies dict, unpackb, "
                        "(use_list, raw, ext_hook), response_type, general)");
        return NULL;
    }
    conn = args[0];
    replies = args[2];
    options = args[4];
    general = args[6];
    d.unpackb = args[3];
    d.use_list = PyTuple_GET_ITEM(options, 0);
    d.raw = PyTuple_GET_ITEM(options, 1);
    d.ext_hook = PyTuple_GET_ITEM(options, 2);
    d.response_type = (PyTypeObject *)args[5];
    if (check_response_type(args[5]) < 0)
        return NULL;
    /* Decoding can run Python (ext_hook), which may change `syncs` and
     * `replies`: the loop works on its own references to both's items. */
    syncs = PyList_AsTuple(args[1]);
    if (syncs == NULL)
        return NULL;
    n = PyTuple_GET_SIZE(syncs);
    out = PyList_New(n);
    if (out == NULL)
        goto error;
    for (i = 0; i < n; i++) {
        PyObject *sync = PyTuple_GET_ITEM(syncs, i), *value, *result = NULL;
        value = PyDict_GetItemWithError(replies, sync);   /* borrowed */
        if (value == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetObject(PyExc_KeyError, sync);
            goto error;
        }
        Py_INCREF(value);   /* and so its body bytes, which decode_body reads in place */
        if (PyTuple_CheckExact(value) && PyTuple_GET_SIZE(value) == 3
                && PyBytes_CheckExact(PyTuple_GET_ITEM(value, 2))
                && PyBytes_GET_SIZE(PyTuple_GET_ITEM(value, 2)) > 0
                && is_zero(PyTuple_GET_ITEM(value, 0))) {
            PyObject *bytes = PyTuple_GET_ITEM(value, 2), *schema = PyTuple_GET_ITEM(value, 1);
            const unsigned char *start = (const unsigned char *)PyBytes_AS_STRING(bytes);
            PyObject *rows = data_only(&d, start, PyBytes_GET_SIZE(bytes)), *body;
            int failed;

            if (rows != NULL) {
                result = ok_response(&d, sync, schema, NULL, rows, NULL);
                Py_DECREF(rows);
                failed = result == NULL;
            } else {
                body = decode_body(&d, start, PyBytes_GET_SIZE(bytes), 0);
                failed = body == NULL;
                if (body != NULL && PyDict_CheckExact(body)) {
                    result = ok_response(&d, sync, schema, body, NULL, NULL);
                    failed = result == NULL;
                }
                Py_XDECREF(body);   /* an error or not a map: the general way says which */
            }
            if (failed) {
                Py_DECREF(value);
                goto error;
            }
            if (result != NULL)
                Py_XSETREF(((ResponseCore *)result)->conn, Py_NewRef(conn));
        }
        if (result == NULL)
            result = PyObject_CallFunctionObjArgs(general, sync, value, NULL);
        Py_DECREF(value);
        if (result == NULL)
            goto error;
        PyList_SET_ITEM(out, i, result);
    }
    Py_DECREF(syncs);
    return out;
error:
    Py_XDECREF(out);
    Py_DECREF(syncs);
    return NULL;
}

/* decode_error(data, unpackb, (use_list, raw, ext_hook)): an error reply's
 * body (any buffer), as protocol.BodyDecoder.decode(data, error=True) decodes
 * it, without a Python call per byte that is not UTF-8. */
static PyObject *
decode_error(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer view;
    Decoding d;
    PyObject *body;

    if (nargs != 3 || !PyTuple_Check(args[2]) || PyTuple_GET_SIZE(args[2]) != 3) {
        PyErr_SetString(PyExc_TypeError,
                        "decode_error(data, unpackb, (use_list, raw, ext_hook))");
        return NULL;
    }
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    d.unpackb = args[1];
    d.use_list = PyTuple_GET_ITEM(args[2], 0);
    d.raw = PyTuple_GET_ITEM(args[2], 1);
    d.ext_hook = PyTuple_GET_ITEM(args[2], 2);
    body = unpack_body(&d, (const unsigned char *)view.buf, view.len, 1);
    PyBuffer_Release(&view);
    return body;
}

static PyObject *
get_fork_generation(PyObject *module, PyObject *unused)
{
    return PyLong_FromUnsignedLong(fork_generation);
}

static PyMethodDef speedups_functions[] = {
    {"fork_generation", get_fork_generation, METH_NOARGS,
     "fork_generation() -> int: how many fork()s made this process (each child's count "
     "is its parent's plus one)"},
    {"decode_error", (PyCFunction)(void (*)(void))decode_error, METH_FASTCALL,
     "decode_error(data, unpackb, (use_list, raw, ext_hook)) -> an error reply's body"},
    {"responses", (PyCFunction)(void (*)(void))responses, METH_FASTCALL,
     "responses(conn, syncs, replies, unpackb, options, response_type, general) -> list"},
    {NULL, NULL, 0, NULL}
};

static struct PyModuleDef speedups_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "gtarantool._speedups",
    .m_doc = "transport.py's hot paths in C (optional: transport.py does the same without it).",
    .m_size = -1,
    .m_methods = speedups_functions,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    PyObject *module;

    if (!(checked_reply = Py_BuildValue("(iOy#)", 0, Py_None, "", (Py_ssize_t)0))
            || !(unpack_kwnames = Py_BuildValue("(ssss)", "use_list", "raw", "strict_map_key",
                                                "ext_hook"))
            || !(unpack_escaped_kwnames = Py_BuildValue("(sssss)", "use_list", "raw",
                                                        "strict_map_key", "ext_hook",
                                                        "unicode_errors"))
            || !(str_backslashreplace = PyUnicode_InternFromString("backslashreplace"))
            || !(data_key = PyLong_FromLong(IPROTO_DATA))
            || !(zero = PyLong_FromLong(0))
            || !(one = PyLong_FromLong(1))
            || !(empty_tuple = PyTuple_New(0))
            || !(str_switch = PyUnicode_InternFromString("switch"))
            || !(str_popleft = PyUnicode_InternFromString("popleft"))
            || !(str_requests = PyUnicode_InternFromString("requests"))
            || !(str_send_calls = PyUnicode_InternFromString("send_calls"))
            || !(str_bytes_out = PyUnicode_InternFromString("bytes_out"))
            || !(str_max_in_flight = PyUnicode_InternFromString("max_in_flight"))
            || !(str_handle_error = PyUnicode_InternFromString("handle_error"))
            || !(str_recv_calls = PyUnicode_InternFromString("recv_calls"))
            || !(str_bytes_in = PyUnicode_InternFromString("bytes_in"))
            || !(str_responses = PyUnicode_InternFromString("responses")))
        return NULL;
    for (int i = 0; i < N_HOOKS; i++)
        if (hooks[i] == NULL && !(hooks[i] = PyUnicode_InternFromString(hook_names[i])))
            return NULL;
    if (!fork_handler_installed) {   /* once per process, whatever imports the module */
        int err = pthread_atfork(NULL, NULL, after_fork_in_child);
        if (err != 0) {
            errno = err;
            return PyErr_SetFromErrno(PyExc_OSError);
        }
        fork_handler_installed = 1;
    }
    if (PyType_Ready(&TransportCoreType) < 0 || PyType_Ready(&ResponseCoreType) < 0
            || PyType_Ready(&ReplyCutterType) < 0 || PyType_Ready(&RequesterType) < 0
            || PyType_Ready(&RawReplyType) < 0 || PyType_Ready(&SinkCoreType) < 0
            || PyType_Ready(&LoneReaderType) < 0)
        return NULL;
    module = PyModule_Create(&speedups_module);
    if (module == NULL)
        return NULL;
    if (PyModule_AddObjectRef(module, "TransportCore", (PyObject *)&TransportCoreType) < 0
            || PyModule_AddObjectRef(module, "ResponseCore", (PyObject *)&ResponseCoreType) < 0
            || PyModule_AddObjectRef(module, "ReplyCutter", (PyObject *)&ReplyCutterType) < 0
            || PyModule_AddObjectRef(module, "Requester", (PyObject *)&RequesterType) < 0
            || PyModule_AddObjectRef(module, "RawReply", (PyObject *)&RawReplyType) < 0
            || PyModule_AddObjectRef(module, "SinkCore", (PyObject *)&SinkCoreType) < 0
            || PyModule_AddObjectRef(module, "CHECKED", checked_reply) < 0
            || PyModule_AddObjectRef(module, "LoneReader", (PyObject *)&LoneReaderType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    {
        PyObject *names = PyTuple_New(N_HOOKS);
        if (names == NULL) {
            Py_DECREF(module);
            return NULL;
        }
        for (int i = 0; i < N_HOOKS; i++)
            PyTuple_SET_ITEM(names, i, Py_NewRef(hooks[i]));
        int added = PyModule_AddObjectRef(module, "TRANSPORT_HOOKS", names);
        Py_DECREF(names);
        if (added < 0) {
            Py_DECREF(module);
            return NULL;
        }
    }
    return module;
}
