/* The exporter's fast path in C: usual regions straight to OTLP `ScopeSpans.spans` bytes.
 *
 * Same output as the Python loop `fast_path.FastPath.regions_python` (the fallback when this
 * module cannot be built; `tests/test_fast_path.py` holds the two to the same bytes, metric
 * durations and leftover records). Why: that loop is most of what the exporter process does
 * for a training loop, ~1.7 us of Python a region here, and the exporter shares the machine's
 * cores with training (docs/benchmarks/2026-11-22-exporter-cpu.md: 1.93 against 2.66 us of exporter
 * CPU a span). It runs in the exporter process, never on the training thread; on a GPU node that
 * process has a core of its own. Kept: not yet measured on a GPU.
 *
 * Everything that is not a plain region with a cached body goes back to Python: a cache miss
 * calls the fast path's `body` / `step`; a record it does not take (a step, a
 * note, an exception, an event, an unusual attribute) is appended to `rest`, in order.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#include "../wire/slots.h"

/* Field layout, as `otlp.REGION_HEAD` / `REGION_HEAD_PARENT` pack it: the trace id field
 * (tag, length, 16 bytes), span_id (tag 0x12, length 8, fixed64), optionally parent_span_id
 * (0x22, 8, fixed64), kind (0x30 0x01), start (0x39 fixed64), end (0x41 fixed64); then the
 * cached body (name and user attributes), the step attribute, and `otlp.TAIL_LOCAL`. */
#define TRACE_FIELD_LEN 18
#define ID_FIELD_LEN 10
#define TIMES_LEN 20 /* kind (2) + tag and fixed64 (9) twice */
static const unsigned char TAIL_LOCAL[] = {0x7a, 0x00, 0x85, 0x01, 0x00, 0x01, 0x00, 0x00};

static PyObject *g_kind_span;                /* KIND_SPAN, from `bind` */
static PyObject *g_between;                  /* `fast_path.BETWEEN_GENERAL`, from `bind` */
static unsigned long long g_id_multiplier;  /* `wire.ids.REGION_ID_MULTIPLIER`, from `bind` */

static unsigned char *put_u64le(unsigned char *p, unsigned long long v) {
    for (int i = 0; i < 8; i++) {
        p[i] = (unsigned char)(v >> (8 * i));
    }
    return p + 8;
}

static int varint_len(unsigned long long v) {
    int n = 1;
    while (v > 0x7F) {
        v >>= 7;
        n++;
    }
    return n;
}

static unsigned char *put_varint(unsigned char *p, unsigned long long v) {
    while (v > 0x7F) {
        *p++ = (unsigned char)((v & 0x7F) | 0x80);
        v >>= 7;
    }
    *p++ = (unsigned char)v;
    return p;
}

/* A region's span id in wire form (`wire.ids.region_wire_id`, whose multiplier `bind` gave). */
static unsigned long long wire_id(unsigned long long seq, unsigned long long salt) {
    unsigned long long id = (seq * g_id_multiplier) ^ salt;
    return id ? id : 1;
}

/* Whether a region with neither parent nor step seq named `name` goes the general way: a
 * `train.other` between steps, parented by rank 0's step there (`fast_path.BETWEEN_GENERAL`).
 * 1, 0, or -1 with an error. */
static int between_general(PyObject *name) {
    return g_between == NULL ? 0 : PySequence_Contains(g_between, name);
}

/* The cached body of a region with attributes `attrs` (None or a dict), looked up as the Python
 * loop does; a new reference, NULL with no error to hand the record back (`rest`), NULL with
 * an error to stop. */
