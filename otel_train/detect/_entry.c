/* The patched functions that run torch's or the user's code inside them, as objects in C
 * (`entry.py`): no Python frame of ours between the user's code and torch's.
 *
 * Each was a Python function: its frame stood in the traceback of every error raised through it
 * (a dataset's `__getitem__`, "Trying to backward through the graph a second time", a
 * non-finite norm in `clip_grad_norm_(error_if_nonfinite=True)`), where a user reads it as ours.
 * An `Entry` does what that function did, in the same order (docs/automatic.md, "Patches"):
 *
 *     if compiled.seen and dynamo_compiling() or tc._is_compiling_flag or busy(s) and caught_up(busy, s):
 *         return original(*args, **kwargs)
 *     return run(original, iterator)              # a fetch: `data.fetch`
 *     return run(original, args, kwargs)          # a call: `backward.backward_run`, `GradScaler.step`'s wrapper
 *     r = recorder._rec                           # a recorded call: `optimizer.zero_grad_run`, `clip_run`
 *     return run(r, s, original, args, kwargs) if r is not None else original(*args, **kwargs)
 *
 * (`busy` None: never busy.) `run` is read from its module's globals at each call (`batch`
 * points it at the noting entry points, `otel_train.testing` at stubs). An error that comes back
 * through `run` loses the frames of ours in its traceback (the Python bodies `run` may call,
 * which call the user's function), unless it began in one of them (an error of ours keeps where
 * it happened).
 *
 * Why C: traceback hygiene, not speed. A Python function cannot take its own frame off the stack
 * it runs on; no speed is claimed for it (Python calls added a step 17.4 -> 13.4 on issue 31's
 * loop, the wall clock unresolved: docs/benchmarks/history.md, 2026-11-27-entry-objects), and
 * there is no Python twin: where this module cannot be imported, automatic detection stays off
 * (`native.py`).
 *
 * Dynamo cannot trace a C object. Where Dynamo would trace the call (`clip_grad_norm_` or
 * `model.zero_grad()` in a compiled step), the entry carries a Python function that does the
 * same (`entry.make`'s `for_dynamo`), which Dynamo inlines in its place (on a class, `entry.MethodEntry`, whose Python
 * `__get__` Dynamo follows, binds to it); `backward` and a `DataLoader`'s iteration it never
 * traces. An `Entry`
 * binds as a method does (`__get__`, and the method-descriptor flag for the interpreter's
 * unbound call), carries the original's `__name__`, `__doc__` and `__wrapped__`
 * (`functools.update_wrapper`) and pickles by name, as the function it replaced did.
 *
 * What else is patched (checkpoints, collectives, framework methods) is a `wrapt` wrapper, whose
 * call is C: `Hidden(wrapper)` is the Python wrapper it calls, with our frames taken out of an
 * error that comes back through it the same way (`patches.Patches.wrap`). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>

#include "_member.h"

/* What every entry reads: `compile.compiled`, `compile.dynamo_compiling`, `compile.tc`, the
 * detection state, `state.caught_up` and the recorder module's globals (`bind`). */
static PyObject *g_compiled, *g_dynamo_compiling, *g_tc, *g_state, *g_caught_up, *g_recorder;
static PyObject *s_seen, *s_flag, *s_name, *s_qualname, *s_rec, *g_prefix;
static Member m_seen = {&s_seen};

enum { FETCH, CALL, RECORDED };

typedef struct {
    PyObject_HEAD
    PyObject *original; /* the function replaced */
    PyObject *busy;     /* `busy(s)`: the call is part of something else (None: never) */
    PyObject *globals;  /* the module whose `run` this calls */
    PyObject *run;      /* its name there */
    int kind;           /* FETCH: run(original, iterator); CALL: run(original, args, kwargs);
                           RECORDED: run(recorder._rec, s, original, args, kwargs) */
    PyObject *dict;     /* `__name__`, `__doc__`, `__wrapped__`... */
    vectorcallfunc vectorcall;
} Entry;

