/* The reader's inner loop in C: what transport.Transport._cut does, written
 * out in Python there, for the replies that nearly every request gets.
 *
 * ReplyCutter(pending, ready, unpackb, options, response_type, skip_types)
 * .cut(data, pos, end, limit) takes the whole frames of data[pos:end], one
 * after another, while each is a reply to a greenlet waiting in `pending`
 * (sync -> waiter), in the layout Tarantool writes every reply in:
 *
 *     0xce len32 | 0x83 0x00 0xce code32 0x01 0xcf sync64 0x05 0xce schema32 | body
 *
 * For each it pops the waiter, decodes the body with
 * unpackb(body, use_list=, raw=, strict_map_key=False, ext_hook=) (options
 * gives the three), and appends (waiter, value) to `ready`: value is the
 * response_type object for an OK reply whose body is a map, otherwise the
 * tuple (sync, code, schema version, body or the exception decoding it
 * raised, None).  It stops at the first frame it does not take (another
 * layout, too long, incomplete, a push, a sync not in `pending` or whose
 * waiter's type is in `skip_types`) and returns where that frame starts:
 * the Python code decides about it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define HEADER_SIZE 28          /* length prefix and header, as above */
#define MIN_LENGTH (HEADER_SIZE - 5)
#define IPROTO_CHUNK 0x80
#define IPROTO_DATA 0x30

static PyObject *str_sync, *str_code, *str_body, *str_schema_version, *str_return_code,
    *str_data, *unpack_kwnames, *data_key, *zero, *empty_tuple;

typedef struct {
    PyObject_HEAD
    PyObject *pending;          /* dict */
    PyObject *ready_append;     /* bound deque.append */
    PyObject *unpackb;
    PyObject *use_list, *raw, *ext_hook;
    PyTypeObject *response_type;
    PyObject *skip_types;       /* tuple of types */
} ReplyCutter;

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

static int
skipped(ReplyCutter *self, PyObject *waiter)
{
    Py_ssize_t i, n = PyTuple_GET_SIZE(self->skip_types);
    for (i = 0; i < n; i++) {
        if ((PyObject *)Py_TYPE(waiter) == PyTuple_GET_ITEM(self->skip_types, i))
            return 1;
    }
    return 0;
}

/* The decoded body (new reference), the exception decoding it raised
 * (traceback dropped), or NULL with an error set for anything that is not
 * an Exception (KeyboardInterrupt, ...), which must propagate. */
static PyObject *
decode_body(ReplyCutter *self, const unsigned char *start, Py_ssize_t size)
{
    PyObject *view, *body, *type, *value, *tb;
    PyObject *args[5];

    if (size == 0)
        return PyDict_New();
    view = PyMemoryView_FromMemory((char *)start, size, PyBUF_READ);
    if (view == NULL)
        return NULL;
    args[0] = view;
    args[1] = self->use_list;
    args[2] = self->raw;
    args[3] = Py_False;
    args[4] = self->ext_hook;
    body = PyObject_Vectorcall(self->unpackb, args, 1, unpack_kwnames);
    Py_DECREF(view);
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

/* protocol.ok_response without conn (the caller sets it). */
static PyObject *
ok_response(ReplyCutter *self, PyObject *sync, PyObject *schema, PyObject *body)
{
    PyObject *resp, *rows, *data;

    resp = self->response_type->tp_new(self->response_type, empty_tuple, NULL);
    if (resp == NULL)
        return NULL;
    rows = PyDict_GetItemWithError(body, data_key);   /* borrowed */
    if (rows == NULL && PyErr_Occurred())
        goto fail;
    if (rows == NULL) {
        data = Py_NewRef(Py_None);
    } else if (PyList_Check(rows) || PyTuple_Check(rows)) {
        data = Py_NewRef(rows);
    } else {
        data = PyList_New(1);
        if (data == NULL)
            goto fail;
        PyList_SET_ITEM(data, 0, Py_NewRef(rows));
    }
    if (PyObject_SetAttr(resp, str_data, data) < 0) {
        Py_DECREF(data);
        goto fail;
    }
    Py_DECREF(data);
    if (PyObject_SetAttr(resp, str_sync, sync) < 0
            || PyObject_SetAttr(resp, str_code, zero) < 0
            || PyObject_SetAttr(resp, str_body, body) < 0
            || PyObject_SetAttr(resp, str_schema_version, schema) < 0
            || PyObject_SetAttr(resp, str_return_code, zero) < 0)
        goto fail;
    return resp;
fail:
    Py_DECREF(resp);
    return NULL;
}

/* Queue the reply in the frame at p (whose waiter is already popped). */
static int
take(ReplyCutter *self, PyObject *waiter, PyObject *sync, const unsigned char *p,
     Py_ssize_t body_size)
{
    PyObject *code = NULL, *schema = NULL, *body = NULL, *value = NULL, *pair, *res;
    uint32_t code_value = be32(p + 8);
    int ok = -1;

    schema = PyLong_FromUnsignedLong(be32(p + 24));
    if (schema == NULL)
        goto done;
    body = decode_body(self, p + HEADER_SIZE, body_size);
    if (body == NULL)
        goto done;
    if (code_value == 0 && PyDict_CheckExact(body)) {
        value = ok_response(self, sync, schema, body);
    } else {
        code = PyLong_FromUnsignedLong(code_value);
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
    Py_XDECREF(code);
    Py_XDECREF(schema);
    Py_XDECREF(body);
    Py_XDECREF(value);
    return ok;
}

static PyObject *
ReplyCutter_cut(ReplyCutter *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer buffer;
    Py_ssize_t pos, end, limit;
    const unsigned char *data;

    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "cut(data, pos, end, limit)");
        return NULL;
    }
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
    while (end - pos >= HEADER_SIZE) {
        const unsigned char *p = data + pos;
        PyObject *sync, *waiter;
        Py_ssize_t length, stop;

        if (p[0] != 0xce || p[5] != 0x83 || p[6] != 0x00 || p[7] != 0xce || p[12] != 0x01
                || p[13] != 0xcf || p[22] != 0x05 || p[23] != 0xce)
            break;
        length = be32(p + 1);
        if (length < MIN_LENGTH || length > limit)
            break;
        stop = pos + 5 + length;
        if (stop > end || be32(p + 8) == IPROTO_CHUNK)
            break;
        sync = PyLong_FromUnsignedLongLong(be64(p + 14));
        if (sync == NULL)
            goto error;
        waiter = PyDict_GetItemWithError(self->pending, sync);   /* borrowed */
        if (waiter == NULL || skipped(self, waiter)) {
            Py_DECREF(sync);
            if (PyErr_Occurred())
                goto error;
            break;
        }
        Py_INCREF(waiter);
        if (PyDict_DelItem(self->pending, sync) < 0
                || take(self, waiter, sync, p, length - MIN_LENGTH) < 0) {
            Py_DECREF(waiter);
            Py_DECREF(sync);
            goto error;
        }
        Py_DECREF(waiter);
        Py_DECREF(sync);
        pos = stop;
    }
    PyBuffer_Release(&buffer);
    return PyLong_FromSsize_t(pos);
error:
    PyBuffer_Release(&buffer);
    return NULL;
}

