/* ConnectionPool's data methods (select, insert, replace, update, upsert,
 * delete) in C, for the call nearly every request makes: positional arguments
 * and at most mode=.  connection_pool.py's Python methods are their
 * specification; a Route does what its Python method does, without the Python
 * frame, the keyword arguments passed on at their defaults and the counters as
 * Python ints:
 *
 *     instance = next(pool._next[mode's value])   # pool._route's pick
 *     instance.in_flight += 1; instance.requests += 1
 *     try:
 *         return getattr(instance.conn, name)(*args)   # (the class's method: see method())
 *     except Exception as exc:
 *         other = failed(pool, instance, exc, mode, may_resend)
 *     finally:
 *         instance.in_flight -= 1
 *         if instance.drained is not None:
 *             drained(instance)
 *     return send(pool, other, mode, name, args, {}, False)
 *
 * Any other call (other keywords, a mode that is no tarantool.Mode, too few or
 * too many arguments, hooks not set) goes to the Python method itself.
 *
 * The interface: the state a Route reads and writes lives in two C types,
 * InstanceCore (the base of pool.Instance: conn, drained, in_flight, requests;
 * Python twin pool.InstanceFields) and PoolCore (the base of
 * pool.ConnectionPool: _next; twin pool.PoolFields).  The rare paths go back to
 * Python through three functions given once by set_hooks(failed, drained,
 * send) (POOL_HOOKS): ConnectionPool's _failed, _drained and _send.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#if PY_VERSION_HEX < 0x030A0000
/* setup.py marks the extension optional: older Pythons run connection_pool.py's methods. */
#error "needs Python 3.10 or later (Py_NewRef, PyModule_AddObjectRef)"
#endif
#include <structmember.h>

#define MAX_ARGS 8                /* positional arguments a Route takes, the pool's included */
#define N_MODES 5                 /* tarantool.Mode's values are 1..5 */

static PyObject *str_mode;

/* The hooks (set_hooks): the Python functions a Route calls for its rare paths. */
static PyObject *hook_failed, *hook_drained, *hook_send;

/* -- InstanceCore: the base of pool.Instance ------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    PyObject *conn;
    PyObject *drained;            /* NULL reads as None */
    Py_ssize_t in_flight;
    Py_ssize_t requests;
} InstanceCore;

static PyMemberDef InstanceCore_members[] = {
    {"conn", T_OBJECT_EX, offsetof(InstanceCore, conn), 0, "the instance's gtarantool.Connection"},
    {"drained", T_OBJECT, offsetof(InstanceCore, drained), 0,
     "an Event while remove() waits for the requests in flight, else None"},
    {"in_flight", T_PYSSIZET, offsetof(InstanceCore, in_flight), 0, "requests awaiting replies"},
    {"requests", T_PYSSIZET, offsetof(InstanceCore, requests), 0, "requests routed here"},
    {NULL, 0, 0, 0, NULL}
};

static int
InstanceCore_traverse(InstanceCore *self, visitproc visit, void *arg)
{
    Py_VISIT(self->conn);
    Py_VISIT(self->drained);
    return 0;
}

static int
InstanceCore_clear(InstanceCore *self)
{
    Py_CLEAR(self->conn);
    Py_CLEAR(self->drained);
    return 0;
}

static void
InstanceCore_dealloc(InstanceCore *self)
{
    PyObject_GC_UnTrack(self);
    InstanceCore_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject InstanceCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gtarantool._pool.InstanceCore",
    .tp_basicsize = sizeof(InstanceCore),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The base of pool.Instance: conn, drained, in_flight, requests (twin: "
              "pool.InstanceFields).",
    .tp_new = PyType_GenericNew,
    .tp_traverse = (traverseproc)InstanceCore_traverse,
    .tp_clear = (inquiry)InstanceCore_clear,
    .tp_dealloc = (destructor)InstanceCore_dealloc,
    .tp_members = InstanceCore_members,
};

/* -- PoolCore: the base of pool.ConnectionPool ------------------------------------ */

typedef struct {
    PyObject_HEAD
    PyObject *next;               /* _next: the iterators of picks by mode value */
} PoolCore;

static PyMemberDef PoolCore_members[] = {
    {"_next", T_OBJECT, offsetof(PoolCore, next), 0,
     "the iterator of picks of each mode, by mode value (see ConnectionPool._reroute)"},
    {NULL, 0, 0, 0, NULL}
};

static int
PoolCore_traverse(PoolCore *self, visitproc visit, void *arg)
{
    Py_VISIT(self->next);
    return 0;
}

static int
PoolCore_clear(PoolCore *self)
{
    Py_CLEAR(self->next);
    return 0;
}

static void
PoolCore_dealloc(PoolCore *self)
{
    PyObject_GC_UnTrack(self);
    PoolCore_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject PoolCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gtarantool._pool.PoolCore",
    .tp_basicsize = sizeof(PoolCore),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The base of pool.ConnectionPool: _next, as a C field (twin: pool.PoolFields).",
    .tp_new = PyType_GenericNew,
    .tp_traverse = (traverseproc)PoolCore_traverse,
    .tp_clear = (inquiry)PoolCore_clear,
    .tp_dealloc = (destructor)PoolCore_dealloc,
    .tp_members = PoolCore_members,
};

/* -- Route ------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *name;               /* the Connection method, e.g. "select" */
    PyObject *python;             /* connection_pool.py's method: the specification, and any other call */
    PyObject *mode;               /* the default mode */
    PyObject *modes;              /* the tarantool.Mode members by value - 1 */
    Py_ssize_t min_args, max_args;   /* positional arguments, the pool's included */
    PyObject *may_resend;         /* True for reads: _failed may pick another instance */
    vectorcallfunc vectorcall;
    /* The connection class's method, while that class is unchanged (see method()). */
    PyTypeObject *conn_type;
    unsigned int conn_tag;
    PyObject *func;
} Route;