/* `compiled.seen and dynamo_compiling() or tc._is_compiling_flag`: 1 (or not bound: nothing of
 * ours runs), 0, or -1 on error. */
static int
compiling(void)
{
    if (g_compiled == NULL)
        return 1;
    int yes = true_of(mget(g_compiled, &m_seen));
    if (yes > 0)
        yes = true_of(PyObject_CallNoArgs(g_dynamo_compiling));
    if (yes == 0)
        yes = true_of(PyObject_GetAttr(g_tc, s_flag));
    return yes;
}

/* 1 where the user's function is called alone (the check above), 0 where `run` is, -1 on error. */
static int
alone(Entry *self)
{
    int yes = compiling();
    if (yes != 0 || self->busy == Py_None)
        return yes;
    yes = true_of(PyObject_CallOneArg(self->busy, g_state));
    if (yes <= 0)
        return yes;
    PyObject *args[2] = {self->busy, g_state};
    return true_of(PyObject_Vectorcall(g_caught_up, args, 2, NULL));
}

/* Whether `frame` runs code of otel_train's (its module's `__name__`). */
static int
ours(PyFrameObject *frame)
{
    PyObject *globals = PyFrame_GetGlobals(frame);
    if (globals == NULL)
        return 0;
    PyObject *name = PyDict_GetItemWithError(globals, s_name); /* borrowed */
    int yes = name != NULL && PyUnicode_Check(name) &&
              (PyUnicode_Tailmatch(name, g_prefix, 0, PY_SSIZE_T_MAX, -1) > 0 ||
               PyUnicode_CompareWithASCIIString(name, "otel_train") == 0);
    Py_DECREF(globals);
    PyErr_Clear();
    return yes;
}

/* `tb` (owned) with the entries of our frames unlinked, unless its innermost is one (owned). */
static PyObject *
without_ours(PyObject *tb)
{
    PyTracebackObject *t = (PyTracebackObject *)tb, *last = t;
    for (; t != NULL; t = t->tb_next)
        last = t;
    if (last == NULL || ours(last->tb_frame))
        return tb;
    while (ours(((PyTracebackObject *)tb)->tb_frame)) {
        PyObject *next = Py_NewRef((PyObject *)((PyTracebackObject *)tb)->tb_next);
        Py_SETREF(tb, next);
    }
    for (PyTracebackObject *prev = (PyTracebackObject *)tb; prev->tb_next != NULL;) {
        PyTracebackObject *cur = prev->tb_next;
        if (ours(cur->tb_frame)) {
            prev->tb_next = (PyTracebackObject *)Py_XNewRef((PyObject *)cur->tb_next);
            Py_DECREF(cur);
        }
        else
            prev = cur;
    }
    return tb;
}

/* The error set, its traceback without our frames. */
static void
hide_ours(void)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL && PyTraceBack_Check(tb)) {
        tb = without_ours(tb);
        if (value != NULL)
            PyException_SetTraceback(value, tb);
    }
    PyErr_Restore(type, value, tb);
}

static PyObject *
entry_call(PyObject *op, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Entry *self = (Entry *)op;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    int skip = alone(self);
    if (skip < 0)
        return NULL;
    if (skip || (self->kind == FETCH && (nargs != 1 || kwnames != NULL)))
        return PyObject_Vectorcall(self->original, args, nargsf, kwnames);
    PyObject *run = PyDict_GetItemWithError(self->globals, self->run); /* borrowed */
    if (run == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetObject(PyExc_NameError, self->run);
        return NULL;
    }
    PyObject *r = NULL;
    if (self->kind == RECORDED) {
        r = PyDict_GetItemWithError(g_recorder, s_rec); /* borrowed */
        if (r == NULL && PyErr_Occurred())
            return NULL;
        if (r == NULL || r == Py_None)
            return PyObject_Vectorcall(self->original, args, nargsf, kwnames);
        Py_INCREF(r);
    }
    Py_INCREF(run);
    PyObject *out;
    if (self->kind == FETCH) {
        PyObject *call[2] = {self->original, args[0]};
        out = PyObject_Vectorcall(run, call, 2, NULL);
    }
    else {
        PyObject *positional = PyTuple_New(nargs), *keywords = PyDict_New();
        if (positional == NULL || keywords == NULL)
            out = NULL;
        else {
            for (Py_ssize_t i = 0; i < nargs; i++)
                PyTuple_SET_ITEM(positional, i, Py_NewRef(args[i]));
            Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
            int ok = 0;
            for (Py_ssize_t i = 0; i < nkw && ok == 0; i++)
                ok = PyDict_SetItem(keywords, PyTuple_GET_ITEM(kwnames, i), args[nargs + i]);
            PyObject *call[5] = {r, g_state, self->original, positional, keywords};
            out = ok < 0 ? NULL
                  : r != NULL ? PyObject_Vectorcall(run, call, 5, NULL)
                              : PyObject_Vectorcall(run, call + 2, 3, NULL);
        }
        Py_XDECREF(positional);
        Py_XDECREF(keywords);
    }
    Py_DECREF(run);
    Py_XDECREF(r);
    if (out == NULL)
        hide_ours();
    return out;
}

