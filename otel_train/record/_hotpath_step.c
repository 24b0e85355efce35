/* Part of `_hotpath.c` (see `_hotpath.h`): the step types, `otel_train.step`.
 *
 * `Step` is one training step (explicit, or opened and closed by automatic detection), `After`
 * marks "between steps, after this one": spans there join that step's trace as siblings. Same
 * behaviour as the pure-Python `recorder._PyStep` / `_PyAfter`.
 */
#include "_hotpath.h"

GC_FIELD_FUNCTIONS(step, StepObject, STEP_FIELDS, (void)0)

static PyObject *step_called(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames);

/* A new step: `n` and `epoch` may be NULL (None); `attrs` a dict or None/NULL. */
static StepObject *
step_make(PyTypeObject *type, PyObject *n, PyObject *epoch, PyObject *attrs)
{
    StepObject *self = (StepObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->n = Py_NewRef(n != NULL ? n : Py_None);
    self->epoch = Py_NewRef(epoch != NULL ? epoch : Py_None);
    self->attrs = Py_NewRef(attrs != NULL ? attrs : Py_None);
    self->micro_batches = Py_NewRef(s_zero);
    self->dev = Py_NewRef(Py_None);
    self->tags = Py_NewRef(Py_None);
    self->events = Py_NewRef(Py_None);
    self->links = Py_NewRef(Py_None);
    self->vectorcall = step_called;
    return self;
}

static PyObject *
step_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"n", "epoch", "attrs", NULL};
    PyObject *n = NULL, *epoch = NULL, *attrs = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|OOO:Step", kwlist, &n, &epoch, &attrs))
        return NULL;
    return (PyObject *)step_make(type, n, epoch, attrs);
}

static PyObject *
after_make(StepObject *step)
{
    AfterObject *after = PyObject_New(AfterObject, &AfterType);
    if (after == NULL)
        return NULL;
    after->step = Py_NewRef(step);
    after->ref = PyTuple_Pack(2, step->n, Py_None);
    if (after->ref == NULL) {
        Py_DECREF(after);
        return NULL;
    }
    untrack_if_atomic(after->ref);
    return (PyObject *)after;
}

/* `step.ref` (a new reference): read in place for the C step types. */
static PyObject *
step_ref_of(PyObject *step)
{
    if (Py_IS_TYPE(step, &StepType) && ((StepObject *)step)->ref != NULL)
        return Py_NewRef(((StepObject *)step)->ref);
    if (Py_IS_TYPE(step, &AfterType))
        return Py_NewRef(((AfterObject *)step)->ref);
    return PyObject_GetAttr(step, s_ref);
}

/* `recorder.close_step`: end the open step at `t1` and append its record. */
static int
close_step(RecorderObject *rec, StepObject *step, PyObject *t1, PyObject *exc_type)
{
    /* The end must be in place before the record is appended: the worker may drain it at once. */
    Py_XSETREF(step->t1, Py_NewRef(t1));
    if (g_dev_free != NULL)
        Py_XSETREF(step->dev, dev_step_end(rec, t1));  /* the step's end event: its device boundary */
    else if (rec->step_end != NULL && rec->step_end != Py_None) {
        PyObject *res = PyObject_CallOneArg(rec->step_end, (PyObject *)step);  /* device timing's end event */
        if (res == NULL)
            return -1;
        Py_DECREF(res);
    }
    Py_XSETREF(step->exc, Py_NewRef(exc_type));
    PyObject *after = after_make(step);
    if (after == NULL)
        return -1;
    Py_XSETREF(rec->step, after);
    PyObject *record;
    if (step->dev != NULL && step->dev != Py_None)
        record = Py_NewRef(step);
    else {
        PyObject *tags = Py_None;
        int has_tags = step->tags != NULL && step->tags != Py_None ? PyObject_IsTrue(step->tags) : 0;
        if (has_tags < 0)
            return -1;
        if (has_tags && (tags = PySequence_Tuple(step->tags)) == NULL)
            return -1;
        if (!has_tags)
            Py_INCREF(tags);
        record = PyTuple_New(12);
        if (record == NULL) {
            Py_DECREF(tags);
            return -1;
        }
#define OR_NONE(f) Py_NewRef(step->f != NULL ? step->f : Py_None)
        PyTuple_SET_ITEM(record, 0, Py_NewRef(g_kind_step));
        PyTuple_SET_ITEM(record, 1, OR_NONE(seq));
        PyTuple_SET_ITEM(record, 2, OR_NONE(n));
        PyTuple_SET_ITEM(record, 3, OR_NONE(t0));
        PyTuple_SET_ITEM(record, 4, Py_NewRef(t1));
        PyTuple_SET_ITEM(record, 5, OR_NONE(attrs));
        PyTuple_SET_ITEM(record, 6, OR_NONE(epoch));
        PyTuple_SET_ITEM(record, 7, OR_NONE(micro_batches));
        PyTuple_SET_ITEM(record, 8, tags);
        PyTuple_SET_ITEM(record, 9, OR_NONE(events));
        PyTuple_SET_ITEM(record, 10, OR_NONE(links));
        PyTuple_SET_ITEM(record, 11, Py_NewRef(exc_type));
#undef OR_NONE
        untrack_if_atomic(record);
    }
    return append_record(rec, record);
}

