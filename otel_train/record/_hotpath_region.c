/* Part of `_hotpath.c` (see `_hotpath.h`): the region type, `otel_train.span`.
 *
 * Same behaviour as the pure-Python `recorder._PyRegion` (the fallback when this module cannot
 * be built), with no Python frame between `otel_train.span(...)` and the record in the buffer.
 * Entering reads the parent (the current region), the step, a sequence number and the clock;
 * leaving appends the record (`_hotpath_recorder.c`).
 */
#include "_hotpath.h"

/* The innermost open region this thread entered outside an event loop (a strong reference).
 * Why not always the ContextVar: its set (a new HAMT and a token, both tracked by the garbage
 * collector) was 1,660 of the ~2,600 instructions of a region's enter and exit. A C thread
 * local is a pointer swap. Regions in an asyncio loop, or nested in a region that used the
 * ContextVar, still use it: tasks interleave there, and each sees its own context. */
static THREAD_LOCAL PyObject *tl_current;
static PyObject *g_running_loop;  /* asyncio.events._get_running_loop, once asyncio is imported */
static PyObject *g_loop_key;      /* its thread-state dict key, when that is the C `_asyncio` one */

/* What calling `Region` (`otel_train.span`) makes besides a Region (`set_span_target`, from
 * `record/span.py`): NULL, a Region; a type (the device-timed region), an instance of it; any
 * other object (the disabled no-op), that object itself. The public name never changes: the
 * call reads this, one compare while it is NULL. */
static PyObject *g_span_target;
static int g_span_target_is_type;

static PyObject *region_called(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames);

GC_FIELD_FUNCTIONS(region, RegionObject, REGION_FIELDS, (void)0)

static PyObject *
region_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    RegionObject *self = (RegionObject *)type->tp_alloc(type, 0);
    if (self != NULL) {
        self->events = Py_NewRef(Py_None);
        self->dev = Py_NewRef(Py_None);
        self->vectorcall = region_called;
    }
    return (PyObject *)self;
}

/* One keyword of `Region(name, *, device_time=None, **attrs)`: `device_time` (None: the
 * default) or an attribute, into `attrs`, which stays None until the first one (the usual
 * region has none: no dict). */
static int
region_keyword(RegionObject *self, PyObject *key, PyObject *value)
{
    if (key == s_device_time || PyUnicode_Compare(key, s_device_time) == 0) {
        if (value != Py_None)
            Py_XSETREF(self->timed, Py_NewRef(value));
        return 0;
    }
    if (self->attrs == NULL || self->attrs == Py_None) {
        PyObject *attrs = PyDict_New();
        if (attrs == NULL)
            return -1;
        Py_XSETREF(self->attrs, attrs);
    }
    return PyDict_SetItem(self->attrs, key, value);
}

static int
region_init(RegionObject *self, PyObject *args, PyObject *kwds)
{
    PyObject *name, *key, *value;
    if (!PyArg_UnpackTuple(args, "span", 1, 1, &name))
        return -1;
    Py_XSETREF(self->name, Py_NewRef(name));
    Py_XSETREF(self->attrs, Py_NewRef(Py_None));
    for (Py_ssize_t pos = 0; kwds != NULL && PyDict_Next(kwds, &pos, &key, &value);)
        if (region_keyword(self, key, value) < 0)
            return -1;
    return 0;
}

