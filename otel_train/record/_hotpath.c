/* The hot path in C: the region and step types and the recorder fields they read.
 *
 * Same behaviour as the pure-Python `_recorder._PyRegion` / `_PyStep` (the fallback when this
 * module cannot be built), with no Python frame between `otel_train.span(...)` and the tuple
 * in the buffer. Why: between framework ops a region runs with cold caches, and there the Python
 * version's bytecode costs 10-14 us a region against 0.86 us back to back (README, "Where
 * the small step's overhead goes"). The record is the same tuple, so nothing downstream knows
 * which one made it.
 *
 * `_recorder` binds the module-level objects this reads (`bind`, `bind_steps`) and the
 * recorder in force (`install`); everything else (tags, events, links, the worker) stays in
 * Python.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "../wire/slots.h"

/* --- bound by `_recorder` ---------------------------------------------------------------- */
static PyObject *g_current;    /* ContextVar: the innermost open region */
static PyObject *g_no_step;    /* (None, None) */
static PyObject *g_kind_span;  /* KIND_SPAN */
static PyObject *g_auto_init;  /* () -> Recorder | None */
static PyObject *g_decorate;   /* (region, fn) -> wrapper */
static PyObject *g_aenter;     /* async (region) -> region */
static PyObject *g_aexit;      /* async (region, exc_type, exc, tb) -> None */
static PyObject *g_rec;        /* the RecorderBase in force, or NULL */
static PyObject *g_kind_step;  /* KIND_STEP */
static PyObject *g_reopened;   /* (new step, recorder): says so and closes the step still open */
static PyObject *g_running_loop;  /* asyncio.events._get_running_loop, once asyncio is imported */
static PyObject *g_loop_key;      /* its thread-state dict key, when that is the C `_asyncio` one */

#if defined(_MSC_VER)
#define THREAD_LOCAL __declspec(thread)
#else
#define THREAD_LOCAL _Thread_local
#endif
/* The innermost open region this thread entered outside an event loop (a strong reference).
 * Why not always the ContextVar: its set (a new HAMT and a token, both tracked by the garbage
 * collector) was 1,660 of the ~2,600 instructions of a region's enter and exit. A C thread
 * local is a pointer swap. Regions in an asyncio loop, or nested in a region that used the
 * ContextVar, still use it: tasks interleave there, and each sees its own context. */
static THREAD_LOCAL PyObject *tl_current;

/* The next number that names a span id (`_distributed.region_span_id`), for regions and steps
 * alike; `seq`, the module's iterator, hands them to the Python side (`_recorder._seq_counter`).
 * A region keeps it as a C integer, not a new int object: see "Region" below. */
static int64_t g_next_seq = 1;

static PyObject *g_perf_counter_ns;  /* time.perf_counter_ns: read directly when it is the clock */
static PyObject *s_ref, *s_append, *s_device_time, *s_asyncio_events;

/* --- RecorderBase -------------------------------------------------------------------------- */
#define STRING_CACHE 64  /* a power of two */
typedef struct {
    PyObject_HEAD
    PyObject *buf;      /* deque(maxlen=cap) */
    PyObject *append;   /* buf.append, looked up once */
    PyObject *popleft;  /* buf.popleft */
    PyObject *now;      /* () -> int perf ns */
    PyObject *step;     /* Step | After | None */
    PyObject *next_step;      /* the number the next step takes by default */
    PyObject *pending_links;  /* links for the next step (a list) */
    PyObject *step_end;       /* called with a step right after its end is read (device timing), or None */
    Py_ssize_t cap;
    Py_ssize_t dropped;
    int fast_clock;     /* `now` is time.perf_counter_ns: read CLOCK_MONOTONIC here (the same clock) */
    /* Packing (`packing = True`, see "the packed ring" below): the records in order, as slots;
     * `buf` then holds only the records that are not slots, each marked by a SLOT_SIDE slot. */
    struct Slot *ring;        /* `cap` slots, or NULL while packing is off */
    Py_ssize_t head, count;   /* the oldest slot, the slots in use */
    PyObject *string_ids;     /* str -> its index in `strings` */
    PyObject *strings;        /* the names, keys and values slots refer to, by index */
    /* The last strings looked up, by address (strong references, so an address names one
     * object while it is here), and their indices: a region's name and key are usually the
     * same objects every time, and a hit reads one line here, where the dict lookup read its
     * table and the index's int. */
    PyObject *id_cache[STRING_CACHE];
    uint32_t id_cached[STRING_CACHE];
} RecorderObject;

static PyTypeObject RecorderType;

static PyObject *
rec_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    RecorderObject *self = (RecorderObject *)type->tp_alloc(type, 0);
    if (self != NULL) {
        self->step = Py_NewRef(Py_None);
        self->next_step = PyLong_FromLong(0);
        self->pending_links = PyList_New(0);
        self->step_end = Py_NewRef(Py_None);
        self->now = Py_NewRef(g_perf_counter_ns);
        self->fast_clock = 1;
        if (self->next_step == NULL || self->pending_links == NULL)
            Py_CLEAR(self);
    }
    return (PyObject *)self;
}

