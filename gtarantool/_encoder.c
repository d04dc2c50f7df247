/* Request bodies in one piece: protocol.Encoder.join in C; and many whole
 * requests in one piece: protocol.bulk.encode_batch in C (see below).
 *
 * BodyEncoder(pack, use_bin_type).join(raw0, obj0, raw1, obj1, ...) returns
 * raw0 + pack(obj0) + raw1 + pack(obj1) + ... as one bytes object: the raw
 * parts (bytes) copied, the objects msgpack-encoded as msgpack.Packer
 * (use_bin_type=use_bin_type) encodes them.  A body is made with one
 * allocation and one copy of each string in it, where `prefix + pack(obj)`
 * makes three (Packer's buffer, its bytes, the concatenation): that is most
 * of what an insert of a large tuple costs the client.
 *
 * It encodes only the exact built-in types a request is nearly always made
 * of (None, bool, int within 64 bits, float, str, bytes, list, tuple, dict),
 * nested at most MAX_DEPTH deep.  Any other object (subclasses, Decimal, UUID,
 * datetime, bytearray, a str with lone surrogates, an int beyond 64 bits...)
 * makes it call pack(obj) for every object part of that body instead, so
 * every body and every error is the packer's own.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#if PY_VERSION_HEX < 0x030B0000
/* setup.py marks the extension optional: older Pythons build without it
 * and use protocol.py's Python join. */
#error "needs Python 3.11 or later (PyFloat_Pack8)"
#endif
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>
#include <sys/uio.h>

#define MAX_DEPTH 64
#define MAX_PARTS 8
#define DECLINED (-2)        /* sized() result: the packer must encode this one */
#define MAX_LENGTH 0xffffffffLL

typedef struct {
    PyObject_HEAD
    PyObject *pack;
    int use_bin_type;
} BodyEncoder;

/* The UTF-8 of an exact str, or NULL (with no exception set) when it has
 * none (lone surrogates): the packer then raises its own error. */
static const char *
utf8(PyObject *str, Py_ssize_t *size)
{
    const char *data;

    if (PyUnicode_IS_COMPACT_ASCII(str)) {
        *size = PyUnicode_GET_LENGTH(str);
        return (const char *)PyUnicode_DATA(str);
    }
    data = PyUnicode_AsUTF8AndSize(str, size);
    if (data == NULL)
        PyErr_Clear();
    return data;
}

static inline Py_ssize_t
int_size(long long v)
{
    if (v < -(1LL << 31))
        return 9;
    if (v < -(1LL << 15))
        return 5;
    if (v < -(1LL << 7))
        return 3;
    if (v < -(1LL << 5))
        return 2;
    if (v < (1LL << 7))
        return 1;
    if (v < (1LL << 8))
        return 2;
    if (v < (1LL << 16))
        return 3;
    if (v < (1LL << 32))
        return 5;
    return 9;
}

/* The size of a header for `n` items (or bytes): one byte below fix_limit,
 * then the 8-bit form when there is one (has8), the 16-bit, the 32-bit. */
static inline Py_ssize_t
header_size(Py_ssize_t n, Py_ssize_t fix_limit, int has8)
{
    if (n < fix_limit)
        return 1;
    if (has8 && n < 256)
        return 2;
    return n < 65536 ? 3 : 5;
}

/* The encoded size of `obj`, or DECLINED. */
static Py_ssize_t
sized(const BodyEncoder *self, PyObject *obj, int depth)
{
    PyTypeObject *type = Py_TYPE(obj);
    Py_ssize_t n, i, total;

    if (obj == Py_None || type == &PyBool_Type)
        return 1;
    if (type == &PyLong_Type) {
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
        if (overflow == 0)
            return int_size(v);
        if (overflow > 0) {
            PyLong_AsUnsignedLongLong(obj);
            if (!PyErr_Occurred())
                return 9;
            PyErr_Clear();
        }
        return DECLINED;
    }
    if (type == &PyFloat_Type)
        return 9;
    if (type == &PyUnicode_Type) {
        if (utf8(obj, &n) == NULL || n > MAX_LENGTH)
            return DECLINED;
        return header_size(n, 32, self->use_bin_type) + n;
    }
    if (type == &PyBytes_Type) {
        n = PyBytes_GET_SIZE(obj);
        if (n > MAX_LENGTH)
            return DECLINED;
        if (self->use_bin_type)
            return header_size(n, 0, 1) + n;
        return header_size(n, 32, 0) + n;
    }
    if (depth >= MAX_DEPTH)
        return DECLINED;
    if (type == &PyList_Type || type == &PyTuple_Type) {
        PyObject **items = PySequence_Fast_ITEMS(obj);
        n = PySequence_Fast_GET_SIZE(obj);
        if (n > MAX_LENGTH)
            return DECLINED;
        total = header_size(n, 16, 0);
        for (i = 0; i < n; i++) {
            Py_ssize_t size = sized(self, items[i], depth + 1);
            if (size < 0)
                return size;
            total += size;
        }
        return total;
    }
    if (type == &PyDict_Type) {
        PyObject *key, *value;
        i = 0;
        n = PyDict_GET_SIZE(obj);
        if (n > MAX_LENGTH)
            return DECLINED;
        total = header_size(n, 16, 0);
        while (PyDict_Next(obj, &i, &key, &value)) {
            Py_ssize_t k = sized(self, key, depth + 1), v;
            if (k < 0)
                return k;
            v = sized(self, value, depth + 1);
            if (v < 0)
                return v;
            total += k + v;
        }
        return total;
    }
    return DECLINED;
}

static inline unsigned char *
put_be(unsigned char *p, uint64_t v, int bytes)
{
    int i;
    for (i = bytes - 1; i >= 0; i--) {
        p[i] = (unsigned char)v;
        v >>= 8;
    }
    return p + bytes;
}

static unsigned char *
put_int(unsigned char *p, long long v)
{
    switch (int_size(v)) {
    case 1:
        *p = (unsigned char)v;
        return p + 1;
    case 2:
        *p = v < 0 ? 0xd0 : 0xcc;
        return put_be(p + 1, (uint64_t)v, 1);
    case 3:
        *p = v < 0 ? 0xd1 : 0xcd;
        return put_be(p + 1, (uint64_t)v, 2);
    case 5:
        *p = v < 0 ? 0xd2 : 0xce;
        return put_be(p + 1, (uint64_t)v, 4);
    default:
        *p = v < 0 ? 0xd3 : 0xcf;
        return put_be(p + 1, (uint64_t)v, 8);
    }
}

/* A header for `n` items: `fix` | n below fix_limit, else the 8-bit form
 * (when has8), 16-bit or 32-bit one, whose type bytes are `first`,
 * first + 1, first + 2. */
static inline unsigned char *
put_header(unsigned char *p, Py_ssize_t n, unsigned char fix, Py_ssize_t fix_limit,
           int has8, unsigned char first)
{
    if (n < fix_limit) {
        *p = fix | (unsigned char)n;
        return p + 1;
    }
    if (has8 && n < 256) {
        *p = first;
        return put_be(p + 1, (uint64_t)n, 1);
    }
    if (n < 65536) {
        *p = first + 1;
        return put_be(p + 1, (uint64_t)n, 2);
    }
    *p = first + 2;
    return put_be(p + 1, (uint64_t)n, 4);
}