static int
ReplyCutter_init(ReplyCutter *self, PyObject *args, PyObject *kwds)
{
    PyObject *pending, *ready, *unpackb, *options, *response_type, *skip_types;
    static char *names[] = {"pending", "ready", "unpackb", "options", "response_type",
                            "skip_types", NULL};

    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!OOO!O!O!:ReplyCutter", names,
                                     &PyDict_Type, &pending, &ready, &unpackb,
                                     &PyTuple_Type, &options, &PyType_Type, &response_type,
                                     &PyTuple_Type, &skip_types))
        return -1;
    if (PyTuple_GET_SIZE(options) != 3) {
        PyErr_SetString(PyExc_TypeError, "options must be (use_list, raw, ext_hook)");
        return -1;
    }
    Py_XSETREF(self->ready_append, PyObject_GetAttrString(ready, "append"));
    if (self->ready_append == NULL)
        return -1;
    Py_XSETREF(self->pending, Py_NewRef(pending));
    Py_XSETREF(self->unpackb, Py_NewRef(unpackb));
    Py_XSETREF(self->use_list, Py_NewRef(PyTuple_GET_ITEM(options, 0)));
    Py_XSETREF(self->raw, Py_NewRef(PyTuple_GET_ITEM(options, 1)));
    Py_XSETREF(self->ext_hook, Py_NewRef(PyTuple_GET_ITEM(options, 2)));
    Py_XSETREF(self->response_type, (PyTypeObject *)Py_NewRef(response_type));
    Py_XSETREF(self->skip_types, Py_NewRef(skip_types));
    return 0;
}

static int
ReplyCutter_traverse(ReplyCutter *self, visitproc visit, void *arg)
{
    Py_VISIT(self->pending);
    Py_VISIT(self->ready_append);
    Py_VISIT(self->unpackb);
    Py_VISIT(self->use_list);
    Py_VISIT(self->raw);
    Py_VISIT(self->ext_hook);
    Py_VISIT(self->response_type);
    Py_VISIT(self->skip_types);
    return 0;
}

static int
ReplyCutter_clear(ReplyCutter *self)
{
    Py_CLEAR(self->pending);
    Py_CLEAR(self->ready_append);
    Py_CLEAR(self->unpackb);
    Py_CLEAR(self->use_list);
    Py_CLEAR(self->raw);
    Py_CLEAR(self->ext_hook);
    Py_CLEAR(self->response_type);
    Py_CLEAR(self->skip_types);
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
     "cut(data, pos, end, limit) -> where the first frame not taken starts"},
    {NULL, NULL, 0, NULL}
};

static PyTypeObject ReplyCutterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gtarantool._speedups.ReplyCutter",
    .tp_basicsize = sizeof(ReplyCutter),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The reader's loop over reply frames, for replies to waiting greenlets.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)ReplyCutter_init,
    .tp_traverse = (traverseproc)ReplyCutter_traverse,
    .tp_clear = (inquiry)ReplyCutter_clear,
    .tp_dealloc = (destructor)ReplyCutter_dealloc,
    .tp_methods = ReplyCutter_methods,
};

static struct PyModuleDef speedups_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "gtarantool._speedups",
    .m_doc = "The reader's inner loop in C (optional: transport.py does the same without it).",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    PyObject *module;

    if (!(str_sync = PyUnicode_InternFromString("_sync"))
            || !(str_code = PyUnicode_InternFromString("_code"))
            || !(str_body = PyUnicode_InternFromString("_body"))
            || !(str_schema_version = PyUnicode_InternFromString("_schema_version"))
            || !(str_return_code = PyUnicode_InternFromString("_return_code"))
            || !(str_data = PyUnicode_InternFromString("_data"))
            || !(unpack_kwnames = Py_BuildValue("(ssss)", "use_list", "raw", "strict_map_key",
                                                "ext_hook"))
            || !(data_key = PyLong_FromLong(IPROTO_DATA))
            || !(zero = PyLong_FromLong(0))
            || !(empty_tuple = PyTuple_New(0)))
        return NULL;
    if (PyType_Ready(&ReplyCutterType) < 0)
        return NULL;
    module = PyModule_Create(&speedups_module);
    if (module == NULL)
        return NULL;
    if (PyModule_AddObjectRef(module, "ReplyCutter", (PyObject *)&ReplyCutterType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