static PyObject *
entry_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *original, *busy, *globals, *run;
    int kind;
    if (!PyArg_ParseTuple(args, "OOO!Ui:Entry", &original, &busy, &PyDict_Type, &globals, &run, &kind))
        return NULL;
    if (kind != FETCH && kind != CALL && kind != RECORDED) {
        PyErr_SetString(PyExc_ValueError, "Entry: kind must be 0 (a fetch), 1 (a call) or 2 (a recorded call)");
        return NULL;
    }
    Entry *self = (Entry *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->original = Py_NewRef(original);
    self->busy = Py_NewRef(busy);
    self->globals = Py_NewRef(globals);
    self->run = Py_NewRef(run);
    self->kind = kind;
    self->vectorcall = entry_call;
    return (PyObject *)self;
}

static int
entry_traverse(Entry *self, visitproc visit, void *arg)
{
    Py_VISIT(self->original);
    Py_VISIT(self->busy);
    Py_VISIT(self->globals);
    Py_VISIT(self->run);
    Py_VISIT(self->dict);
    return 0;
}

static int
entry_clear(Entry *self)
{
    Py_CLEAR(self->original);
    Py_CLEAR(self->busy);
    Py_CLEAR(self->globals);
    Py_CLEAR(self->run);
    Py_CLEAR(self->dict);
    return 0;
}