static PyObject *region_body(PyObject *name, PyObject *attrs, PyObject *bodies, PyObject *make_body) {
    PyObject *body = NULL;
    if (attrs == Py_None || (PyDict_Check(attrs) && PyDict_GET_SIZE(attrs) == 0)) {
        body = PyDict_GetItemWithError(bodies, name);
        Py_XINCREF(body);
    } else if (!PyDict_Check(attrs)) {
        return NULL;
    } else if (PyDict_GET_SIZE(attrs) == 1) {
        Py_ssize_t pos = 0;
        PyObject *key, *value;
        PyDict_Next(attrs, &pos, &key, &value);
        PyObject *cache_key = PyTuple_Pack(4, name, key, (PyObject *)Py_TYPE(value), value);
        if (cache_key == NULL) {
            return NULL;
        }
        body = PyDict_GetItemWithError(bodies, cache_key);
        Py_DECREF(cache_key);
        if (body == NULL && PyErr_Occurred()) {
            if (!PyErr_ExceptionMatches(PyExc_TypeError)) {
                return NULL;
            }
            PyErr_Clear(); /* unhashable: a list value */
            return NULL;
        }
        Py_XINCREF(body);
    }
    if (body == NULL && !PyErr_Occurred()) {
        body = PyObject_CallFunctionObjArgs(make_body, name, attrs, NULL);
        if (body == Py_None) {
            Py_DECREF(body);
            return NULL; /* a sibling (checkpoint, eval, GC) or an unusual value */
        }
    }
    if (body != NULL && !PyBytes_Check(body)) {
        PyErr_SetString(PyExc_TypeError, "the body function must return bytes or None");
        Py_CLEAR(body);
    }
    return body;
}

static int int_field(PyObject *obj, long long *out) {
    if (!PyLong_CheckExact(obj)) {
        return 0;
    }
    int overflow;
    *out = PyLong_AsLongLongAndOverflow(obj, &overflow);
    return !overflow && !(*out == -1 && PyErr_Occurred());
}

static int append_duration(PyObject *durations, PyObject *name, long long ns) {
    PyObject *spans = PyDict_GetItemWithError(durations, name);
    if (spans == NULL) {
        if (PyErr_Occurred()) {
            return -1;
        }
        spans = PyList_New(0);
        if (spans == NULL || PyDict_SetItem(durations, name, spans) < 0) {
            Py_XDECREF(spans);
            return -1;
        }
        Py_DECREF(spans); /* the dict holds it */
    }
    PyObject *value = PyLong_FromLongLong(ns);
    if (value == NULL) {
        return -1;
    }
    int err = PyList_Append(spans, value);
    Py_DECREF(value);
    return err;
}

/* The whole `ScopeSpans.spans` field of one region. */
static PyObject *encode(const char *trace, Py_ssize_t trace_len, unsigned long long span, int has_parent,
                        unsigned long long parent, unsigned long long t0, unsigned long long t1,
                        PyObject *body, PyObject *step_kv) {
    Py_ssize_t body_len = PyBytes_GET_SIZE(body), kv_len = PyBytes_GET_SIZE(step_kv);
    Py_ssize_t length = TRACE_FIELD_LEN + ID_FIELD_LEN * (has_parent ? 2 : 1) + TIMES_LEN + body_len + kv_len
                        + (Py_ssize_t)sizeof(TAIL_LOCAL);
    PyObject *field = PyBytes_FromStringAndSize(NULL, 1 + varint_len((unsigned long long)length) + length);
    if (field == NULL) {
        return NULL;
    }
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(field);
    *p++ = 0x12;
    p = put_varint(p, (unsigned long long)length);
    /* struct's "18s": truncated or zero-padded to 18 bytes */
    Py_ssize_t n = trace_len < TRACE_FIELD_LEN ? trace_len : TRACE_FIELD_LEN;
    memcpy(p, trace, (size_t)n);
    memset(p + n, 0, (size_t)(TRACE_FIELD_LEN - n));
    p += TRACE_FIELD_LEN;
    *p++ = 0x12;
    *p++ = 0x08;
    p = put_u64le(p, span);
    if (has_parent) {
        *p++ = 0x22;
        *p++ = 0x08;
        p = put_u64le(p, parent);
    }
    *p++ = 0x30;
    *p++ = 0x01;
    *p++ = 0x39;
    p = put_u64le(p, t0);
    *p++ = 0x41;
    p = put_u64le(p, t1);
    memcpy(p, PyBytes_AS_STRING(body), (size_t)body_len);
    p += body_len;
    memcpy(p, PyBytes_AS_STRING(step_kv), (size_t)kv_len);
    p += kv_len;
    memcpy(p, TAIL_LOCAL, sizeof(TAIL_LOCAL));
    return field;
}

static int wall_time(long long perf, long long offset, unsigned long long *out) {
    long long wall;
    if (__builtin_add_overflow(perf, offset, &wall) || wall < 0) {
        PyErr_SetString(PyExc_OverflowError, "a region's wall-clock time is out of the fixed64 range");
        return -1;
    }
    *out = (unsigned long long)wall;
    return 0;
}