/* The header of an exact str (its UTF-8 `n` bytes long) or bytes, before its contents. */
static inline unsigned char *
put_text_header(const BodyEncoder *self, unsigned char *p, PyObject *obj, Py_ssize_t n)
{
    if (Py_TYPE(obj) == &PyUnicode_Type || !self->use_bin_type)
        return put_header(p, n, 0xa0, 32, Py_TYPE(obj) == &PyUnicode_Type && self->use_bin_type,
                          0xd9);
    return put_header(p, n, 0, 0, 1, 0xc4);
}

/* Writes `obj`, which sized() accepted, at `p`; returns where it ends. */
static unsigned char *
put(const BodyEncoder *self, unsigned char *p, PyObject *obj)
{
    PyTypeObject *type = Py_TYPE(obj);
    Py_ssize_t n, i;

    if (obj == Py_None) {
        *p = 0xc0;
        return p + 1;
    }
    if (type == &PyBool_Type) {
        *p = obj == Py_True ? 0xc3 : 0xc2;
        return p + 1;
    }
    if (type == &PyLong_Type) {
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
        if (overflow == 0)
            return put_int(p, v);
        *p = 0xcf;   /* above int64, within uint64 (sized() checked) */
        return put_be(p + 1, PyLong_AsUnsignedLongLong(obj), 8);
    }
    if (type == &PyFloat_Type) {
        *p = 0xcb;
        PyFloat_Pack8(PyFloat_AS_DOUBLE(obj), (char *)p + 1, 0);
        return p + 9;
    }
    if (type == &PyUnicode_Type) {
        const char *data = utf8(obj, &n);
        p = put_text_header(self, p, obj, n);
        memcpy(p, data, n);
        return p + n;
    }
    if (type == &PyBytes_Type) {
        n = PyBytes_GET_SIZE(obj);
        p = put_text_header(self, p, obj, n);
        memcpy(p, PyBytes_AS_STRING(obj), n);
        return p + n;
    }
    if (type == &PyDict_Type) {
        PyObject *key, *value;
        i = 0;
        p = put_header(p, PyDict_GET_SIZE(obj), 0x80, 16, 0, 0xdd);
        while (PyDict_Next(obj, &i, &key, &value)) {
            p = put(self, p, key);
            p = put(self, p, value);
        }
        return p;
    }
    {   /* a list or a tuple */
        PyObject **items = PySequence_Fast_ITEMS(obj);
        n = PySequence_Fast_GET_SIZE(obj);
        p = put_header(p, n, 0x90, 16, 0, 0xdb);
        for (i = 0; i < n; i++)
            p = put(self, p, items[i]);
        return p;
    }
}

/* Packs every object part with pack(), for a body with a declined part.
 * pack() runs Python code (a default hook, a finaliser), which may change an
 * object already sized; packing them all, in order, leaves nothing sized to
 * be written later, and each part is what the packer saw at its turn. */
static int
pack_all(const BodyEncoder *self, PyObject *const *args, Py_ssize_t nargs,
         PyObject **packed, Py_ssize_t *sizes)
{
    Py_ssize_t i;

    for (i = 1; i < nargs; i += 2) {
        packed[i] = PyObject_CallOneArg(self->pack, args[i]);
        if (packed[i] == NULL)
            return -1;
        if (!PyBytes_CheckExact(packed[i])) {
            PyErr_SetString(PyExc_TypeError, "pack() returned something not bytes");
            return -1;
        }
        sizes[i] = PyBytes_GET_SIZE(packed[i]);
    }
    return 0;
}

static PyObject *
BodyEncoder_join(BodyEncoder *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *packed[MAX_PARTS] = {NULL};
    Py_ssize_t sizes[MAX_PARTS], total = 0, i;
    PyObject *result = NULL;
    unsigned char *p;
    int declined = 0;

    if (self->pack == NULL) {
        PyErr_SetString(PyExc_TypeError,
                        "BodyEncoder object was not initialised (its __init__ was not called)");
        return NULL;
    }
    if (nargs > MAX_PARTS) {
        PyErr_Format(PyExc_TypeError, "join() takes at most %d parts", MAX_PARTS);
        return NULL;
    }
    for (i = 0; i < nargs; i++) {
        PyObject *part = args[i];
        if (i % 2 == 0) {   /* raw bytes */
            if (!PyBytes_CheckExact(part)) {
                PyErr_Format(PyExc_TypeError, "join(): part %zd must be bytes, not %.100s",
                             i, Py_TYPE(part)->tp_name);
                return NULL;
            }
            sizes[i] = PyBytes_GET_SIZE(part);
        } else if (!declined) {
            sizes[i] = sized(self, part, 0);
            declined = sizes[i] == DECLINED;
        }
    }
    if (declined && pack_all(self, args, nargs, packed, sizes) < 0)
        goto done;
    for (i = 0; i < nargs; i++)
        total += sizes[i];
    result = PyBytes_FromStringAndSize(NULL, total);
    if (result == NULL)
        goto done;
    p = (unsigned char *)PyBytes_AS_STRING(result);
    for (i = 0; i < nargs; i++) {
        PyObject *raw = i % 2 == 0 ? args[i] : packed[i];
        if (raw != NULL) {
            memcpy(p, PyBytes_AS_STRING(raw), sizes[i]);
            p += sizes[i];
        } else {
            p = put(self, p, args[i]);
        }
    }
done:
    for (i = 0; i < nargs; i++)
        Py_XDECREF(packed[i]);
    return result;
}

/* -- Gather: a batch whose long values stay where they are ------------------
 *
 * encode_batch(..., gather=N) leaves out of the bytes it encodes the contents
 * of each str or bytes field of a row that is N bytes or longer: their
 * headers are written, the contents are written from the objects themselves
 * by writev (pieces of the encoded bytes between them), so that a bulk load
 * of large rows does not copy each value once more before the kernel does.
 * A Gather holds an export of the bytearray it was encoded in (which cannot
 * be resized meanwhile) and a reference to each object whose contents it
 * sends; str and bytes are immutable.  write(fd) writes what it can from
 * where it stopped; len() is what is left; tobytes() is the whole, as
 * encode_batch without gather gives it. */

#ifdef IOV_MAX
#define GATHER_IOV (IOV_MAX < 1024 ? IOV_MAX : 1024)
#else
#define GATHER_IOV 16
#endif

typedef struct {
    Py_ssize_t at;              /* where in the encoded bytes its contents go */
    const char *data;
    Py_ssize_t size;
    PyObject *owner;            /* the str or bytes holding them */
} Piece;

typedef struct {
    PyObject_HEAD
    Py_buffer arena;            /* the encoded bytes (an export of the bytearray) */
    Piece *pieces;
    Py_ssize_t npieces;
    Py_ssize_t total, sent;     /* bytes on the wire; written so far */
    /* where writing stopped: the next piece not wholly written, the encoded
     * bytes written, the bytes of that piece written */
    Py_ssize_t next, arena_at, piece_at;
} Gather;