static void
entry_dealloc(Entry *self)
{
    PyObject_GC_UnTrack(self);
    entry_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* A method of the class it is set on, as the function it replaced was. */
static PyObject *
entry_get(PyObject *self, PyObject *obj, PyObject *type)
{
    if (obj == NULL || obj == Py_None)
        return Py_NewRef(self);
    return PyMethod_New(self, obj);
}

static PyObject *
entry_repr(Entry *self)
{
    return PyUnicode_FromFormat("<%R, timed by otel_train>", self->original);
}

/* Pickled by name, as a function is: `__module__` and `__qualname__` are the replaced one's. */
static PyObject *
entry_reduce(PyObject *self, PyObject *Py_UNUSED(ignored))
{
    return PyObject_GetAttr(self, s_qualname);
}

static PyMethodDef entry_methods[] = {
    {"__reduce__", entry_reduce, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef entry_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(Entry, vectorcall), READONLY, NULL},
    {"__dictoffset__", T_PYSSIZET, offsetof(Entry, dict), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef entry_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject EntryType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "otel_train.detect._entry.Entry",
    .tp_doc = "Entry(original, busy, globals, run, kind): `original` timed by `globals[run]` (the module's docstring).",
    .tp_basicsize = sizeof(Entry),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR |
                Py_TPFLAGS_BASETYPE,
    .tp_new = entry_new,
    .tp_traverse = (traverseproc)entry_traverse,
    .tp_clear = (inquiry)entry_clear,
    .tp_dealloc = (destructor)entry_dealloc,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Entry, vectorcall),
    .tp_dictoffset = offsetof(Entry, dict),
    .tp_descr_get = entry_get,
    .tp_repr = (reprfunc)entry_repr,
    .tp_methods = entry_methods,
    .tp_members = entry_members,
    .tp_getset = entry_getset,
};

/* `Hidden(fn)`: `fn(*args, **kwargs)`, our frames taken out of an error's traceback. */
typedef struct {
    PyObject_HEAD
    PyObject *fn;
    vectorcallfunc vectorcall;
} Hidden;

static PyObject *
hidden_call(PyObject *op, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    PyObject *out = PyObject_Vectorcall(((Hidden *)op)->fn, args, nargsf, kwnames);
    if (out == NULL)
        hide_ours();
    return out;
}

static PyObject *
hidden_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *fn;
    if (!PyArg_ParseTuple(args, "O:Hidden", &fn))
        return NULL;
    Hidden *self = (Hidden *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->fn = Py_NewRef(fn);
    self->vectorcall = hidden_call;
    return (PyObject *)self;
}

static int
hidden_traverse(Hidden *self, visitproc visit, void *arg)
{
    Py_VISIT(self->fn);
    return 0;
}

static int
hidden_clear(Hidden *self)
{
    Py_CLEAR(self->fn);
    return 0;
}

static void
hidden_dealloc(Hidden *self)
{
    PyObject_GC_UnTrack(self);
    hidden_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
hidden_repr(Hidden *self)
{
    return PyUnicode_FromFormat("<otel_train Hidden(%R)>", self->fn);
}

static PyMemberDef hidden_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(Hidden, vectorcall), READONLY, NULL},
    {"fn", T_OBJECT_EX, offsetof(Hidden, fn), READONLY, "the function called"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject HiddenType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "otel_train.detect._entry.Hidden",
    .tp_doc = "Hidden(fn): `fn(*args, **kwargs)`, the frames of otel_train's taken out of the traceback of an "
              "error that comes back (unless it began in one).",
    .tp_basicsize = sizeof(Hidden),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = hidden_new,
    .tp_traverse = (traverseproc)hidden_traverse,
    .tp_clear = (inquiry)hidden_clear,
    .tp_dealloc = (destructor)hidden_dealloc,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Hidden, vectorcall),
    .tp_repr = (reprfunc)hidden_repr,
    .tp_members = hidden_members,
};

/* `Slot(module, globals, begin, end, code)`: a root module's forward timed from its
 * `_compiled_call_impl` (`torch_hooks.slot`), where torch's `Module.__call__`
 * (`_wrapped_call_impl`, whose code is `code`) looks first:
 *
 *     def __call__(self, *args, **kwargs):   # torch's
 *         if self._compiled_call_impl is not None:
 *             return self._compiled_call_impl(*args, **kwargs)
 *         return self._call_impl(*args, **kwargs)
 *
 * The slot calls `globals[begin](module)`, the module's `_call_impl(*args, **kwargs)` and
 * `globals[end](module)` (also when the forward raises, as an always-called hook is): what the
 * forward pre-hook and always-called hook did, but torch's `_call_impl` keeps its fast path, as
 * for a module without hooks (the hook path is a closure, a set and three Python calls of torch's
 * each forward). No frame of ours is on the stack.
 *
 * A module's `__dict__` copied onto another (`DataParallel`'s replicas) brings the slot along, and
 * the slot is called without the module: it reads the module from torch's `__call__` frame that
 * calls it (its `self`), and calls that module's `_call_impl` alone if it is not the root it was
 * made for (a weak reference). While torch.compile or torch.export traces
 * (`compiling`), the module's `_call_impl` alone. Copies: `copy.copy` and `copy.deepcopy` of the
 * slot give None (torch's `Module.__getstate__` already drops `_compiled_call_impl`). */
typedef struct {
    PyObject_HEAD
    PyObject *module;  /* a weak reference to the root */
    PyObject *globals; /* the module whose `begin` and `end` this calls, read at each call */
    PyObject *begin;
    PyObject *end;
    PyObject *code;    /* the code of torch's `Module.__call__` */
    vectorcallfunc vectorcall;
} Slot;

static PyObject *s_self, *s_call_impl;

