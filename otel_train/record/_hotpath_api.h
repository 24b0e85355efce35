/* What the C hot path offers other C modules of otel_train (detection's `_batch.c` and
 * `_loops.c`), as the capsule `otel_train.record._hotpath._C_API`: the recorder's type, its clock
 * read without an attribute lookup (`rec_now_ns`: CLOCK_MONOTONIC read directly while `now` is
 * time.perf_counter_ns, the pinned time while one is pinned, else `now()` called), and the clock
 * pinned to a time (a replayed call's, `detect/batch.py`) until `now` is set again.
 *
 * `recorder_now` and `recorder_pin` are the one way both modules read and pin a recorder's
 * clock: through the capsule where the recorder is a `RecorderBase`, else as Python would;
 * `as_i64` is their one way to read a time (an int of ns) as a C integer.
 */
#ifndef OTEL_TRAIN_HOTPATH_API_H
#define OTEL_TRAIN_HOTPATH_API_H

#include <Python.h>
#include <stdint.h>

#define HOTPATH_API_NAME "otel_train.record._hotpath._C_API"

typedef struct {
    PyTypeObject *recorder_type;  /* RecorderBase */
    /* a RecorderBase's `now()` as a C integer: 0, or -1 with an error */
    int (*now_ns)(PyObject *recorder, int64_t *out);
    /* a RecorderBase's clock pinned at `t` until its `now` is set (which unpins it) */
    void (*pin)(PyObject *recorder, int64_t t);
} HotpathAPI;

/* `PyLong_AsLongLong`, without its detour through `_PyLong_AsByteArray` (~200 instructions) for
 * every int over 2**30, which every perf-counter time is: 0, or -1 with an error. */
static inline int
as_i64(PyObject *obj, int64_t *out)
{
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (overflow) {
        PyErr_SetString(PyExc_OverflowError, "Python int too large to convert to C long long");
        return -1;
    }
    if (v == -1 && PyErr_Occurred())
        return -1;
    *out = (int64_t)v;
    return 0;
}

/* Whether `r` is a `RecorderBase` the capsule `api` serves (`api` NULL: the hot path not built).
 * `*seen` is the caller's cache of the type last found to be one (a strong reference), so a
 * recorder of that type costs one compare, not a walk of its MRO. */
static inline int
is_recorder(const HotpathAPI *api, PyTypeObject **seen, PyObject *r)
{
    if (api == NULL)
        return 0;
    if (Py_TYPE(r) == *seen)
        return 1;
    if (!PyObject_TypeCheck(r, api->recorder_type))
        return 0;
    Py_XSETREF(*seen, (PyTypeObject *)Py_NewRef((PyObject *)Py_TYPE(r)));
    return 1;
}

/* `r.now()`, a new int or NULL with an error; `api` and `seen` as `is_recorder` takes them,
 * `name` the interned "now". */
static inline PyObject *
recorder_now(const HotpathAPI *api, PyTypeObject **seen, PyObject *r, PyObject *name)
{
    if (is_recorder(api, seen, r)) {
        int64_t t;
        return api->now_ns(r, &t) < 0 ? NULL : PyLong_FromLongLong(t);
    }
    return PyObject_CallMethodNoArgs(r, name);
}

/* `r.now = t.__int__`: the clock reads int `t` until `now` is set again. 0, or -1 with an error;
 * `api` and `seen` as `is_recorder` takes them, `name` the interned "now", `int_name` "__int__". */
static inline int
recorder_pin(const HotpathAPI *api, PyTypeObject **seen, PyObject *r, PyObject *t, PyObject *name,
             PyObject *int_name)
{
    if (is_recorder(api, seen, r)) {
        int64_t v;
        if (as_i64(t, &v) < 0)
            return -1;
        api->pin(r, v);
        return 0;
    }
    PyObject *fn = PyObject_GetAttr(t, int_name);
    if (fn == NULL)
        return -1;
    int out = PyObject_SetAttr(r, name, fn);
    Py_DECREF(fn);
    return out;
}

#endif