/* The rest, from where writing stopped, as at most `max` iovecs. */
static int
gather_fill(const Gather *g, struct iovec *iov, int max)
{
    char *base = (char *)g->arena.buf;
    Py_ssize_t k = g->next, a = g->arena_at, off = g->piece_at;
    int n = 0;

    while (n < max) {
        if (k < g->npieces) {
            const Piece *piece = &g->pieces[k];
            if (a < piece->at) {
                iov[n].iov_base = base + a;
                iov[n++].iov_len = (size_t)(piece->at - a);
                a = piece->at;
                continue;
            }
            iov[n].iov_base = (void *)(piece->data + off);
            iov[n++].iov_len = (size_t)(piece->size - off);
            off = 0;
            k++;
            continue;
        }
        if (a < g->arena.len) {
            iov[n].iov_base = base + a;
            iov[n++].iov_len = (size_t)(g->arena.len - a);
        }
        break;
    }
    return n;
}

static void
gather_advance(Gather *g, Py_ssize_t w)
{
    g->sent += w;
    while (w > 0) {
        if (g->next < g->npieces) {
            const Piece *piece = &g->pieces[g->next];
            Py_ssize_t step;
            if (g->arena_at < piece->at) {
                step = Py_MIN(w, piece->at - g->arena_at);
                g->arena_at += step;
                w -= step;
                continue;
            }
            step = Py_MIN(w, piece->size - g->piece_at);
            g->piece_at += step;
            w -= step;
            if (g->piece_at == piece->size) {
                g->piece_at = 0;
                g->next++;
            }
            continue;
        }
        g->arena_at += w;
        w = 0;
    }
}

static PyObject *
Gather_write(Gather *self, PyObject *fd_obj)
{
    struct iovec iov[GATHER_IOV];
    int fd = PyObject_AsFileDescriptor(fd_obj), n;

    if (fd < 0)
        return NULL;
    n = gather_fill(self, iov, GATHER_IOV);
    if (n == 0)
        return PyLong_FromLong(0);
    for (;;) {
        ssize_t w = writev(fd, iov, n);
        if (w >= 0) {
            gather_advance(self, (Py_ssize_t)w);
            return PyLong_FromSsize_t((Py_ssize_t)w);
        }
        if (errno != EINTR)
            return PyErr_SetFromErrno(PyExc_OSError);   /* EAGAIN: BlockingIOError */
        if (PyErr_CheckSignals() < 0)
            return NULL;
    }
}

static PyObject *
Gather_tobytes(Gather *self, PyObject *unused)
{
    PyObject *result = PyBytes_FromStringAndSize(NULL, self->total);
    char *p, *base = (char *)self->arena.buf;
    Py_ssize_t k, a = 0;

    if (result == NULL)
        return NULL;
    p = PyBytes_AS_STRING(result);
    for (k = 0; k < self->npieces; k++) {
        const Piece *piece = &self->pieces[k];
        memcpy(p, base + a, piece->at - a);
        p += piece->at - a;
        a = piece->at;
        memcpy(p, piece->data, piece->size);
        p += piece->size;
    }
    memcpy(p, base + a, self->arena.len - a);
    return result;
}

static Py_ssize_t
Gather_length(Gather *self)
{
    return self->total - self->sent;
}

static void
Gather_dealloc(Gather *self)
{
    Py_ssize_t k;

    for (k = 0; k < self->npieces; k++)
        Py_XDECREF(self->pieces[k].owner);
    PyMem_Free(self->pieces);
    if (self->arena.obj != NULL)
        PyBuffer_Release(&self->arena);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Gather_methods[] = {
    {"write", (PyCFunction)Gather_write, METH_O,
     "write(fd) -> int: one writev of what is left (at most 1,024 pieces); raises "
     "BlockingIOError when the socket takes nothing"},
    {"tobytes", (PyCFunction)Gather_tobytes, METH_NOARGS,
     "tobytes() -> bytes: the whole batch, as encode_batch without gather encodes it"},
    {NULL, NULL, 0, NULL}
};

static PySequenceMethods Gather_as_sequence = {
    .sq_length = (lenfunc)Gather_length,
};

static PyTypeObject GatherType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gtarantool._encoder.Gather",
    .tp_basicsize = sizeof(Gather),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A batch of requests whose long values are written from their objects "
              "(see _encoder.c); len(): the bytes not written yet.",
    .tp_dealloc = (destructor)Gather_dealloc,
    .tp_methods = Gather_methods,
    .tp_as_sequence = &Gather_as_sequence,
};

/* Whether `item` (a row's field) is sent from where it is: the size of its
 * contents, or 0. */
static Py_ssize_t
gathered(const BodyEncoder *self, PyObject *item, Py_ssize_t from, const char **data)
{
    Py_ssize_t n;

    if (Py_TYPE(item) == &PyUnicode_Type) {
        *data = utf8(item, &n);   /* (sized() made sure it has one) */
        return *data != NULL && n >= from ? n : 0;
    }
    if (Py_TYPE(item) == &PyBytes_Type && PyBytes_GET_SIZE(item) >= from) {
        *data = PyBytes_AS_STRING(item);
        return PyBytes_GET_SIZE(item);
    }
    return 0;
}

/* A row (a list or a tuple sized() accepted) with its long fields' contents
 * left out, each recorded in g->pieces (with `base` the encoded bytes' start). */
static unsigned char *
put_gathered(const BodyEncoder *self, unsigned char *p, PyObject *row, Py_ssize_t from,
             Gather *g, const unsigned char *base)
{
    PyObject **items = PySequence_Fast_ITEMS(row);
    Py_ssize_t n = PySequence_Fast_GET_SIZE(row), i;

    p = put_header(p, n, 0x90, 16, 0, 0xdb);
    for (i = 0; i < n; i++) {
        const char *data;
        Py_ssize_t size = gathered(self, items[i], from, &data);
        Piece *piece;
        if (size == 0) {
            p = put(self, p, items[i]);
            continue;
        }
        p = put_text_header(self, p, items[i], size);
        piece = &g->pieces[g->npieces++];
        piece->at = p - base;
        piece->data = data;
        piece->size = size;
        piece->owner = Py_NewRef(items[i]);
    }
    return p;
}

/* -- encode_batch: many whole requests in one bytes object ------------------
 *
 * encode_batch(code, prefix, rows, first_sync, suffix=None, assign=(), out=None)
 * is protocol.bulk.encode_batch (its specification) in C: for each row, with the
 * syncs first_sync, first_sync + 1, ..., the frame
 *   0xce len32 | {0: code, 1: 0xcf sync64, 5: 0xce 0} | prefix pack(row)
 * and, with a suffix, suffix pack([("=", f, row[f]) for f in assign if
 * f < len(row)]) (an upsert's operations).  Rows sized() accepts are written
 * straight into the result; when one is declined, every row is packed with
 * pack() instead (as join does), so every frame and every error is the
 * packer's. */

#define REQUEST_HEADER_SIZE 24