/* The object fields, for the collector (`cap`, `dropped` and `fast_clock` are plain C). */
#define RECORDER_OBJECTS(X) X(buf) X(append) X(popleft) X(now) X(step) X(next_step) X(pending_links) X(step_end) \
    X(string_ids) X(strings)
#define VISIT_FIELD(f) Py_VISIT(self->f);
#define CLEAR_FIELD(f) Py_CLEAR(self->f);

/* A collected type's tp_traverse, tp_clear and tp_dealloc (`PREFIX_traverse`, `_clear`,
 * `_dealloc`) from its field list, `CLEAR_MORE` run in clear after the fields. The dealloc clears its own type's fields (a Python subclass's
 * are cleared by the subclass's dealloc first) inside the trashcan, which bounds the C stack
 * when a long chain of regions (each holding its parent) is freed at once. */
#define GC_FIELD_FUNCTIONS(PREFIX, TYPE, FIELDS, CLEAR_MORE) \
    static int PREFIX##_traverse(TYPE *self, visitproc visit, void *arg) \
    { \
        FIELDS(VISIT_FIELD) \
        return 0; \
    } \
    static int PREFIX##_clear(TYPE *self) \
    { \
        FIELDS(CLEAR_FIELD) \
        CLEAR_MORE; \
        return 0; \
    } \
    static void PREFIX##_dealloc(TYPE *self) \
    { \
        PyObject_GC_UnTrack(self); \
        Py_TRASHCAN_BEGIN(self, PREFIX##_dealloc) \
        PREFIX##_clear(self); \
        Py_TYPE(self)->tp_free((PyObject *)self); \
        Py_TRASHCAN_END \
    }

/* The ring is plain memory: freed with the fields (a recorder the collector cleared has none). */
static void
ring_free(RecorderObject *self)
{
    PyMem_Free(self->ring);
    self->ring = NULL;
    self->head = self->count = 0;
}

/* The string ids go with the table they index (cleared with it). */
static void
id_cache_clear(RecorderObject *self)
{
    for (int i = 0; i < STRING_CACHE; i++)
        Py_CLEAR(self->id_cache[i]);
}

GC_FIELD_FUNCTIONS(rec, RecorderObject, RECORDER_OBJECTS, (ring_free(self), id_cache_clear(self)))

static PyObject *
rec_get_buf(RecorderObject *self, void *closure)
{
    if (self->buf == NULL) {
        PyErr_SetString(PyExc_AttributeError, "buf");
        return NULL;
    }
    return Py_NewRef(self->buf);
}

static int
rec_set_buf(RecorderObject *self, PyObject *value, void *closure)
{
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "buf cannot be deleted");
        return -1;
    }
    PyObject *append = PyObject_GetAttr(value, s_append);
    if (append == NULL)
        return -1;
    PyObject *popleft = PyObject_GetAttrString(value, "popleft");
    if (popleft == NULL) {
        Py_DECREF(append);
        return -1;
    }
    Py_XSETREF(self->append, append);
    Py_XSETREF(self->popleft, popleft);
    Py_XSETREF(self->buf, Py_NewRef(value));
    return 0;
}

static PyObject *
rec_get_now(RecorderObject *self, void *closure)
{
    return Py_NewRef(self->now);
}

static int
rec_set_now(RecorderObject *self, PyObject *value, void *closure)
{
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "now cannot be deleted");
        return -1;
    }
    Py_XSETREF(self->now, Py_NewRef(value));
#ifdef __linux__
    self->fast_clock = value == g_perf_counter_ns;
#else
    self->fast_clock = 0;
#endif
    return 0;
}

static PyObject *rec_get_packing(RecorderObject *self, void *closure);
static int rec_set_packing(RecorderObject *self, PyObject *value, void *closure);
static PyObject *rec_get_strings(RecorderObject *self, void *closure);

static PyGetSetDef rec_getset[] = {
    {"buf", (getter)rec_get_buf, (setter)rec_set_buf,
     "The bounded record buffer (a deque); packing, only the records that are not slots.", NULL},
    {"packing", (getter)rec_get_packing, (setter)rec_set_packing,
     "Plain regions go to the ring as slots (set while the buffer is empty).", NULL},
    {"strings", (getter)rec_get_strings, NULL, "The strings slots refer to, by index (a list).", NULL},
    {"now", (getter)rec_get_now, (setter)rec_set_now, "The perf-ns clock regions read.", NULL},
    {NULL}
};

static PyMemberDef rec_members[] = {
    {"step", T_OBJECT, offsetof(RecorderObject, step), 0, "The open step, the step just ended, or None."},
    {"next_step", T_OBJECT_EX, offsetof(RecorderObject, next_step), 0, "The next step's default number."},
    {"pending_links", T_OBJECT_EX, offsetof(RecorderObject, pending_links), 0, "Links for the next step."},
    {"step_end", T_OBJECT, offsetof(RecorderObject, step_end), 0, "Called with a step when its end is read."},
    {"cap", T_PYSSIZET, offsetof(RecorderObject, cap), 0, "The buffer's capacity."},
    {"dropped", T_PYSSIZET, offsetof(RecorderObject, dropped), 0, "Records a full buffer dropped."},
    {NULL}
};

