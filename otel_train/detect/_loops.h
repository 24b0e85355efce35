/* What `_loops.c` and its parts share: interned names, the detection state and the recorder's
 * objects read where they lie, and small helpers. Private to `_loops.c`, which includes it and
 * then each part (`_loops_*.c`) as one translation unit, as `record/_hotpath.c` does its parts:
 * a part's calls into another inline as they did when this was one file, and everything stays
 * `static`. pyproject.toml lists the parts as `depends` of the extension, never as sources. */
#ifndef OTEL_TRAIN_LOOPS_H
#define OTEL_TRAIN_LOOPS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <structmember.h>
#if PY_VERSION_HEX < 0x030B0000
#include <frameobject.h>
#endif

#include "_member.h"
#include "_update.h"
#include "../record/_hotpath_api.h"
#include "../wire/record.h"

/* Interned attribute names (set at init). */
static PyObject *s_after, *s_append, *s_attrs, *s_boundary, *s_bwd_depth, *s_copying, *s_cover, *s_data_driven,
    *s_decide, *s_discovering, *s_enter, *s_epoch, *s_epoch_fixed, *s_eval_explicit, *s_eval_t0,
    *s_exit, *s_fetching, *s_fwd_depth, *s_fwd_kind, *s_fwd_nested, *s_fwd_region, *s_index_sampler, *s_last_end,
    *s_mb, *s_mb_bwd, *s_mb_fwd, *s_micro_batches, *s_n, *s_needed, *s_now, *s_opt_closure, *s_opt_depth,
    *s_opt_end, *s_parent, *s_part_phase, *s_pending, *s_phase, *s_rec, *s_rec_, *s_rediscover_every, *s_ref, *s_seq,
    *s_step, *s_step_closed, *s_stepped, *s_t0, *s_t1, *s_train_iter, *s_train_src, *s_training, *s_unseen,
    *s_uses_opt, *s_aux_depth, *s_closure, *s_dev, *s_evaluations, *s_events, *s_last_callers, *s_nest, *s_opt_frame,
    *s_opt_owner, *s_opt_t0, *s_phase_end, *s_phase_parts, *s_site_probe;

/* --- detection's state, read where it lies -------------------------------------------------- */
/* `state.State` keeps its fields in `__slots__`: each is an object pointer at a fixed offset of
 * the instance, which Python's specialised attribute access reads directly. So does this module
 * (`bind_state` finds the offsets); a generic attribute lookup from C costs ~10x more, as much as
 * the bytecode it replaced. An object of any other type goes the generic way. */
typedef struct {
    PyObject **name; /* the interned name (set at init) */
    Py_ssize_t off;  /* its slot's offset in a `State`, or -1 */
} Field;

static PyTypeObject *g_state_type;

/* While `detect.batch` replays a call: what only the call's moment knew, `(grad_enabled,
 * training, batch_size, step_wrapper_frame, callers, zero_grad_place)` (`set_replay`), read
 * here instead of the live values; NULL otherwise. */
static PyObject *g_replay;
enum { RP_GRAD, RP_TRAINING, RP_SIZE, RP_WRAPPER, RP_CALLERS, RP_PLACE, RP_N };

/* `s.<field>`: a new reference, or NULL with AttributeError (unset) or another error. */
static PyObject *
sget(PyObject *s, Field *f)
{
    if (f->off >= 0 && Py_TYPE(s) == g_state_type) {
        PyObject *v = *(PyObject **)((char *)s + f->off);
        if (v == NULL)
            PyErr_SetObject(PyExc_AttributeError, *f->name);
        return Py_XNewRef(v);
    }
    return PyObject_GetAttr(s, *f->name);
}

/* `s.<field> = v`: 0, or -1 with an error. */
static int
sset(PyObject *s, Field *f, PyObject *v)
{
    if (f->off >= 0 && Py_TYPE(s) == g_state_type) {
        Py_XSETREF(*(PyObject **)((char *)s + f->off), Py_NewRef(v));
        return 0;
    }
    return PyObject_SetAttr(s, *f->name, v);
}