/* Whether `n` is a step number as it must be: an int from 0 to 2**63 - 1 (a bool is not one). */
static int
step_number_ok(PyObject *n)
{
    if (!PyLong_CheckExact(n))
        return 0;
    int overflow;
    long long value = PyLong_AsLongLongAndOverflow(n, &overflow);
    return !overflow && value >= 0;
}

static PyObject *
step_enter(StepObject *self)
{
    PyObject *r;
    if ((g_settle != NULL && settle_pending() < 0) || recorder_in_force(&r) < 0)
        return NULL;
    Py_XSETREF(self->rec, Py_NewRef(r));
    if (r == Py_None)
        return Py_NewRef(self);  /* disabled, or shut down: nothing is recorded */
    RecorderObject *rec = (RecorderObject *)r;
    if (PyObject_TypeCheck(rec->step, &StepType)) {  /* the last one is still open: said, and closed */
        PyObject *res = PyObject_CallFunctionObjArgs(g_reopened, (PyObject *)self, r, NULL);
        if (res == NULL)
            return NULL;
        Py_DECREF(res);
    }
    if (self->n == NULL || self->n == Py_None)
        Py_XSETREF(self->n, Py_NewRef(rec->next_step));
    else if (!step_number_ok(self->n)) {  /* `step("5")`, `step(-1)`, `step(1.5)`: said, and made valid */
        if (g_step_number == NULL) {
            PyErr_SetString(PyExc_TypeError, "otel_train.step(n): n must be an integer >= 0");
            return NULL;
        }
        PyObject *fixed = PyObject_CallFunctionObjArgs(g_step_number, self->n, rec->next_step, NULL);
        if (fixed == NULL)
            return NULL;
        Py_XSETREF(self->n, fixed);
    }
    PyObject *next = PyNumber_Add(self->n, s_one);
    if (next == NULL)
        return NULL;
    Py_XSETREF(rec->next_step, next);
    PyObject *seq = PyLong_FromLongLong(g_next_seq++);
    if (seq == NULL)
        return NULL;
    Py_XSETREF(self->seq, seq);
    PyObject *ref = PyTuple_Pack(2, self->n, seq);  /* what a region records of the step it ran in */
    if (ref == NULL)
        return NULL;
    untrack_if_atomic(ref);  /* so are the records that hold it (`region_exit`) */
    Py_XSETREF(self->ref, ref);
    Py_XSETREF(self->tags, Py_NewRef(Py_None));
    Py_XSETREF(self->events, Py_NewRef(Py_None));
    PyObject *pending = rec->pending_links;
    if (pending != NULL && PyList_Check(pending) && PyList_GET_SIZE(pending)) {
        PyObject *fresh = PyList_New(0);
        if (fresh == NULL)
            return NULL;
        Py_XSETREF(self->links, pending);  /* the recorder's reference moves to the step */
        rec->pending_links = fresh;
    }
    else
        Py_XSETREF(self->links, Py_NewRef(Py_None));
    Py_XSETREF(rec->step, Py_NewRef(self));
    PyObject *t0 = rec_now(rec);
    if (t0 == NULL)
        return NULL;
    Py_XSETREF(self->t0, t0);
    return Py_NewRef(self);
}

static PyObject *
step_exit(StepObject *self, PyObject *exc_type)
{
    PyObject *r = self->rec;
    if (r == NULL || r == Py_None || ((RecorderObject *)r)->step != (PyObject *)self)
        Py_RETURN_NONE;
    PyObject *t1 = rec_now((RecorderObject *)r);
    if (t1 == NULL)
        return NULL;
    int rc = close_step((RecorderObject *)r, self, t1, exc_type);
    Py_DECREF(t1);
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
step_called(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames == NULL || PyTuple_GET_SIZE(kwnames) == 0) {
        if (nargs == 0)
            return step_enter((StepObject *)self);
        if (nargs == 3)
            return step_exit((StepObject *)self, args[0]);
    }
    PyErr_SetString(PyExc_TypeError, "a step is used with `with`, not called");
    return NULL;
}

static PyObject *
step_enter_unbound(PyObject *module, PyObject *self)
{
    if (!PyObject_TypeCheck(self, &StepType)) {
        PyErr_SetString(PyExc_TypeError, "__enter__ needs a Step");
        return NULL;
    }
    return step_enter((StepObject *)self);
}