/* What one call works with: its arguments, and the step the last region belonged to. */
typedef struct {
    long long offset;
    unsigned long long salt;
    PyObject *bodies, *steps, *make_body, *make_step, *durations, *out, *rest;
    PyObject *step_n; /* the step number (an int or None) whose `step` this is: a strong reference, NULL before any */
    PyObject *step;   /* what the step function gave for it (a strong reference: the cache may be cleared) */
    int step_i64;     /* `step_n` is an int in the int64 range, `step_value` */
    int64_t step_value;
} Ctx;

static void ctx_clear(Ctx *c) {
    Py_CLEAR(c->step_n);
    Py_CLEAR(c->step);
}

/* Arguments 1-2 (offset, salt) and the dicts and lists from `first` on, checked: 0, or -1. */
static int ctx_init(Ctx *c, PyObject *const *args, PyObject *const *rest_args) {
    memset(c, 0, sizeof *c);
    if (!int_field(args[0], &c->offset)) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "offset must be an int in the int64 range");
        }
        return -1;
    }
    c->salt = PyLong_AsUnsignedLongLongMask(args[1]);
    if (c->salt == (unsigned long long)-1 && PyErr_Occurred()) {
        return -1;
    }
    c->bodies = rest_args[0];
    c->steps = rest_args[1];
    c->make_body = rest_args[2];
    c->make_step = rest_args[3];
    c->durations = rest_args[4];
    c->out = rest_args[5];
    c->rest = rest_args[6];
    if (!PyDict_Check(c->bodies) || !PyDict_Check(c->steps) || !PyDict_Check(c->durations) || !PyList_Check(c->out)
        || !PyList_Check(c->rest)) {
        PyErr_SetString(PyExc_TypeError, "bodies, steps and durations must be dicts; out and rest lists");
        return -1;
    }
    if (g_kind_span == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_encode.bind() was not called");
        return -1;
    }
    return 0;
}

/* Make step `step_n` (a new reference, stolen) the one in use: 0, or -1. */
static int use_step(Ctx *c, PyObject *step_n) {
    PyObject *found = PyDict_GetItemWithError(c->steps, step_n);
    if (found != NULL) {
        Py_INCREF(found);
    } else if (!PyErr_Occurred()) {
        found = PyObject_CallOneArg(c->make_step, step_n);
    }
    if (found == NULL || !PyTuple_CheckExact(found) || PyTuple_GET_SIZE(found) != 5
        || !PyBytes_Check(PyTuple_GET_ITEM(found, 0)) || !PyBytes_Check(PyTuple_GET_ITEM(found, 2))) {
        if (found != NULL) {
            PyErr_SetString(PyExc_TypeError, "the step function must return (bytes, int|None, bytes, bool, int|None)");
            Py_DECREF(found);
        }
        Py_DECREF(step_n);
        return -1;
    }
    long long v = 0;
    c->step_i64 = int_field(step_n, &v);
    PyErr_Clear();
    c->step_value = v;
    Py_XSETREF(c->step_n, step_n);
    Py_XSETREF(c->step, found);
    return 0;
}

/* One usual region into `out` (and its duration into `durations`); `body` is its cached body. */
static int emit(Ctx *c, PyObject *name, PyObject *body, long long seq_n, int has_parent, long long parent_n,
                int has_step_seq, long long t0, long long t1) {
    if (append_duration(c->durations, name, t1 - t0) < 0) {
        return -1;
    }
    int sampled = PyObject_IsTrue(PyTuple_GET_ITEM(c->step, 3));
    if (sampled <= 0) {
        return sampled;
    }
    unsigned long long wall0, wall1, parent = 0;
    if (wall_time(t0, c->offset, &wall0) < 0 || wall_time(t1, c->offset, &wall1) < 0) {
        return -1;
    }
    if (has_parent) {
        parent = wire_id((unsigned long long)parent_n, c->salt);
    } else if (has_step_seq && PyTuple_GET_ITEM(c->step, 1) != Py_None) {
        parent = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(c->step, 1));
        if (parent == (unsigned long long)-1 && PyErr_Occurred()) {
            return -1;
        }
    }
    PyObject *trace = PyTuple_GET_ITEM(c->step, 0);
    PyObject *field = encode(PyBytes_AS_STRING(trace), PyBytes_GET_SIZE(trace), wire_id((unsigned long long)seq_n, c->salt),
                             parent != 0, parent, wall0, wall1, body, PyTuple_GET_ITEM(c->step, 2));
    if (field == NULL) {
        return -1;
    }
    int err = PyList_Append(c->out, field);
    Py_DECREF(field);
    return err;
}

