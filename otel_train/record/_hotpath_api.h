/* What the C hot path offers other C modules of otel_train (detection's `_batch.c`), as the
 * capsule `otel_train.record._hotpath._C_API`: the recorder's type and its clock read without an
 * attribute lookup (`rec_now_ns`: CLOCK_MONOTONIC read directly while `now` is
 * time.perf_counter_ns, else `now()` called).
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
} HotpathAPI;

#endif
