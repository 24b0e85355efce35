/* The C hot path's internal header: the objects, state and declarations its parts share.
 *
 * `_hotpath.c` is compiled as one translation unit that includes its parts, each a concern:
 * `_hotpath_recorder.c` (the recorder's buffer and the packed ring), `_hotpath_region.c` (the
 * region type: enter and exit, the current region) and `_hotpath_step.c` (the step types). A
 * region's exit calls into the buffer code, and as one unit those calls inline as they did
 * when this was one file. So everything here is `static`, and pyproject.toml lists the parts
 * as `depends` of the extension, never as sources of their own.
 */
#ifndef OTEL_TRAIN_HOTPATH_H
#define OTEL_TRAIN_HOTPATH_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "../wire/slots.h"

/* --- the module's state ------------------------------------------------------------------- */
/* Bound by `recorder.py` (`bind`, `bind_steps`) and the recorder in force (`install`). */
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
static PyObject *g_step_number; /* (n, next step): a valid step number for an `n` that is not one */
static PyObject *g_misused;    /* (what, name): says once that a region was misused (re-entered, exited twice) */
static PyObject *g_name_of;    /* (name) -> str: a span name that is not a str, as text (said once) */

#if defined(_MSC_VER)
#define THREAD_LOCAL __declspec(thread)
#else
#define THREAD_LOCAL _Thread_local
#endif

/* The next number that names a span id (`wire.ids.region_span_id`), for regions and steps
 * alike; `seq`, the module's iterator, hands them to the Python side (`recorder.seq`). A region
 * keeps it as a C integer, not a new int object (`RegionObject`). */
static int64_t g_next_seq = 1;

static PyObject *g_perf_counter_ns;  /* time.perf_counter_ns: read directly when it is the clock */
static PyObject *s_ref, *s_append, *s_device_time, *s_asyncio_events;  /* interned names */
static PyObject *s_zero, *s_one;

/* --- the objects --------------------------------------------------------------------------- */
/* The recorder (`RecorderBase`, `_hotpath_recorder.c`). */
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
    int pinned;         /* the clock reads `pinned_ns` until `now` is set (`pin`: a replayed call's time) */
    int64_t pinned_ns;
    /* Packing (`packing = True`, "the packed ring" in `_hotpath_recorder.c`): the records in
     * order, as slots; `buf` then holds only the records that are not slots, each marked by a
     * SLOT_SIDE slot. */
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

/* The fields of a collected type: visited, cleared and freed from one list (`GC_FIELD_FUNCTIONS`). */
#define VISIT_FIELD(f) Py_VISIT(self->f);
#define CLEAR_FIELD(f) Py_CLEAR(self->f);

/* A collected type's tp_traverse, tp_clear and tp_dealloc (`PREFIX_traverse`, `_clear`,
 * `_dealloc`) from its field list, `CLEAR_MORE` run in clear after the fields. The dealloc
 * clears its own type's fields (a Python subclass's are cleared by the subclass's dealloc
 * first) inside the trashcan, which bounds the C stack when a long chain of regions (each
 * holding its parent) is freed at once. */
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

/* A region (`_hotpath_region.c`). Its object fields: its struct, its members (all read and
 * written from Python by these names, unset ones raising AttributeError like empty slots) and
 * its collector hooks. */
#define REGION_FIELDS(X) X(name) X(attrs) X(rec) X(parent) X(token) X(step) X(exc) X(events) X(dev) X(timed) X(ev1)
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
    /* Entries of it while it was already open (`with sp: with sp:`), each ignored, as its
     * matching exit is: entering it again would make it its own parent (a cycle that any walk
     * up the parents would follow forever). */
    uint32_t reentered;
    vectorcallfunc vectorcall;  /* calling the region: enter (no arguments), exit (3), decorate (1) */
} RegionObject;

#define HAS_SEQ 1
#define HAS_T0 2
#define HAS_T1 4

/* A step and "after a step" (`_hotpath_step.c`). */
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

static PyTypeObject RecorderType, RegionType, StepType, AfterType;

/* Defined in one part, called from another. */
static int recorder_in_force(PyObject **out);
static int settle_pending(void);
static int append_object(RecorderObject *rec, PyObject *record);
static int append_record(RecorderObject *rec, PyObject *record);
static int pack_region(RecorderObject *rec, PyObject *name, int64_t seq, const int64_t *parent_seq,
                       PyObject *step_ref, int64_t t0, int64_t t1, PyObject *attrs, PyObject *exc,
                       PyObject *events);
static int int64_of(PyObject *o, int64_t *out);
static PyObject *rec_now(RecorderObject *r);
static int rec_now_ns(RecorderObject *r, int64_t *out);
static void untrack_if_atomic(PyObject *record);
static PyObject *region_aenter(PyObject *self, PyObject *Py_UNUSED(ignored));
static PyObject *region_aexit(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
static int add_self_descr(PyTypeObject *type, PyMethodDef *def);
static PyObject *current_region(PyObject **from_var);
static int region_leave(RegionObject *self);
static int region_make_current(RegionObject *self);
static PyObject *step_ref_of(PyObject *step);

#endif