static PyObject *
region_vectorcall(PyObject *type, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if ((PyTypeObject *)type != &RegionType) {
        /* A subclass that kept this vectorcall: go through its __new__ and __init__. */
        PyObject *tuple = PyTuple_New(nargs);
        if (tuple == NULL)
            return NULL;
        for (Py_ssize_t i = 0; i < nargs; i++)
            PyTuple_SET_ITEM(tuple, i, Py_NewRef(args[i]));
        PyObject *kw = NULL;
        if (kwnames != NULL && PyTuple_GET_SIZE(kwnames)) {
            kw = PyDict_New();
            for (Py_ssize_t i = 0; kw != NULL && i < PyTuple_GET_SIZE(kwnames); i++)
                if (PyDict_SetItem(kw, PyTuple_GET_ITEM(kwnames, i), args[nargs + i]) < 0)
                    Py_CLEAR(kw);
            if (kw == NULL) {
                Py_DECREF(tuple);
                return NULL;
            }
        }
        PyObject *res = PyType_Type.tp_call(type, tuple, kw);
        Py_DECREF(tuple);
        Py_XDECREF(kw);
        return res;
    }
    if (nargs != 1) {
        PyErr_Format(PyExc_TypeError, "otel_train.span() takes the span name as its one positional argument "
                     "(%zd given); attributes go as keywords", nargs);
        return NULL;
    }
    if (g_span_target != NULL)
        return g_span_target_is_type ? PyObject_Vectorcall(g_span_target, args, nargsf, kwnames)
                                     : Py_NewRef(g_span_target);
    RegionObject *self = PyObject_GC_New(RegionObject, &RegionType);
    if (self == NULL)
        return NULL;
    self->attrs = self->rec = self->parent = self->token = self->step = NULL;
    self->exc = self->timed = self->ev1 = NULL;
    self->has = 0;
    self->tid = 0;
    self->reentered = 0;
    self->vectorcall = region_called;
    self->name = Py_NewRef(args[0]);
    self->events = Py_NewRef(Py_None);
    self->dev = Py_NewRef(Py_None);
    self->attrs = Py_NewRef(Py_None);
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t i = 0; i < nkw; i++)
        if (region_keyword(self, PyTuple_GET_ITEM(kwnames, i), args[nargs + i]) < 0)
            goto fail;
    PyObject_GC_Track(self);
    return (PyObject *)self;
fail:
    PyObject_GC_Track(self);
    Py_DECREF(self);
    return NULL;
}
/* The innermost open region of this thread's `tl_current` chain (borrowed), or NULL. A region
 * left on another thread is skipped (it has its end time): its own thread's pointer went stale. */
static PyObject *
tl_open(void)
{
    /* Regions exited out of order can leave closed regions that are each other's parents (a
     * region re-entered under its own child, later closed): this walk marks where it has been
     * (Brent's cycle finding: the mark moves to where the walk is after 1, 2, 4... steps) and
     * takes a cycle for "no open region", where a plain walk spun forever holding the GIL. */
    PyObject *p = tl_current, *mark = p;
    size_t steps = 0, span = 1;
    while (p != NULL && PyObject_TypeCheck(p, &RegionType) && (((RegionObject *)p)->has & HAS_T1)) {
        p = ((RegionObject *)p)->parent;
        if (p == Py_None || p == mark)
            return NULL;
        if (++steps == span) {
            mark = p;
            span <<= 1;
            steps = 0;
        }
    }
    return p;
}

/* Say once that region `self` was misused (`what`: "reentered", "exited"), through
 * `misuse.misused`; an error there is not the caller's: cleared. */
static void
say_misused(RegionObject *self, const char *what)
{
    if (g_misused == NULL)
        return;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *kind = PyUnicode_FromString(what);
    PyObject *res = kind == NULL ? NULL : PyObject_CallFunctionObjArgs(g_misused, kind,
                                                                     self->name != NULL ? self->name : Py_None, NULL);
    Py_XDECREF(kind);
    if (res == NULL)
        PyErr_Clear();
    Py_XDECREF(res);
    PyErr_Restore(type, value, tb);
}

/* The open region a new one nests in (a new reference; None outside any): the ContextVar's
 * value where one is set in this context, else this thread's `tl_current`. */
static PyObject *
current_region(PyObject **from_var)
{
    PyObject *value;
    if (PyContextVar_Get(g_current, NULL, &value) < 0)
        return NULL;
    if (value != Py_None) {
        *from_var = value;
        return value;
    }
    Py_DECREF(value);
    *from_var = NULL;
    PyObject *p = tl_open();
    return Py_NewRef(p != NULL ? p : Py_None);
}

/* `asyncio.events._get_running_loop`, found once asyncio is imported (no loop runs before):
 * 1 when found, 0 not yet, -1 on error. The package does not import asyncio for this. */
static int
resolve_running_loop(void)
{
    PyObject *events = PyImport_GetModule(s_asyncio_events);
    if (events == NULL)
        return PyErr_Occurred() ? -1 : 0;
    PyObject *fn = PyObject_GetAttrString(events, "_get_running_loop");
    Py_DECREF(events);
    if (fn == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError))
            return -1;
        PyErr_Clear();  /* asyncio.events is still being imported: look again next time */
        return 0;
    }
    if (PyCFunction_Check(fn)) {  /* not the pure-Python one, which keeps a threading.local */
        g_loop_key = PyUnicode_InternFromString("__asyncio_running_event_loop__");
        if (g_loop_key == NULL) {
            Py_DECREF(fn);
            return -1;
        }
    }
    g_running_loop = fn;
    return 1;
}