static PyObject *
step_exit_unbound(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyObject_TypeCheck(args[0], &StepType)) {
        PyErr_SetString(PyExc_TypeError, "__exit__ needs a Step and 3 arguments");
        return NULL;
    }
    return step_exit((StepObject *)args[0], args[1]);
}

static PyMethodDef step_unbound_defs[] = {
    {"__enter__", (PyCFunction)step_enter_unbound, METH_O, "Open the step: number, seq, links, t0."},
    {"__exit__", (PyCFunction)(void (*)(void))step_exit_unbound, METH_FASTCALL, "Close it: append its record."},
};

static PyMethodDef step_methods[] = {
    {"__aenter__", (PyCFunction)region_aenter, METH_NOARGS, NULL},
    {"__aexit__", (PyCFunction)(void (*)(void))region_aexit, METH_FASTCALL, NULL},
    {NULL}
};

#define STEP_MEMBER(f) {#f, T_OBJECT_EX, offsetof(StepObject, f), 0, NULL},
static PyMemberDef step_members[] = {
    STEP_FIELDS(STEP_MEMBER)
    {NULL}
};
#undef STEP_MEMBER

static PyTypeObject StepType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "otel_train.record._hotpath.Step",
    .tp_doc = "One training step (otel_train.step): Step(n=None, epoch=None, attrs=None).",
    .tp_basicsize = sizeof(StepObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(StepObject, vectorcall),
    .tp_new = step_new,
    .tp_traverse = (traverseproc)step_traverse,
    .tp_clear = (inquiry)step_clear,
    .tp_dealloc = (destructor)step_dealloc,
    .tp_call = PyVectorcall_Call,
    .tp_methods = step_methods,
    .tp_members = step_members,
};

static PyObject *
after_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *step;
    if (!PyArg_UnpackTuple(args, "After", 1, 1, &step))
        return NULL;
    if (!PyObject_TypeCheck(step, &StepType)) {
        PyErr_SetString(PyExc_TypeError, "After() takes a Step");
        return NULL;
    }
    return after_make((StepObject *)step);
}

static void
after_dealloc(AfterObject *self)
{
    Py_XDECREF(self->step);
    Py_XDECREF(self->ref);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef after_members[] = {
    {"step", T_OBJECT_EX, offsetof(AfterObject, step), READONLY, "The step just ended."},
    {"ref", T_OBJECT_EX, offsetof(AfterObject, ref), READONLY, "(step number, None): what a region records."},
    {NULL}
};

/* Not tracked by the collector: it holds the step, which never refers back to it. */
static PyTypeObject AfterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "otel_train.record._hotpath.After",
    .tp_doc = "Between steps, after `step`: spans here join that step's trace as siblings.",
    .tp_basicsize = sizeof(AfterObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = after_new,
    .tp_dealloc = (destructor)after_dealloc,
    .tp_members = after_members,
};

/* `otel_train.step(n=None, epoch=None, **attrs)` */
static PyObject *
mod_step(PyObject *module, PyObject *const *args, Py_ssize_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs > 2) {
        PyErr_Format(PyExc_TypeError, "otel_train.step() takes at most 2 positional arguments, n and epoch "
                     "(%zd given); attributes go as keywords", nargs);
        return NULL;
    }
    PyObject *n = nargs > 0 ? args[0] : NULL, *epoch = nargs > 1 ? args[1] : NULL, *attrs = NULL;
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t i = 0; i < nkw; i++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, i), *value = args[nargs + i];
        int is_n = PyUnicode_CompareWithASCIIString(key, "n") == 0;
        if (is_n || PyUnicode_CompareWithASCIIString(key, "epoch") == 0) {
            if ((is_n ? n : epoch) != NULL) {
                PyErr_Format(PyExc_TypeError, "otel_train.step() got multiple values for argument '%U'", key);
                goto fail;
            }
            if (is_n)
                n = value;
            else
                epoch = value;
            continue;
        }
        if (attrs == NULL && (attrs = PyDict_New()) == NULL)
            return NULL;
        if (PyDict_SetItem(attrs, key, value) < 0)
            goto fail;
    }
    PyObject *step = (PyObject *)step_make(&StepType, n, epoch, attrs);
    Py_XDECREF(attrs);
    return step;
fail:
    Py_XDECREF(attrs);
    return NULL;
}

static PyObject *
mod_close_step(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyObject_TypeCheck(args[0], &RecorderType) || !PyObject_TypeCheck(args[1], &StepType)) {
        PyErr_SetString(PyExc_TypeError, "close_step(recorder, step, t1, exc_type)");
        return NULL;
    }
    if (close_step((RecorderObject *)args[0], (StepObject *)args[1], args[2], args[3]) < 0)
        return NULL;
    Py_RETURN_NONE;
}