/* The Python function that is the Route's method on class `type`, or NULL for
 * anything else (call it by name).  It is looked up on the class, as Python's
 * own method cache does, and kept while the class's version tag (which every
 * change to the class or its bases renews) stays the same: an instance
 * attribute of the same name would not be seen (nothing sets one on a pool's
 * connections). */
static PyObject *
method(Route *self, PyTypeObject *type)
{
    PyObject *func;

    if (type == self->conn_type && type->tp_version_tag == self->conn_tag
            && (type->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG))
        return self->func;
    func = PyObject_GetAttr((PyObject *)type, self->name);   /* (assigns the tag) */
    if (func == NULL) {
        PyErr_Clear();        /* the call by name raises the AttributeError */
        return NULL;
    }
    if (!PyFunction_Check(func) || !(type->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG)) {
        Py_DECREF(func);
        return NULL;
    }
    Py_XSETREF(self->func, func);
    Py_INCREF(type);
    Py_XSETREF(self->conn_type, type);
    self->conn_tag = type->tp_version_tag;
    return func;
}

/* The failed hook's part of the except clause; returns the instance to re-send to or
 * NULL with the error it raised (the request's, nearly always). */
static PyObject *
failed(Route *self, PyObject *pool, PyObject *instance, PyObject *mode)
{
    PyObject *type, *exc, *tb, *other;

    PyErr_Fetch(&type, &exc, &tb);
    PyErr_NormalizeException(&type, &exc, &tb);
    if (tb != NULL)
        PyException_SetTraceback(exc, tb);
    other = PyObject_CallFunctionObjArgs(hook_failed, pool, instance, exc, mode,
                                         self->may_resend, NULL);
    Py_XDECREF(type);
    Py_XDECREF(exc);
    Py_XDECREF(tb);
    return other;
}