#if PY_VERSION_HEX < 0x030E0000
/* The thread state and its `context_ver` when this thread last found no loop running. The
 * version counts the thread's context switches (`Context.run`), and asyncio runs every callback
 * and task step of a loop in one: while it is unchanged, no loop has begun running code here
 * since, and the answer stands. That check is two words of the thread state, where asking again
 * read the thread-state dict or called into asyncio: ~2 us of a cold region's ~6 (memory the
 * training step had evicted). */
#define LOOP_CHECK_CACHE 1
static THREAD_LOCAL PyThreadState *tl_noloop_ts;
static THREAD_LOCAL uint64_t tl_noloop_ver;
#endif

static int running_loop_now(void);

static int
loop_running(void)
{
#ifdef LOOP_CHECK_CACHE
    PyThreadState *ts = PyThreadState_Get();
    if (ts == tl_noloop_ts && ts->context_ver == tl_noloop_ver)
        return 0;
    int running = running_loop_now();
    if (running == 0) {
        tl_noloop_ts = ts;
        tl_noloop_ver = ts->context_ver;
    }
    return running;
#else
    return running_loop_now();
#endif
}

/* Whether an asyncio loop runs on this thread, asked of asyncio: 1, 0, or -1 on error. */
static int
running_loop_now(void)
{
    if (g_running_loop == NULL) {
        int found = resolve_running_loop();
        if (found <= 0)
            return found;
    }
#if PY_VERSION_HEX < 0x030C0000
    /* CPython 3.10-3.11's `_asyncio` keeps a thread's running loop in its thread-state dict
     * under this key, set when a loop first runs on the thread. No key: no loop runs here, and
     * the call below (~1,000 instructions: a miss in that dict through two calls) is spared. */
    if (g_loop_key != NULL) {
        PyObject *dict = PyThreadState_GetDict();
        if (dict != NULL && PyDict_GetItemWithError(dict, g_loop_key) == NULL)
            return PyErr_Occurred() ? -1 : 0;
    }
#endif
    PyObject *loop = PyObject_CallNoArgs(g_running_loop);
    if (loop == NULL)
        return -1;
    int running = loop != Py_None;
    Py_DECREF(loop);
    return running;
}

/* `set_span_target(target)`: what `Region(...)` makes from now on (see `g_span_target`); None
 * or `Region` itself, a Region. */
static PyObject *
mod_set_span_target(PyObject *module, PyObject *target)
{
    if (target == Py_None || target == (PyObject *)&RegionType) {
        Py_CLEAR(g_span_target);
        g_span_target_is_type = 0;
        Py_RETURN_NONE;
    }
    int is_type = PyType_Check(target);
    if (is_type && !PyType_IsSubtype((PyTypeObject *)target, &RegionType)) {
        PyErr_SetString(PyExc_TypeError, "set_span_target() takes None, a Region subclass or an object to hand out");
        return NULL;
    }
    Py_XSETREF(g_span_target, Py_NewRef(target));
    g_span_target_is_type = is_type;
    Py_RETURN_NONE;
}

/* Put `self` on the current-region pointer: the ContextVar where `use_var` (a region nests in
 * one set there) or an asyncio loop runs on this thread, else this thread's `tl_current`. 0, or
 * -1 with an error. */
static int
region_go_current(RegionObject *self, int use_var)
{
    if (!use_var && (use_var = loop_running()) < 0)
        return -1;
    if (use_var) {
        PyObject *token = PyContextVar_Set(g_current, (PyObject *)self);
        if (token == NULL)
            return -1;
        Py_XSETREF(self->token, token);
    }
    else {
        Py_CLEAR(self->token);
        self->tid = PyThread_get_thread_ident();
        PyObject *old = tl_current;
        tl_current = Py_NewRef(self);
        Py_XDECREF(old);
    }
    return 0;
}

/* `make_current(region)`: an entered region that was taken off the current-region pointer
 * (`region_leave`) goes back on it, where a new region would: what the optimizer phase does
 * for each of its calls (`detect/phase.py`). */
static int
region_make_current(RegionObject *self)
{
    if (self->rec == NULL || self->rec == Py_None || (self->has & HAS_T1))
        return 0;  /* never entered, entered while disabled, or over */
    PyObject *value;
    if (PyContextVar_Get(g_current, NULL, &value) < 0)
        return -1;
    Py_DECREF(value);
    return region_go_current(self, value != Py_None);
}

