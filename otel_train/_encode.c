/* The exporter's fast path in C: usual regions straight to OTLP `ScopeSpans.spans` bytes.
 *
 * Same output as the Python loop in `_spans.SpanAssembler._fast_regions` (the fallback when
 * this module cannot be built; `tests/test_encode.py` holds the two to the same bytes, metric
 * durations and leftover records). Why: that loop is most of what the exporter process does
 * for a training loop, ~1.7 us of Python a region here, and the exporter shares the machine's
 * cores with training (README, "What the exporter costs").
 *
 * Everything that is not a plain region with a cached body goes back to Python: a cache miss
 * calls the assembler's `_fast_body` / `_fast_step`; a record it does not take (a step, a
 * note, an exception, an event, an unusual attribute) is appended to `rest`, in order.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

/* Field layout, as `_otlp.REGION_HEAD` / `REGION_HEAD_PARENT` pack it: the trace id field
 * (tag, length, 16 bytes), span_id (tag 0x12, length 8, fixed64), optionally parent_span_id
 * (0x22, 8, fixed64), kind (0x30 0x01), start (0x39 fixed64), end (0x41 fixed64); then the
 * cached body (name and user attributes), the step attribute, and `_otlp.TAIL_LOCAL`. */
#define TRACE_FIELD_LEN 18
#define ID_FIELD_LEN 10
#define TIMES_LEN 20 /* kind (2) + tag and fixed64 (9) twice */
static const unsigned char TAIL_LOCAL[] = {0x7a, 0x00, 0x85, 0x01, 0x00, 0x01, 0x00, 0x00};
#define REGION_ID_MULTIPLIER 0x9E3779B97F4A7C15ULL

static PyObject *g_kind_span; /* KIND_SPAN */

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