static unsigned char *
put_request_header(unsigned char *p, Py_ssize_t body, unsigned char code, uint64_t sync)
{
    *p++ = 0xce;
    p = put_be(p, (uint64_t)(REQUEST_HEADER_SIZE - 5 + body), 4);
    *p++ = 0x83;
    *p++ = 0x00;
    *p++ = code;
    *p++ = 0x01;
    *p++ = 0xcf;
    p = put_be(p, sync, 8);
    *p++ = 0x05;
    *p++ = 0xce;
    return put_be(p, 0, 4);
}

typedef struct {
    unsigned char code;
    PyObject *prefix, *suffix;      /* suffix: NULL without operations */
    Py_ssize_t *assign, nassign;
} Batch;

/* The operations' number of entries for `row`, a list or tuple. */
static Py_ssize_t
ops_count(const Batch *b, Py_ssize_t width)
{
    Py_ssize_t i, m = 0;
    for (i = 0; i < b->nassign; i++)
        m += b->assign[i] < width;
    return m;
}

/* The encoded size of the operations of `row`, or DECLINED. */
static Py_ssize_t
ops_sized(const BodyEncoder *self, const Batch *b, PyObject *row)
{
    PyObject **items;
    Py_ssize_t width, i, total;

    if (!PyList_CheckExact(row) && !PyTuple_CheckExact(row))
        return DECLINED;
    items = PySequence_Fast_ITEMS(row);
    width = PySequence_Fast_GET_SIZE(row);
    total = header_size(ops_count(b, width), 16, 0);
    for (i = 0; i < b->nassign; i++) {
        Py_ssize_t f = b->assign[i], v;
        if (f >= width)
            continue;
        v = sized(self, items[f], 1);
        if (v < 0)
            return v;
        total += 3 + int_size(f) + v;   /* 0x93, "=" (0xa1 0x3d), f, the value */
    }
    return total;
}

static unsigned char *
put_ops(const BodyEncoder *self, const Batch *b, unsigned char *p, PyObject *row)
{
    PyObject **items = PySequence_Fast_ITEMS(row);
    Py_ssize_t width = PySequence_Fast_GET_SIZE(row), i;

    p = put_header(p, ops_count(b, width), 0x90, 16, 0, 0xdb);
    for (i = 0; i < b->nassign; i++) {
        Py_ssize_t f = b->assign[i];
        if (f >= width)
            continue;
        *p++ = 0x93;
        *p++ = 0xa1;
        *p++ = '=';
        p = put_int(p, f);
        p = put(self, p, items[f]);
    }
    return p;
}

/* pack([("=", f, row[f]) for f in assign if f < len(row)]), as bytes. */
static PyObject *
pack_ops(const BodyEncoder *self, const Batch *b, PyObject *row)
{
    PyObject *ops, *result = NULL;
    Py_ssize_t width = PyObject_Size(row), i;

    if (width < 0)
        return NULL;
    ops = PyList_New(0);
    if (ops == NULL)
        return NULL;
    for (i = 0; i < b->nassign; i++) {
        PyObject *key, *value, *op;
        int failed;
        if (b->assign[i] >= width)
            continue;
        key = PyLong_FromSsize_t(b->assign[i]);
        if (key == NULL)
            goto done;
        value = PyObject_GetItem(row, key);
        if (value == NULL) {
            Py_DECREF(key);
            goto done;
        }
        op = Py_BuildValue("(sNN)", "=", key, value);
        if (op == NULL)
            goto done;
        failed = PyList_Append(ops, op);
        Py_DECREF(op);
        if (failed < 0)
            goto done;
    }
    result = PyObject_CallOneArg(self->pack, ops);
done:
    Py_DECREF(ops);
    return result;
}

static PyObject *
packed_bytes(PyObject *obj)
{
    if (obj != NULL && !PyBytes_CheckExact(obj)) {
        PyErr_SetString(PyExc_TypeError, "pack() returned something not bytes");
        Py_DECREF(obj);
        return NULL;
    }
    return obj;
}

/* Every row (and its operations) packed by pack(): packed[2i], packed[2i + 1]. */
static int
pack_rows(const BodyEncoder *self, const Batch *b, PyObject *const *rows, Py_ssize_t n,
          PyObject **packed, Py_ssize_t *sizes)
{
    Py_ssize_t i;

    for (i = 0; i < n; i++) {
        Py_ssize_t size;
        packed[2 * i] = packed_bytes(PyObject_CallOneArg(self->pack, rows[i]));
        if (packed[2 * i] == NULL)
            return -1;
        size = PyBytes_GET_SIZE(b->prefix) + PyBytes_GET_SIZE(packed[2 * i]);
        if (b->suffix != NULL) {
            packed[2 * i + 1] = packed_bytes(pack_ops(self, b, rows[i]));
            if (packed[2 * i + 1] == NULL)
                return -1;
            size += PyBytes_GET_SIZE(b->suffix) + PyBytes_GET_SIZE(packed[2 * i + 1]);
        }
        sizes[i] = size;
    }
    return 0;
}

static unsigned char *
put_raw(unsigned char *p, PyObject *bytes)
{
    memcpy(p, PyBytes_AS_STRING(bytes), PyBytes_GET_SIZE(bytes));
    return p + PyBytes_GET_SIZE(bytes);
}