/* The `self` of torch's `Module.__call__` frame that called us (a new reference), or NULL (not
 * called from there; an error only if one is set). */
static PyObject *
caller_self(PyObject *code)
{
    PyFrameObject *frame = PyEval_GetFrame(); /* borrowed */
    if (frame == NULL)
        return NULL;
    PyCodeObject *running = PyFrame_GetCode(frame);
    int ours = (PyObject *)running == code;
    Py_DECREF(running);
    if (!ours)
        return NULL;
#if PY_VERSION_HEX >= 0x030C0000
    return PyFrame_GetVar(frame, s_self);
#else
    PyObject *locals = PyFrame_GetLocals(frame);
    if (locals == NULL)
        return NULL;
    PyObject *self = PyMapping_GetItemString(locals, "self");
    Py_DECREF(locals);
    return self;
#endif
}

/* `globals[name](module)`: 0, or -1 with an error. */
static int
call_entry(PyObject *globals, PyObject *name, PyObject *module)
{
    PyObject *fn = PyDict_GetItemWithError(globals, name); /* borrowed */
    if (fn == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetObject(PyExc_NameError, name);
        return -1;
    }
    Py_INCREF(fn);
    PyObject *out = PyObject_CallOneArg(fn, module);
    Py_DECREF(fn);
    Py_XDECREF(out);
    return out == NULL ? -1 : 0;
}

static PyObject *
slot_call(PyObject *op, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Slot *self = (Slot *)op;
    PyObject *root = PyWeakref_GetObject(self->module); /* borrowed; None once it is gone */
    if (root == NULL)
        return NULL;
    PyObject *module = caller_self(self->code);
    if (module == NULL) {
        if (PyErr_Occurred())
            return NULL;
        if (root == Py_None) {
            PyErr_SetString(PyExc_TypeError, "otel_train: a forward slot called after its module was freed");
            return NULL;
        }
        module = Py_NewRef(root); /* called other than by torch's `__call__` */
    }
    int timed = module == root ? compiling() : 1;
    PyObject *out = NULL, *impl = timed >= 0 ? PyObject_GetAttr(module, s_call_impl) : NULL;
    timed = !timed;
    if (impl == NULL)
        goto end;
    if (!timed) {
        out = PyObject_Vectorcall(impl, args, nargsf, kwnames);
        goto end;
    }
    if (call_entry(self->globals, self->begin, module) < 0)
        goto end;
    out = PyObject_Vectorcall(impl, args, nargsf, kwnames);
    if (out == NULL) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        if (call_entry(self->globals, self->end, module) < 0)
            PyErr_Clear(); /* the forward's error goes on, as torch does after an always-called hook's */
        PyErr_Restore(type, value, tb);
    }
    else if (call_entry(self->globals, self->end, module) < 0)
        Py_CLEAR(out);
end:
    Py_XDECREF(impl);
    Py_DECREF(module);
    return out;
}

static PyObject *
slot_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *module, *globals, *begin, *end, *code;
    if (!PyArg_ParseTuple(args, "OO!UUO!:Slot", &module, &PyDict_Type, &globals, &begin, &end, &PyCode_Type, &code))
        return NULL;
    PyObject *ref = PyWeakref_NewRef(module, NULL);
    if (ref == NULL)
        return NULL;
    Slot *self = (Slot *)type->tp_alloc(type, 0);
    if (self == NULL) {
        Py_DECREF(ref);
        return NULL;
    }
    self->module = ref;
    self->globals = Py_NewRef(globals);
    self->begin = Py_NewRef(begin);
    self->end = Py_NewRef(end);
    self->code = Py_NewRef(code);
    self->vectorcall = slot_call;
    return (PyObject *)self;
}

static int
slot_traverse(Slot *self, visitproc visit, void *arg)
{
    Py_VISIT(self->module);
    Py_VISIT(self->globals);
    Py_VISIT(self->begin);
    Py_VISIT(self->end);
    Py_VISIT(self->code);
    return 0;
}