static PyTypeObject RecorderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "otel_train.record._hotpath.RecorderBase",
    .tp_doc = "The recorder fields the C region reads: buf, cap, dropped, step, now.",
    .tp_basicsize = sizeof(RecorderObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = rec_new,
    .tp_traverse = (traverseproc)rec_traverse,
    .tp_clear = (inquiry)rec_clear,
    .tp_dealloc = (destructor)rec_dealloc,
    .tp_getset = rec_getset,
    .tp_members = rec_members,
};

#ifdef __linux__
/* time.perf_counter_ns() without the call: CLOCK_MONOTONIC, which is what it reads on Linux. */
static int64_t
monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}
#endif

static PyObject *
rec_now(RecorderObject *r)
{
#ifdef __linux__
    if (r->fast_clock)
        return PyLong_FromLongLong(monotonic_ns());
#endif
    return PyObject_CallNoArgs(r->now);
}

/* `rec_now` as a C integer: 0, or -1 with an exception (a clock that gave something else). */
static int
rec_now_ns(RecorderObject *r, int64_t *out)
{
#ifdef __linux__
    if (r->fast_clock) {
        *out = monotonic_ns();
        return 0;
    }
#endif
    PyObject *t = PyObject_CallNoArgs(r->now);
    if (t == NULL)
        return -1;
    long long v = PyLong_Check(t) ? PyLong_AsLongLong(t) : -1;
    if (!PyLong_Check(t))
        PyErr_Format(PyExc_TypeError, "otel_train: the recorder's clock gave %.100s, not an int of ns",
                     Py_TYPE(t)->tp_name);
    Py_DECREF(t);
    if (v == -1 && PyErr_Occurred())
        return -1;
    *out = (int64_t)v;
    return 0;
}

/* --- Region -------------------------------------------------------------------------------- */
/* A region's object fields: its struct, its members (all read and written from Python by these
 * names, unset ones raising AttributeError like empty slots) and its collector hooks. */
#define REGION_FIELDS(X) X(name) X(attrs) X(rec) X(parent) X(token) X(step) X(exc) X(events) X(dev) X(timed)
#define DECLARE_FIELD(f) PyObject *f;

typedef struct {
    PyObject_HEAD
    REGION_FIELDS(DECLARE_FIELD)
    /* Its span number and its host start and end (perf ns) as C integers, `has` saying which are
     * set (HAS_SEQ...), read from Python as `seq`, `t0` and `t1` (unset: AttributeError). Kept as
     * int objects they were three allocations and frees a region, and memory a cold one touched. */
    int64_t seq, t0, t1;
    uint8_t has;
    unsigned long tid;  /* the thread that entered it, when it went on `tl_current` (no token) */
    vectorcallfunc vectorcall;  /* calling the region: enter (no arguments), exit (3), decorate (1) */
} RegionObject;

#define HAS_SEQ 1
#define HAS_T0 2
#define HAS_T1 4

static PyObject *region_called(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames);

static PyTypeObject RegionType;
static PyTypeObject StepType, AfterType;
static PyObject *step_ref_of(PyObject *step);

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
    RegionObject *self = PyObject_GC_New(RegionObject, &RegionType);
    if (self == NULL)
        return NULL;
    self->attrs = self->rec = self->parent = self->token = self->step = NULL;
    self->exc = self->timed = NULL;
    self->has = 0;
    self->tid = 0;
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

/* The recorder a region or step entered now records to (borrowed): the one installed, else
 * what initialising from the environment gives (`_recorder.auto_init`), else None. */
static int
recorder_in_force(PyObject **out)
{
    if (g_rec == NULL) {
        PyObject *got = PyObject_CallNoArgs(g_auto_init);
        if (got == NULL)
            return -1;
        int disabled = got == Py_None;
        Py_DECREF(got);
        if (disabled) {
            *out = Py_None;
            return 0;
        }
    }
    *out = g_rec != NULL ? g_rec : Py_None;
    return 0;
}

/* --- the packed ring ---------------------------------------------------------------------- */
/* With the exporter process taking the records (`_runtime` sets `packing`), the usual region's
 * record is not a tuple in `buf` but a fixed-size `Slot` in `ring`: its name, key and string value
 * as indices into `strings`, its numbers as 64-bit integers. The worker then moves a drain as one
 * bytes object (`drain_packed`) instead of popping, pickling and freeing a tuple, a dict and its
 * integers a record; the exporter process turns the slots back into the same tuples (`unpack`).
 * Measured on the benchmark's small step (9 records a step), the worker cost 583 ns a record
 * that way, of which marshal 232, popping 50, freeing 67.
 *
 * A record that is not a plain region (a step, a tag, an event, a region with an exception,
 * events, device time, several attributes or a value of another type) stays an object in
 * `buf`, with a SLOT_SIDE slot where it falls in the order. `strings` is bounded
 * (MAX_STRINGS): past it, records with new strings go that way too. */

/* An exact int's value; 0 if `o` is anything else or does not fit. */
static int
int64_of(PyObject *o, int64_t *out)
{
    if (!PyLong_CheckExact(o))
        return 0;
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    *out = (int64_t)v;
    return 1;
}