/* --- the recorder's objects, read where they lie (`_member.h`) ----------------------------- */

/* `module.<name>` from the module's dict (its own attributes, which nothing on the module type
 * shadows); the generic lookup where it is not there (a module `__getattr__`) or not a module. */
static NOINLINE PyObject *
module_attr(PyObject *module, PyObject *name)
{
    if (PyModule_CheckExact(module)) {
        PyObject *v = PyDict_GetItemWithError(PyModule_GetDict(module), name); /* borrowed */
        if (v != NULL)
            return Py_NewRef(v);
        if (PyErr_Occurred())
            return NULL;
    }
    return PyObject_GetAttr(module, name);
}

/* The recorder's C region and step types (`otel_train.record._hotpath`; NULL where it was not
 * built). Calling one is its `__enter__` (no arguments) or `__exit__` (three), which is what
 * `with` reaches through their descriptors: so `enter_of` and `exit_of` call them, with no
 * method lookup, and anything else (the Python fallback, a subclass) the generic way. */
static PyTypeObject *g_c_region, *g_c_step;

static NOINLINE PyObject *
enter_of(PyObject *obj)
{
    if (Py_TYPE(obj) == g_c_region || Py_TYPE(obj) == g_c_step)
        return PyObject_Vectorcall(obj, NULL, 0, NULL);
    return PyObject_CallMethodNoArgs(obj, s_enter);
}

static NOINLINE PyObject *
exit_of(PyObject *obj, PyObject *exc_type, PyObject *exc, PyObject *tb)
{
    if (Py_TYPE(obj) == g_c_region || Py_TYPE(obj) == g_c_step) {
        PyObject *const args[3] = {exc_type, exc, tb};
        return PyObject_Vectorcall(obj, args, 3, NULL);
    }
    return PyObject_CallMethodObjArgs(obj, s_exit, exc_type, exc, tb, NULL);
}

/* Where they are read: the recorder (`Recorder`: its open step, its clock), a step (`Step`,
 * or `After` between steps), a region (`Region`: a phase, or the one a phase nests in),
 * `data.copy_edge`, `roots.roots`, a batch's tensor. */
static Member m_rec_step = {&s_step};
static Member m_step_ref = {&s_ref};
static Member m_step_attrs = {&s_attrs}, m_step_attrs_w = {&s_attrs};
static Member m_step_t0 = {&s_t0}, m_step_t0_w = {&s_t0};
static Member m_step_n = {&s_n};
static Member m_step_rec = {&s_rec};
static Member m_step_micro_batches_w = {&s_micro_batches};
static Member m_region_parent = {&s_parent};
static Member m_region_step = {&s_step};
static Member m_region_rec = {&s_rec};
static Member m_region_attrs_w = {&s_attrs};
static Member m_region_events = {&s_events};
static Member m_region_t0 = {&s_t0}, m_region_t1 = {&s_t1}, m_region_seq = {&s_seq};

/* The hot path's capsule (`_hotpath_api.h`), NULL where it is not built; the recorder type last
 * found to be its `RecorderBase`. */
static const HotpathAPI *g_api;
static PyTypeObject *g_rec_type;

/* `r.now()`: the recorder's clock read, a new reference (NULL with an error). */
static NOINLINE PyObject *
now_of(PyObject *r)
{
    return recorder_now(g_api, &g_rec_type, r, s_now);
}
static Member m_edge_needed = {&s_needed};
static Member m_roots_discovering = {&s_discovering};
static PyObject *g_shape, *g_dtype; /* "shape", "dtype" */
static Member m_tensor_shape = {&g_shape}, m_tensor_dtype = {&g_dtype}; /* a batch's tensor (`size_of`) */

/* A Python-callable function's entry: its arguments as it takes them (`ok`) and what its
 * `bind_*` function sets (`bound`); 0, or -1 with TypeError(`usage`) or RuntimeError. */