/* Take `self` off the current-region pointer it went on (at exit, or when abandoned). */
static int
region_leave(RegionObject *self)
{
    if (self->rec == NULL || self->rec == Py_None)
        return 0;  /* never entered, or entered while disabled */
    if (self->token != NULL) {
        if (PyContextVar_Reset(g_current, self->token) == 0)
            return 0;
        /* exited in another context (a different asyncio task): restore the parent there */
        if (!PyErr_ExceptionMatches(PyExc_ValueError))
            return -1;
        PyErr_Clear();
        PyObject *token = PyContextVar_Set(g_current, self->parent != NULL ? self->parent : Py_None);
        if (token == NULL)
            return -1;
        Py_DECREF(token);
        return 0;
    }
    if (self->tid == PyThread_get_thread_ident()) {
        /* otherwise left on another thread: its own thread skips it from now on (`tl_open`) */
        PyObject *parent = self->parent == Py_None ? NULL : self->parent;
        PyObject *old = tl_current;
        tl_current = parent;
        Py_XINCREF(parent);
        Py_XDECREF(old);
    }
    return 0;
}

static PyObject *
region_enter(RegionObject *self, PyObject *Py_UNUSED(ignored))
{
    PyObject *r;
    if (self->rec != NULL && self->rec != Py_None && (self->has & (HAS_T0 | HAS_T1)) == HAS_T0) {
        /* Open already: `with sp: with sp:`. Ignored, with its exit (`reentered`). */
        if (self->reentered < UINT32_MAX)
            self->reentered++;
        say_misused(self, "reentered");
        return Py_NewRef(self);
    }
    if ((g_settle != NULL && settle_pending() < 0) || recorder_in_force(&r) < 0)
        return NULL;
    Py_XSETREF(self->rec, Py_NewRef(r));
    if (r == Py_None)
        return Py_NewRef(self);  /* disabled, or shut down: nothing is recorded */
    RecorderObject *rec = (RecorderObject *)r;
    PyObject *from_var;
    PyObject *parent = current_region(&from_var);
    if (parent == NULL)
        return NULL;
    Py_XSETREF(self->parent, parent);
    if (region_go_current(self, from_var != NULL) < 0)
        return NULL;
    Py_XSETREF(self->step, Py_NewRef(rec->step));
    self->seq = g_next_seq++;
    self->has = (self->has & ~HAS_T1) | HAS_SEQ;
    if (rec_now_ns(rec, &self->t0) < 0)
        return NULL;
    self->has |= HAS_T0;
    if (DEV_ON && Py_IS_TYPE(self, &RegionType))
        dev_region_enter(self);  /* the start event, after t0 (`_hotpath_device.c`) */
    return Py_NewRef(self);
}

/* A record waits in the buffer for up to a flush interval. Tracked, every young collection in
 * that time visits it (the interpreter untracks such tuples only when a collection sees them);
 * one of strings, numbers, None and untracked tuples and dicts never needs tracking. */
static void
untrack_if_atomic(PyObject *record)
{
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(record); i++) {
        PyObject *item = PyTuple_GET_ITEM(record, i);
        if (PyObject_IS_GC(item) && PyObject_GC_IsTracked(item))
            return;
    }
    PyObject_GC_UnTrack(record);
}