/* `s`'s index in `strings`, added if new: 1, or 0 if `s` is not an exact str or the table is full. */
static int
string_id(RecorderObject *rec, PyObject *s, uint32_t *out)
{
    if (!PyUnicode_CheckExact(s))
        return 0;
    uintptr_t at = (uintptr_t)s;
    size_t slot = (at >> 4 ^ at >> 10) & (STRING_CACHE - 1);
    if (rec->id_cache[slot] == s) {
        *out = rec->id_cached[slot];
        return 1;
    }
    PyObject *found = PyDict_GetItemWithError(rec->string_ids, s);
    Py_ssize_t n;
    if (found != NULL)
        n = PyLong_AsSsize_t(found);
    else {
        if (PyErr_Occurred())
            return -1;
        n = PyList_GET_SIZE(rec->strings);
        if (n >= MAX_STRINGS)
            return 0;
        PyObject *id = PyLong_FromSsize_t(n);
        if (id == NULL)
            return -1;
        int err = PyDict_SetItem(rec->string_ids, s, id) < 0 || PyList_Append(rec->strings, s) < 0;
        Py_DECREF(id);
        if (err)
            return -1;
    }
    Py_XSETREF(rec->id_cache[slot], Py_NewRef(s));
    rec->id_cached[slot] = (uint32_t)n;
    *out = (uint32_t)n;
    return 1;
}

/* Put `slot` last in the ring; a full ring drops its oldest record (and a side record's object). */
static int
ring_push(RecorderObject *rec, const Slot *slot)
{
    if (rec->count == rec->cap) {
        rec->dropped++;
        int side = rec->ring[rec->head].tag == SLOT_SIDE;
        rec->head = (rec->head + 1) % rec->cap;
        rec->count--;
        if (side) {
            PyObject *gone = PyObject_CallNoArgs(rec->popleft);
            if (gone == NULL)
                return -1;
            Py_DECREF(gone);
        }
    }
    rec->ring[(rec->head + rec->count) % rec->cap] = *slot;
    rec->count++;
    return 0;
}

/* A region's record fields as a slot: 1 pushed, 0 not a plain region (left to the caller). */
static int
pack_region(RecorderObject *rec, PyObject *name, int64_t seq, const int64_t *parent_seq, PyObject *step_ref,
            int64_t t0, int64_t t1, PyObject *attrs, PyObject *exc, PyObject *events)
{
    Slot slot;
    memset(&slot, 0, sizeof slot);
    slot.tag = SLOT_REGION;
    if (exc != Py_None || events != Py_None || !PyTuple_CheckExact(step_ref) || PyTuple_GET_SIZE(step_ref) != 2)
        return 0;
    slot.seq = seq;
    slot.t0 = t0;
    slot.t1 = t1;
    if (parent_seq != NULL) {
        slot.parent = *parent_seq;
        slot.flags |= F_PARENT;
    }
    PyObject *step_n = PyTuple_GET_ITEM(step_ref, 0), *step_seq = PyTuple_GET_ITEM(step_ref, 1);
    if (step_n != Py_None) {
        if (!int64_of(step_n, &slot.step_n))
            return 0;
        slot.flags |= F_STEP_N;
    }
    if (step_seq != Py_None) {
        if (!int64_of(step_seq, &slot.step_seq))
            return 0;
        slot.flags |= F_STEP_SEQ;
    }
    if (attrs != Py_None) {
        Py_ssize_t pos = 0;
        PyObject *key, *value;
        if (!PyDict_CheckExact(attrs) || PyDict_GET_SIZE(attrs) != 1 || !PyDict_Next(attrs, &pos, &key, &value))
            return 0;
        if (value == Py_True)
            slot.attr = A_TRUE;
        else if (value == Py_False)
            slot.attr = A_FALSE;
        else if (PyFloat_CheckExact(value)) {
            slot.attr = A_FLOAT;
            slot.value.f = PyFloat_AS_DOUBLE(value);
        }
        else if (int64_of(value, &slot.value.i))
            slot.attr = A_INT;
        else {
            uint32_t id;
            int got = string_id(rec, value, &id);
            if (got <= 0)
                return got;
            slot.attr = A_STR;
            slot.value.i = id;
        }
        int got = string_id(rec, key, &slot.key);
        if (got <= 0)
            return got;
    }
    int got = string_id(rec, name, &slot.name);
    if (got <= 0)
        return got;
    return ring_push(rec, &slot) < 0 ? -1 : 1;
}

/* `buf.append(record)`, the reference stolen. */
static int
deque_append(RecorderObject *rec, PyObject *record)
{
    PyObject *res = PyObject_CallOneArg(rec->append, record);
    Py_DECREF(record);
    if (res == NULL)
        return -1;
    Py_DECREF(res);
    return 0;
}