static PyObject *
Route_vectorcall(Route *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf), value, i;
    PyObject *mode = self->mode, *pool, *table, *picks, *instance, *conn, *result, *other = NULL;
    PyObject *call[MAX_ARGS], *func;
    InstanceCore *counted;

    if (nargs < self->min_args || nargs > self->max_args || hook_send == NULL)
        goto python;
    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, 0);
        if (PyTuple_GET_SIZE(kwnames) != 1
                || (key != str_mode && PyUnicode_Compare(key, str_mode) != 0))
            goto python;
        mode = args[nargs];
    }
    for (value = 0; value < N_MODES && PyTuple_GET_ITEM(self->modes, value) != mode; value++)
        ;
    if (value == N_MODES)
        goto python;          /* (where a mode that is no tarantool.Mode gets its ValueError) */
    pool = args[0];
    if (!PyObject_TypeCheck(pool, &PoolCoreType))
        goto python;
    table = ((PoolCore *)pool)->next;
    if (table == NULL || !PyTuple_Check(table) || PyTuple_GET_SIZE(table) <= value + 1
            || !PyIter_Check(PyTuple_GET_ITEM(table, value + 1)))
        goto python;          /* (a pool without instances yet) */
    picks = PyTuple_GET_ITEM(table, value + 1);
    Py_INCREF(table);
    /* The pick may wait (wait_timeout) while _next is replaced: we hold the old table. */
    instance = Py_TYPE(picks)->tp_iternext(picks);
    Py_DECREF(table);
    if (instance == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "the pool's picks ran out");
        return NULL;
    }
    if (!PyObject_TypeCheck(instance, &InstanceCoreType) || ((InstanceCore *)instance)->conn == NULL) {
        PyErr_Format(PyExc_TypeError, "the pool picked %R, not a pool.Instance", instance);
        Py_DECREF(instance);
        return NULL;
    }
    counted = (InstanceCore *)instance;
    conn = Py_NewRef(counted->conn);
    counted->in_flight++;
    counted->requests++;
    call[0] = conn;
    for (i = 1; i < nargs; i++)
        call[i] = args[i];
    func = method(self, Py_TYPE(conn));
    if (func != NULL) {
        Py_INCREF(func);      /* (another call may replace the cached one meanwhile) */
        result = PyObject_Vectorcall(func, call, nargs, NULL);
        Py_DECREF(func);
    } else {
        result = PyObject_VectorcallMethod(self->name, call, nargs, NULL);
    }
    if (result == NULL && PyErr_ExceptionMatches(PyExc_Exception))
        other = failed(self, pool, instance, mode);
    /* finally: */
    counted->in_flight--;
    if (counted->drained != NULL && counted->drained != Py_None) {
        PyObject *type, *exc, *tb, *done;
        PyErr_Fetch(&type, &exc, &tb);
        done = PyObject_CallOneArg(hook_drained, instance);
        if (done == NULL) {   /* an error in finally replaces the request's outcome */
            Py_XDECREF(type);
            Py_XDECREF(exc);
            Py_XDECREF(tb);
            Py_CLEAR(result);
            Py_CLEAR(other);
        } else {
            Py_DECREF(done);
            PyErr_Restore(type, exc, tb);
        }
    }
    if (other != NULL) {      /* a read re-sent once, as the Python method does */
        PyObject *rest = PyTuple_New(nargs - 1), *kwargs = PyDict_New();
        if (rest != NULL && kwargs != NULL) {
            for (i = 1; i < nargs; i++)
                PyTuple_SET_ITEM(rest, i - 1, Py_NewRef(args[i]));
            result = PyObject_CallFunctionObjArgs(hook_send, pool, other, mode, self->name, rest,
                                                  kwargs, Py_False, NULL);
        }
        Py_XDECREF(rest);
        Py_XDECREF(kwargs);
        Py_DECREF(other);
    }
    Py_DECREF(conn);
    Py_DECREF(instance);
    return result;

python:
    return PyObject_Vectorcall(self->python, args, nargsf, kwnames);
}

static int
Route_init(Route *self, PyObject *args, PyObject *kwds)
{
    static char *names[] = {"name", "python", "mode", "modes", "min_args", "max_args",
                            "may_resend", NULL};
    PyObject *name, *python, *mode, *modes, *may_resend;
    Py_ssize_t min_args, max_args;

    if (!PyArg_ParseTupleAndKeywords(args, kwds, "UOOO!nnO!:Route", names, &name, &python,
                                     &mode, &PyTuple_Type, &modes, &min_args, &max_args,
                                     &PyBool_Type, &may_resend))
        return -1;
    if (PyTuple_GET_SIZE(modes) != N_MODES) {
        PyErr_SetString(PyExc_ValueError, "modes must be the 5 tarantool.Mode members");
        return -1;
    }
    if (min_args < 1 || max_args < min_args || max_args > MAX_ARGS) {
        PyErr_Format(PyExc_ValueError, "a Route takes 1 to %d positional arguments", MAX_ARGS);
        return -1;
    }
    Py_XSETREF(self->name, Py_NewRef(name));
    PyUnicode_InternInPlace(&self->name);
    Py_XSETREF(self->python, Py_NewRef(python));
    Py_XSETREF(self->mode, Py_NewRef(mode));
    Py_XSETREF(self->modes, Py_NewRef(modes));
    Py_XSETREF(self->may_resend, Py_NewRef(may_resend));
    self->min_args = min_args;
    self->max_args = max_args;
    self->vectorcall = (vectorcallfunc)Route_vectorcall;
    return 0;
}

/* pool.method: bound as a Python method is (calls through LOAD_METHOD skip this). */
static PyObject *
Route_get(PyObject *self, PyObject *obj, PyObject *type)
{
    if (obj == NULL || obj == Py_None)
        return Py_NewRef(self);
    return PyMethod_New(self, obj);
}

static PyObject *
Route_doc(Route *self, void *closure)
{
    return PyObject_GetAttrString(self->python, "__doc__");
}

static PyGetSetDef Route_getset[] = {
    {"__doc__", (getter)Route_doc, NULL, "the Python method's", NULL},
    {NULL, NULL, NULL, NULL, NULL}
};