static int
call_ok(int ok, const char *usage, int bound, const char *binder)
{
    if (!ok) {
        PyErr_SetString(PyExc_TypeError, usage);
        return -1;
    }
    if (!bound) {
        PyErr_Format(PyExc_RuntimeError, "_loops.%s() was not called", binder);
        return -1;
    }
    return 0;
}

/* Whether `v`, a new reference released here (NULL: an error already set), is None: 1, 0 or -1. */
static int
none_of(PyObject *v)
{
    if (v == NULL)
        return -1;
    int none = v == Py_None;
    Py_DECREF(v);
    return none;
}

static int
sattr_true(PyObject *s, Field *f)
{
    return true_of(sget(s, f));
}

static int
sattr_none(PyObject *s, Field *f)
{
    return none_of(sget(s, f));
}

/* The state's fields the functions here read and write; `bind_state` sets their offsets. */
static Field f_after = {&s_after, -1};
static Field f_boundary = {&s_boundary, -1};
static Field f_bwd_depth = {&s_bwd_depth, -1};
static Field f_copying = {&s_copying, -1};
static Field f_cover = {&s_cover, -1};
static Field f_data_driven = {&s_data_driven, -1};
static Field f_epoch = {&s_epoch, -1};
static Field f_epoch_fixed = {&s_epoch_fixed, -1};
static Field f_eval_explicit = {&s_eval_explicit, -1};
static Field f_eval_t0 = {&s_eval_t0, -1};
static Field f_fetching = {&s_fetching, -1};
static Field f_fwd_depth = {&s_fwd_depth, -1};
static Field f_fwd_kind = {&s_fwd_kind, -1};
static Field f_fwd_nested = {&s_fwd_nested, -1};
static Field f_fwd_region = {&s_fwd_region, -1};
static Field f_last_end = {&s_last_end, -1};
static Field f_mb = {&s_mb, -1};
static Field f_mb_bwd = {&s_mb_bwd, -1};
static Field f_mb_fwd = {&s_mb_fwd, -1};
static Field f_opt_closure = {&s_opt_closure, -1};
static Field f_opt_depth = {&s_opt_depth, -1};
static Field f_opt_end = {&s_opt_end, -1};
static Field f_part_phase = {&s_part_phase, -1};
static Field f_pending = {&s_pending, -1};
static Field f_phase = {&s_phase, -1};
static Field f_step = {&s_step, -1};
static Field f_stepped = {&s_stepped, -1};
static Field f_train_iter = {&s_train_iter, -1};
static Field f_train_src = {&s_train_src, -1};
static Field f_uses_opt = {&s_uses_opt, -1};
static Field f_aux_depth = {&s_aux_depth, -1};
static Field f_evaluations = {&s_evaluations, -1};
static Field f_last_callers = {&s_last_callers, -1};
static Field f_nest = {&s_nest, -1};
static Field f_opt_frame = {&s_opt_frame, -1};
static Field f_opt_owner = {&s_opt_owner, -1};
static Field f_opt_t0 = {&s_opt_t0, -1};
static Field f_phase_end = {&s_phase_end, -1};
static Field f_phase_parts = {&s_phase_parts, -1};
static Field f_site_probe = {&s_site_probe, -1};

/* One region record (`wire/record.h`) numbered `next(seq)`, without exception or events, appended. */
static int
append_record(PyObject *append, PyObject *seq, PyObject *kind, PyObject *name, PyObject *parent, PyObject *ref,
              PyObject *t0, PyObject *t1, PyObject *attrs)
{
    PyObject *n = PyIter_Next(seq);
    if (n == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "the span numbers ran out");
        return -1;
    }
    PyObject *record = region_pack(kind, name, n, parent, ref, t0, t1, attrs, Py_None, Py_None);
    Py_DECREF(n);
    if (record == NULL)
        return -1;
    PyObject *res = PyObject_CallOneArg(append, record);
    Py_DECREF(record);
    if (res == NULL)
        return -1;
    Py_DECREF(res);
    return 0;
}

#endif /* OTEL_TRAIN_LOOPS_H */