/* A hot-path tuple as `pack_region` takes it: 1 pushed, 0 not a plain region. */
static int
pack_record(RecorderObject *rec, PyObject *record)
{
    if (!PyTuple_CheckExact(record) || PyTuple_GET_SIZE(record) != 10 || PyTuple_GET_ITEM(record, 0) != g_kind_span)
        return 0;
    PyObject **f = &PyTuple_GET_ITEM(record, 0);
    int64_t seq, parent, t0, t1;
    if (!int64_of(f[2], &seq) || !int64_of(f[5], &t0) || !int64_of(f[6], &t1))
        return 0;
    if (f[3] != Py_None && !int64_of(f[3], &parent))
        return 0;
    return pack_region(rec, f[1], seq, f[3] != Py_None ? &parent : NULL, f[4], t0, t1, f[7], f[8], f[9]);
}



/* Append `record` (a reference stolen) to the recorder's buffer as the object it is; a full
 * one drops its oldest, counted in `dropped`. Packing, it goes in `buf` as a side record. */
static int
append_object(RecorderObject *rec, PyObject *record)
{
    if (rec->buf == NULL || rec->append == NULL) {
        Py_DECREF(record);
        PyErr_SetString(PyExc_RuntimeError, "otel_train: the recorder has no buffer");
        return -1;
    }
    if (rec->ring != NULL) {
        Slot slot;
        memset(&slot, 0, sizeof slot);
        slot.tag = SLOT_SIDE;
        if (ring_push(rec, &slot) < 0) {
            Py_DECREF(record);
            return -1;
        }
        return deque_append(rec, record);
    }
    Py_ssize_t size = PyObject_Length(rec->buf);
    if (size < 0) {
        Py_DECREF(record);
        return -1;
    }
    if (size == rec->cap)
        rec->dropped++;
    return deque_append(rec, record);
}

/* `append_object`, except that packing, a plain region's tuple becomes a slot. */
static int
append_record(RecorderObject *rec, PyObject *record)
{
    int packed = rec->ring != NULL ? pack_record(rec, record) : 0;
    if (packed == 0)
        return append_object(rec, record);
    Py_DECREF(record);
    return packed < 0 ? -1 : 0;
}


/* --- RecorderBase's methods: the buffer as the worker and the Python fallback see it ------- */
static PyObject *
rec_get_packing(RecorderObject *self, void *closure)
{
    return PyBool_FromLong(self->ring != NULL);
}