static PyObject *
region_exit(RegionObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "__exit__ takes 3 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *r = self->rec;
    if (r == NULL || r == Py_None)
        Py_RETURN_NONE;
    if (self->reentered) {  /* the exit of an entry that was ignored */
        self->reentered--;
        Py_RETURN_NONE;
    }
    if (self->has & HAS_T1) {  /* over already: exited twice, or ended at shutdown */
        say_misused(self, "exited");
        Py_RETURN_NONE;
    }
    RecorderObject *rec = (RecorderObject *)r;
    if (!PyUnicode_CheckExact(self->name) && g_name_of != NULL) {
        /* Not a str (an int, None, an object whose __str__ raises): as text, here, where the
         * user's code runs anyway, so that the exporter only ever sees str names. */
        PyObject *text = PyObject_CallOneArg(g_name_of, self->name != NULL ? self->name : Py_None);
        if (text == NULL)
            return NULL;
        Py_XSETREF(self->name, text);
    }
    if (rec_now_ns(rec, &self->t1) < 0)
        return NULL;
    self->has |= HAS_T1;
    if (region_leave(self) < 0)
        return NULL;
    PyObject *record;
    if (self->dev != NULL && self->dev != Py_None && g_dev_free != NULL && Py_IS_TYPE(self, &RegionType))
        dev_region_exit(self);  /* the end event, before the record is appended */
    if (self->dev == NULL || self->dev == Py_None) {
        PyObject *parent = self->parent;
        const int64_t *parent_seq = NULL;
        if (parent != NULL && PyObject_TypeCheck(parent, &RegionType)) {
            RegionObject *p = (RegionObject *)parent;
            if (p->rec == r && (p->has & HAS_SEQ))
                parent_seq = &p->seq;
        }
        PyObject *step_ref;
        if (self->step == NULL || self->step == Py_None)
            step_ref = Py_NewRef(g_no_step);
        else if ((step_ref = step_ref_of(self->step)) == NULL)
            return NULL;
        PyObject *attrs = self->attrs;
        if (attrs == NULL || attrs == Py_None)
            attrs = Py_None;
        else {
            int truth = PyObject_IsTrue(attrs);
            if (truth < 0) {
                Py_DECREF(step_ref);
                return NULL;
            }
            if (!truth)
                attrs = Py_None;
        }
        PyObject *events = self->events != NULL ? self->events : Py_None;
        int has_times = (self->has & (HAS_SEQ | HAS_T0)) == (HAS_SEQ | HAS_T0);
        if (rec->ring != NULL && has_times) {
            int packed = pack_region(rec, self->name, self->seq, parent_seq, step_ref, self->t0, self->t1, attrs,
                                     args[0], events);
            if (packed != 0) {
                Py_DECREF(step_ref);
                if (packed < 0)
                    return NULL;
                Py_RETURN_NONE;
            }
        }
        record = region_record(g_kind_span, self->name, has_times ? &self->seq : NULL, parent_seq, step_ref,
                               has_times ? &self->t0 : NULL, self->t1, attrs, args[0], events);
        Py_DECREF(step_ref);
        if (record == NULL)
            return NULL;
        untrack_if_atomic(record);
    }
    else {
        Py_XSETREF(self->exc, Py_NewRef(args[0]));
        record = Py_NewRef(self);
    }
    /* Not a slot: `pack_region` above said no, or the region is an object (device time). */
    if (append_object(rec, record) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
region_aenter(PyObject *self, PyObject *Py_UNUSED(ignored))
{
    return PyObject_CallOneArg(g_aenter, self);
}

static PyObject *
region_aexit(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "__aexit__ takes 3 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *call[4] = {self, args[0], args[1], args[2]};
    return PyObject_Vectorcall(g_aexit, call, 4, NULL);
}

/* `with` looks `__enter__` and `__exit__` up on the type and binds them to the region: for
 * methods that is a new bound-method object each, allocated, tracked by the collector and
 * freed again, about 1,700 of the ~4,500 instructions a region cost. Here the two names are
 * `SelfDescr`s, whose binding is the region itself (no allocation), and calling a region
 * dispatches on its arguments: none is `__enter__`, three are `__exit__`, one is the
 * decorator. Looked up on the class, they give plain functions of the region
 * (`Region.__enter__(region)`), as methods would. */
static PyObject *
region_called(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames == NULL || PyTuple_GET_SIZE(kwnames) == 0) {
        if (nargs == 0)
            return region_enter((RegionObject *)self, NULL);
        if (nargs == 3)
            return region_exit((RegionObject *)self, args, 3);
        if (nargs == 1)
            return PyObject_CallFunctionObjArgs(g_decorate, self, args[0], NULL);
    }
    PyErr_SetString(PyExc_TypeError, "a span used as a decorator takes the function alone");
    return NULL;
}

static PyObject *
enter_unbound(PyObject *module, PyObject *self)
{
    if (!PyObject_TypeCheck(self, &RegionType)) {
        PyErr_SetString(PyExc_TypeError, "__enter__ needs a Region");
        return NULL;
    }
    return region_enter((RegionObject *)self, NULL);
}

static PyObject *
exit_unbound(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyObject_TypeCheck(args[0], &RegionType)) {
        PyErr_SetString(PyExc_TypeError, "__exit__ needs a Region and 3 arguments");
        return NULL;
    }
    return region_exit((RegionObject *)args[0], args + 1, 3);
}

static PyMethodDef unbound_defs[] = {
    {"__enter__", (PyCFunction)enter_unbound, METH_O, "Open the region: parent, step, seq, t0."},
    {"__exit__", (PyCFunction)(void (*)(void))exit_unbound, METH_FASTCALL, "Close it: append its record."},
};

typedef struct {
    PyObject_HEAD
    PyObject *unbound;  /* what the name gives on the class */
} SelfDescrObject;