static PyObject *
BodyEncoder_encode_batch(BodyEncoder *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"code", "prefix", "rows", "first_sync", "suffix", "assign", "out",
                             "gather", NULL};
    int code;
    PyObject *prefix, *rows_arg, *first_obj, *suffix = Py_None, *assign = NULL, *out = Py_None;
    PyObject *rows = NULL, *assign_fast = NULL, *result = NULL;
    PyObject **packed = NULL;
    Py_ssize_t *sizes = NULL, n = 0, i, total = 0, from = 0, left_out = 0, npieces = 0;
    unsigned long long first_sync;
    unsigned char *p;
    Batch b = {0};
    Gather *g = NULL;
    int declined = 0;

    if (self->pack == NULL) {
        PyErr_SetString(PyExc_TypeError,
                        "BodyEncoder object was not initialised (its __init__ was not called)");
        return NULL;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "iOOO|OOOn:encode_batch", kwlist, &code,
                                     &prefix, &rows_arg, &first_obj, &suffix,
                                     &assign, &out, &from))
        return NULL;
    if (from < 0) {
        PyErr_SetString(PyExc_ValueError, "encode_batch(): gather must be >= 0");
        return NULL;
    }
    if (out != Py_None && !PyByteArray_CheckExact(out)) {
        PyErr_SetString(PyExc_TypeError, "encode_batch(): out must be a bytearray or None");
        return NULL;
    }
    if (code < 0 || code > 127) {
        PyErr_SetString(PyExc_ValueError, "encode_batch(): code must be in 0..127");
        return NULL;
    }
    if (!PyBytes_CheckExact(prefix) || (suffix != Py_None && !PyBytes_CheckExact(suffix))) {
        PyErr_SetString(PyExc_TypeError, "encode_batch(): prefix and suffix must be bytes");
        return NULL;
    }
    if (!PyLong_CheckExact(first_obj)) {
        PyErr_SetString(PyExc_TypeError, "encode_batch(): first_sync must be an int");
        return NULL;
    }
    first_sync = PyLong_AsUnsignedLongLong(first_obj);
    if (PyErr_Occurred()) {
        PyErr_SetString(PyExc_OverflowError, "encode_batch(): first_sync beyond 64 bits");
        return NULL;
    }
    b.code = (unsigned char)code;
    b.prefix = prefix;
    b.suffix = suffix == Py_None ? NULL : suffix;
    if (assign != NULL) {
        assign_fast = PySequence_Fast(assign, "encode_batch(): assign must be a sequence");
        if (assign_fast == NULL)
            return NULL;
        b.nassign = PySequence_Fast_GET_SIZE(assign_fast);
        b.assign = PyMem_New(Py_ssize_t, b.nassign ? b.nassign : 1);
        if (b.assign == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        for (i = 0; i < b.nassign; i++) {
            PyObject *f = PySequence_Fast_GET_ITEM(assign_fast, i);
            if (!PyLong_CheckExact(f)) {
                PyErr_SetString(PyExc_ValueError,
                                "encode_batch(): assign must hold field numbers (int >= 0)");
                goto done;
            }
            b.assign[i] = PyLong_AsSsize_t(f);
            if (b.assign[i] < 0) {
                PyErr_Clear();
                PyErr_SetString(PyExc_ValueError,
                                "encode_batch(): assign must hold field numbers (int >= 0)");
                goto done;
            }
        }
    }
    /* A tuple of the rows: pack() (Python) cannot change which rows there are. */
    rows = PySequence_Tuple(rows_arg);
    if (rows == NULL)
        goto done;
    n = PyTuple_GET_SIZE(rows);
    if (n > 0 && (unsigned long long)(n - 1) > UINT64_MAX - first_sync) {
        PyErr_SetString(PyExc_OverflowError, "encode_batch(): the syncs go beyond 64 bits");
        goto done;
    }
    sizes = PyMem_New(Py_ssize_t, n ? n : 1);
    if (sizes == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (i = 0; i < n && !declined; i++) {
        PyObject *row = PyTuple_GET_ITEM(rows, i);
        Py_ssize_t size = sized(self, row, 0), ops = 0;
        if (size >= 0 && b.suffix != NULL)
            ops = ops_sized(self, &b, row);
        if (size < 0 || ops < 0) {
            declined = 1;
            break;
        }
        sizes[i] = PyBytes_GET_SIZE(prefix) + size;
        if (b.suffix != NULL)
            sizes[i] += PyBytes_GET_SIZE(b.suffix) + ops;
    }
    if (declined) {
        packed = PyMem_New(PyObject *, 2 * n);
        if (packed == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        memset(packed, 0, 2 * n * sizeof(PyObject *));
        if (pack_rows(self, &b, &PyTuple_GET_ITEM(rows, 0), n, packed, sizes) < 0)
            goto done;
    }
    for (i = 0; i < n; i++) {
        if (sizes[i] > MAX_LENGTH - (REQUEST_HEADER_SIZE - 5)) {
            PyErr_SetString(PyExc_ValueError, "encode_batch(): a request beyond 4 GiB");
            goto done;
        }
        if (total > PY_SSIZE_T_MAX - REQUEST_HEADER_SIZE - sizes[i]) {
            PyErr_NoMemory();
            goto done;
        }
        total += REQUEST_HEADER_SIZE + sizes[i];
    }
    if (from > 0 && packed == NULL && b.suffix == NULL) {
        /* the long fields, whose contents a Gather sends from the rows */
        for (i = 0; i < n; i++) {
            PyObject *row = PyTuple_GET_ITEM(rows, i), **items;
            Py_ssize_t k, width;
            if (!PyList_CheckExact(row) && !PyTuple_CheckExact(row))
                continue;   /* (a row of another type is encoded as it is) */
            items = PySequence_Fast_ITEMS(row);
            width = PySequence_Fast_GET_SIZE(row);
            for (k = 0; k < width; k++) {
                const char *data;
                Py_ssize_t size = gathered(self, items[k], from, &data);
                left_out += size;
                npieces += size > 0;
            }
        }
    }
    if (npieces > 0) {
        g = PyObject_New(Gather, &GatherType);
        if (g == NULL)
            goto done;
        g->arena.obj = NULL;
        g->npieces = 0;
        g->pieces = PyMem_New(Piece, npieces);
        g->total = total;
        g->sent = g->next = g->arena_at = g->piece_at = 0;
        if (g->pieces == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        if (out == Py_None) {
            out = PyByteArray_FromStringAndSize(NULL, 0);
        } else if (((PyByteArrayObject *)out)->ob_exports > 0) {
            /* (a Gather may still write from it: a resize to the same size
             * would succeed and overwrite what it has yet to write) */
            PyErr_SetString(PyExc_BufferError,
                            "encode_batch(): out is still exported (a batch being written?)");
            goto done;
        } else {
            Py_INCREF(out);
        }
        if (out == NULL)
            goto done;
        total -= left_out;
        if (PyByteArray_Resize(out, total) < 0) {
            Py_DECREF(out);
            goto done;
        }
        p = (unsigned char *)PyByteArray_AS_STRING(out);
        for (i = 0; i < n; i++) {
            p = put_request_header(p, sizes[i], b.code, (uint64_t)(first_sync + i));
            p = put_raw(p, prefix);
            PyObject *row = PyTuple_GET_ITEM(rows, i);
            if (PyList_CheckExact(row) || PyTuple_CheckExact(row))
                p = put_gathered(self, p, row, from, g,
                                 (unsigned char *)PyByteArray_AS_STRING(out));
            else
                p = put(self, p, row);
        }
        /* held by the Gather: no resize while it may still write from it */
        i = PyObject_GetBuffer(out, &g->arena, PyBUF_SIMPLE);
        Py_DECREF(out);
        if (i < 0)
            goto done;
        result = (PyObject *)g;
        g = NULL;
        goto done;
    }
    if (out == Py_None) {
        result = PyBytes_FromStringAndSize(NULL, total);
        if (result == NULL)
            goto done;
        p = (unsigned char *)PyBytes_AS_STRING(result);
    } else {
        /* (resized in place: its memory, touched already, is reused) */
        if (PyByteArray_Resize(out, total) < 0)
            goto done;
        result = Py_NewRef(out);
        p = (unsigned char *)PyByteArray_AS_STRING(result);
    }
    for (i = 0; i < n; i++) {
        PyObject *row = PyTuple_GET_ITEM(rows, i);
        p = put_request_header(p, sizes[i], b.code, (uint64_t)(first_sync + i));
        p = put_raw(p, prefix);
        if (packed != NULL) {
            p = put_raw(p, packed[2 * i]);
            if (b.suffix != NULL) {
                p = put_raw(p, b.suffix);
                p = put_raw(p, packed[2 * i + 1]);
            }
            continue;
        }
        p = put(self, p, row);
        if (b.suffix != NULL) {
            p = put_raw(p, b.suffix);
            p = put_ops(self, &b, p, row);
        }
    }
done:
    Py_XDECREF(g);
    if (packed != NULL) {
        for (i = 0; i < 2 * n; i++)
            Py_XDECREF(packed[i]);
        PyMem_Free(packed);
    }
    PyMem_Free(sizes);
    PyMem_Free(b.assign);
    Py_XDECREF(assign_fast);
    Py_XDECREF(rows);
    return result;
}

static int
BodyEncoder_init(BodyEncoder *self, PyObject *args, PyObject *kwds)
{
    PyObject *pack;
    int use_bin_type;

    if (!PyArg_ParseTuple(args, "Op:BodyEncoder", &pack, &use_bin_type))
        return -1;
    if (!PyCallable_Check(pack)) {
        PyErr_SetString(PyExc_TypeError, "BodyEncoder(pack, use_bin_type): pack must be callable");
        return -1;
    }
    /* join() calls pack() (Python) and goes on using self: set once, for good */
    if (self->pack != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "BodyEncoder object is initialised already");
        return -1;
    }
    self->pack = Py_NewRef(pack);
    self->use_bin_type = use_bin_type;
    return 0;
}

static int
BodyEncoder_traverse(BodyEncoder *self, visitproc visit, void *arg)
{
    Py_VISIT(self->pack);
    return 0;
}

static int
BodyEncoder_clear(BodyEncoder *self)
{
    Py_CLEAR(self->pack);
    return 0;
}

static void
BodyEncoder_dealloc(BodyEncoder *self)
{
    PyObject_GC_UnTrack(self);
    BodyEncoder_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef BodyEncoder_methods[] = {
    {"join", (PyCFunction)(void (*)(void))BodyEncoder_join, METH_FASTCALL,
     "join(raw, obj, raw, obj, ...) -> raw + pack(obj) + raw + pack(obj) + ... (bytes)"},
    {"encode_batch", (PyCFunction)(void (*)(void))BodyEncoder_encode_batch,
     METH_VARARGS | METH_KEYWORDS,
     "encode_batch(code, prefix, rows, first_sync, suffix=None, assign=(), out=None, gather=0) "
     "-> bytes, out or a Gather: a whole request per row (protocol.bulk.encode_batch)"},
    {NULL, NULL, 0, NULL}
};

static PyTypeObject BodyEncoderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gtarantool._encoder.BodyEncoder",
    .tp_basicsize = sizeof(BodyEncoder),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Request bodies in one piece, encoded as pack() would (see _encoder.c).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)BodyEncoder_init,
    .tp_traverse = (traverseproc)BodyEncoder_traverse,
    .tp_clear = (inquiry)BodyEncoder_clear,
    .tp_dealloc = (destructor)BodyEncoder_dealloc,
    .tp_methods = BodyEncoder_methods,
};

/* -- convert_lines / convert_records: rows from text by a plan ---------------
 *
 * protocol.bulk.convert_lines and convert_records (their specification) in C:
 * the tuple of each record whose values are all in the strict spelling of
 * their kind, None for any other record (the caller's converter handles it).
 * A plan is a tuple of (slot, kind, nullable, call) per column. */

enum { KIND_STRING, KIND_UNSIGNED, KIND_INTEGER, KIND_NUMBER, KIND_DOUBLE, KIND_BOOLEAN,
       KIND_CALL };

typedef struct {
    Py_ssize_t slot;
    int kind, nullable;
    PyObject *call;             /* borrowed from the plan */
} Column;

typedef struct {
    Column *cols;
    Py_ssize_t ncols, width;
    PyObject *null;             /* borrowed */
    const char *null_utf8;
    Py_ssize_t null_len;
} Plan;

/* The plan's arguments checked and read, in the order the twin checks them. */
static int
plan_read(Plan *p, PyObject *null, PyObject *width, PyObject *plan)
{
    Py_ssize_t i;

    p->cols = NULL;
    if (!PyUnicode_CheckExact(null)) {
        PyErr_SetString(PyExc_TypeError, "null must be a str");
        return -1;
    }
    p->null = null;
    p->null_utf8 = PyUnicode_AsUTF8AndSize(null, &p->null_len);
    if (p->null_utf8 == NULL)
        return -1;
    if (!PyLong_CheckExact(width) || (p->width = PyLong_AsSsize_t(width)) < 0) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "width must be an int >= 0");
        return -1;
    }
    if (!PyTuple_CheckExact(plan)) {
        PyErr_SetString(PyExc_TypeError, "plan must be a tuple");
        return -1;
    }
    p->ncols = PyTuple_GET_SIZE(plan);
    p->cols = PyMem_New(Column, p->ncols ? p->ncols : 1);
    if (p->cols == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (i = 0; i < p->ncols; i++) {
        PyObject *entry = PyTuple_GET_ITEM(plan, i), *slot, *kind;
        Column *c = &p->cols[i];
        long k;
        if (!PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != 4) {
            PyErr_SetString(PyExc_TypeError, "a plan entry is (slot, kind, nullable, call)");
            return -1;
        }
        slot = PyTuple_GET_ITEM(entry, 0);
        kind = PyTuple_GET_ITEM(entry, 1);
        if (!PyLong_CheckExact(slot) || (c->slot = PyLong_AsSsize_t(slot)) < 0
                || c->slot >= p->width) {
            PyErr_Clear();
            PyErr_SetString(PyExc_ValueError, "a plan's slot must be in 0..width-1");
            return -1;
        }
        if (!PyLong_CheckExact(kind) || (k = PyLong_AsLong(kind)) < KIND_STRING
                || k > KIND_CALL) {
            PyErr_Clear();
            PyErr_SetString(PyExc_ValueError, "a plan's kind must be in 0..6");
            return -1;
        }
        c->kind = (int)k;
        c->nullable = PyObject_IsTrue(PyTuple_GET_ITEM(entry, 2));
        if (c->nullable < 0)
            return -1;
        c->call = PyTuple_GET_ITEM(entry, 3);
        if (c->kind == KIND_CALL && !PyCallable_Check(c->call)) {
            PyErr_SetString(PyExc_TypeError, "a plan's call must be callable");
            return -1;
        }
    }
    return 0;
}