static int
slot_clear(Slot *self)
{
    Py_CLEAR(self->module);
    Py_CLEAR(self->globals);
    Py_CLEAR(self->begin);
    Py_CLEAR(self->end);
    Py_CLEAR(self->code);
    return 0;
}

static void
slot_dealloc(Slot *self)
{
    PyObject_GC_UnTrack(self);
    slot_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
slot_repr(Slot *self)
{
    return PyUnicode_FromString("<otel_train forward slot>");
}

/* A copy of a module's `__dict__` (`parametrize`'s deep copy of a parametrized module) gets None,
 * torch's default: the copy has no slot. */
static PyObject *
slot_copy(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_RETURN_NONE;
}

static PyMethodDef slot_methods[] = {
    {"__copy__", (PyCFunction)(void (*)(void))slot_copy, METH_FASTCALL, NULL},
    {"__deepcopy__", (PyCFunction)(void (*)(void))slot_copy, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef slot_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(Slot, vectorcall), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject SlotType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "otel_train.detect._entry.Slot",
    .tp_doc = "Slot(module, globals, begin, end, code): a root module's forward timed from its "
              "`_compiled_call_impl` (the type's comment in `_entry.c`).",
    .tp_basicsize = sizeof(Slot),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = slot_new,
    .tp_traverse = (traverseproc)slot_traverse,
    .tp_clear = (inquiry)slot_clear,
    .tp_dealloc = (destructor)slot_dealloc,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Slot, vectorcall),
    .tp_repr = (reprfunc)slot_repr,
    .tp_methods = slot_methods,
    .tp_members = slot_members,
};

static PyObject *
bind(PyObject *module, PyObject *args)
{
    PyObject *compiled, *dynamo_compiling, *tc, *state, *caught_up, *recorder;
    if (!PyArg_ParseTuple(args, "OOOOOO!:bind", &compiled, &dynamo_compiling, &tc, &state, &caught_up, &PyDict_Type,
                          &recorder))
        return NULL;
    Py_XSETREF(g_compiled, Py_NewRef(compiled));
    Py_XSETREF(g_dynamo_compiling, Py_NewRef(dynamo_compiling));
    Py_XSETREF(g_tc, Py_NewRef(tc));
    Py_XSETREF(g_state, Py_NewRef(state));
    Py_XSETREF(g_caught_up, Py_NewRef(caught_up));
    Py_XSETREF(g_recorder, Py_NewRef(recorder));
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"bind", bind, METH_VARARGS,
     "bind(compiled, dynamo_compiling, tc, state, caught_up, recorder_globals): what every entry reads."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "otel_train.detect._entry", NULL, -1, methods,
};

PyMODINIT_FUNC
PyInit__entry(void)
{
    if ((s_seen = PyUnicode_InternFromString("seen")) == NULL ||
        (s_flag = PyUnicode_InternFromString("_is_compiling_flag")) == NULL ||
        (s_name = PyUnicode_InternFromString("__name__")) == NULL ||
        (s_qualname = PyUnicode_InternFromString("__qualname__")) == NULL ||
        (s_rec = PyUnicode_InternFromString("_rec")) == NULL ||
        (g_prefix = PyUnicode_InternFromString("otel_train.")) == NULL ||
        (s_self = PyUnicode_InternFromString("self")) == NULL ||
        (s_call_impl = PyUnicode_InternFromString("_call_impl")) == NULL || PyType_Ready(&EntryType) < 0 ||
        PyType_Ready(&HiddenType) < 0 || PyType_Ready(&SlotType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL)
        return NULL;
    if (PyModule_AddObjectRef(module, "Entry", (PyObject *)&EntryType) < 0 ||
        PyModule_AddObjectRef(module, "Hidden", (PyObject *)&HiddenType) < 0 ||
        PyModule_AddObjectRef(module, "Slot", (PyObject *)&SlotType) < 0 ||
        PyModule_AddIntConstant(module, "FETCH", FETCH) < 0 || PyModule_AddIntConstant(module, "CALL", CALL) < 0 ||
        PyModule_AddIntConstant(module, "RECORDED", RECORDED) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