static PyMemberDef Route_members[] = {
    /* inspect.signature() and help() follow __wrapped__ to the Python method */
    {"__wrapped__", T_OBJECT, offsetof(Route, python), READONLY, "connection_pool.py's method"},
    {"__name__", T_OBJECT, offsetof(Route, name), READONLY, NULL},
    {NULL, 0, 0, 0, NULL}
};

static int
Route_traverse(Route *self, visitproc visit, void *arg)
{
    Py_VISIT(self->python);
    Py_VISIT(self->mode);
    Py_VISIT(self->modes);
    Py_VISIT(self->conn_type);
    Py_VISIT(self->func);
    return 0;
}

static int
Route_clear(Route *self)
{
    Py_CLEAR(self->name);
    Py_CLEAR(self->python);
    Py_CLEAR(self->mode);
    Py_CLEAR(self->modes);
    Py_CLEAR(self->may_resend);
    Py_CLEAR(self->conn_type);
    Py_CLEAR(self->func);
    return 0;
}

static void
Route_dealloc(Route *self)
{
    PyObject_GC_UnTrack(self);
    Route_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject RouteType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gtarantool._pool.Route",
    .tp_basicsize = sizeof(Route),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL
        | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_doc = "Route(name, python, mode, modes, min_args, max_args, may_resend): a pool's data "
              "method (see _pool.c).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Route_init,
    .tp_call = PyVectorcall_Call,     /* (fails cleanly before __init__ sets vectorcall) */
    .tp_vectorcall_offset = offsetof(Route, vectorcall),
    .tp_descr_get = Route_get,
    .tp_traverse = (traverseproc)Route_traverse,
    .tp_clear = (inquiry)Route_clear,
    .tp_dealloc = (destructor)Route_dealloc,
    .tp_members = Route_members,
    .tp_getset = Route_getset,
};

/* set_hooks(failed, drained, send): the functions a Route calls for its rare
 * paths (see the top of this file); until they are set every call goes to the
 * Python method. */
static PyObject *
set_hooks(PyObject *module, PyObject *args, PyObject *kwds)
{
    static char *names[] = {"failed", "drained", "send", NULL};
    PyObject *failed, *drained, *send;

    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO:set_hooks", names, &failed, &drained,
                                     &send))
        return NULL;
    if (!PyCallable_Check(failed) || !PyCallable_Check(drained) || !PyCallable_Check(send)) {
        PyErr_SetString(PyExc_TypeError, "the pool's hooks must be callable");
        return NULL;
    }
    Py_XSETREF(hook_failed, Py_NewRef(failed));
    Py_XSETREF(hook_drained, Py_NewRef(drained));
    Py_XSETREF(hook_send, Py_NewRef(send));
    Py_RETURN_NONE;
}

static PyMethodDef pool_functions[] = {
    {"set_hooks", (PyCFunction)(void (*)(void))set_hooks, METH_VARARGS | METH_KEYWORDS,
     "set_hooks(failed, drained, send): failed(pool, instance, exc, mode, may_resend) -> the "
     "instance to re-send to, or raises; drained(instance); send(pool, instance, mode, name, "
     "args, kwargs, may_resend) -> the reply"},
    {NULL, NULL, 0, NULL}
};

static struct PyModuleDef pool_module = {
    PyModuleDef_HEAD_INIT,
    .m_methods = pool_functions,
    .m_name = "gtarantool._pool",
    .m_doc = "connection_pool.py's data methods in C (optional: connection_pool.py does the same without it).",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__pool(void)
{
    PyObject *module, *hook_names = NULL;

    if (!(str_mode = PyUnicode_InternFromString("mode")))
        return NULL;
    if (PyType_Ready(&InstanceCoreType) < 0 || PyType_Ready(&PoolCoreType) < 0
            || PyType_Ready(&RouteType) < 0)
        return NULL;
    module = PyModule_Create(&pool_module);
    if (module == NULL)
        return NULL;
    if (PyModule_AddObjectRef(module, "InstanceCore", (PyObject *)&InstanceCoreType) < 0
            || PyModule_AddObjectRef(module, "PoolCore", (PyObject *)&PoolCoreType) < 0
            || PyModule_AddObjectRef(module, "Route", (PyObject *)&RouteType) < 0
            || !(hook_names = Py_BuildValue("(sss)", "failed", "drained", "send"))
            || PyModule_AddObjectRef(module, "POOL_HOOKS", hook_names) < 0) {
        Py_XDECREF(hook_names);
        Py_DECREF(module);
        return NULL;
    }
    Py_DECREF(hook_names);
    return module;
}