/* One hot-path record: a usual region is encoded, anything else appended to `rest`. 0, or -1. */
static int take_record(Ctx *c, PyObject *record) {
    int is_region = PyTuple_CheckExact(record) && PyTuple_GET_SIZE(record) == REC_FIELDS;
    if (is_region && PyTuple_GET_ITEM(record, REC_KIND) != g_kind_span) { /* KIND_SPAN: a small int, one object */
        is_region = PyObject_RichCompareBool(PyTuple_GET_ITEM(record, REC_KIND), g_kind_span, Py_EQ);
        if (is_region < 0) {
            return -1;
        }
    }
    if (!is_region || PyTuple_GET_ITEM(record, REC_EXC) != Py_None || PyTuple_GET_ITEM(record, REC_EVENTS) != Py_None) {
        return PyList_Append(c->rest, record); /* a step or a note, an exception, an event */
    }
    PyObject *name = PyTuple_GET_ITEM(record, REC_NAME), *pair = PyTuple_GET_ITEM(record, REC_STEP);
    PyObject *attrs = PyTuple_GET_ITEM(record, REC_ATTRS), *parent_seq = PyTuple_GET_ITEM(record, REC_PARENT);
    long long seq_n, t0, t1, parent_n = 0;
    if (!PyUnicode_CheckExact(name) || !PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2
        || !int_field(PyTuple_GET_ITEM(record, REC_SEQ), &seq_n) || !int_field(PyTuple_GET_ITEM(record, REC_T0), &t0)
        || !int_field(PyTuple_GET_ITEM(record, REC_T1), &t1)
        || (parent_seq != Py_None && !int_field(parent_seq, &parent_n))) {
        PyErr_Clear();
        return PyList_Append(c->rest, record); /* an unusual record: the general path decides */
    }
    if (parent_seq == Py_None && PyTuple_GET_ITEM(pair, 1) == Py_None) {
        int general = between_general(name);
        if (general != 0) {
            return general < 0 ? -1 : PyList_Append(c->rest, record);
        }
    }
    PyObject *body = region_body(name, attrs, c->bodies, c->make_body);
    if (body == NULL) {
        return PyErr_Occurred() ? -1 : PyList_Append(c->rest, record);
    }
    PyObject *step_n = PyTuple_GET_ITEM(pair, 0);
    int changed = c->step_n == NULL ? 1 : PyObject_RichCompareBool(step_n, c->step_n, Py_NE);
    int err = changed < 0 || (changed && use_step(c, Py_NewRef(step_n)) < 0)
              || emit(c, name, body, seq_n, parent_seq != Py_None, parent_n, PyTuple_GET_ITEM(pair, 1) != Py_None,
                      t0, t1) < 0;
    Py_DECREF(body);
    return err ? -1 : 0;
}

PyDoc_STRVAR(regions_doc,
"regions(records, offset, salt, bodies, steps, make_body, make_step, durations, out, rest)\n--\n\n"
"The usual regions among `records` encoded into `out` (bytes), their host durations into\n"
"`durations` (name -> list of ns); every other record appended to `rest`, in order.");

static PyObject *regions(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "regions() takes 10 arguments");
        return NULL;
    }
    Ctx c;
    if (ctx_init(&c, args + 1, args + 3) < 0) {
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[0], "records must be a sequence");
    if (seq == NULL) {
        return NULL;
    }
    PyObject *result = Py_None;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < count && result != NULL; i++) {
        if (take_record(&c, items[i]) < 0) {
            result = NULL;
        }
    }
    ctx_clear(&c);
    Py_DECREF(seq);
    return Py_XNewRef(result);
}

/* --- slots ------------------------------------------------------------------------------- */
/* The same for a packed drain ("the packed ring" in `record/_hotpath_recorder.c`): slots are
 * read where they lie, with no tuple, int or dict made for a usual region. A batch holds a few
 * distinct bodies (a name, or a name and its one attribute), so the last few found are kept by
 * their slot fields here. */