static char not_strict;                 /* its address only: "not the strict spelling" */
#define NO ((PyObject *)&not_strict)

/* -?[0-9]+ (the sign only when `signed_`) within int64..uint64, or NO. */
static PyObject *
digits_value(const char *s, Py_ssize_t n, int signed_)
{
    Py_ssize_t i = 0;
    uint64_t v = 0;
    int negative = 0;

    if (signed_ && n > 0 && s[0] == '-') {
        negative = 1;
        i = 1;
    }
    if (i == n)
        return NO;
    for (; i < n; i++) {
        unsigned d = (unsigned char)s[i] - '0';
        if (d > 9 || v > (UINT64_MAX - d) / 10)
            return NO;
        v = v * 10 + d;
    }
    if (!negative)
        return PyLong_FromUnsignedLongLong(v);
    if (v > (uint64_t)INT64_MAX + 1)
        return NO;
    return PyLong_FromLongLong(v == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)v);
}

/* float(text) for text of [0-9.eE+-] only, when finite; else NO (inf and nan
 * are the Python converter's). */
static PyObject *
float_value(const char *s, Py_ssize_t n)
{
    char small[64], *buf = small, *end;
    double d;
    Py_ssize_t i;
    PyObject *result = NO;

    if (n == 0)
        return NO;
    for (i = 0; i < n; i++)
        if (strchr("0123456789.eE+-", s[i]) == NULL || s[i] == '\0')
            return NO;
    if (n >= (Py_ssize_t)sizeof(small)) {
        buf = PyMem_Malloc(n + 1);
        if (buf == NULL)
            return PyErr_NoMemory();
    }
    memcpy(buf, s, n);
    buf[n] = '\0';
    d = PyOS_string_to_double(buf, &end, NULL);
    if (d == -1.0 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_ValueError))
            PyErr_Clear();
        else
            result = NULL;
    } else if (end == buf + n && d - d == 0.0) {
        result = PyFloat_FromDouble(d);
    }
    if (buf != small)
        PyMem_Free(buf);
    return result;
}