static int
rec_set_packing(RecorderObject *self, PyObject *value, void *closure)
{
    int on = value == NULL ? 0 : PyObject_IsTrue(value);
    if (on < 0)
        return -1;
    if (on == (self->ring != NULL))
        return 0;
    Py_ssize_t in_buf = self->buf != NULL ? PyObject_Length(self->buf) : 0;
    if (in_buf < 0)
        return -1;
    if (self->count || in_buf) {
        PyErr_SetString(PyExc_ValueError, "packing can be switched only while the buffer is empty");
        return -1;
    }
    if (!on) {
        ring_free(self);
        return 0;
    }
    if (self->cap <= 0 || self->buf == NULL) {
        PyErr_SetString(PyExc_ValueError, "packing needs the buffer and its capacity first");
        return -1;
    }
    if (self->strings == NULL) {
        self->strings = PyList_New(0);
        self->string_ids = PyDict_New();
        if (self->strings == NULL || self->string_ids == NULL)
            return -1;
    }
    self->ring = PyMem_Calloc((size_t)self->cap, sizeof(Slot));
    if (self->ring == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->head = self->count = 0;
    return 0;
}

static PyObject *
rec_get_strings(RecorderObject *self, void *closure)
{
    return self->strings != NULL ? Py_NewRef(self->strings) : PyList_New(0);
}

static PyObject *
rec_append(RecorderObject *self, PyObject *record)
{
    if (append_record(self, Py_NewRef(record)) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
rec_pending(RecorderObject *self, PyObject *Py_UNUSED(ignored))
{
    if (self->ring != NULL)
        return PyLong_FromSsize_t(self->count);
    if (self->buf == NULL)
        return PyLong_FromLong(0);
    Py_ssize_t n = PyObject_Length(self->buf);
    return n < 0 ? NULL : PyLong_FromSsize_t(n);
}

/* The next object of `buf` (the oldest side record), appended to `out`. */
static int
pop_side(RecorderObject *self, PyObject *out)
{
    PyObject *record = PyObject_CallNoArgs(self->popleft);
    if (record == NULL)
        return -1;
    int err = PyList_Append(out, record);
    Py_DECREF(record);
    return err;
}

/* A drain's `limit` (negative is 0); -1 with an exception set. */
static Py_ssize_t
limit_arg(RecorderObject *self, PyObject *arg)
{
    Py_ssize_t limit = PyLong_AsSsize_t(arg);
    if (limit == -1 && PyErr_Occurred())
        return -1;
    if (self->buf == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "otel_train: the recorder has no buffer");
        return -1;
    }
    return limit < 0 ? 0 : limit;
}

/* Pop up to `limit` records, oldest first, as records (slots unpacked); called by the worker only. */
static PyObject *
rec_drain(RecorderObject *self, PyObject *arg)
{
    Py_ssize_t limit = limit_arg(self, arg);
    if (limit < 0)
        return NULL;
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    if (self->ring == NULL) {
        Py_ssize_t n = PyObject_Length(self->buf);
        if (n < 0)
            goto fail;
        for (Py_ssize_t i = 0; i < n && i < limit; i++)
            if (pop_side(self, out) < 0)
                goto fail;
        return out;
    }
    LastStep last = {NULL, 0, 0, 0};
    for (Py_ssize_t i = 0; i < limit && self->count; i++) {
        Slot slot = self->ring[self->head];
        self->head = (self->head + 1) % self->cap;
        self->count--;
        if (slot.tag == SLOT_SIDE) {
            if (pop_side(self, out) < 0)
                goto fail_ref;
            continue;
        }
        PyObject *record = unpack_slot(&slot, self->strings, &last, g_kind_span);
        if (record == NULL || PyList_Append(out, record) < 0) {
            Py_XDECREF(record);
            goto fail_ref;
        }
        Py_DECREF(record);
    }
    Py_XDECREF(last.ref);
    return out;
fail_ref:
    Py_XDECREF(last.ref);
fail:
    Py_DECREF(out);
    return NULL;
}

/* Pop up to `limit` records as they lie (packing only): (count, the slots as bytes, the side
 * records in order). `unpack` turns them back into records. */
static PyObject *
rec_drain_packed(RecorderObject *self, PyObject *arg)
{
    Py_ssize_t limit = limit_arg(self, arg);
    if (limit < 0)
        return NULL;
    if (self->ring == NULL) {
        PyErr_SetString(PyExc_ValueError, "drain_packed() needs packing on");
        return NULL;
    }
    Py_ssize_t n = limit < self->count ? limit : self->count;
    PyObject *slots = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(Slot));
    PyObject *side = PyList_New(0);
    if (slots == NULL || side == NULL)
        goto fail;
    Slot *to = (Slot *)PyBytes_AS_STRING(slots);
    Py_ssize_t first = self->cap - self->head < n ? self->cap - self->head : n;
    memcpy(to, self->ring + self->head, (size_t)first * sizeof(Slot));
    memcpy(to + first, self->ring, (size_t)(n - first) * sizeof(Slot));
    self->head = (self->head + n) % self->cap;
    self->count -= n;
    for (Py_ssize_t i = 0; i < n; i++)
        if (to[i].tag == SLOT_SIDE && pop_side(self, side) < 0)
            goto fail;
    return Py_BuildValue("(nNN)", n, slots, side);
fail:
    Py_XDECREF(slots);
    Py_XDECREF(side);
    return NULL;
}

static PyMethodDef rec_methods[] = {
    {"append", (PyCFunction)rec_append, METH_O,
     "Append a record; a full buffer drops its oldest (counted in `dropped`)."},
    {"pending", (PyCFunction)rec_pending, METH_NOARGS, "How many records the buffer holds."},
    {"drain", (PyCFunction)rec_drain, METH_O, "drain(limit): pop up to `limit` records, oldest first."},
    {"drain_packed", (PyCFunction)rec_drain_packed, METH_O,
     "drain_packed(limit) -> (count, slots, side): pop up to `limit` records as they lie (packing only)."},
    {NULL}
};

/* `unpack(slots, side, wire, strings)`: what `drain_packed` gave, back as `_worker.Segments`:
 * runs of (is_wire, records), a side record being wire where `wire` (flags by side index, or
 * None) says so, slots unpacked with `strings`. */
static PyObject *
mod_unpack(PyObject *module, PyObject *args)
{
    PyObject *slots_obj, *side, *wire, *strings;
    if (!PyArg_ParseTuple(args, "OO!OO!:unpack", &slots_obj, &PyList_Type, &side, &wire, &PyList_Type, &strings))
        return NULL;
    if (wire != Py_None && (!PyList_Check(wire) || PyList_GET_SIZE(wire) != PyList_GET_SIZE(side))) {
        PyErr_SetString(PyExc_ValueError, "unpack: `wire` must be None or a list as long as `side`");
        return NULL;
    }
    Py_buffer view;
    Py_ssize_t n, next_side = 0;
    if (slots_open(slots_obj, &view, &n, "unpack") < 0)
        return NULL;
    PyObject *segments = PyList_New(0), *run = NULL;
    int run_wire = -1;
    LastStep last = {NULL, 0, 0, 0};
    if (segments == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        Slot slot;
        slot_at(&view, i, &slot);
        PyObject *record;
        int is_wire = 0;
        if (slot.tag == SLOT_SIDE) {
            Py_ssize_t at = next_side;
            PyObject *found = side_record(side, &next_side, "unpack");
            if (found == NULL)
                goto fail;
            if (wire != Py_None && (is_wire = PyObject_IsTrue(PyList_GET_ITEM(wire, at))) < 0)
                goto fail;
            record = Py_NewRef(found);
        }
        else if ((record = unpack_slot(&slot, strings, &last, g_kind_span)) == NULL)
            goto fail;
        if (is_wire != run_wire) {
            PyObject *fresh = PyList_New(0);
            PyObject *pair = fresh != NULL ? Py_BuildValue("(OO)", is_wire ? Py_True : Py_False, fresh) : NULL;
            if (pair == NULL || PyList_Append(segments, pair) < 0) {
                Py_XDECREF(fresh);
                Py_XDECREF(pair);
                Py_DECREF(record);
                goto fail;
            }
            Py_DECREF(pair);
            Py_XSETREF(run, fresh);
            run_wire = is_wire;
        }
        int err = PyList_Append(run, record);
        Py_DECREF(record);
        if (err < 0)
            goto fail;
    }
    if (sides_done(side, next_side, "unpack") < 0)
        goto fail;
    PyBuffer_Release(&view);
    Py_XDECREF(run);
    Py_XDECREF(last.ref);
    return segments;
fail:
    PyBuffer_Release(&view);
    Py_XDECREF(run);
    Py_XDECREF(last.ref);
    Py_XDECREF(segments);
    return NULL;
}

/* The innermost open region of this thread's `tl_current` chain (borrowed), or NULL. A region
 * left on another thread is skipped (it has its end time): its own thread's pointer went stale. */
static PyObject *
tl_open(void)
{
    PyObject *p = tl_current;
    while (p != NULL && PyObject_TypeCheck(p, &RegionType) && (((RegionObject *)p)->has & HAS_T1)) {
        p = ((RegionObject *)p)->parent;
        if (p == Py_None)
            p = NULL;
    }
    return p;
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
    if (recorder_in_force(&r) < 0)
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
    int use_var = from_var != NULL;
    if (!use_var && (use_var = loop_running()) < 0)
        return NULL;
    if (use_var) {
        PyObject *token = PyContextVar_Set(g_current, (PyObject *)self);
        if (token == NULL)
            return NULL;
        Py_XSETREF(self->token, token);
    }
    else {
        Py_CLEAR(self->token);
        self->tid = PyThread_get_thread_ident();
        PyObject *old = tl_current;
        tl_current = Py_NewRef(self);
        Py_XDECREF(old);
    }
    Py_XSETREF(self->step, Py_NewRef(rec->step));
    self->seq = g_next_seq++;
    self->has = (self->has & ~HAS_T1) | HAS_SEQ;
    if (rec_now_ns(rec, &self->t0) < 0)
        return NULL;
    self->has |= HAS_T0;
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
    RecorderObject *rec = (RecorderObject *)r;
    if (rec_now_ns(rec, &self->t1) < 0)
        return NULL;
    self->has |= HAS_T1;
    if (region_leave(self) < 0)
        return NULL;
    PyObject *record;
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

/* --- Step and After ------------------------------------------------------------------------ */
#define STEP_FIELDS(X) X(n) X(epoch) X(rec) X(seq) X(ref) X(t0) X(t1) X(tags) X(events) X(links) X(attrs) \
    X(micro_batches) X(exc) X(dev)

typedef struct {
    PyObject_HEAD
    STEP_FIELDS(DECLARE_FIELD)
    vectorcallfunc vectorcall;  /* calling the step: enter (no arguments), exit (3) */
} StepObject;

typedef struct {
    PyObject_HEAD
    PyObject *step, *ref;
} AfterObject;

static PyObject *s_zero, *s_one;

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

/* `_recorder.close_step`: end the open step at `t1` and append its record. */
static int
close_step(RecorderObject *rec, StepObject *step, PyObject *t1, PyObject *exc_type)
{
    /* The end must be in place before the record is appended: the worker may drain it at once. */
    Py_XSETREF(step->t1, Py_NewRef(t1));
    if (rec->step_end != NULL && rec->step_end != Py_None) {
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

static PyObject *
step_enter(StepObject *self)
{
    PyObject *r;
    if (recorder_in_force(&r) < 0)
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

/* --- the span numbers ----------------------------------------------------------------------- */
/* `_hotpath.seq`: an iterator over `g_next_seq`, so that Python's `next(_seq_counter)` and the C
 * regions and steps draw from one sequence, as they did from one `itertools.count`. */
static PyObject *
seq_next(PyObject *self)
{
    return PyLong_FromLongLong(g_next_seq++);
}

static PyTypeObject SeqType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "otel_train.record._hotpath.Seq",
    .tp_doc = "The numbers that name span ids, shared by the C and Python regions and steps.",
    .tp_basicsize = sizeof(PyObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = seq_next,
};

/* --- module ------------------------------------------------------------------------------ */
static PyObject *
mod_bind(PyObject *module, PyObject *args)
{
    PyObject *current, *no_step, *kind_span, *auto_init, *decorate, *aenter, *aexit;
    if (!PyArg_UnpackTuple(args, "bind", 7, 7, &current, &no_step, &kind_span, &auto_init, &decorate,
                           &aenter, &aexit))
        return NULL;
    Py_XSETREF(g_current, Py_NewRef(current));
    Py_XSETREF(g_no_step, Py_NewRef(no_step));
    Py_XSETREF(g_kind_span, Py_NewRef(kind_span));
    Py_XSETREF(g_auto_init, Py_NewRef(auto_init));
    Py_XSETREF(g_decorate, Py_NewRef(decorate));
    Py_XSETREF(g_aenter, Py_NewRef(aenter));
    Py_XSETREF(g_aexit, Py_NewRef(aexit));
    Py_RETURN_NONE;
}

static PyObject *
mod_install(PyObject *module, PyObject *rec)
{
    if (rec == Py_None) {
        Py_CLEAR(g_rec);
        Py_RETURN_NONE;
    }
    if (!PyObject_TypeCheck(rec, &RecorderType)) {
        PyErr_SetString(PyExc_TypeError, "install() takes a RecorderBase or None");
        return NULL;
    }
    Py_XSETREF(g_rec, Py_NewRef(rec));
    Py_RETURN_NONE;
}

static PyObject *
mod_current(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    PyObject *from_var;
    return current_region(&from_var);
}

static PyObject *
mod_leave(PyObject *module, PyObject *region)
{
    if (!PyObject_TypeCheck(region, &RegionType)) {
        PyErr_SetString(PyExc_TypeError, "leave() takes a Region");
        return NULL;
    }
    if (region_leave((RegionObject *)region) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
mod_bind_steps(PyObject *module, PyObject *args)
{
    PyObject *kind_step, *reopened;
    if (!PyArg_UnpackTuple(args, "bind_steps", 2, 2, &kind_step, &reopened))
        return NULL;
    Py_XSETREF(g_kind_step, Py_NewRef(kind_step));
    Py_XSETREF(g_reopened, Py_NewRef(reopened));
    Py_RETURN_NONE;
}

static PyMethodDef mod_methods[] = {
    {"bind_steps", mod_bind_steps, METH_VARARGS, "bind_steps(kind_step, reopened)"},
    {"step", (PyCFunction)(void (*)(void))mod_step, METH_FASTCALL | METH_KEYWORDS,
     "step(n=None, epoch=None, **attrs)\n--\n\nMark one training step: `with otel_train.step(n):` "
     "(n defaults to the previous step + 1)."},
    {"close_step", (PyCFunction)(void (*)(void))mod_close_step, METH_FASTCALL,
     "close_step(recorder, step, t1, exc_type): end the open step at t1 and append its record."},
    {"bind", mod_bind, METH_VARARGS,
     "bind(current, no_step, kind_span, auto_init, decorate, aenter, aexit)"},
    {"current", mod_current, METH_NOARGS, "The innermost open region here (either kind of region), or None."},
    {"leave", mod_leave, METH_O, "Take an entered C region off the current-region pointer without recording it."},
    {"install", mod_install, METH_O, "install(recorder or None): the recorder regions record to."},
    {"unpack", mod_unpack, METH_VARARGS,
     "unpack(slots, side, wire, strings): what RecorderBase.drain_packed gave, back as runs of records."},
    {NULL}
};

static struct PyModuleDef hotpath_module = {
    PyModuleDef_HEAD_INIT, "otel_train.record._hotpath", "The region type and recorder fields in C.", -1, mod_methods,
};

PyMODINIT_FUNC
PyInit__hotpath(void)
{
    PyObject *time = PyImport_ImportModule("time");
    if (time == NULL)
        return NULL;
    g_perf_counter_ns = PyObject_GetAttrString(time, "perf_counter_ns");
    Py_DECREF(time);
    if (g_perf_counter_ns == NULL)
        return NULL;
    s_ref = PyUnicode_InternFromString("ref");
    s_append = PyUnicode_InternFromString("append");
    s_device_time = PyUnicode_InternFromString("device_time");
    s_asyncio_events = PyUnicode_InternFromString("asyncio.events");
    if (s_ref == NULL || s_append == NULL || s_device_time == NULL || s_asyncio_events == NULL)
        return NULL;
    s_zero = PyLong_FromLong(0);
    s_one = PyLong_FromLong(1);
    if (s_zero == NULL || s_one == NULL)
        return NULL;
    RecorderType.tp_methods = rec_methods;
    if (PyType_Ready(&RecorderType) < 0 || PyType_Ready(&RegionType) < 0 || PyType_Ready(&SelfDescrType) < 0 ||
        PyType_Ready(&StepType) < 0 || PyType_Ready(&AfterType) < 0 || PyType_Ready(&SeqType) < 0)
        return NULL;
    if (add_self_descr(&RegionType, &unbound_defs[0]) < 0 || add_self_descr(&RegionType, &unbound_defs[1]) < 0 ||
        add_self_descr(&StepType, &step_unbound_defs[0]) < 0 || add_self_descr(&StepType, &step_unbound_defs[1]) < 0)
        return NULL;
    PyType_Modified(&RegionType);
    PyType_Modified(&StepType);
    PyObject *m = PyModule_Create(&hotpath_module);
    if (m == NULL)
        return NULL;
    PyObject *seq = PyType_GenericAlloc(&SeqType, 0);
    if (seq == NULL || PyModule_AddObject(m, "seq", seq) < 0) {
        Py_XDECREF(seq);
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddObjectRef(m, "RecorderBase", (PyObject *)&RecorderType) < 0 ||
        PyModule_AddObjectRef(m, "Region", (PyObject *)&RegionType) < 0 ||
        PyModule_AddObjectRef(m, "Step", (PyObject *)&StepType) < 0 ||
        PyModule_AddObjectRef(m, "After", (PyObject *)&AfterType) < 0 ||
        PyModule_AddIntConstant(m, "MAX_STRINGS", MAX_STRINGS) < 0 ||
        PyModule_AddIntConstant(m, "SLOT_SIZE", (long)sizeof(Slot)) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