/* A region's span id in wire form (`_distributed.region_wire_id`). */
static unsigned long long wire_id(unsigned long long seq, unsigned long long salt) {
    unsigned long long id = (seq * REGION_ID_MULTIPLIER) ^ salt;
    return id ? id : 1;
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
        PyErr_SetString(PyExc_TypeError, "_fast_body must return bytes or None");
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

PyDoc_STRVAR(regions_doc,
"regions(records, offset, salt, bodies, steps, make_body, make_step, durations, out, rest)\n--\n\n"
"The usual regions among `records` encoded into `out` (bytes), their host durations into\n"
"`durations` (name -> list of ns); every other record appended to `rest`, in order.");

static PyObject *regions(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "regions() takes 10 arguments");
        return NULL;
    }
    PyObject *records = args[0], *bodies = args[3], *steps = args[4], *make_body = args[5];
    PyObject *make_step = args[6], *durations = args[7], *out = args[8], *rest = args[9];
    long long offset;
    if (!int_field(args[1], &offset)) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "offset must be an int in the int64 range");
        }
        return NULL;
    }
    unsigned long long salt = PyLong_AsUnsignedLongLongMask(args[2]);
    if (salt == (unsigned long long)-1 && PyErr_Occurred()) {
        return NULL;
    }
    if (!PyDict_Check(bodies) || !PyDict_Check(steps) || !PyDict_Check(durations) || !PyList_Check(out)
        || !PyList_Check(rest)) {
        PyErr_SetString(PyExc_TypeError, "bodies, steps and durations must be dicts; out and rest lists");
        return NULL;
    }
    if (g_kind_span == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_encode.bind() was not called");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(records, "records must be a sequence");
    if (seq == NULL) {
        return NULL;
    }
    PyObject *last_step = NULL; /* borrowed from the current record's step pair: none before the first */
    PyObject *step = NULL;      /* the step tuple in use (a strong reference: the cache may be cleared) */
    PyObject *last_pair = NULL; /* a strong reference keeping `last_step` alive */
    PyObject *body = NULL;      /* the region's cached body (a strong reference), cleared every record */
    PyObject *result = NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *record = items[i];
        Py_CLEAR(body);
        PyObject *pair, *name, *attrs;
        long long seq_n, t0, t1;
        int is_region = PyTuple_CheckExact(record) && PyTuple_GET_SIZE(record) == 10;
        if (is_region && PyTuple_GET_ITEM(record, 0) != g_kind_span) {  /* KIND_SPAN: a small int, one object */
            is_region = PyObject_RichCompareBool(PyTuple_GET_ITEM(record, 0), g_kind_span, Py_EQ);
            if (is_region < 0) {
                goto done;
            }
        }
        if (!is_region || PyTuple_GET_ITEM(record, 8) != Py_None || PyTuple_GET_ITEM(record, 9) != Py_None) {
            if (PyList_Append(rest, record) < 0) { /* a step or a note, an exception, an event */
                goto done;
            }
            continue;
        }
        name = PyTuple_GET_ITEM(record, 1);
        pair = PyTuple_GET_ITEM(record, 4);
        attrs = PyTuple_GET_ITEM(record, 7);
        PyObject *parent_seq = PyTuple_GET_ITEM(record, 3);
        long long parent_n = 0;
        if (!PyUnicode_CheckExact(name) || !PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2
            || !int_field(PyTuple_GET_ITEM(record, 2), &seq_n) || !int_field(PyTuple_GET_ITEM(record, 5), &t0)
            || !int_field(PyTuple_GET_ITEM(record, 6), &t1)
            || (parent_seq != Py_None && !int_field(parent_seq, &parent_n))) {
            PyErr_Clear();
            if (PyList_Append(rest, record) < 0) { /* an unusual record: the general path decides */
                goto done;
            }
            continue;
        }
        body = region_body(name, attrs, bodies, make_body);
        if (body == NULL) {
            if (PyErr_Occurred() || PyList_Append(rest, record) < 0) {
                goto done;
            }
            continue;
        }
        if (append_duration(durations, name, t1 - t0) < 0) {
            goto done;
        }
        PyObject *step_n = PyTuple_GET_ITEM(pair, 0), *step_seq = PyTuple_GET_ITEM(pair, 1);
        int changed = last_step == NULL ? 1 : PyObject_RichCompareBool(step_n, last_step, Py_NE);
        if (changed < 0) {
            goto done;
        }
        if (changed) {
            Py_INCREF(pair);
            Py_XSETREF(last_pair, pair);
            last_step = step_n;
            PyObject *found = PyDict_GetItemWithError(steps, step_n);
            if (found != NULL) {
                Py_INCREF(found);
            } else if (!PyErr_Occurred()) {
                found = PyObject_CallOneArg(make_step, step_n);
            }
            if (found == NULL || !PyTuple_CheckExact(found) || PyTuple_GET_SIZE(found) != 5
                || !PyBytes_Check(PyTuple_GET_ITEM(found, 0)) || !PyBytes_Check(PyTuple_GET_ITEM(found, 2))) {
                if (found != NULL) {
                    PyErr_SetString(PyExc_TypeError, "_fast_step must return (bytes, int|None, bytes, bool, int|None)");
                    Py_DECREF(found);
                }
                goto done;
            }
            Py_XSETREF(step, found);
        }
        int sampled = PyObject_IsTrue(PyTuple_GET_ITEM(step, 3));
        if (sampled < 0) {
            goto done;
        }
        if (!sampled) {
            continue;
        }
        unsigned long long wall0, wall1, parent = 0;
        if (wall_time(t0, offset, &wall0) < 0 || wall_time(t1, offset, &wall1) < 0) {
            goto done;
        }
        if (parent_seq != Py_None) {
            parent = wire_id((unsigned long long)parent_n, salt);
        } else if (step_seq != Py_None && PyTuple_GET_ITEM(step, 1) != Py_None) {
            parent = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(step, 1));
            if (parent == (unsigned long long)-1 && PyErr_Occurred()) {
                goto done;
            }
        }
        PyObject *trace = PyTuple_GET_ITEM(step, 0);
        PyObject *field = encode(PyBytes_AS_STRING(trace), PyBytes_GET_SIZE(trace),
                                 wire_id((unsigned long long)seq_n, salt), parent != 0, parent, wall0, wall1, body,
                                 PyTuple_GET_ITEM(step, 2));
        if (field == NULL) {
            goto done;
        }
        int err = PyList_Append(out, field);
        Py_DECREF(field);
        if (err < 0) {
            goto done;
        }
    }
    result = Py_None;
    Py_INCREF(result);
done:
    Py_XDECREF(body);
    Py_XDECREF(step);
    Py_XDECREF(last_pair);
    Py_DECREF(seq);
    return result;
}

PyDoc_STRVAR(bind_doc, "bind(kind_span)\n--\n\nThe record kind of a region (`_recorder.KIND_SPAN`).");

static PyObject *bind(PyObject *module, PyObject *kind_span) {
    Py_INCREF(kind_span);
    Py_XSETREF(g_kind_span, kind_span);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"regions", (PyCFunction)(void (*)(void))regions, METH_FASTCALL, regions_doc},
    {"bind", bind, METH_O, bind_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "otel_train._encode",
    "The exporter's fast path in C: usual regions straight to OTLP bytes (see _encode.c).", -1, methods,
};

PyMODINIT_FUNC PyInit__encode(void) {
    return PyModule_Create(&module_def);
}
