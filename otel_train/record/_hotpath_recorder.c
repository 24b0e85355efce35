/* Part of `_hotpath.c` (see `_hotpath.h`): the recorder's buffer, as the regions append to it
 * and the worker drains it.
 *
 * `RecorderBase` holds the fields the C region and step read without an attribute lookup
 * (`buf`, `cap`, `dropped`, `step`, `now`, ...); `recorder.Recorder` subclasses it in Python.
 * A full buffer drops its oldest record, counted in `dropped`. With packing on, the usual
 * region's record is a fixed-size slot in a ring instead of a tuple ("the packed ring" below).
 */
#include "_hotpath.h"

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
    if (self->pinned) { /* the pinned time's `__int__`, as Python code that reads the clock calls it */
        PyObject *t = PyLong_FromLongLong(self->pinned_ns);
        PyObject *fn = t == NULL ? NULL : PyObject_GetAttrString(t, "__int__");
        Py_XDECREF(t);
        return fn;
    }
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
    self->pinned = 0;
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
    if (r->pinned) /* (never with fast_clock) */
        return PyLong_FromLongLong(r->pinned_ns);
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
    if (r->pinned) { /* (never with fast_clock) */
        *out = r->pinned_ns;
        return 0;
    }
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


/* `detect.batch.settle` while detection's calls wait to run (`set_settle`), else NULL. */
static PyObject *g_settle;

/* Run detection's waiting calls first: before anything reads or changes the step or the
 * current region. 0, or -1 with an error (`settle` catches its own). */
static int
settle_pending(void)
{
    PyObject *fn = g_settle;
    if (fn == NULL)
        return 0;
    Py_INCREF(fn);
    PyObject *res = PyObject_CallNoArgs(fn);
    Py_DECREF(fn);
    if (res == NULL)
        return -1;
    Py_DECREF(res);
    return 0;
}

/* The recorder a region or step entered now records to (borrowed): the one installed, else
 * what initialising from the environment gives (`recorder.auto_init`), else None. */
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
    if (!PyTuple_CheckExact(record) || PyTuple_GET_SIZE(record) != REC_FIELDS
        || PyTuple_GET_ITEM(record, REC_KIND) != g_kind_span)
        return 0;
    PyObject **f = &PyTuple_GET_ITEM(record, 0);
    int64_t seq, parent, t0, t1;
    if (!int64_of(f[REC_SEQ], &seq) || !int64_of(f[REC_T0], &t0) || !int64_of(f[REC_T1], &t1))
        return 0;
    if (f[REC_PARENT] != Py_None && !int64_of(f[REC_PARENT], &parent))
        return 0;
    return pack_region(rec, f[REC_NAME], seq, f[REC_PARENT] != Py_None ? &parent : NULL, f[REC_STEP], t0, t1,
                       f[REC_ATTRS], f[REC_EXC], f[REC_EVENTS]);
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