#define MEMO 16

typedef struct {
    uint32_t name, key;
    uint8_t attr, used;
    int64_t value;
    PyObject *body; /* a strong reference; NULL: such a region goes the general way */
} Memo;

/* A slot's body (borrowed from `memo`), or NULL: without an error, the slot goes to `rest`. */
static PyObject *slot_body(const Slot *slot, PyObject *strings, Memo *memo, int *next_memo, PyObject *bodies,
                           PyObject *make_body) {
    int64_t value = slot->attr == A_NONE ? 0 : slot->value.i;
    uint32_t key = slot->attr == A_NONE ? 0 : slot->key;
    for (int i = 0; i < MEMO; i++) {
        Memo *m = &memo[i];
        if (m->used && m->name == slot->name && m->attr == slot->attr && m->key == key && m->value == value) {
            return m->body;
        }
    }
    PyObject *name = PyList_GET_ITEM(strings, slot->name), *attrs = Py_None, *v = NULL;
    switch (slot->attr) {
    case A_NONE: break;
    case A_INT: v = PyLong_FromLongLong(slot->value.i); break;
    case A_FLOAT: v = PyFloat_FromDouble(slot->value.f); break;
    case A_TRUE: v = Py_NewRef(Py_True); break;
    case A_FALSE: v = Py_NewRef(Py_False); break;
    default: v = Py_NewRef(PyList_GET_ITEM(strings, slot->value.i)); break;
    }
    if (slot->attr != A_NONE) {
        if (v == NULL || (attrs = PyDict_New()) == NULL || PyDict_SetItem(attrs, PyList_GET_ITEM(strings, key), v) < 0) {
            Py_XDECREF(v);
            if (attrs != Py_None) {
                Py_DECREF(attrs);
            }
            return NULL;
        }
        Py_DECREF(v);
    }
    PyObject *body = region_body(name, attrs, bodies, make_body);
    if (attrs != Py_None) {
        Py_DECREF(attrs);
    }
    if (body == NULL && PyErr_Occurred()) {
        return NULL;
    }
    Memo *m = &memo[*next_memo];
    *next_memo = (*next_memo + 1) % MEMO;
    Py_XSETREF(m->body, body);
    m->name = slot->name;
    m->key = key;
    m->attr = slot->attr;
    m->value = value;
    m->used = 1;
    return body;
}

PyDoc_STRVAR(packed_regions_doc,
"packed_regions(slots, side, strings, offset, salt, bodies, steps, make_body, make_step, durations, out, rest)\n"
"--\n\n"
"`regions` for a packed drain (`RecorderBase.drain_packed`'s slots and side records, `strings`\n"
"its string table), the slots read where they lie: the same `out`, `durations` and `rest` as\n"
"`regions` of the records the drain unpacks into (`unpack`). Returns their number.");