static PyObject *
boolean_value(const char *s, Py_ssize_t n)
{
    static const char *const words[] = {"true", "t", "1", "yes", "y", "on",
                                        "false", "f", "0", "no", "n", "off"};
    char low[5];
    Py_ssize_t i;

    if (n == 0 || n > 5)
        return NO;
    for (i = 0; i < n; i++)
        low[i] = (char)(s[i] >= 'A' && s[i] <= 'Z' ? s[i] + 32 : s[i]);
    for (i = 0; i < 12; i++)
        if ((Py_ssize_t)strlen(words[i]) == n && memcmp(low, words[i], n) == 0)
            return Py_NewRef(i < 6 ? Py_True : Py_False);
    return NO;
}

/* The value of one column: a new reference, NO (not strict), or NULL (an
 * error to raise).  `text` is the str when the caller has one (else it is
 * made from the UTF-8 `s`, `n`, when the kind needs it). */
static PyObject *
column_value(const Column *c, const char *s, Py_ssize_t n, PyObject *text)
{
    PyObject *made = NULL, *v;

    switch (c->kind) {
    case KIND_UNSIGNED:
        return digits_value(s, n, 0);
    case KIND_INTEGER:
        return digits_value(s, n, 1);
    case KIND_NUMBER:
        if (memchr(s, '.', n) || memchr(s, 'e', n) || memchr(s, 'E', n))
            return float_value(s, n);
        return digits_value(s, n, 1);
    case KIND_DOUBLE:
        return float_value(s, n);
    case KIND_BOOLEAN:
        return boolean_value(s, n);
    }
    if (text == NULL) {
        text = made = PyUnicode_DecodeUTF8(s, n, "strict");
        if (text == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
                return NULL;
            PyErr_Clear();
            return NO;
        }
    }
    if (c->kind == KIND_STRING) {
        if (made != NULL)
            return made;
        return Py_NewRef(text);
    }
    v = PyObject_CallOneArg(c->call, text);
    Py_XDECREF(made);
    if (v == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_Exception))
            return NULL;
        PyErr_Clear();
        return NO;
    }
    return v;
}

/* The tuple for one record (Py_None's reference when a value is not strict,
 * NULL on an error).  fields[i] / sizes[i]: the UTF-8 of column i;
 * texts[i] the str, or NULL (then made when needed). */
static PyObject *
plan_row(const Plan *p, const char *const *fields, const Py_ssize_t *sizes,
         PyObject *const *texts)
{
    PyObject *row = PyTuple_New(p->width);
    Py_ssize_t i;

    if (row == NULL)
        return NULL;
    for (i = 0; i < p->width; i++)
        PyTuple_SET_ITEM(row, i, Py_NewRef(Py_None));
    for (i = 0; i < p->ncols; i++) {
        const Column *c = &p->cols[i];
        PyObject *v, *old;
        if (c->nullable && sizes[i] == p->null_len
                && memcmp(fields[i], p->null_utf8, sizes[i]) == 0)
            continue;
        v = column_value(c, fields[i], sizes[i], texts ? texts[i] : NULL);
        if (v == NULL) {
            Py_DECREF(row);
            return NULL;
        }
        if (v == NO) {
            Py_DECREF(row);
            return Py_NewRef(Py_None);
        }
        old = PyTuple_GET_ITEM(row, c->slot);
        PyTuple_SET_ITEM(row, c->slot, v);
        Py_DECREF(old);
    }
    return row;
}

typedef struct {
    const char **fields;
    Py_ssize_t *sizes;
    PyObject **texts;
} Scratch;

