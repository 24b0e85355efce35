/* What the C hot path offers other C modules of otel_train (detection's `_batch.c` and
 * `_loops.c`), as the capsule `otel_train.record._hotpath._C_API`: the recorder's type, its clock
 * read without an attribute lookup (`rec_now_ns`: CLOCK_MONOTONIC read directly while `now` is
 * time.perf_counter_ns, the pinned time while one is pinned, else `now()` called), and the clock
 * pinned to a time (a replayed call's, `detect/batch.py`) until `now` is set again.
 *
 * `recorder_now` and `recorder_pin` are the one way both modules read and pin a recorder's
 * clock: through the capsule where the recorder is a `RecorderBase`, else as Python would.
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

/* `r.now()`, a new int or NULL with an error; `api` may be NULL (the hot path not built) and
 * `name` is the interned "now". */
static inline PyObject *
recorder_now(const HotpathAPI *api, PyObject *r, PyObject *name)
{
    if (api != NULL && PyObject_TypeCheck(r, api->recorder_type)) {
        int64_t t;
        return api->now_ns(r, &t) < 0 ? NULL : PyLong_FromLongLong(t);
    }
    return PyObject_CallMethodNoArgs(r, name);
}

/* `r.now = t.__int__`: the clock reads int `t` until `now` is set again. 0, or -1 with an error;
 * `name` is the interned "now", `int_name` "__int__". */
static inline int
recorder_pin(const HotpathAPI *api, PyObject *r, PyObject *t, PyObject *name, PyObject *int_name)
{
    if (api != NULL && PyObject_TypeCheck(r, api->recorder_type)) {
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(t, &overflow);
        if (overflow)
            PyErr_SetString(PyExc_OverflowError, "otel_train: a note's time is out of range");
        if (overflow || (v == -1 && PyErr_Occurred()))
            return -1;
        api->pin(r, (int64_t)v);
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