static PyObject *packed_regions(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 12) {
        PyErr_SetString(PyExc_TypeError, "packed_regions() takes 12 arguments");
        return NULL;
    }
    PyObject *side = args[1], *strings = args[2];
    if (!PyList_Check(side) || !PyList_Check(strings)) {
        PyErr_SetString(PyExc_TypeError, "side and strings must be lists");
        return NULL;
    }
    Ctx c;
    if (ctx_init(&c, args + 3, args + 5) < 0) {
        return NULL;
    }
    Py_buffer view;
    Py_ssize_t count, next_side = 0, n_strings = PyList_GET_SIZE(strings);
    if (slots_open(args[0], &view, &count, "packed_regions") < 0) {
        return NULL;
    }
    Memo memo[MEMO];
    memset(memo, 0, sizeof memo);
    int next_memo = 0;
    LastStep last = {NULL, 0, 0, 0};
    PyObject *result = NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        Slot slot;
        slot_at(&view, i, &slot);
        if (slot.tag == SLOT_SIDE) { /* an object, as the tuple loop takes it */
            PyObject *record = side_record(side, &next_side, "packed_regions");
            if (record == NULL || take_record(&c, record) < 0) {
                goto done;
            }
            continue;
        }
        if (slot.tag != SLOT_REGION || slot.name >= n_strings || slot.attr > A_STR
            || (slot.attr != A_NONE && slot.key >= n_strings)
            || (slot.attr == A_STR && (slot.value.i < 0 || slot.value.i >= n_strings))) {
            PyErr_SetString(PyExc_ValueError, "packed_regions: a slot this recorder cannot have packed");
            goto done;
        }
        PyObject *body = slot_body(&slot, strings, memo, &next_memo, c.bodies, c.make_body);
        if (body != NULL && !(slot.flags & (F_PARENT | F_STEP_SEQ))) {
            int general = between_general(PyList_GET_ITEM(strings, slot.name));
            if (general < 0) {
                goto done;
            }
            if (general) {
                body = NULL;
            }
        }
        if (body == NULL) { /* the general path's: as a record */
            PyObject *record = PyErr_Occurred() ? NULL : unpack_slot(&slot, strings, &last, g_kind_span);
            int err = record == NULL || PyList_Append(c.rest, record) < 0;
            Py_XDECREF(record);
            if (err) {
                goto done;
            }
            continue;
        }
        int has_n = slot.flags & F_STEP_N;
        int same = c.step_n != NULL && (has_n ? c.step_i64 && c.step_value == slot.step_n : c.step_n == Py_None);
        if (!same) {
            PyObject *step_n = has_n ? PyLong_FromLongLong(slot.step_n) : Py_NewRef(Py_None);
            if (step_n == NULL || use_step(&c, step_n) < 0) {
                goto done;
            }
        }
        if (emit(&c, PyList_GET_ITEM(strings, slot.name), body, slot.seq, slot.flags & F_PARENT, slot.parent,
                 slot.flags & F_STEP_SEQ, slot.t0, slot.t1) < 0) {
            goto done;
        }
    }
    if (sides_done(side, next_side, "packed_regions") < 0) {
        goto done;
    }
    result = PyLong_FromSsize_t(count);
done:
    for (int i = 0; i < MEMO; i++) {
        Py_XDECREF(memo[i].body);
    }
    ctx_clear(&c);
    Py_XDECREF(last.ref);
    PyBuffer_Release(&view);
    return result;
}

PyDoc_STRVAR(bind_doc, "bind(kind_span, id_multiplier, between_general)\n--\n\n"
"The record kind of a region (`wire.schema.KIND_SPAN`), the multiplier of region span ids\n"
"(`wire.ids.REGION_ID_MULTIPLIER`), and the names whose regions between steps (no parent, no\n"
"step seq) go the general way (`fast_path.BETWEEN_GENERAL`).");

static PyObject *bind(PyObject *module, PyObject *args) {
    PyObject *kind_span, *multiplier, *between;
    if (!PyArg_UnpackTuple(args, "bind", 3, 3, &kind_span, &multiplier, &between)) {
        return NULL;
    }
    unsigned long long m = PyLong_AsUnsignedLongLong(multiplier);
    if (m == (unsigned long long)-1 && PyErr_Occurred()) {
        return NULL;
    }
    Py_INCREF(kind_span);
    Py_XSETREF(g_kind_span, kind_span);
    Py_INCREF(between);
    Py_XSETREF(g_between, between);
    g_id_multiplier = m;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(unpack_doc, "unpack(slots, side, wire, strings)\n--\n\n"
"What `RecorderBase.drain_packed` gave, back as runs of records (`export.pipe.Segments`).");

static PyObject *unpack(PyObject *module, PyObject *args) {
    if (g_kind_span == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_encode.bind() was not called");
        return NULL;
    }
    return unpack_segments(args, g_kind_span);
}

static PyMethodDef methods[] = {
    {"regions", (PyCFunction)(void (*)(void))regions, METH_FASTCALL, regions_doc},
    {"packed_regions", (PyCFunction)(void (*)(void))packed_regions, METH_FASTCALL, packed_regions_doc},
    {"bind", bind, METH_VARARGS, bind_doc},
    {"unpack", unpack, METH_VARARGS, unpack_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "otel_train.export._encode",
    "The exporter's fast path in C: usual regions straight to OTLP bytes (see _encode.c).", -1, methods,
};

PyMODINIT_FUNC PyInit__encode(void) {
    PyObject *m = PyModule_Create(&module_def);
    if (m != NULL && PyModule_AddIntConstant(m, "SLOT_SIZE", (long)sizeof(Slot)) < 0) {
        Py_CLEAR(m);
    }
    return m;
}