static int
scratch_new(Scratch *s, Py_ssize_t n)
{
    s->fields = PyMem_New(const char *, n ? n : 1);
    s->sizes = PyMem_New(Py_ssize_t, n ? n : 1);
    s->texts = PyMem_New(PyObject *, n ? n : 1);
    if (s->fields == NULL || s->sizes == NULL || s->texts == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static void
scratch_free(Scratch *s)
{
    PyMem_Free((void *)s->fields);
    PyMem_Free(s->sizes);
    PyMem_Free(s->texts);
}

static PyObject *
convert_records(PyObject *module, PyObject *args)
{
    PyObject *records, *null, *width, *plan, *out = NULL;
    Plan p;
    Scratch s = {NULL, NULL, NULL};
    Py_ssize_t n, k, i;

    if (!PyArg_ParseTuple(args, "OOOO:convert_records", &records, &null, &width, &plan))
        return NULL;
    if (plan_read(&p, null, width, plan) < 0)
        goto done;
    if (!PyList_CheckExact(records)) {
        PyErr_SetString(PyExc_TypeError, "records must be a list");
        goto done;
    }
    if (scratch_new(&s, p.ncols) < 0)
        goto done;
    n = PyList_GET_SIZE(records);
    out = PyList_New(n);
    if (out == NULL)
        goto done;
    for (k = 0; k < n; k++)
        PyList_SET_ITEM(out, k, Py_NewRef(Py_None));
    /* (a call may change the list: its length is read again each time) */
    for (k = 0; k < PyList_GET_SIZE(records) && k < n; k++) {
        PyObject *record = PyList_GET_ITEM(records, k), *row;
        int strict = 1;
        if (!PyList_CheckExact(record) || PyList_GET_SIZE(record) != p.ncols)
            continue;
        Py_INCREF(record);
        for (i = 0; i < p.ncols; i++) {
            PyObject *text = PyList_GET_ITEM(record, i);
            if (!PyUnicode_CheckExact(text)) {
                strict = 0;
                break;
            }
            s.texts[i] = text;
            if (p.cols[i].nullable && PyUnicode_Compare(text, p.null) == 0) {
                s.fields[i] = p.null_utf8;   /* plan_row takes it as null */
                s.sizes[i] = p.null_len;
                continue;
            }
            if (PyUnicode_IS_ASCII(text)) {
                s.fields[i] = (const char *)PyUnicode_DATA(text);
                s.sizes[i] = PyUnicode_GET_LENGTH(text);
            } else if (p.cols[i].kind == KIND_STRING || p.cols[i].kind == KIND_CALL) {
                s.fields[i] = "";      /* (the str itself is used) */
                s.sizes[i] = -1;
            } else {
                strict = 0;            /* no strict number or boolean is beyond ASCII */
                break;
            }
        }
        if (!strict) {
            Py_DECREF(record);
            continue;
        }
        /* (the list is held: a call cannot free the str its fields point into) */
        for (i = 0; i < p.ncols; i++)
            Py_INCREF(s.texts[i]);
        row = plan_row(&p, s.fields, s.sizes, s.texts);
        for (i = 0; i < p.ncols; i++)
            Py_DECREF(s.texts[i]);
        Py_DECREF(record);
        if (row == NULL) {
            Py_CLEAR(out);
            goto done;
        }
        Py_DECREF(PyList_GET_ITEM(out, k));
        PyList_SET_ITEM(out, k, row);
    }
done:
    scratch_free(&s);
    PyMem_Free(p.cols);
    return out;
}


/* Where the `m` bytes at `needle` (m >= 1) first are in [s, end), or NULL. */
static const char *
find(const char *s, const char *end, const char *needle, Py_ssize_t m)
{
    while (end - s >= m) {
        const char *at = memchr(s, needle[0], end - s - m + 1);
        if (at == NULL)
            return NULL;
        if (memcmp(at, needle, m) == 0)
            return at;
        s = at + 1;
    }
    return NULL;
}

/* The fields of the line [f, end) into fields/sizes (the first `ncols`);
 * returns how many there are, or -1 when the line is not in the plain form:
 * with `quotes`, a field is either quoted whole ("...", no quote inside, the
 * delimiter or the line's end right after) or holds no quote at all. */
static Py_ssize_t
split_line(const char *f, const char *end, const char *sep, Py_ssize_t sepn, const char *q,
           Py_ssize_t qn, int quotes, const char **fields, Py_ssize_t *sizes,
           Py_ssize_t ncols)
{
    Py_ssize_t i = 0;

    for (;;) {
        const char *start = f, *stop, *next;
        if (quotes && end - f >= qn && memcmp(f, q, qn) == 0) {
            stop = find(f + qn, end, q, qn);
            if (stop == NULL)
                return -1;
            start = f + qn;
            next = stop + qn;
            if (next != end && (end - next < sepn || memcmp(next, sep, sepn) != 0))
                return -1;
        } else {
            const char *d = find(f, end, sep, sepn);
            stop = next = d ? d : end;
            if (quotes && find(start, stop, q, qn) != NULL)
                return -1;
        }
        if (i < ncols) {
            fields[i] = start;
            sizes[i] = stop - start;
        }
        i++;
        if (next == end)
            return i;
        f = next + sepn;    /* (next is at a delimiter) */
    }
}

static PyObject *
convert_lines(PyObject *module, PyObject *args)
{
    PyObject *data, *n_obj, *delimiter, *quote, *null, *width, *plan, *out = NULL;
    Plan p;
    Scratch s = {NULL, NULL, NULL};
    Py_buffer buffer = {NULL, NULL};
    const char *q, *sep, *at, *end;
    Py_ssize_t qn, sepn, n, k;
    int quotes, returns;    /* a quote, a carriage return somewhere in the data */

    if (!PyArg_ParseTuple(args, "OOOOOOO:convert_lines", &data, &n_obj, &delimiter, &quote,
                          &null, &width, &plan))
        return NULL;
    if (plan_read(&p, null, width, plan) < 0)
        goto done;
    if (!PyObject_CheckBuffer(data) || !PyLong_CheckExact(n_obj)) {
        PyErr_SetString(PyExc_TypeError, "data must be bytes-like and n an int");
        goto done;
    }
    if (!PyUnicode_CheckExact(delimiter) || PyUnicode_GET_LENGTH(delimiter) != 1
            || !PyUnicode_CheckExact(quote) || PyUnicode_GET_LENGTH(quote) != 1) {
        PyErr_SetString(PyExc_TypeError, "delimiter and quote must be one-character str");
        goto done;
    }
    if ((q = PyUnicode_AsUTF8AndSize(quote, &qn)) == NULL
            || (sep = PyUnicode_AsUTF8AndSize(delimiter, &sepn)) == NULL)
        goto done;
    if (scratch_new(&s, p.ncols) < 0)
        goto done;
    /* (held to the end: a bytearray cannot be resized meanwhile, by a call) */
    if (PyObject_GetBuffer(data, &buffer, PyBUF_SIMPLE) < 0)
        goto done;
    n = PyLong_AsSsize_t(n_obj);
    if (n < 0 || n > buffer.len) {
        if (PyErr_Occurred())
            PyErr_Clear();
        /* (every line but an unended last one has its newline: no more lines than bytes) */
        out = Py_NewRef(Py_None);
        goto done;
    }
    at = (const char *)buffer.buf;
    end = at + buffer.len;
    quotes = find(at, end, q, qn) != NULL;
    returns = memchr(at, '\r', end - at) != NULL;
    /* (n items, each set below or the list dropped: not n lines) */
    out = PyList_New(n);
    if (out == NULL)
        goto done;
    for (k = 0; k < n; k++) {
        if (at == end) {   /* fewer lines than n */
            Py_SETREF(out, Py_NewRef(Py_None));
            goto done;
        }

        const char *nl = memchr(at, '\n', end - at), *line_end = nl ? nl : end;
        Py_ssize_t i = -1;
        PyObject *row;
        if (returns && line_end != at && line_end[-1] == '\r')
            line_end--;   /* a CRLF line end: the record ends before it, as in the csv module */
        if (line_end != at && (!returns || memchr(at, '\r', line_end - at) == NULL))
            i = split_line(at, line_end, sep, sepn, q, qn, quotes, s.fields, s.sizes, p.ncols);
        if (i != p.ncols)
            row = Py_NewRef(Py_None);
        else
            row = plan_row(&p, s.fields, s.sizes, NULL);
        if (row == NULL) {
            Py_SETREF(out, NULL);
            goto done;
        }
        PyList_SET_ITEM(out, k, row);
        at = nl ? nl + 1 : end;
    }
    if (at != end)         /* more lines than n */
        Py_SETREF(out, Py_NewRef(Py_None));
done:
    if (buffer.obj != NULL)
        PyBuffer_Release(&buffer);
    scratch_free(&s);
    PyMem_Free(p.cols);
    return out;
}

static PyMethodDef module_methods[] = {
    {"convert_lines", convert_lines, METH_VARARGS,
     "convert_lines(data, n, delimiter, quote, null, width, plan) -> list or None "
     "(protocol.bulk.convert_lines)"},
    {"convert_records", convert_records, METH_VARARGS,
     "convert_records(records, null, width, plan) -> list (protocol.bulk.convert_records)"},
    {NULL, NULL, 0, NULL}
};

static struct PyModuleDef encoder_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "gtarantool._encoder",
    .m_doc = "protocol.Encoder.join in C (optional: protocol.py does the same without it).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC
PyInit__encoder(void)
{
    PyObject *module;

    if (PyType_Ready(&BodyEncoderType) < 0 || PyType_Ready(&GatherType) < 0)
        return NULL;
    module = PyModule_Create(&encoder_module);
    if (module == NULL)
        return NULL;
    if (PyModule_AddObjectRef(module, "BodyEncoder", (PyObject *)&BodyEncoderType) < 0
            || PyModule_AddObjectRef(module, "Gather", (PyObject *)&GatherType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