static PyObject *
selfdescr_get(SelfDescrObject *descr, PyObject *obj, PyObject *type)
{
    return Py_NewRef(obj == NULL || obj == Py_None ? descr->unbound : obj);
}

static void
selfdescr_dealloc(SelfDescrObject *descr)
{
    Py_XDECREF(descr->unbound);
    Py_TYPE(descr)->tp_free((PyObject *)descr);
}

static PyTypeObject SelfDescrType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "otel_train.record._hotpath.SelfDescr",
    .tp_doc = "A class attribute whose binding to an instance is the instance itself.",
    .tp_basicsize = sizeof(SelfDescrObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)selfdescr_dealloc,
    .tp_descr_get = (descrgetfunc)selfdescr_get,
};

static int
add_self_descr(PyTypeObject *type, PyMethodDef *def)
{
    SelfDescrObject *descr = PyObject_New(SelfDescrObject, &SelfDescrType);
    if (descr == NULL)
        return -1;
    descr->unbound = PyCFunction_New(def, NULL);
    int rc = descr->unbound == NULL ? -1 : PyDict_SetItemString(type->tp_dict, def->ml_name, (PyObject *)descr);
    Py_DECREF(descr);
    return rc;
}

static PyMethodDef region_methods[] = {
    {"__aenter__", (PyCFunction)region_aenter, METH_NOARGS, NULL},
    {"__aexit__", (PyCFunction)(void (*)(void))region_aexit, METH_FASTCALL, NULL},
    {NULL}
};

#define REGION_MEMBER(f) {#f, T_OBJECT_EX, offsetof(RegionObject, f), 0, NULL},
static PyMemberDef region_members[] = {
    REGION_FIELDS(REGION_MEMBER)
    {NULL}
};
#undef REGION_MEMBER

/* `seq`, `t0` and `t1` from Python: the C integer as an int, AttributeError while unset (as the
 * object fields were); set from an int that fits 64 bits, unset by `del`. */
static int64_t *
region_number(RegionObject *self, void *closure, uint8_t *flag)
{
    *flag = (uint8_t)(uintptr_t)closure;
    return *flag == HAS_SEQ ? &self->seq : *flag == HAS_T0 ? &self->t0 : &self->t1;
}

static PyObject *
region_get_number(RegionObject *self, void *closure)
{
    uint8_t flag;
    int64_t *field = region_number(self, closure, &flag);
    if (!(self->has & flag)) {
        PyErr_Format(PyExc_AttributeError, "%s", flag == HAS_SEQ ? "seq" : flag == HAS_T0 ? "t0" : "t1");
        return NULL;
    }
    return PyLong_FromLongLong(*field);
}

static int
region_set_number(RegionObject *self, PyObject *value, void *closure)
{
    uint8_t flag;
    int64_t *field = region_number(self, closure, &flag);
    if (value == NULL) {
        self->has &= (uint8_t)~flag;
        return 0;
    }
    int64_t v;
    if (!int64_of(value, &v)) {
        PyErr_Format(PyExc_TypeError, "a region's %s is an int of 64 bits, not %.100R",
                     flag == HAS_SEQ ? "seq" : flag == HAS_T0 ? "t0" : "t1", value);
        return -1;
    }
    *field = v;
    self->has |= flag;
    return 0;
}

static PyGetSetDef region_getset[] = {
    {"seq", (getter)region_get_number, (setter)region_set_number, "Its span number.", (void *)HAS_SEQ},
    {"t0", (getter)region_get_number, (setter)region_set_number, "Its host start (perf ns).", (void *)HAS_T0},
    {"t1", (getter)region_get_number, (setter)region_set_number, "Its host end (perf ns).", (void *)HAS_T1},
    {NULL}
};

static PyTypeObject RegionType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "otel_train.record._hotpath.Region",
    .tp_doc = "One timed region (otel_train.span): a context manager or a decorator.",
    .tp_basicsize = sizeof(RegionObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(RegionObject, vectorcall),
    .tp_new = region_new,
    .tp_init = (initproc)region_init,
    .tp_vectorcall = region_vectorcall,  /* calling the type (a new region), not its instances */
    .tp_traverse = (traverseproc)region_traverse,
    .tp_clear = (inquiry)region_clear,
    .tp_dealloc = (destructor)region_dealloc,
    .tp_call = PyVectorcall_Call,
    .tp_methods = region_methods,
    .tp_members = region_members,
    .tp_getset = region_getset,
};

