/* Detection's per-step work in C: the common paths of the hooks and patched functions that run
 * every micro-batch (the forward hooks, `backward`, the DataLoader fetch, the optimizer's hooks
 * and `zero_grad`, past their compile checks), of the step machine they call (a step's
 * `train_activity`, `close` and `begin`, the optimizer phase's parts), and the loops they run (a
 * closing step's gaps, the fetches a training phase takes over, the frame walk that places a
 * `zero_grad()`, a batch's size).
 *
 * Each has a Python function beside it (`*_python`, or the one named in its doc string): the
 * fallback where this module cannot be built, and what anything uncommon calls from its start
 * before the C code changed anything. tests/test_detect_loops_c.py holds each pair to the same
 * records, state and errors on random states. Why: in automatic mode this was ~85 % of the
 * Python bytecode detection ran a step (issue 31's loop: 3,395 opcodes a step, 508 left, 322 of
 * them torch's own hook dispatch), and each opcode between torch's operations runs with cold
 * caches.
 */
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

typedef struct {
    int64_t a, b;
} Interval;

typedef struct {
    int64_t length, a, b;
} Gap;

static int
interval_cmp(const void *x, const void *y)
{
    const Interval *p = x, *q = y;
    if (p->a != q->a)
        return p->a < q->a ? -1 : 1;
    return (p->b > q->b) - (p->b < q->b);
}

/* Descending (length, a, b): Python's `gaps.sort(reverse=True)` on those tuples. */
static int
gap_cmp_desc(const void *x, const void *y)
{
    const Gap *p = x, *q = y;
    if (p->length != q->length)
        return p->length > q->length ? -1 : 1;
    if (p->a != q->a)
        return p->a > q->a ? -1 : 1;
    return (p->b < q->b) - (p->b > q->b);
}

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

static int
append_gap(PyObject *append, PyObject *seq, PyObject *kind, PyObject *name, PyObject *ref, const Gap *gap)
{
    PyObject *t0 = PyLong_FromLongLong(gap->a), *t1 = PyLong_FromLongLong(gap->b);
    int err = t0 == NULL || t1 == NULL || append_record(append, seq, kind, name, Py_None, ref, t0, t1, Py_None) < 0;
    Py_XDECREF(t0);
    Py_XDECREF(t1);
    return err ? -1 : 0;
}

PyDoc_STRVAR(gaps_doc,
"gaps(cover, t0, t1, max_uncovered, min_gap_ns, append, seq, kind, name, ref)\n--\n\n"
"`coverage.gaps_python`: the step [t0, t1]'s largest gaps between the intervals in `cover`\n"
"([a, b, a, b, ...]) appended as `name` records until what stays uncovered is at most\n"
"`max_uncovered` of the step; returns the uncovered nanoseconds left.");

static int gaps_of(PyObject *cover, int64_t t0, int64_t t1, double share, int64_t min_gap, PyObject *append,
                   PyObject *seq, PyObject *kind, PyObject *name, PyObject *ref, int64_t *total_out);

static PyObject *
gaps(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "gaps() takes 10 arguments");
        return NULL;
    }
    int64_t t0, t1, min_gap, total;
    double share = PyFloat_AsDouble(args[3]);
    if (as_i64(args[1], &t0) < 0 || as_i64(args[2], &t1) < 0 || (share == -1.0 && PyErr_Occurred())
        || as_i64(args[4], &min_gap) < 0
        || gaps_of(args[0], t0, t1, share, min_gap, args[5], args[6], args[7], args[8], args[9], &total) < 0)
        return NULL;
    return PyLong_FromLongLong(total);
}

/* `gaps` on C values: the uncovered nanoseconds left in `*total`. 0, or -1 with an error. */
static int
gaps_of(PyObject *cover, int64_t t0, int64_t t1, double share, int64_t min_gap, PyObject *append, PyObject *seq,
        PyObject *kind, PyObject *name, PyObject *ref, int64_t *total_out)
{
    if (!PyList_Check(cover) || PyList_GET_SIZE(cover) % 2) {
        PyErr_SetString(PyExc_TypeError, "cover must be a list of interval bounds");
        return -1;
    }
    Py_ssize_t n = PyList_GET_SIZE(cover) / 2;
    Interval stack_iv[32];
    Gap stack_gap[33];
    Interval *iv = n <= 32 ? stack_iv : PyMem_Malloc(n * sizeof(Interval));
    Gap *gap = n <= 32 ? stack_gap : PyMem_Malloc((n + 1) * sizeof(Gap));
    int result = -1;
    if (iv == NULL || gap == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    int sorted = 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (as_i64(PyList_GET_ITEM(cover, 2 * i), &iv[i].a) < 0 || as_i64(PyList_GET_ITEM(cover, 2 * i + 1), &iv[i].b) < 0)
            goto done;
        if (i && interval_cmp(&iv[i - 1], &iv[i]) > 0)
            sorted = 0;
    }
    if (!sorted)
        qsort(iv, n, sizeof(Interval), interval_cmp);
    Py_ssize_t ngaps = 0;
    int64_t total = 0, cursor = t0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (iv[i].a > cursor) {
            int64_t end = iv[i].a < t1 ? iv[i].a : t1;
            if (end > cursor) {
                gap[ngaps++] = (Gap){end - cursor, cursor, end};
                total += end - cursor;
            }
        }
        if (iv[i].b > cursor)
            cursor = iv[i].b;
    }
    if (t1 > cursor) {
        gap[ngaps++] = (Gap){t1 - cursor, cursor, t1};
        total += t1 - cursor;
    }
    double allowed = (double)(t1 - t0) * share;
    if ((double)total > allowed) {
        qsort(gap, ngaps, sizeof(Gap), gap_cmp_desc);
        for (Py_ssize_t i = 0; i < ngaps; i++) {
            if ((double)total <= allowed || gap[i].length < min_gap)
                break;
            if (append_gap(append, seq, kind, name, ref, &gap[i]) < 0)
                goto done;
            total -= gap[i].length;
        }
    }
    *total_out = total;
    result = 0;
done:
    if (iv != stack_iv)
        PyMem_Free(iv);
    if (gap != stack_gap)
        PyMem_Free(gap);
    return result;
}

PyDoc_STRVAR(resolve_doc,
"resolve(pending, data, data_attrs, parent, ref, seq, append, kind, cover, train_src)\n--\n\n"
"`machine.resolve_python`: each pending entry ([name, t0, t1, src, iterator, size]) appended as\n"
"a record (`data_attrs` on `data` fetches), its interval added to `cover` (a list, or None);\n"
"returns (the last entry's source or None, whether `train_src` was among them, samples,\n"
"tokens, whether any entry had a size).");

/* The entries of `pending` appended as records; what `resolve` returns, as strong references
 * (`last`, `samples`, `tokens`: NULL for none). 0, or -1 with an error (the references then
 * released). */
static int
resolve_entries(PyObject *pending, PyObject *data, PyObject *data_attrs, PyObject *parent, PyObject *ref, PyObject *seq,
                PyObject *append, PyObject *kind, PyObject *cover, PyObject *train_src, PyObject **last, int *seen_train,
                PyObject **samples, PyObject **tokens, int *sized)
{
    *last = *samples = *tokens = NULL;
    *seen_train = *sized = 0;
    if (!PyList_Check(pending) || (cover != Py_None && !PyList_Check(cover))) {
        PyErr_SetString(PyExc_TypeError, "pending (and cover) must be lists");
        return -1;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(pending); i++) {
        PyObject *entry = PyList_GET_ITEM(pending, i);
        if (!PyList_Check(entry) || PyList_GET_SIZE(entry) != 6) {
            PyErr_SetString(PyExc_TypeError, "a pending entry must be a list of 6");
            goto fail;
        }
        Py_INCREF(entry); /* its fields stay alive while the append runs */
        PyObject *name = PyList_GET_ITEM(entry, 0), *t0 = PyList_GET_ITEM(entry, 1), *t1 = PyList_GET_ITEM(entry, 2);
        PyObject *src = PyList_GET_ITEM(entry, 3), *size = PyList_GET_ITEM(entry, 5);
        int err = append_record(append, seq, kind, name, parent, ref, t0, t1, name == data ? data_attrs : Py_None) < 0
                  || (cover != Py_None && (PyList_Append(cover, t0) < 0 || PyList_Append(cover, t1) < 0));
        if (!err && src != Py_None) {
            Py_XSETREF(*last, Py_NewRef(src));
            if (src == train_src)
                *seen_train = 1;
        }
        if (!err && size != Py_None) {
            *sized = 1;
            if (!PyTuple_Check(size) || PyTuple_GET_SIZE(size) != 2) {
                PyErr_SetString(PyExc_TypeError, "a size must be a (samples, tokens) tuple");
                err = 1;
            } else {
                PyObject *n = PyTuple_GET_ITEM(size, 0), *t = PyTuple_GET_ITEM(size, 1);
                PyObject *sum = *samples == NULL ? Py_NewRef(n) : PyNumber_Add(*samples, n);
                Py_XSETREF(*samples, sum);
                int truthy = sum == NULL ? -1 : PyObject_IsTrue(t);
                if (truthy > 0) {
                    sum = *tokens == NULL ? Py_NewRef(t) : PyNumber_Add(*tokens, t);
                    Py_XSETREF(*tokens, sum);
                    if (sum == NULL)
                        truthy = -1;
                }
                err = truthy < 0;
            }
        }
        Py_DECREF(entry);
        if (err)
            goto fail;
    }
    return 0;
fail:
    Py_CLEAR(*last);
    Py_CLEAR(*samples);
    Py_CLEAR(*tokens);
    return -1;
}

static PyObject *
resolve(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "resolve() takes 10 arguments");
        return NULL;
    }
    PyObject *last, *samples, *tokens;
    int seen_train, sized;
    if (resolve_entries(args[0], args[1], args[2], args[3], args[4], args[5], args[6], args[7], args[8], args[9], &last,
                        &seen_train, &samples, &tokens, &sized) < 0)
        return NULL;
    PyObject *out = PyTuple_Pack(5, last ? last : Py_None, seen_train ? Py_True : Py_False,
                                 samples ? samples : Py_None, tokens ? tokens : Py_None, sized ? Py_True : Py_False);
    Py_XDECREF(last);
    Py_XDECREF(samples);
    Py_XDECREF(tokens);
    return out;
}

/* --- machine.resolve_pending ------------------------------------------------------------- */
/* What `bind_machine` gave: `recorder.current_get`, `recorder.seq`, KIND_SPAN, DATA, MB_ATTRS,
 * `state.mb_attrs`, NO_STEP, TRAIN_SAMPLES, TRAIN_TOKENS. */
static PyObject *g_current_get, *g_seq, *g_kind, *g_data, *g_mb_attrs, *g_mb_attrs_fn, *g_no_step, *g_samples_key,
    *g_tokens_key;

/* `state.mb_attrs(mb)`: the shared attribute dict of micro-batch `mb` (a new reference). */
static PyObject *
micro_batch_attrs(PyObject *mb)
{
    Py_ssize_t i = PyLong_AsSsize_t(mb);
    if (i == -1 && PyErr_Occurred())
        return NULL;
    return i >= 0 && i < PyTuple_GET_SIZE(g_mb_attrs) ? Py_NewRef(PyTuple_GET_ITEM(g_mb_attrs, i))
                                                      : PyObject_CallOneArg(g_mb_attrs_fn, mb);
}

/* `mapping[key] = mapping.get(key, 0) + value` */
static int
add_to(PyObject *mapping, PyObject *key, PyObject *value)
{
    PyObject *old = PyObject_GetItem(mapping, key);
    if (old == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_KeyError))
            return -1;
        PyErr_Clear();
        old = PyLong_FromLong(0);
        if (old == NULL)
            return -1;
    }
    PyObject *sum = PyNumber_Add(old, value);
    Py_DECREF(old);
    int err = sum == NULL || PyObject_SetItem(mapping, key, sum) < 0;
    Py_XDECREF(sum);
    return err ? -1 : 0;
}

/* The batches' samples and tokens added to the step's attributes (`batch_size`). */
static int
add_sizes(PyObject *step, PyObject *samples, PyObject *tokens)
{
    PyObject *attrs = mget(step, &m_step_attrs);
    if (attrs == NULL)
        return -1;
    int err;
    if (attrs == Py_None) {
        PyObject *fresh = PyDict_New();
        err = fresh == NULL || PyDict_SetItem(fresh, g_samples_key, samples) < 0
              || (tokens != NULL && PyDict_SetItem(fresh, g_tokens_key, tokens) < 0)
              || mset(step, &m_step_attrs_w, fresh) < 0;
        Py_XDECREF(fresh);
    } else {
        err = add_to(attrs, g_samples_key, samples) < 0 || (tokens != NULL && add_to(attrs, g_tokens_key, tokens) < 0);
    }
    Py_DECREF(attrs);
    return err ? -1 : 0;
}

PyDoc_STRVAR(resolve_pending_doc,
"resolve_pending(r, s)\n--\n\n"
"`machine.resolve_pending_python`: the batches fetched (and zero_grads made) before this\n"
"training phase recorded in recorder `r` as its step's, from detection state `s`.");

static PyObject *
resolve_pending(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (call_ok(nargs == 2, "resolve_pending() takes 2 arguments", g_current_get != NULL, "bind_machine") < 0)
        return NULL;
    PyObject *r = args[0], *s = args[1];
    PyObject *mb = NULL, *data_attrs = NULL, *parent = NULL, *parent_seq = NULL, *step = NULL, *s_step_obj = NULL;
    PyObject *ref = NULL, *append = NULL, *cover = NULL, *train_src = NULL, *pending = NULL, *result = NULL;
    PyObject *last = NULL, *samples = NULL, *tokens = NULL;
    int seen_train = 0, sized = 0;
    if ((mb = sget(s, &f_mb)) == NULL || (data_attrs = micro_batch_attrs(mb)) == NULL
        || (parent = PyObject_CallNoArgs(g_current_get)) == NULL)
        goto done;
    parent_seq = Py_NewRef(Py_None);
    if (parent != Py_None) {
        PyObject *rec = mget(parent, &m_region_rec);
        if (rec == NULL)
            goto done;
        int same = rec == r;
        Py_DECREF(rec);
        if (same) {
            Py_SETREF(parent_seq, mget(parent, &m_region_seq));
            if (parent_seq == NULL)
                goto done;
        }
    }
    if ((step = mget(r, &m_rec_step)) == NULL || (s_step_obj = sget(s, &f_step)) == NULL)
        goto done;
    int ours = s_step_obj != Py_None && step == s_step_obj && parent_seq == Py_None; /* top level of our step */
    ref = step != Py_None ? mget(step, &m_step_ref) : Py_NewRef(g_no_step);
    if (ref == NULL || (append = PyObject_GetAttr(r, s_append)) == NULL)
        goto done;
    cover = ours ? sget(s, &f_cover) : Py_NewRef(Py_None);
    if (cover == NULL || (train_src = sget(s, &f_train_src)) == NULL
        || (pending = sget(s, &f_pending)) == NULL)
        goto done;
    if (resolve_entries(pending, g_data, data_attrs, parent_seq, ref, g_seq, append, g_kind, cover, train_src, &last,
                        &seen_train, &samples, &tokens, &sized) < 0)
        goto done;
    if (PyList_SetSlice(pending, 0, PyList_GET_SIZE(pending), NULL) < 0)
        goto done;
    if (sized) {
        Py_SETREF(s_step_obj, sget(s, &f_step));
        if (s_step_obj == NULL || (s_step_obj != Py_None && add_sizes(s_step_obj, samples, tokens) < 0))
            goto done;
    }
    if (last != NULL) {
        PyObject *driven = sget(s, &f_data_driven);
        if (driven == NULL)
            goto done;
        int unset = driven == Py_None;
        Py_DECREF(driven);
        if ((unset && sset(s, &f_data_driven, Py_True) < 0)
            || ((train_src == Py_None || !seen_train) && sset(s, &f_train_src, last) < 0))
            goto done;
    }
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(mb);
    Py_XDECREF(data_attrs);
    Py_XDECREF(parent);
    Py_XDECREF(parent_seq);
    Py_XDECREF(step);
    Py_XDECREF(s_step_obj);
    Py_XDECREF(ref);
    Py_XDECREF(append);
    Py_XDECREF(cover);
    Py_XDECREF(train_src);
    Py_XDECREF(pending);
    Py_XDECREF(last);
    Py_XDECREF(samples);
    Py_XDECREF(tokens);
    return result;
}

PyDoc_STRVAR(bind_machine_doc,
"bind_machine(current_get, seq, kind_span, data, mb_attrs, mb_attrs_fn, no_step, samples_key, tokens_key)\n--\n\n"
"What `resolve_pending` reads besides its arguments: `recorder.current_get`, `recorder.seq`,\n"
"KIND_SPAN, the data span's name, `state.MB_ATTRS` and `state.mb_attrs`, NO_STEP and the\n"
"step's size attribute keys.");

static PyObject *
bind_machine(PyObject *module, PyObject *args)
{
    PyObject *o[9];
    if (!PyArg_UnpackTuple(args, "bind_machine", 9, 9, &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7], &o[8]))
        return NULL;
    if (!PyTuple_Check(o[4])) {
        PyErr_SetString(PyExc_TypeError, "mb_attrs must be a tuple");
        return NULL;
    }
    PyObject **slots[9] = {&g_current_get, &g_seq, &g_kind, &g_data, &g_mb_attrs, &g_mb_attrs_fn, &g_no_step,
                           &g_samples_key, &g_tokens_key};
    for (int i = 0; i < 9; i++)
        Py_XSETREF(*slots[i], Py_NewRef(o[i]));
    Py_RETURN_NONE;
}

/* --- machine.train_activity -------------------------------------------------------------- */
static PyObject *begin(PyObject *r, PyObject *s, PyObject *t);
/* Its common paths here: a phase of the open step, a new micro-batch, the update's phase ended
 * by the next phase, and the next step begun by a forward after an update where no batch fetch
 * closes steps (a loop without a `DataLoader`). Anything else (an evaluation to end, a step to
 * close for a manual update, gradient accumulation to tell from one) calls the Python function,
 * from its start before anything is changed here, or once the update's phase is ended (its
 * first line, which it then skips): so the two cannot disagree. */
static PyObject *g_train_activity_python, *g_step_type, *g_one;
static PyObject *g_close_phase_end; /* `phase.end` (`bind_close`) */
static PyObject *close_(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
static long g_ph_fwd = -1, g_ph_opt = -1, g_ph_bwd = -1;

/* The attribute's truth value: 1, 0, or -1 with an error. */
static int
attr_true(PyObject *obj, PyObject *name)
{
    return true_of(PyObject_GetAttr(obj, name));
}

PyDoc_STRVAR(train_activity_doc,
"train_activity(r, s, t, phase_kind, module=None)\n--\n\n"
"`machine.train_activity_python`'s common paths (a phase of the open step, a new micro-batch,\n"
"its fetches resolved, the update's phase ended, the next step after an update with no fetch to\n"
"close it); the Python function for anything else.");

static PyObject *
train_activity(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 4 || nargs > 5) {
        PyErr_SetString(PyExc_TypeError, "train_activity() takes 4 or 5 arguments");
        return NULL;
    }
    if (g_train_activity_python == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_loops.bind_train_activity() was not called");
        return NULL;
    }
    PyObject *r = args[0], *s = args[1], *step = NULL, *s_step_obj = NULL;
    long kind = PyLong_AsLong(args[3]);
    if (kind == -1 && PyErr_Occurred())
        return NULL;
    int slow = 0, end_phase = 0, v;
    if (kind != g_ph_opt) {
        if ((v = sattr_none(s, &f_phase)) < 0)
            return NULL;
        end_phase = !v; /* the update is over: its phase ends */
    }
    if ((v = sattr_none(s, &f_eval_t0)) < 0)
        return NULL;
    if (!v) { /* an evaluation pass in progress */
        if ((v = sattr_true(s, &f_eval_explicit)) < 0)
            return NULL;
        slow = !v;
    }
    if (slow || (end_phase && g_close_phase_end == NULL))
        return PyObject_Vectorcall(g_train_activity_python, args, nargs, NULL);
    if (end_phase) { /* the Python function's first line; from here on it would skip it */
        PyObject *res = PyObject_CallFunctionObjArgs(g_close_phase_end, r, s, NULL);
        if (res == NULL)
            return NULL;
        Py_DECREF(res);
    }
    if ((step = mget(r, &m_rec_step)) == NULL)
        return NULL;
    if ((v = PyObject_IsInstance(step, g_step_type)) < 0)
        goto fail;
    if (!v) { /* no step open: one begins */
        Py_SETREF(step, begin(r, s, args[2]));
        if (step == NULL)
            goto fail;
        goto resolve;
    }
    if ((s_step_obj = sget(s, &f_step)) == NULL)
        goto fail;
    if (step != s_step_obj) { /* the user's explicit `otel_train.step()` rules; phases only */
        Py_DECREF(s_step_obj);
        return step;
    }
    Py_CLEAR(s_step_obj);
    int new_mb = 0;
    if (kind != g_ph_opt) {
        int mb_bwd = sattr_true(s, &f_mb_bwd), mb_fwd = mb_bwd < 0 ? -1 : sattr_true(s, &f_mb_fwd);
        int no_opt_end = mb_fwd < 0 ? -1 : sattr_none(s, &f_opt_end);
        int driven = no_opt_end < 0 ? -1 : sattr_true(s, &f_data_driven);
        if (driven < 0)
            goto fail;
        new_mb = mb_bwd && (kind == g_ph_fwd || !mb_fwd);
        if (!no_opt_end && !driven) { /* a new forward after an optimizer step begins a new step */
            PyObject *opt_end = sget(s, &f_opt_end);
            if (opt_end == NULL)
                goto fail;
            PyObject *const closing[3] = {r, s, opt_end};
            PyObject *res = close_(module, closing, 3);
            Py_DECREF(opt_end);
            if (res == NULL)
                goto fail;
            Py_DECREF(res);
            Py_SETREF(step, begin(r, s, args[2]));
            if (step == NULL)
                goto fail;
            goto resolve;
        } else if (new_mb && no_opt_end) {
            PyObject *uses_opt = sget(s, &f_uses_opt);
            if (uses_opt == NULL)
                goto fail;
            slow = uses_opt != Py_True; /* maybe a manual update, not accumulation */
            Py_DECREF(uses_opt);
        }
    }
    if (slow) {
        Py_XDECREF(step);
        return PyObject_Vectorcall(g_train_activity_python, args, nargs, NULL);
    }
    if (new_mb) { /* gradient accumulation: the next micro-batch */
        PyObject *mb = sget(s, &f_mb);
        PyObject *next = mb == NULL ? NULL : PyNumber_Add(mb, g_one);
        Py_XDECREF(mb);
        int err = next == NULL || sset(s, &f_mb, next) < 0 || sset(s, &f_mb_fwd, Py_False) < 0
                  || sset(s, &f_mb_bwd, Py_False) < 0;
        Py_XDECREF(next);
        if (err)
            goto fail;
    }
resolve:
    if ((v = sattr_true(s, &f_pending)) < 0)
        goto fail;
    if (v) {
        PyObject *const pair[2] = {r, s};
        PyObject *done = resolve_pending(module, pair, 2);
        if (done == NULL)
            goto fail;
        Py_DECREF(done);
    }
    return step;
fail:
    Py_XDECREF(step);
    Py_XDECREF(s_step_obj);
    return NULL;
}

PyDoc_STRVAR(bind_train_activity_doc,
"bind_train_activity(python_function, step_type, ph_fwd, ph_opt)\n--\n\n"
"`machine.train_activity_python`, `recorder.Step` and the phase kinds PH_FWD and PH_OPT.");

static PyObject *
bind_train_activity(PyObject *module, PyObject *args)
{
    PyObject *fn, *step_type;
    long fwd, opt;
    if (!PyArg_ParseTuple(args, "OOll:bind_train_activity", &fn, &step_type, &fwd, &opt))
        return NULL;
    Py_XSETREF(g_train_activity_python, Py_NewRef(fn));
    Py_XSETREF(g_step_type, Py_NewRef(step_type));
    g_ph_fwd = fwd;
    g_ph_opt = opt;
    Py_RETURN_NONE;
}

/* A training phase's recorded region `live` has ended: its end is the step's latest so far and,
 * a top-level phase (`ours`: of our open step), it covers (`coverage.cover`). 0, or -1. */

static int
phase_ended(PyObject *s, PyObject *live, int ours)
{
    PyObject *t0 = NULL, *t1 = NULL, *parent = NULL, *cover = NULL;
    int err = (t1 = mget(live, &m_region_t1)) == NULL || sset(s, &f_last_end, t1) < 0
              || (parent = mget(live, &m_region_parent)) == NULL;
    if (!err && parent == Py_None && ours) {
        cover = sget(s, &f_cover);
        if (cover != NULL && !PyList_Check(cover)) {
            PyErr_SetString(PyExc_TypeError, "State.cover must be a list");
            Py_CLEAR(cover);
        }
        err = cover == NULL || (t0 = mget(live, &m_region_t0)) == NULL || PyList_Append(cover, t0) < 0
              || PyList_Append(cover, t1) < 0;
    }
    Py_XDECREF(t0);
    Py_XDECREF(t1);
    Py_XDECREF(parent);
    Py_XDECREF(cover);
    return err ? -1 : 0;
}

/* --- machine.close, machine.begin, machine.track_epoch ------------------------------------ */
static PyObject *g_close_step, *g_close_roots, *g_other, *g_uncovered_key;
static PyObject *g_track_step_type, *g_epoch_zero;
static double g_max_uncovered = 0.0;
static int64_t g_min_gap = 0;


/* `coverage.close`: the closing step's gaps as `train.other`, the rest on it as uncovered_s. */
static int
coverage_close(PyObject *r, PyObject *s, PyObject *step, PyObject *t1)
{
    PyObject *cover = sget(s, &f_cover), *fresh = PyList_New(0), *t0 = NULL, *append = NULL, *ref = NULL;
    PyObject *attrs = NULL, *seconds = NULL;
    int64_t start, end, total;
    int err = cover == NULL || fresh == NULL || sset(s, &f_cover, fresh) < 0
              || (t0 = mget(step, &m_step_t0)) == NULL || as_i64(t0, &start) < 0 || as_i64(t1, &end) < 0
              || (append = PyObject_GetAttr(r, s_append)) == NULL || (ref = mget(step, &m_step_ref)) == NULL
              || gaps_of(cover, start, end, g_max_uncovered, g_min_gap, append, g_seq, g_kind, g_other, ref, &total) < 0
              || (seconds = PyFloat_FromDouble((double)total / 1e9)) == NULL
              || (attrs = mget(step, &m_step_attrs)) == NULL;
    if (!err) {
        if (attrs == Py_None) {
            PyObject *d = PyDict_New();
            err = d == NULL || PyDict_SetItem(d, g_uncovered_key, seconds) < 0 || mset(step, &m_step_attrs_w, d) < 0;
            Py_XDECREF(d);
        } else {
            err = PyObject_SetItem(attrs, g_uncovered_key, seconds) < 0;
        }
    }
    Py_XDECREF(cover);
    Py_XDECREF(fresh);
    Py_XDECREF(t0);
    Py_XDECREF(append);
    Py_XDECREF(ref);
    Py_XDECREF(attrs);
    Py_XDECREF(seconds);
    return err ? -1 : 0;
}

/* `s.<name> = t` where it is None or earlier than `t`. */
static int
move_up(PyObject *s, Field *field, PyObject *t)
{
    PyObject *cur = sget(s, field);
    if (cur == NULL)
        return -1;
    int later = cur == Py_None ? 1 : PyObject_RichCompareBool(cur, t, Py_LT);
    Py_DECREF(cur);
    return later < 0 ? -1 : later ? sset(s, field, t) : 0;
}

PyDoc_STRVAR(close_doc,
"close(r, s, t1)\n--\n\n"
"`machine.close_python`: close the step detection opened at `t1`, which becomes the next\n"
"step's boundary.");

static PyObject *
close_(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (call_ok(nargs == 3, "close(r, s, t1)", g_close_step != NULL, "bind_close") < 0)
        return NULL;
    PyObject *r = args[0], *s = args[1], *t1 = Py_NewRef(args[2]), *step = NULL, *open = NULL;
    int v = sattr_none(s, &f_phase);
    if (v < 0)
        goto fail;
    if (!v) { /* the update's phase ends first */
        PyObject *res = PyObject_CallFunctionObjArgs(g_close_phase_end, r, s, NULL);
        if (res == NULL)
            goto fail;
        Py_DECREF(res);
    }
    if ((step = sget(s, &f_step)) == NULL || sset(s, &f_step, Py_None) < 0
        || sset(s, &f_opt_end, Py_None) < 0 || (open = mget(r, &m_rec_step)) == NULL)
        goto fail;
    if (step != Py_None && open == step) {
        PyObject *t0 = mget(step, &m_step_t0);
        int later = t0 == NULL ? -1 : PyObject_RichCompareBool(t1, t0, Py_GT);
        if (later == 0)
            Py_SETREF(t1, Py_NewRef(t0));
        Py_XDECREF(t0);
        if (later < 0 || coverage_close(r, s, step, t1) < 0)
            goto fail;
        PyObject *res = PyObject_CallFunctionObjArgs(g_close_step, r, step, t1, Py_None, NULL);
        if (res == NULL)
            goto fail;
        Py_DECREF(res);
        int disc = true_of(mget(g_close_roots, &m_roots_discovering)), due = disc;
        PyObject *n = disc < 0 ? NULL : mget(step, &m_step_n);
        if (n == NULL)
            goto fail;
        if (!disc) { /* read each time: tests change it */
            PyObject *every = PyObject_GetAttr(g_close_roots, s_rediscover_every);
            PyObject *rem = every == NULL ? NULL : PyNumber_Remainder(n, every);
            due = rem == NULL ? -1 : !PyObject_IsTrue(rem);
            Py_XDECREF(rem);
            Py_XDECREF(every);
        }
        if (due > 0) {
            res = PyObject_CallMethodOneArg(g_close_roots, s_step_closed, n);
            Py_XDECREF(res);
            due = res == NULL ? -1 : 1;
        }
        Py_DECREF(n);
        if (due < 0 || move_up(s, &f_after, t1) < 0) /* `coverage.sibling_end` */
            goto fail;
    }
    if (move_up(s, &f_boundary, t1) < 0)
        goto fail;
    Py_DECREF(t1);
    Py_DECREF(step);
    Py_DECREF(open);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(t1);
    Py_XDECREF(step);
    Py_XDECREF(open);
    return NULL;
}

/* `machine.track_epoch`: a new iterator of the training loader, or a training loader never seen
 * before, is a new epoch. 0, or -1 with an error. */
static int
track_epoch(PyObject *s, PyObject *pending)
{
    PyObject *train_src = sget(s, &f_train_src), *last = NULL;
    if (train_src == NULL)
        return -1;
    int found = 0, err = 0;
    Py_ssize_t n = PyList_GET_SIZE(pending);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *entry = PyList_GET_ITEM(pending, i);
        if (PyList_GET_ITEM(entry, 4) != Py_None) {
            last = entry;
            if (train_src != Py_None && PyList_GET_ITEM(entry, 3) == train_src)
                found = 1;
        }
    }
    if (last == NULL) {
        Py_DECREF(train_src);
        return 0;
    }
    if (!found) {
        Py_SETREF(train_src, Py_NewRef(PyList_GET_ITEM(last, 3)));
        if (sset(s, &f_train_src, train_src) < 0)
            goto done;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(pending) && !err; i++) {
        PyObject *entry = PyList_GET_ITEM(pending, i), *it = PyList_GET_ITEM(entry, 4);
        if (it == Py_None || PyList_GET_ITEM(entry, 3) != train_src)
            continue;
        PyObject *ref = sget(s, &f_train_iter), *current = NULL;
        if (ref == NULL) {
            err = 1;
            break;
        }
        if (ref != Py_None && (current = PyObject_CallNoArgs(ref)) == NULL) {
            Py_DECREF(ref);
            err = 1;
            break;
        }
        int same = current == it;
        Py_XDECREF(current);
        Py_DECREF(ref);
        if (same)
            continue;
        Py_INCREF(it);
        PyObject *epoch = sget(s, &f_epoch), *next = NULL, *weak = NULL;
        if (epoch != NULL)
            next = epoch == Py_None ? Py_NewRef(g_epoch_zero) : PyNumber_Add(epoch, g_one);
        err = next == NULL || sset(s, &f_epoch, next) < 0
              || (weak = PyWeakref_NewRef(it, NULL)) == NULL /* weak: a dead iterator must shut its workers down */
              || sset(s, &f_train_iter, weak) < 0;
        Py_XDECREF(epoch);
        Py_XDECREF(next);
        Py_XDECREF(weak);
        Py_DECREF(it);
    }
done:
    Py_DECREF(train_src);
    return err || PyErr_Occurred() ? -1 : 0;
}

/* `machine.begin`: open a step for a training phase at `t`, backdated to the boundary or its
 * first fetch. A new reference to the step (or None), NULL with an error. */
static PyObject *
begin(PyObject *r, PyObject *s, PyObject *t)
{
    if (g_track_step_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_loops.bind_close() was not called");
        return NULL;
    }
    PyObject *t0 = Py_NewRef(t), *pending = sget(s, &f_pending), *step = NULL, *epoch = NULL;
    PyObject *boundary = NULL, *rec = NULL, *zero = NULL, *stepped = NULL, *cover = NULL;
    if (pending == NULL || !PyList_Check(pending)) {
        if (pending != NULL)
            PyErr_SetString(PyExc_TypeError, "State.pending must be a list");
        goto fail;
    }
    if (PyList_GET_SIZE(pending)) {
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(pending); i++) {
            PyObject *entry = PyList_GET_ITEM(pending, i);
            if (!PyList_Check(entry) || PyList_GET_SIZE(entry) != 6) {
                PyErr_SetString(PyExc_TypeError, "a pending entry must be a list of 6");
                goto fail;
            }
            int earlier = PyObject_RichCompareBool(PyList_GET_ITEM(entry, 1), t0, Py_LT);
            if (earlier < 0)
                goto fail;
            if (earlier)
                Py_SETREF(t0, Py_NewRef(PyList_GET_ITEM(entry, 1)));
        }
        int fixed = sattr_true(s, &f_epoch_fixed);
        if (fixed < 0 || (!fixed && track_epoch(s, pending) < 0))
            goto fail;
    }
    if ((boundary = sget(s, &f_boundary)) == NULL)
        goto fail;
    if (boundary != Py_None) {
        int earlier = PyObject_RichCompareBool(boundary, t0, Py_LT);
        if (earlier < 0)
            goto fail;
        if (earlier)
            Py_SETREF(t0, Py_NewRef(boundary));
    }
    if ((epoch = sget(s, &f_epoch)) == NULL
        || (step = PyObject_CallFunctionObjArgs(g_track_step_type, Py_None, epoch, Py_None, NULL)) == NULL)
        goto fail;
    PyObject *entered = enter_of(step);
    if (entered == NULL)
        goto fail;
    Py_DECREF(entered);
    if ((rec = mget(step, &m_step_rec)) == NULL)
        goto fail;
    if (rec == Py_None)
        Py_SETREF(step, Py_NewRef(Py_None));
    else if (mset(step, &m_step_t0_w, t0) < 0)
        goto fail;
    if (sset(s, &f_step, step) < 0 || (zero = PyLong_FromLong(0)) == NULL || sset(s, &f_mb, zero) < 0
        || sset(s, &f_mb_fwd, Py_False) < 0 || sset(s, &f_mb_bwd, Py_False) < 0
        || sset(s, &f_opt_end, Py_None) < 0 || sset(s, &f_last_end, Py_None) < 0
        || (stepped = sget(s, &f_stepped)) == NULL || !PyList_Check(stepped)
        || PyList_SetSlice(stepped, 0, PyList_GET_SIZE(stepped), NULL) < 0 || (cover = PyList_New(0)) == NULL
        || sset(s, &f_cover, cover) < 0) {
        if (stepped != NULL && !PyList_Check(stepped))
            PyErr_SetString(PyExc_TypeError, "State.stepped must be a list");
        goto fail;
    }
    Py_DECREF(t0);
    Py_DECREF(pending);
    Py_DECREF(epoch);
    Py_DECREF(boundary);
    Py_DECREF(rec);
    Py_DECREF(zero);
    Py_DECREF(stepped);
    Py_DECREF(cover);
    return step;
fail:
    Py_XDECREF(t0);
    Py_XDECREF(pending);
    Py_XDECREF(step);
    Py_XDECREF(epoch);
    Py_XDECREF(boundary);
    Py_XDECREF(rec);
    Py_XDECREF(zero);
    Py_XDECREF(stepped);
    Py_XDECREF(cover);
    return NULL;
}

PyDoc_STRVAR(bind_close_doc,
"bind_close(phase_end, close_step, roots, step_type, max_uncovered, min_gap_ns, other, uncovered_key)\n--\n\n"
"What `close` and the step `train_activity` opens read: `phase.end`, `recorder.close_step`,\n"
"`roots.roots`, `recorder.Step`, `coverage.MAX_UNCOVERED` and `MIN_GAP_NS`, the `train.other`\n"
"name and the `train.step.uncovered_s` key. After `bind_machine`.");

static PyObject *
bind_close(PyObject *module, PyObject *args)
{
    PyObject *o[4], *other, *key;
    double share;
    long long min_gap;
    if (!PyArg_ParseTuple(args, "OOOOdLOO:bind_close", &o[0], &o[1], &o[2], &o[3], &share, &min_gap, &other, &key))
        return NULL;
    PyObject **slots[4] = {&g_close_phase_end, &g_close_step, &g_close_roots, &g_track_step_type};
    for (int i = 0; i < 4; i++)
        Py_XSETREF(*slots[i], Py_NewRef(o[i]));
    Py_XSETREF(g_other, Py_NewRef(other));
    Py_XSETREF(g_uncovered_key, Py_NewRef(key));
    g_max_uncovered = share;
    g_min_gap = min_gap;
    Py_RETURN_NONE;
}

/* --- forward.forward_pre_hook / forward_hook, after their compile check ------------------ */
/* Their common path (a training forward of the open step begins; the outermost forward ends);
 * anything else calls the Python body from its start, before anything is changed here. The
 * hooks themselves stay Python functions: Dynamo traces them (`compile`). */
static PyObject *g_state, *g_roots, *g_recorder_module, *g_loss_type, *g_grad_enabled, *g_region_type, *g_forward;
static PyObject *g_begin_python, *g_end_python;
static long g_fwd_train = -1, g_fwd_eval = -1;

/* A training phase's region (`name`: forward or backward) of the current micro-batch, entered:
 * `state.region(name, mb_attrs(s.mb))`. A new reference, NULL with an error. */
static PyObject *
enter_phase(PyObject *s, PyObject *name)
{
    PyObject *live = PyObject_CallOneArg(g_region_type, name), *mb = NULL, *attrs = NULL, *entered = NULL;
    if (live != NULL && (mb = sget(s, &f_mb)) != NULL && (attrs = micro_batch_attrs(mb)) != NULL
        && mset(live, &m_region_attrs_w, attrs) == 0)
        entered = enter_of(live);
    Py_XDECREF(live);
    Py_XDECREF(mb);
    Py_XDECREF(attrs);
    return entered;
}

/* A phase of micro-batch `s.mb` ran in `step`: if that is our open step, it has `s.mb + 1`
 * micro-batches so far. 0, or -1 with an error. */
static int
count_micro_batches(PyObject *s, PyObject *step)
{
    if (step == Py_None)
        return 0;
    PyObject *ours = sget(s, &f_step);
    if (ours == NULL)
        return -1;
    int is_ours = ours == step;
    Py_DECREF(ours);
    if (!is_ours)
        return 0;
    PyObject *mb = sget(s, &f_mb), *count = mb == NULL ? NULL : PyNumber_Add(mb, g_one);
    int err = count == NULL || mset(step, &m_step_micro_batches_w, count) < 0;
    Py_XDECREF(mb);
    Py_XDECREF(count);
    return err ? -1 : 0;
}

PyDoc_STRVAR(forward_begin_doc,
"forward_begin(module)\n--\n\n"
"`forward.forward_begin_python`'s common path: a training forward of the open step begins.");

static PyObject *
forward_begin(PyObject *module_, PyObject *module)
{
    if (g_begin_python == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_loops.bind_forward() was not called");
        return NULL;
    }
    PyObject *s = g_state, *r = NULL, *t = NULL, *step = NULL, *entered = NULL;
    PyObject *depth = sget(s, &f_fwd_depth);
    if (depth == NULL)
        return NULL;
    int nested = PyObject_IsTrue(depth);
    if (nested != 0) { /* inside the outermost forward: count it */
        PyObject *more = nested < 0 ? NULL : PyNumber_Add(depth, g_one);
        Py_DECREF(depth);
        int err = more == NULL || sset(s, &f_fwd_depth, more) < 0;
        Py_XDECREF(more);
        return err ? NULL : Py_NewRef(Py_None);
    }
    Py_DECREF(depth);
    int v = sattr_true(s, &f_fetching);
    if (v != 0) /* a transform module inside a batch fetch */
        return v < 0 ? NULL : Py_NewRef(Py_None);
    /* The common case only: not discovering roots, recording, a training-mode module with
     * gradients (not a loss module), outside optimizer.step(). */
    int slow = (v = true_of(mget(g_roots, &m_roots_discovering))) != 0;
    if (!slow) {
        if ((r = module_attr(g_recorder_module, s_rec_)) == NULL)
            return NULL;
        slow = r == Py_None;
    }
    if (!slow && (slow = PyObject_IsInstance(module, g_loss_type)) == 0) {
        PyObject *grad = g_replay != NULL ? Py_NewRef(PyTuple_GET_ITEM(g_replay, RP_GRAD))
                                          : PyObject_CallNoArgs(g_grad_enabled);
        slow = grad == NULL ? -1 : !PyObject_IsTrue(grad);
        Py_XDECREF(grad);
        if (slow == 0 && g_replay != NULL)
            slow = !(v = PyObject_IsTrue(PyTuple_GET_ITEM(g_replay, RP_TRAINING)));
        else if (slow == 0)
            slow = (v = attr_true(module, s_training)) < 0 ? -1 : !v;
        if (slow == 0)
            slow = sattr_true(s, &f_opt_depth); /* maybe a closure evaluation inside the update */
    }
    if (v < 0 || slow < 0)
        goto fail;
    if (slow) {
        Py_XDECREF(r);
        return PyObject_CallOneArg(g_begin_python, module);
    }
    PyObject *fwd_train = PyLong_FromLong(g_fwd_train);
    if (fwd_train == NULL || (t = now_of(r)) == NULL
        || sset(s, &f_copying, Py_False) < 0 || sset(s, &f_fwd_kind, fwd_train) < 0
        || sset(s, &f_fwd_nested, Py_False) < 0) {
        Py_XDECREF(fwd_train);
        goto fail;
    }
    Py_DECREF(fwd_train);
    PyObject *ph_fwd = PyLong_FromLong(g_ph_fwd);
    if (ph_fwd == NULL)
        goto fail;
    PyObject *const call[5] = {r, s, t, ph_fwd, module};
    step = train_activity(NULL, call, 5);
    Py_DECREF(ph_fwd);
    if (step == NULL || (entered = enter_phase(s, g_forward)) == NULL || sset(s, &f_fwd_region, entered) < 0
        || sset(s, &f_mb_fwd, Py_True) < 0 || count_micro_batches(s, step) < 0 || sset(s, &f_fwd_depth, g_one) < 0)
        goto fail;
    Py_DECREF(r);
    Py_DECREF(t);
    Py_DECREF(step);
    Py_DECREF(entered);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(r);
    Py_XDECREF(t);
    Py_XDECREF(step);
    Py_XDECREF(entered);
    return NULL;
}

/* A forward of our step that began after its update was done (a sample, `netG(fixed_noise)`;
 * a GAN's next update's forward): the step's update now ends after it, so whatever closes the
 * step next (the next batch, an evaluation, the end) closes it after this forward, never before
 * it. `forward.forward_end_python`'s rule; 0, or -1 with an error. */
static int
after_update(PyObject *s, PyObject *live)
{
    PyObject *opt_end = sget(s, &f_opt_end), *t0 = NULL, *t1 = NULL;
    int err = opt_end == NULL;
    if (!err && opt_end != Py_None) {
        int after = (t0 = mget(live, &m_region_t0)) == NULL ? -1 : PyObject_RichCompareBool(t0, opt_end, Py_GE);
        err = after < 0 || (after && ((t1 = mget(live, &m_region_t1)) == NULL || sset(s, &f_opt_end, t1) < 0));
    }
    Py_XDECREF(opt_end);
    Py_XDECREF(t0);
    Py_XDECREF(t1);
    return err ? -1 : 0;
}

PyDoc_STRVAR(forward_end_doc,
"forward_end(module)\n--\n\n"
"`forward.forward_end_python`'s common path: the outermost forward in flight ends.");

static PyObject *
forward_end(PyObject *module_, PyObject *module)
{
    if (g_end_python == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_loops.bind_forward() was not called");
        return NULL;
    }
    PyObject *s = g_state;
    PyObject *depth = sget(s, &f_fwd_depth);
    if (depth == NULL)
        return NULL;
    long d = PyLong_AsLong(depth);
    Py_DECREF(depth);
    if (d == -1 && PyErr_Occurred())
        return NULL;
    if (d == 0)
        Py_RETURN_NONE;
    if (d > 1) { /* an inner forward of the outermost one */
        PyObject *less = PyLong_FromLong(d - 1);
        int err = less == NULL || sset(s, &f_fwd_depth, less) < 0;
        Py_XDECREF(less);
        return err ? NULL : Py_NewRef(Py_None);
    }
    PyObject *kind_obj = sget(s, &f_fwd_kind);
    if (kind_obj == NULL)
        return NULL;
    long kind = PyLong_AsLong(kind_obj);
    Py_DECREF(kind_obj);
    if (kind == -1 && PyErr_Occurred())
        return NULL;
    if (kind == g_fwd_eval)
        return PyObject_CallOneArg(g_end_python, module);
    PyObject *zero = PyLong_FromLong(0);
    int err = zero == NULL || sset(s, &f_fwd_depth, zero) < 0;
    Py_XDECREF(zero);
    if (err)
        return NULL;
    if (kind != g_fwd_train)
        Py_RETURN_NONE;
    PyObject *live = sget(s, &f_fwd_region);
    if (live == NULL || sset(s, &f_fwd_region, Py_None) < 0)
        goto fail;
    if (live == Py_None) {
        Py_DECREF(live);
        Py_RETURN_NONE;
    }
    PyObject *res = exit_of(live, Py_None, Py_None, Py_None);
    if (res == NULL)
        goto fail;
    Py_DECREF(res);
    int recorded = none_of(mget(live, &m_region_rec)), nested = recorded < 0 ? -1 : sattr_true(s, &f_fwd_nested);
    if (recorded < 0 || nested < 0)
        goto fail;
    if (!recorded && !nested) { /* recorded, and not a closure evaluation inside the update */
        PyObject *step = mget(live, &m_region_step), *ours = step == NULL ? NULL : sget(s, &f_step);
        err = ours == NULL || phase_ended(s, live, step == ours) < 0 || (step == ours && after_update(s, live) < 0);
        Py_XDECREF(step);
        Py_XDECREF(ours);
        if (err)
            goto fail;
    }
    Py_DECREF(live);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(live);
    return NULL;
}

PyDoc_STRVAR(bind_forward_doc,
"bind_forward(state, roots, recorder_module, loss_type, is_grad_enabled, region_type, forward_name,\n"
"             begin_python, end_python, fwd_train, fwd_eval)\n--\n\n"
"What `forward_begin` and `forward_end` read: detection's state, `roots.roots`, the\n"
"`otel_train.record.recorder` module, torch's loss base class and `is_grad_enabled`,\n"
"`recorder.Region`, the forward span's name, the Python bodies and FWD_TRAIN, FWD_EVAL.");

static PyObject *
bind_forward(PyObject *module, PyObject *args)
{
    PyObject *o[9];
    long train, eval;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOll:bind_forward", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7],
                          &o[8], &train, &eval))
        return NULL;
    PyObject **slots[9] = {&g_state, &g_roots, &g_recorder_module, &g_loss_type, &g_grad_enabled, &g_region_type,
                           &g_forward, &g_begin_python, &g_end_python};
    for (int i = 0; i < 9; i++)
        Py_XSETREF(*slots[i], Py_NewRef(o[i]));
    g_fwd_train = train;
    g_fwd_eval = eval;
    Py_RETURN_NONE;
}

/* --- backward.backward, after its compile check ------------------------------------------ */
static PyObject *g_backward, *g_backward_python, *g_part_begin, *g_part_step;

/* The backward region ends (its exception, if any, pending and kept) and the state moves on:
 * `backward.backward_python`'s finally block. 0, or -1 with a new error. */
static int
backward_done(PyObject *s, PyObject *live, PyObject *step)
{
    PyObject *zero = PyLong_FromLong(0);
    int err = zero == NULL || sset(s, &f_bwd_depth, zero) < 0 || sset(s, &f_mb_bwd, Py_True) < 0;
    Py_XDECREF(zero);
    if (err)
        return -1;
    PyObject *ours = sget(s, &f_step);
    if (ours == NULL)
        return -1;
    int is_ours = step != Py_None && step == ours;
    Py_DECREF(ours);
    if (count_micro_batches(s, step) < 0)
        return -1;
    int unrecorded = none_of(mget(live, &m_region_rec));
    if (unrecorded < 0)
        return -1;
    if (!unrecorded && phase_ended(s, live, is_ours) < 0)
        return -1;
    int opt = sattr_true(s, &f_opt_depth), closure = opt <= 0 ? opt : sattr_true(s, &f_opt_closure);
    if (closure < 0)
        return -1;
    if (closure) { /* the update after the closure's one evaluation */
        PyObject *res = PyObject_CallFunctionObjArgs(g_part_begin, s, g_part_step, NULL);
        if (res == NULL)
            return -1;
        Py_DECREF(res);
    }
    return 0;
}

PyDoc_STRVAR(backward_run_doc,
"backward_run(original, args, kwargs)\n--\n\n"
"`backward.backward_python`'s common path: `original(*args, **kwargs)` as the open step's\n"
"`train.backward`.");

static PyObject *
backward_run(PyObject *module_, PyObject *const *args, Py_ssize_t nargs)
{
    if (call_ok(nargs == 3 && PyTuple_Check(args[1]) && (args[2] == Py_None || PyDict_Check(args[2])),
                "backward_run(original, args, kwargs)", g_backward_python != NULL, "bind_backward") < 0)
        return NULL;
    PyObject *s = g_state, *original = args[0], *r = NULL, *t = NULL, *step = NULL, *live = NULL;
    PyObject *kwargs = args[2] == Py_None ? NULL : args[2];
    if ((r = module_attr(g_recorder_module, s_rec_)) == NULL)
        return NULL;
    int slow = r == Py_None, v;
    if (!slow) { /* a closure evaluation nested under the update: the Python body */
        if ((v = sattr_true(s, &f_opt_depth)) < 0)
            goto fail;
        if (v) {
            if ((v = sattr_none(s, &f_part_phase)) < 0)
                goto fail;
            slow = !v;
        }
    }
    if (slow) {
        Py_DECREF(r);
        return PyObject_CallFunctionObjArgs(g_backward_python, original, args[1], args[2], NULL);
    }
    PyObject *ph_bwd = PyLong_FromLong(g_ph_bwd);
    if (ph_bwd == NULL || (t = now_of(r)) == NULL) {
        Py_XDECREF(ph_bwd);
        goto fail;
    }
    PyObject *const call[4] = {r, s, t, ph_bwd};
    step = train_activity(NULL, call, 4);
    Py_DECREF(ph_bwd);
    if (step == NULL)
        goto fail;
    if (step != Py_None) {
        int fwd = sattr_true(s, &f_mb_fwd), disc = fwd != 0 ? fwd : true_of(mget(g_roots, &m_roots_discovering));
        if (disc < 0)
            goto fail;
        if (!fwd && !disc) { /* no forward seen: a model built after discovery settled */
            PyObject *n = mget(step, &m_step_n);
            PyObject *res = n == NULL ? NULL : PyObject_CallMethodOneArg(g_roots, s_unseen, n);
            Py_XDECREF(n);
            if (res == NULL)
                goto fail;
            Py_DECREF(res);
        }
    }
    if ((live = enter_phase(s, g_backward)) == NULL || sset(s, &f_bwd_depth, g_one) < 0)
        goto fail;
    /* `try: out = original(...) except BaseException as err: live.__exit__(type(err), err, None);
     * raise else: live.__exit__(None, None, None) finally: backward_done`, as Python runs it. */
    PyObject *out = PyObject_Call(original, args[1], kwargs);
    PyObject *type = NULL, *value = NULL, *tb = NULL, *type2 = NULL, *value2 = NULL, *tb2 = NULL;
    if (out == NULL) {
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        if (tb != NULL && value != NULL)
            PyException_SetTraceback(value, tb);
    }
    PyObject *res = exit_of(live, out ? Py_None : type, out || !value ? Py_None : value, Py_None);
    int exit_failed = res == NULL;
    Py_XDECREF(res);
    if (exit_failed)
        PyErr_Fetch(&type2, &value2, &tb2);
    int done = backward_done(s, live, step);
    if (done < 0 || exit_failed || out == NULL) {
        if (done < 0) { /* an error in the finally block replaces any other */
            Py_XDECREF(type2);
            Py_XDECREF(value2);
            Py_XDECREF(tb2);
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(tb);
        } else if (exit_failed) { /* raised in __exit__: that error, as a `with` block gives */
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(tb);
            PyErr_Restore(type2, value2, tb2);
        } else {
            PyErr_Restore(type, value, tb);
        }
        Py_XDECREF(out);
        goto fail;
    }
    Py_DECREF(r);
    Py_DECREF(t);
    Py_DECREF(step);
    Py_DECREF(live);
    return out;
fail:
    Py_XDECREF(r);
    Py_XDECREF(t);
    Py_XDECREF(step);
    Py_XDECREF(live);
    return NULL;
}

PyDoc_STRVAR(bind_backward_doc,
"bind_backward(state, roots, recorder_module, region_type, backward_name, backward_python, part_begin,\n"
"              part_step, ph_bwd)\n--\n\n"
"What `backward_run` reads: detection's state, `roots.roots`, the `otel_train.record.recorder`\n"
"module, `recorder.Region` (the same objects `bind_forward` takes), the backward span's name,\n"
"`backward.backward_python` (called as (original, args, kwargs)), `phase.part_begin` and\n"
"`phase.STEP`, PH_BWD.");

static PyObject *
bind_backward(PyObject *module, PyObject *args)
{
    PyObject *o[8];
    long bwd;
    if (!PyArg_ParseTuple(args, "OOOOOOOOl:bind_backward", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7],
                          &bwd))
        return NULL;
    PyObject **slots[8] = {&g_state, &g_roots, &g_recorder_module, &g_region_type, &g_backward, &g_backward_python,
                           &g_part_begin, &g_part_step};
    for (int i = 0; i < 8; i++)
        Py_XSETREF(*slots[i], Py_NewRef(o[i]));
    g_ph_bwd = bwd;
    Py_RETURN_NONE;
}

/* --- data.next_patch's `__next__`, after its checks --------------------------------------- */
static PyObject *g_fetch_python, *g_close, *g_manual, *g_phase_end, *g_copy_edge;
static PyObject *size_of(PyObject *module, PyObject *batch);

/* `machine.ours`: the step detection opened (`s.step`) is the recorder's open step: 1, 0, or
 * -1 with an error. */
static int
same_step(PyObject *s, PyObject *r)
{
    PyObject *ours = sget(s, &f_step), *open = ours == NULL ? NULL : mget(r, &m_rec_step);
    int same = open == NULL ? -1 : ours != Py_None && ours == open;
    Py_XDECREF(ours);
    Py_XDECREF(open);
    return same;
}

/* After a fetch from the training loader: the step's updates are over, or (a loop with no
 * optimizer) its backward was. `data.fetch_python`'s close rules; 0, or -1 with an error. */
static int
fetch_closes(PyObject *r, PyObject *s, PyObject *t0)
{
    int mine = same_step(s, r);
    if (mine <= 0)
        return mine;
    PyObject *opt_end = sget(s, &f_opt_end);
    if (opt_end == NULL)
        return -1;
    int driven = sattr_true(s, &f_data_driven), close = 0;
    PyObject *at = opt_end;
    if (driven > 0 && opt_end != Py_None) {
        close = 1; /* the next batch: the step's updates are over */
    } else if (driven > 0) {
        int bwd = sattr_true(s, &f_mb_bwd);
        PyObject *uses_opt = bwd > 0 ? sget(s, &f_uses_opt) : NULL;
        if (bwd < 0 || (bwd > 0 && uses_opt == NULL))
            driven = -1;
        else if (bwd > 0 && uses_opt == Py_False)
            close = 1;
        else if (bwd > 0 && uses_opt == Py_None) { /* `machine.manual` */
            PyObject *manual = PyObject_CallOneArg(g_manual, s);
            close = manual == NULL ? -1 : PyObject_IsTrue(manual);
            Py_XDECREF(manual);
        }
        Py_XDECREF(uses_opt);
        at = t0;
    }
    if (driven < 0 || close < 0) {
        Py_DECREF(opt_end);
        return -1;
    }
    int err = 0;
    if (close) {
        PyObject *res = PyObject_CallFunctionObjArgs(g_close, r, s, at, NULL);
        Py_XDECREF(res);
        err = res == NULL;
    }
    Py_DECREF(opt_end);
    return err ? -1 : 0;
}

PyDoc_STRVAR(fetch_doc,
"fetch(original, iterator)\n--\n\n"
"`data.fetch_python`: `original(iterator)` timed as a batch fetch, held pending for the next\n"
"training phase (or evaluation) to claim.");

static PyObject *
fetch(PyObject *module_, PyObject *const *args, Py_ssize_t nargs)
{
    if (call_ok(nargs == 2, "fetch(original, iterator)", g_fetch_python != NULL && g_state != NULL, "bind_fetch") < 0)
        return NULL;
    PyObject *s = g_state, *original = args[0], *it = args[1], *batch = NULL, *t0 = NULL, *t1 = NULL, *src = NULL;
    PyObject *r = module_attr(g_recorder_module, s_rec_);
    if (r == NULL)
        return NULL;
    if (r == Py_None) {
        Py_DECREF(r);
        return PyObject_CallFunctionObjArgs(g_fetch_python, original, it, NULL);
    }
    if ((t0 = now_of(r)) == NULL || sset(s, &f_fetching, Py_True) < 0)
        goto fail;
    batch = PyObject_CallOneArg(original, it); /* StopIteration: not a batch, nothing recorded */
    if (batch == NULL) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        if (sset(s, &f_fetching, Py_False) < 0) {
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(tb);
        } else {
            PyErr_Restore(type, value, tb);
        }
        goto fail;
    }
    if (sset(s, &f_fetching, Py_False) < 0 || (t1 = now_of(r)) == NULL)
        goto fail;
    /* The loader's own (batch) sampler tells loaders apart, even two over one dataset. */
    if ((src = PyObject_GetAttr(it, s_index_sampler)) == NULL) { /* getattr(it, "_index_sampler", None) */
        if (!PyErr_ExceptionMatches(PyExc_AttributeError))
            goto fail;
        PyErr_Clear();
        src = Py_NewRef(Py_None);
    }
    if (src != Py_None && fetch_closes(r, s, t0) < 0)
        goto fail;
    int v = sattr_none(s, &f_phase);
    if (v < 0)
        goto fail;
    if (!v) { /* the update is over */
        PyObject *res = PyObject_CallFunctionObjArgs(g_phase_end, r, s, NULL);
        if (res == NULL)
            goto fail;
        Py_DECREF(res);
    }
    PyObject *size = g_replay != NULL ? Py_NewRef(PyTuple_GET_ITEM(g_replay, RP_SIZE)) : size_of(NULL, batch);
    PyObject *entry = NULL, *pending = NULL;
    int err = size == NULL || (entry = PyList_New(6)) == NULL;
    if (!err) {
        PyObject *fields[6] = {g_data, t0, t1, src, it, size};
        for (int i = 0; i < 6; i++)
            PyList_SET_ITEM(entry, i, Py_NewRef(fields[i]));
        pending = sget(s, &f_pending);
        if (pending != NULL && !PyList_Check(pending)) {
            PyErr_SetString(PyExc_TypeError, "State.pending must be a list");
            Py_CLEAR(pending);
        }
        err = pending == NULL || PyList_Append(pending, entry) < 0;
    }
    Py_XDECREF(size);
    Py_XDECREF(entry);
    Py_XDECREF(pending);
    if (err)
        goto fail;
    PyObject *needed = mget(g_copy_edge, &m_edge_needed);
    if (needed == NULL)
        goto fail;
    if (needed == Py_None) { /* the first fetch decides */
        PyObject *res = PyObject_CallMethodOneArg(g_copy_edge, s_decide, s);
        err = res == NULL;
        Py_XDECREF(res);
    } else {
        int yes = PyObject_IsTrue(needed);
        err = yes < 0 || (yes && sset(s, &f_copying, Py_True) < 0);
    }
    Py_DECREF(needed);
    if (err)
        goto fail;
    Py_DECREF(r);
    Py_DECREF(t0);
    Py_DECREF(t1);
    Py_DECREF(src);
    return batch;
fail:
    Py_XDECREF(r);
    Py_XDECREF(t0);
    Py_XDECREF(t1);
    Py_XDECREF(src);
    Py_XDECREF(batch);
    return NULL;
}

PyDoc_STRVAR(bind_fetch_doc,
"bind_fetch(state, recorder_module, fetch_python, close, manual, phase_end, copy_edge)\n--\n\n"
"What `fetch` reads: detection's state, the `otel_train.record.recorder` module,\n"
"`data.fetch_python` (called as (original, iterator)), `machine.close`, `machine.manual`,\n"
"`phase.end` and `data.copy_edge`. After `bind_machine` and `bind_sizes`.");

static PyObject *
bind_fetch(PyObject *module, PyObject *args)
{
    PyObject *o[7];
    if (!PyArg_UnpackTuple(args, "bind_fetch", 7, 7, &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6]))
        return NULL;
    PyObject **slots[7] = {&g_state, &g_recorder_module, &g_fetch_python, &g_close, &g_manual, &g_phase_end,
                           &g_copy_edge};
    for (int i = 0; i < 7; i++)
        Py_XSETREF(*slots[i], Py_NewRef(o[i]));
    Py_RETURN_NONE;
}

/* --- sites.user_frames ------------------------------------------------------------------- */
static PyObject *g_name_key;      /* "__name__" */
static PyObject *g_own_prefixes;  /* `sites._OURS`, from `bind` */
static PyObject *g_torch;         /* "torch" */
static int g_max_depth = 16;      /* `sites._MAX_DEPTH` */

/* 1 where `frame` runs code of torch or otel_train, 0 where not, -1 with an error. */
static int
frame_is_ours(PyFrameObject *frame)
{
#if PY_VERSION_HEX >= 0x030B0000
    PyObject *globals = PyFrame_GetGlobals(frame);
#else
    PyObject *globals = Py_XNewRef(frame->f_globals);
#endif
    if (globals == NULL)
        return -1;
    PyObject *name = PyDict_Check(globals) ? PyDict_GetItemWithError(globals, g_name_key) : NULL;
    int ours = 0;
    if (name != NULL && PyUnicode_Check(name)) {
        Py_ssize_t n = PyTuple_GET_SIZE(g_own_prefixes);
        for (Py_ssize_t i = 0; i < n && !ours; i++) {
            ours = (int)PyUnicode_Tailmatch(name, PyTuple_GET_ITEM(g_own_prefixes, i), 0, PY_SSIZE_T_MAX, -1);
            if (ours < 0)
                break;
        }
        if (ours == 0)
            ours = PyUnicode_Compare(name, g_torch) == 0;
    } else if (name == NULL && PyErr_Occurred()) {
        ours = -1;
    }
    Py_DECREF(globals);
    return ours;
}

PyDoc_STRVAR(user_frames_doc,
"user_frames(limit)\n--\n\n"
"`sites.user_frames_python`: the innermost `limit` frames of the calling Python stack (its\n"
"innermost frame first) outside torch and otel_train, looking through at most `_MAX_DEPTH`.");

static PyObject *
user_frames(PyObject *module, PyObject *arg)
{
    if (g_own_prefixes == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_loops.bind() was not called");
        return NULL;
    }
    Py_ssize_t limit = PyLong_AsSsize_t(arg);
    if (limit == -1 && PyErr_Occurred())
        return NULL;
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    PyFrameObject *frame = PyEval_GetFrame(); /* borrowed: the Python function that called us */
    Py_XINCREF(frame);
    for (int depth = 0; depth < g_max_depth && frame != NULL; depth++) {
        int ours = frame_is_ours(frame);
        if (ours < 0 || (!ours && PyList_Append(out, (PyObject *)frame) < 0)) {
            Py_DECREF(frame);
            Py_DECREF(out);
            return NULL;
        }
        if (PyList_GET_SIZE(out) == limit)
            break;
        PyFrameObject *back = PyFrame_GetBack(frame);
        Py_DECREF(frame);
        frame = back;
    }
    Py_XDECREF(frame);
    return out;
}

/* --- the optimizer phase (`phase`), the optimizer's hooks and zero_grad (`optimizer`) -------- */
/* Their common paths: an update of the open step with no closure, and a zero_grad placed at
 * the end of the update; anything else calls the Python function from its start, before
 * anything is changed here. What `bind_phase` and `bind_optimizer` gave (`phase` binds its own
 * `Region`, KIND_SPAN and NO_STEP: it may be imported, and called, before the modules whose
 * `bind_*` set the others): */
static PyObject *g_opt_name;       /* OPTIMIZER, the phase's span name */
static PyObject *g_leave;          /* `phase._leave` */
static PyObject *g_make_current;   /* `phase._make_current` */
static PyObject *g_calls;          /* `phase._CALLS` */
static PyObject *g_calls_key;      /* TRAIN_OPTIMIZER_CALLS */
static PyObject *g_end_event;      /* `device.end_event` */
static PyObject *g_finish;         /* `direct.finish` */
static PyObject *g_opt_begin_python, *g_opt_end_python, *g_zero_grad_python, *g_several_updates;
static PyObject *g_decided;        /* `sites._decided` */
static PyObject *g_zero_grad_part; /* `phase.ZERO_GRAD` */
static PyObject *g_clip_part;      /* `phase.CLIP` */
/* `recorder.Region`, KIND_SPAN, NO_STEP, `phase.STEP` */
static PyObject *g_ph_region_type, *g_ph_kind, *g_ph_no_step, *g_ph_step_part;
static PyObject *g_opt_state, *g_opt_recorder_module; /* detection's state, `otel_train.record.recorder` */
static PyObject *g_zero;
static long g_site_end = -1;       /* `sites.END` */

/* `getattr(obj, "dev", None) is not None`: 1, 0, or -1 with an error. */
static int
has_dev(PyObject *obj)
{
    PyObject *v;
#if PY_VERSION_HEX >= 0x030D0000
    int found = PyObject_GetOptionalAttr(obj, s_dev, &v);
#else
    int found = _PyObject_LookupAttr(obj, s_dev, &v);
#endif
    if (found <= 0)
        return found;
    int has = v != Py_None;
    Py_DECREF(v);
    return has;
}

PyDoc_STRVAR(part_begin_doc,
"part_begin(s, name)\n--\n\n"
"`phase.part_begin_python`: a call of the update starts; the phase opens (if it is not open)\n"
"and is current while it runs.");

static int
part_begin_c(PyObject *s, PyObject *name)
{
    PyObject *phase = sget(s, &f_phase);
    if (phase == NULL)
        return -1;
    if (phase == Py_None) {
        Py_DECREF(phase);
        PyObject *fresh = PyObject_CallOneArg(g_ph_region_type, g_opt_name);
        phase = fresh == NULL ? NULL : enter_of(fresh); /* current while this call runs */
        Py_XDECREF(fresh);
        if (phase == NULL)
            return -1;
        int unrecorded = none_of(mget(phase, &m_region_rec));
        if (unrecorded) {
            Py_DECREF(phase);
            return unrecorded < 0 ? -1 : 0;
        }
        PyObject *parts = PyList_New(1);
        if (parts != NULL)
            PyList_SET_ITEM(parts, 0, Py_NewRef(name));
        int err = parts == NULL || sset(s, &f_phase, phase) < 0 || sset(s, &f_phase_parts, parts) < 0;
        Py_XDECREF(parts);
        if (err) {
            Py_DECREF(phase);
            return -1;
        }
    } else {
        PyObject *parts = sget(s, &f_phase_parts), *res = NULL;
        int err = parts == NULL;
        if (!err && PyList_CheckExact(parts))
            err = PyList_Append(parts, name) < 0;
        else if (!err)
            err = (res = PyObject_CallMethodOneArg(parts, s_append, name)) == NULL;
        Py_XDECREF(res);
        Py_XDECREF(parts);
        if (!err) {
            res = PyObject_CallOneArg(g_make_current, phase);
            err = res == NULL;
            Py_XDECREF(res);
        }
        if (err) {
            Py_DECREF(phase);
            return -1;
        }
    }
    int err = sset(s, &f_part_phase, phase);
    Py_DECREF(phase);
    return err;
}

static PyObject *
part_begin(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (call_ok(nargs == 2, "part_begin(s, name)", g_opt_name != NULL, "bind_phase") < 0)
        return NULL;
    if (part_begin_c(args[0], args[1]) < 0)
        return NULL;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(part_end_doc,
"part_end(r, s)\n--\n\n"
"`phase.part_end_python`: that call is over; the phase is current no more and, for now, ends\n"
"here. Returns the time.");

static PyObject *
part_end_c(PyObject *r, PyObject *s)
{
    PyObject *running = sget(s, &f_part_phase);
    if (running == NULL || sset(s, &f_part_phase, Py_None) < 0) {
        Py_XDECREF(running);
        return NULL;
    }
    if (running != Py_None) {
        PyObject *res = PyObject_CallOneArg(g_leave, running);
        if (res == NULL) {
            Py_DECREF(running);
            return NULL;
        }
        Py_DECREF(res);
    }
    Py_DECREF(running);
    PyObject *t = now_of(r), *phase = t == NULL ? NULL : sget(s, &f_phase);
    if (phase == NULL) {
        Py_XDECREF(t);
        return NULL;
    }
    int err = 0;
    if (phase != Py_None) {
        int dev = sset(s, &f_phase_end, t) < 0 ? -1 : has_dev(phase);
        err = dev < 0;
        if (dev > 0) {
            PyObject *res = PyObject_CallOneArg(g_end_event, phase);
            err = res == NULL;
            Py_XDECREF(res);
        }
    }
    Py_DECREF(phase);
    if (err) {
        Py_DECREF(t);
        return NULL;
    }
    return t;
}

static PyObject *
part_end(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (call_ok(nargs == 2, "part_end(r, s)", g_opt_name != NULL, "bind_phase") < 0)
        return NULL;
    return part_end_c(args[0], args[1]);
}

PyDoc_STRVAR(phase_end_doc,
"phase_end(r, s)\n--\n\n"
"`phase.end_python`: something else begins; the phase is recorded, from its first call's\n"
"start to its last's end.");

static int
phase_end_c(PyObject *r, PyObject *s)
{
    PyObject *phase = sget(s, &f_phase), *parts = NULL, *key = NULL, *attrs = NULL, *t1 = NULL, *parent = NULL;
    PyObject *step = NULL, *t0 = NULL, *seq = NULL, *pseq = NULL, *ref = NULL, *events = NULL, *record = NULL;
    PyObject *res = NULL;
    if (phase == NULL)
        return -1;
    if (phase == Py_None) {
        Py_DECREF(phase);
        return 0;
    }
    int err = -1, v = sattr_none(s, &f_part_phase), dev;
    if (v < 0)
        goto done;
    if (!v) { /* a call raised through its hook: it ends now */
        PyObject *t = part_end_c(r, s);
        if (t == NULL)
            goto done;
        Py_DECREF(t);
    }
    if (sset(s, &f_phase, Py_None) < 0 || (parts = sget(s, &f_phase_parts)) == NULL
        || (key = PySequence_Tuple(parts)) == NULL)
        goto done;
    attrs = PyDict_GetItemWithError(g_calls, key);
    if (attrs != NULL) {
        Py_INCREF(attrs);
    } else {
        if (PyErr_Occurred() || (attrs = PyDict_New()) == NULL || PyDict_SetItem(attrs, g_calls_key, key) < 0
            || PyDict_SetItem(g_calls, key, attrs) < 0)
            goto done;
    }
    if ((t1 = sget(s, &f_phase_end)) == NULL || (parent = mget(phase, &m_region_parent)) == NULL
        || (step = mget(phase, &m_region_step)) == NULL || (t0 = mget(phase, &m_region_t0)) == NULL
        || (dev = has_dev(phase)) < 0)
        goto done;
    if (dev) {
        res = PyObject_CallFunctionObjArgs(g_finish, r, phase, t1, attrs, NULL);
    } else { /* `direct.finish`, written out */
        pseq = Py_NewRef(Py_None);
        if (parent != Py_None) {
            PyObject *prec = mget(parent, &m_region_rec);
            if (prec == NULL)
                goto done;
            int mine = prec == r;
            Py_DECREF(prec);
            if (mine)
                Py_SETREF(pseq, mget(parent, &m_region_seq));
        }
        ref = step == Py_None ? Py_NewRef(g_ph_no_step) : mget(step, &m_step_ref);
        if (pseq == NULL || ref == NULL || (seq = mget(phase, &m_region_seq)) == NULL
            || (events = mget(phase, &m_region_events)) == NULL || (v = PyObject_IsTrue(events)) < 0)
            goto done;
        if (!v)
            Py_SETREF(events, Py_NewRef(Py_None));
        if ((record = region_pack(g_ph_kind, g_opt_name, seq, pseq, ref, t0, t1, attrs, Py_None, events)) == NULL)
            goto done;
        res = PyObject_CallMethodOneArg(r, s_append, record);
    }
    if (res == NULL)
        goto done;
    if (parent == Py_None && step != Py_None) {
        PyObject *ours = sget(s, &f_step);
        if (ours == NULL)
            goto done;
        int mine = ours == step;
        Py_DECREF(ours);
        if (mine) { /* `coverage.cover` */
            PyObject *cover = sget(s, &f_cover);
            int bad = cover == NULL || !PyList_Check(cover);
            if (cover != NULL && !PyList_Check(cover))
                PyErr_SetString(PyExc_TypeError, "State.cover must be a list");
            bad = bad || PyList_Append(cover, t0) < 0 || PyList_Append(cover, t1) < 0;
            Py_XDECREF(cover);
            if (bad)
                goto done;
        }
    }
    err = 0;
done:
    Py_DECREF(phase);
    Py_XDECREF(parts);
    Py_XDECREF(key);
    Py_XDECREF(attrs);
    Py_XDECREF(t1);
    Py_XDECREF(parent);
    Py_XDECREF(step);
    Py_XDECREF(t0);
    Py_XDECREF(seq);
    Py_XDECREF(pseq);
    Py_XDECREF(ref);
    Py_XDECREF(events);
    Py_XDECREF(record);
    Py_XDECREF(res);
    return err;
}

static PyObject *
phase_end(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (call_ok(nargs == 2, "phase_end(r, s)", g_opt_name != NULL, "bind_phase") < 0)
        return NULL;
    if (phase_end_c(args[0], args[1]) < 0)
        return NULL;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(optimizer_begin_doc,
"optimizer_begin(optimizer, args, kwargs)\n--\n\n"
"`optimizer.optimizer_begin_python`'s common path (the update of a step, no closure): called\n"
"by the optimizer's pre-hook after its compile check, straight from it (its caller's frame is\n"
"torch's step wrapper).");

static PyObject *
optimizer_begin(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (call_ok(nargs == 3, "optimizer_begin(optimizer, args, kwargs)",
                g_opt_begin_python != NULL && g_opt_name != NULL && g_train_activity_python != NULL,
                "bind_optimizer() or bind_phase") < 0)
        return NULL;
    PyObject *s = g_opt_state, *r = NULL, *t = NULL, *step = NULL, *callers = NULL, *ph = NULL;
    PyFrameObject *wrapper = NULL, *caller = NULL;
    int slow = sattr_true(s, &f_opt_depth);
    if (slow < 0)
        return NULL;
    if (!slow) {
        if ((r = module_attr(g_opt_recorder_module, s_rec_)) == NULL)
            return NULL;
        slow = r == Py_None;
    }
    if (!slow && (slow = sattr_true(s, &f_site_probe)) < 0)
        goto fail;
    if (!slow) {
        PyObject *closure = closure_of(args[1], args[2], s_closure);
        if (closure == NULL && PyErr_Occurred())
            goto fail;
        slow = (closure != NULL && closure != Py_None) || !PyTuple_Check(args[1]);
    }
    if (slow) {
        Py_XDECREF(r);
        return PyObject_Vectorcall(g_opt_begin_python, args, nargs, NULL);
    }
    if ((t = now_of(r)) == NULL || (ph = PyLong_FromLong(g_ph_opt)) == NULL)
        goto fail;
    PyObject *const call[4] = {r, s, t, ph};
    if ((step = train_activity(NULL, call, 4)) == NULL)
        goto fail;
    int driven = sattr_true(s, &f_data_driven), updated = driven <= 0 ? driven : !sattr_none(s, &f_opt_end);
    if (driven < 0 || PyErr_Occurred())
        goto fail;
    if (updated) { /* data-driven, and this step had an update: maybe several updates per batch */
        PyObject *res = PyObject_CallFunctionObjArgs(g_several_updates, s, args[0], NULL);
        if (res == NULL)
            goto fail;
        Py_DECREF(res);
    }
    if (g_replay != NULL) { /* the frames as the call saw them */
        PyObject *frame = PyTuple_GET_ITEM(g_replay, RP_WRAPPER), *seen = PyTuple_GET_ITEM(g_replay, RP_CALLERS);
        if (sset(s, &f_opt_frame, frame) < 0 || (seen != Py_None && sset(s, &f_last_callers, seen) < 0))
            goto fail;
    } else { /* the pre-hook's: torch's step wrapper above it, the update's call site above that */
        update_frames(&wrapper, &caller);
        if (sset(s, &f_opt_frame, wrapper != NULL ? (PyObject *)wrapper : Py_None) < 0)
            goto fail;
    }
    if (caller != NULL) { /* where the update was called from (`_update.h`) */
        if ((callers = callers_of(caller)) == NULL || sset(s, &f_last_callers, callers) < 0)
            goto fail;
    }
    if (sset(s, &f_opt_owner, args[0]) < 0 || sset(s, &f_opt_closure, Py_False) < 0 || sset(s, &f_nest, Py_False) < 0
        || sset(s, &f_opt_t0, t) < 0 || sset(s, &f_evaluations, g_zero) < 0 || sset(s, &f_opt_depth, g_one) < 0
        || part_begin_c(s, g_ph_step_part) < 0)
        goto fail;
    Py_DECREF(r);
    Py_DECREF(t);
    Py_DECREF(ph);
    Py_DECREF(step);
    Py_XDECREF(wrapper);
    Py_XDECREF(caller);
    Py_XDECREF(callers);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(r);
    Py_XDECREF(t);
    Py_XDECREF(ph);
    Py_XDECREF(step);
    Py_XDECREF(wrapper);
    Py_XDECREF(caller);
    Py_XDECREF(callers);
    return NULL;
}

PyDoc_STRVAR(optimizer_end_doc,
"optimizer_end(optimizer, args, kwargs)\n--\n\n"
"`optimizer.optimizer_end_python`'s common path (the outermost update with no closure ends).");

static PyObject *
optimizer_end(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (call_ok(nargs == 3, "optimizer_end(optimizer, args, kwargs)", g_opt_end_python != NULL && g_opt_name != NULL,
                "bind_optimizer() or bind_phase") < 0)
        return NULL;
    PyObject *s = g_opt_state, *r = NULL, *t = NULL, *depth = sget(s, &f_opt_depth);
    if (depth == NULL)
        return NULL;
    int outermost = PyLong_CheckExact(depth) && PyLong_AsLong(depth) == 1, slow = !outermost, v;
    Py_DECREF(depth);
    if (!slow) {
        if ((r = module_attr(g_opt_recorder_module, s_rec_)) == NULL)
            return NULL;
        slow = r == Py_None;
    }
    if (!slow && (slow = sattr_true(s, &f_opt_closure)) < 0)
        goto fail;
    if (slow) {
        Py_XDECREF(r);
        return PyObject_Vectorcall(g_opt_end_python, args, nargs, NULL);
    }
    if (sset(s, &f_opt_depth, g_zero) < 0 || (t = part_end_c(r, s)) == NULL || sset(s, &f_opt_frame, Py_None) < 0
        || sset(s, &f_opt_owner, Py_None) < 0 || sset(s, &f_opt_closure, Py_False) < 0
        || sset(s, &f_nest, Py_False) < 0 || sset(s, &f_uses_opt, Py_True) < 0 || (v = same_step(s, r)) < 0)
        goto fail;
    if (v) { /* `machine.ours` */
        PyObject *stepped = sget(s, &f_stepped), *id = NULL;
        int err = stepped == NULL || sset(s, &f_opt_end, t) < 0 || sset(s, &f_last_end, t) < 0
                  || (id = PyLong_FromVoidPtr(args[0])) == NULL;
        if (!err) {
            PyObject *res = NULL;
            if (PyList_CheckExact(stepped))
                err = PyList_Append(stepped, id) < 0;
            else
                err = (res = PyObject_CallMethodOneArg(stepped, s_append, id)) == NULL;
            Py_XDECREF(res);
        }
        Py_XDECREF(stepped);
        Py_XDECREF(id);
        if (err)
            goto fail;
    }
    Py_DECREF(r);
    Py_DECREF(t);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(r);
    Py_XDECREF(t);
    return NULL;
}

/* The innermost frame of the calling Python stack outside torch and otel_train, looking
 * through `_MAX_DEPTH` (`user_frames(1)`): a new reference, NULL (none, or an error). */
static PyFrameObject *
first_user_frame(void)
{
    PyFrameObject *frame = PyEval_GetFrame();
    Py_XINCREF(frame);
    for (int depth = 0; depth < g_max_depth && frame != NULL; depth++) {
        int ours = frame_is_ours(frame);
        if (ours <= 0) {
            if (ours < 0)
                Py_CLEAR(frame);
            return frame;
        }
        PyFrameObject *back = PyFrame_GetBack(frame);
        Py_DECREF(frame);
        frame = back;
    }
    Py_XDECREF(frame);
    return NULL;
}

/* `sites._decided`'s entry for the call site `frame` stands at (borrowed; NULL: none, or an
 * error). */
static PyObject *
decided_entry(PyFrameObject *frame)
{
    PyCodeObject *code = PyFrame_GetCode(frame);
    PyObject *key = Py_BuildValue("(Ni)", PyLong_FromVoidPtr(code), PyFrame_GetLasti(frame));
    Py_DECREF(code);
    if (key == NULL)
        return NULL;
    PyObject *found = PyDict_GetItemWithError(g_decided, key); /* borrowed */
    Py_DECREF(key);
    if (found != NULL && (!PyTuple_Check(found) || PyTuple_GET_SIZE(found) != 2)) {
        PyErr_SetString(PyExc_TypeError, "sites._decided holds (code, place) pairs");
        return NULL;
    }
    return found;
}

/* Where `sites` decided the calling zero_grad() belongs: TOP, END or ELSEWHERE, 0 where not
 * decided yet (or called from nowhere of the user's), -1 with an error. */
static long
decided_place(void)
{
    if (g_replay != NULL) /* where the call was decided to stand */
        return PyLong_AsLong(PyTuple_GET_ITEM(g_replay, RP_PLACE));
    PyFrameObject *frame = first_user_frame();
    if (frame == NULL)
        return PyErr_Occurred() ? -1 : 0;
    PyObject *found = decided_entry(frame);
    Py_DECREF(frame);
    if (found == NULL)
        return PyErr_Occurred() ? -1 : 0;
    return PyLong_AsLong(PyTuple_GET_ITEM(found, 1));
}

static long g_site_elsewhere = -1; /* `sites.ELSEWHERE` (`bind`) */

PyDoc_STRVAR(decided_place_doc,
"decided_place()\n--\n\n"
"`sites.decided_place_python`: the place decided for the zero_grad being called (TOP, END, or\n"
"ELSEWHERE where no frame of the user's called it), None where its call site is not decided yet.\n"
"Called while a zero_grad is noted (`detect.batch`), never while one is replayed.");

static PyObject *
decided_place_(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    if (call_ok(1, "decided_place()", g_decided != NULL && g_site_elsewhere >= 0,
                "bind(prefixes, max_depth, decided, elsewhere) or bind_optimizer") < 0)
        return NULL;
    PyFrameObject *frame = first_user_frame();
    if (frame == NULL)
        return PyErr_Occurred() ? NULL : PyLong_FromLong(g_site_elsewhere);
    PyObject *found = decided_entry(frame);
    Py_DECREF(frame);
    if (found == NULL)
        return PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
    return Py_NewRef(PyTuple_GET_ITEM(found, 1));
}

/* `optimizer._part`: `original(*args, **kwargs)` as the part `name` of the update's phase:
 *     phase.part_begin(s, name); s.aux_depth = 1
 *     try: return original(...)
 *     finally: s.aux_depth = 0; t = phase.part_end(r, s); [our step:] s.last_end = t, s.opt_end = t if set */
static PyObject *
part_call(PyObject *r, PyObject *s, PyObject *name, PyObject *original, PyObject *args, PyObject *kwargs)
{
    if (part_begin_c(s, name) < 0 || sset(s, &f_aux_depth, g_one) < 0)
        return NULL;
    PyObject *out = PyObject_Call(original, args, kwargs), *type = NULL, *value = NULL, *tb = NULL, *t = NULL;
    if (out == NULL)
        PyErr_Fetch(&type, &value, &tb);
    int mine = 0, v;
    int err = sset(s, &f_aux_depth, g_zero) < 0 || (t = part_end_c(r, s)) == NULL || (mine = same_step(s, r)) < 0;
    if (!err && mine) {
        err = sset(s, &f_last_end, t) < 0 || (v = sattr_none(s, &f_opt_end)) < 0 || (!v && sset(s, &f_opt_end, t) < 0);
    }
    Py_XDECREF(t);
    if (err) { /* an error in the finally block replaces the call's, as in Python */
        if (type != NULL)
            _PyErr_ChainExceptions(type, value, tb);
        Py_XDECREF(out);
        return NULL;
    }
    if (out == NULL)
        PyErr_Restore(type, value, tb);
    return out;
}

/* `call_ok` for what the patched zero_grad and clip_grad_norm_ call: (r, s, original, args, kwargs),
 * `args` a tuple and `kwargs` a dict or None. */
static int
aux_call_ok(PyObject *const *args, Py_ssize_t nargs, const char *signature, int bound, const char *bind)
{
    return call_ok(nargs == 5 && PyTuple_Check(args[3]) && (args[4] == Py_None || PyDict_Check(args[4])), signature,
                   bound, bind);
}

PyDoc_STRVAR(zero_grad_run_doc,
"zero_grad_run(r, s, original, args, kwargs)\n--\n\n"
"`optimizer._zero_grad`'s common path (a zero_grad placed at the end of the open step's\n"
"update joins its `train.optimizer`): called by the patched zero_grad, straight from it.");

static PyObject *
zero_grad_run(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (aux_call_ok(args, nargs, "zero_grad_run(r, s, original, args, kwargs)",
                    g_zero_grad_python != NULL && g_opt_name != NULL, "bind_optimizer() or bind_phase") < 0)
        return NULL;
    PyObject *r = args[0], *s = args[1], *kwargs = args[4] == Py_None ? NULL : args[4];
    int mine = same_step(s, r), v;
    long place = 0;
    if (mine < 0)
        return NULL;
    if (mine) { /* the update of our open step is over, its phase open: where was this zero_grad placed? */
        if ((v = sattr_none(s, &f_opt_end)) < 0 || (!v && (v = sattr_none(s, &f_phase)) < 0))
            return NULL;
        if (!v && (place = decided_place()) < 0)
            return NULL;
    }
    if (place != g_site_end) /* anything else: the Python function, from its start */
        return PyObject_Vectorcall(g_zero_grad_python, args, nargs, NULL);
    return part_call(r, s, g_zero_grad_part, args[2], args[3], kwargs);
}

PyDoc_STRVAR(clip_run_doc,
"clip_run(r, s, original, args, kwargs)\n--\n\n"
"`optimizer._clip`: gradient clipping in a step is the first part of its update (as the patched\n"
"clip_grad_norm_ calls it); outside any step, the user's function alone.");

static PyObject *
clip_run(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (aux_call_ok(args, nargs, "clip_run(r, s, original, args, kwargs)",
                    g_clip_part != NULL && g_step_type != NULL, "bind_phase() or bind_train_activity") < 0)
        return NULL;
    PyObject *kwargs = args[4] == Py_None ? NULL : args[4], *step = mget(args[0], &m_rec_step);
    if (step == NULL)
        return NULL;
    int in_step = PyObject_IsInstance(step, g_step_type);
    Py_DECREF(step);
    if (in_step < 0)
        return NULL;
    if (!in_step)
        return PyObject_Call(args[2], args[3], kwargs);
    return part_call(args[0], args[1], g_clip_part, args[2], args[3], kwargs);
}

PyDoc_STRVAR(bind_phase_doc,
"bind_phase(optimizer_name, region_type, kind_span, no_step, leave, make_current, calls, calls_key,\n"
"           end_event, finish, step_part, zero_grad_part, clip_part)\n--\n\n"
"What the phase's functions read: its span name, `recorder.Region`, KIND_SPAN, NO_STEP,\n"
"`phase._leave`, `phase._make_current`, `phase._CALLS` and TRAIN_OPTIMIZER_CALLS,\n"
"`device.end_event`, `direct.finish`, `phase.STEP`, `phase.ZERO_GRAD` and `phase.CLIP`.");

static PyObject *
bind_phase(PyObject *module, PyObject *args)
{
    PyObject *o[13];
    if (!PyArg_ParseTuple(args, "OOOOOOO!OOOOOO:bind_phase", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &PyDict_Type,
                          &o[6], &o[7], &o[8], &o[9], &o[10], &o[11], &o[12]))
        return NULL;
    PyObject **slots[13] = {&g_opt_name, &g_ph_region_type, &g_ph_kind, &g_ph_no_step, &g_leave, &g_make_current,
                            &g_calls, &g_calls_key, &g_end_event, &g_finish, &g_ph_step_part, &g_zero_grad_part,
                            &g_clip_part};
    for (int i = 0; i < 13; i++)
        Py_XSETREF(*slots[i], Py_NewRef(o[i]));
    Py_RETURN_NONE;
}

PyDoc_STRVAR(bind_optimizer_doc,
"bind_optimizer(state, recorder_module, begin_python, end_python, zero_grad_python, several_updates,\n"
"               decided, site_end)\n--\n\n"
"What the optimizer's hooks and zero_grad read: detection's state, the recorder module, the\n"
"Python functions `optimizer.optimizer_begin_python`, `optimizer_end_python`, `_zero_grad` and\n"
"`several_updates`, `sites._decided` and `sites.END`. With `bind_phase` and\n"
"`bind_train_activity`.");

static PyObject *
bind_optimizer(PyObject *module, PyObject *args)
{
    PyObject *o[7];
    long end;
    if (!PyArg_ParseTuple(args, "OOOOOOO!l:bind_optimizer", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &PyDict_Type,
                          &o[6], &end))
        return NULL;
    PyObject **slots[7] = {&g_opt_state, &g_opt_recorder_module, &g_opt_begin_python, &g_opt_end_python,
                           &g_zero_grad_python, &g_several_updates, &g_decided};
    for (int i = 0; i < 7; i++)
        Py_XSETREF(*slots[i], Py_NewRef(o[i]));
    g_site_end = end;
    Py_RETURN_NONE;
}

/* --- batch_size.size_of -------------------------------------------------------------------- */
static PyObject *g_tensor;        /* torch.Tensor */
static PyObject *g_mapping;       /* collections.abc.Mapping */
static PyObject *g_token_dtypes;  /* `batch_size._TOKEN_DTYPES` */
static PyObject *g_input_ids;     /* "input_ids" */

/* The first item of a non-empty sequence, else None: a new reference. */
static PyObject *
first_item(PyObject *seq)
{
    Py_ssize_t n = PySequence_Size(seq);
    if (n < 0)
        return NULL;
    return n ? PySequence_GetItem(seq, 0) : Py_NewRef(Py_None);
}

/* --- the wrappers' guards ------------------------------------------------------------------ */
/* Whether a call of a patched function is part of something else, which each wrapper asks every
 * call and the replay of each noted call (`detect.batch`) asks again: `data.busy_python`,
 * `backward.busy_python` and `optimizer.aux_busy_python`, here a C call rather than a Python
 * frame. */
static PyObject *
busy_of(PyObject *s, Field *const *fields, int n)
{
    for (int i = 0; i < n; i++) {
        int v = sattr_true(s, fields[i]);
        if (v)
            return v < 0 ? NULL : Py_NewRef(Py_True);
    }
    return Py_NewRef(Py_False);
}

static Field *const g_fetch_busy[] = {&f_fetching, &f_fwd_depth, &f_eval_explicit};
static Field *const g_backward_busy[] = {&f_bwd_depth, &f_eval_explicit};
static Field *const g_aux_busy[] = {&f_opt_depth, &f_aux_depth, &f_fwd_depth, &f_bwd_depth};

PyDoc_STRVAR(fetch_busy_doc, "fetch_busy(s)\n--\n\n`data.busy_python`: a fetch now is not a training batch.");

static PyObject *
fetch_busy(PyObject *module, PyObject *s)
{
    return busy_of(s, g_fetch_busy, 3);
}

PyDoc_STRVAR(backward_busy_doc, "backward_busy(s)\n--\n\n`backward.busy_python`: a backward now is no micro-batch's.");

static PyObject *
backward_busy(PyObject *module, PyObject *s)
{
    return busy_of(s, g_backward_busy, 2);
}

PyDoc_STRVAR(aux_busy_doc,
"aux_busy(s)\n--\n\n`optimizer.aux_busy_python`: a zero_grad or clipping now is part of something else.");

static PyObject *
aux_busy(PyObject *module, PyObject *s)
{
    return busy_of(s, g_aux_busy, 4);
}

PyDoc_STRVAR(size_of_doc,
"size_of(batch)\n--\n\n"
"`batch_size.size_of_python`: (samples, tokens) of a batch from its shape; None when unknown.");

static PyObject *
size_of(PyObject *module, PyObject *batch)
{
    if (g_tensor == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_loops.bind_sizes() was not called");
        return NULL;
    }
    PyObject *x = Py_NewRef(batch), *result = NULL, *shape = NULL;
    int is_tensor = PyObject_IsInstance(x, g_tensor);
    if (is_tensor < 0)
        goto done;
    if (!is_tensor) {
        PyObject *next = NULL;
        if (PyTuple_CheckExact(x) || PyList_CheckExact(x)) {
            next = first_item(x);
        } else {
            int mapping = PyDict_CheckExact(x) ? 1 : PyObject_IsInstance(x, g_mapping);
            if (mapping < 0)
                goto done;
            if (mapping) {
                int has = PySequence_Contains(x, g_input_ids);
                if (has < 0)
                    goto done;
                if (has) {
                    next = PyObject_GetItem(x, g_input_ids);
                } else { /* next(iter(x.values()), None) */
                    PyObject *values = PyObject_CallMethod(x, "values", NULL);
                    PyObject *it = values == NULL ? NULL : PyObject_GetIter(values);
                    Py_XDECREF(values);
                    if (it == NULL)
                        goto done;
                    next = PyIter_Next(it);
                    Py_DECREF(it);
                    if (next == NULL && !PyErr_Occurred())
                        next = Py_NewRef(Py_None);
                }
            } else if (PyTuple_Check(x) || PyList_Check(x)) { /* a namedtuple, a list subclass */
                next = first_item(x);
            } else {
                next = Py_NewRef(x);
            }
        }
        if (next == NULL)
            goto done;
        Py_SETREF(x, next);
        is_tensor = PyObject_IsInstance(x, g_tensor);
        if (is_tensor <= 0) {
            if (is_tensor == 0)
                result = Py_NewRef(Py_None);
            goto done;
        }
    }
    shape = mget(x, &m_tensor_shape);
    if (shape == NULL)
        goto done;
    Py_ssize_t ndim = PySequence_Size(shape);
    if (ndim < 0)
        goto done;
    if (ndim == 0) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    PyObject *samples = PySequence_GetItem(shape, 0);
    if (samples == NULL)
        goto done;
    PyObject *tokens = NULL;
    if (ndim == 2) {
        PyObject *dtype = mget(x, &m_tensor_dtype);
        int token_ids = dtype == NULL ? -1 : PySequence_Contains(g_token_dtypes, dtype);
        Py_XDECREF(dtype);
        if (token_ids > 0) {
            PyObject *length = PySequence_GetItem(shape, 1);
            tokens = length == NULL ? NULL : PyNumber_Multiply(samples, length);
            Py_XDECREF(length);
        } else if (token_ids == 0) {
            tokens = PyLong_FromLong(0);
        }
    } else {
        tokens = PyLong_FromLong(0);
    }
    if (tokens != NULL)
        result = PyTuple_Pack(2, samples, tokens);
    Py_DECREF(samples);
    Py_XDECREF(tokens);
done:
    Py_XDECREF(shape);
    Py_DECREF(x);
    return result;
}

/* --- state ---------------------------------------------------------------------------------- */
static Field *const g_fields[] = {
    &f_after,
    &f_boundary,
    &f_bwd_depth,
    &f_copying,
    &f_cover,
    &f_data_driven,
    &f_epoch,
    &f_epoch_fixed,
    &f_eval_explicit,
    &f_eval_t0,
    &f_fetching,
    &f_fwd_depth,
    &f_fwd_kind,
    &f_fwd_nested,
    &f_fwd_region,
    &f_last_end,
    &f_mb,
    &f_mb_bwd,
    &f_mb_fwd,
    &f_opt_closure,
    &f_opt_depth,
    &f_opt_end,
    &f_part_phase,
    &f_pending,
    &f_phase,
    &f_step,
    &f_stepped,
    &f_train_iter,
    &f_train_src,
    &f_uses_opt,
    &f_aux_depth,
    &f_evaluations,
    &f_last_callers,
    &f_nest,
    &f_opt_frame,
    &f_opt_owner,
    &f_opt_t0,
    &f_phase_end,
    &f_phase_parts,
    &f_site_probe,
};

PyDoc_STRVAR(bind_state_doc,
"bind_state(state_type)\n--\n\n"
"`state.State`: where each field this module reads lies in an instance (`__slots__`).");

static PyObject *
bind_state(PyObject *module, PyObject *type)
{
    if (!PyType_Check(type)) {
        PyErr_SetString(PyExc_TypeError, "bind_state() takes the State class");
        return NULL;
    }
    for (size_t i = 0; i < sizeof g_fields / sizeof g_fields[0]; i++) {
        PyObject *descr = PyObject_GetAttr(type, *g_fields[i]->name);
        if (descr == NULL)
            return NULL;
        int slot = Py_IS_TYPE(descr, &PyMemberDescr_Type)
                   && ((PyMemberDescrObject *)descr)->d_member->type == T_OBJECT_EX
                   && !(((PyMemberDescrObject *)descr)->d_member->flags & READONLY);
        g_fields[i]->off = slot ? ((PyMemberDescrObject *)descr)->d_member->offset : -1;
        Py_DECREF(descr);
    }
    Py_XSETREF(g_state_type, (PyTypeObject *)Py_NewRef(type));
    Py_RETURN_NONE;
}

/* --- module --------------------------------------------------------------------------------- */
PyDoc_STRVAR(bind_doc,
"bind(own_prefixes, max_depth, decided=None, elsewhere=-1)\n--\n\n"
"`sites._OURS` (module name prefixes of frames `user_frames` looks through, besides `torch`)\n"
"and `sites._MAX_DEPTH`; for `decided_place`, `sites._decided` and `sites.ELSEWHERE`.");

static PyObject *
bind(PyObject *module, PyObject *args)
{
    PyObject *prefixes, *decided = NULL;
    int max_depth;
    long elsewhere = -1;
    if (!PyArg_ParseTuple(args, "O!i|O!l:bind", &PyTuple_Type, &prefixes, &max_depth, &PyDict_Type, &decided,
                          &elsewhere))
        return NULL;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(prefixes); i++) {
        if (!PyUnicode_Check(PyTuple_GET_ITEM(prefixes, i))) {
            PyErr_SetString(PyExc_TypeError, "the prefixes must be strings");
            return NULL;
        }
    }
    Py_XSETREF(g_own_prefixes, Py_NewRef(prefixes));
    g_max_depth = max_depth;
    if (decided != NULL) {
        Py_XSETREF(g_decided, Py_NewRef(decided));
        g_site_elsewhere = elsewhere;
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(bind_sizes_doc,
"bind_sizes(tensor_type, mapping_type, token_dtypes)\n--\n\n"
"`torch.Tensor`, `collections.abc.Mapping` and `batch_size._TOKEN_DTYPES`, for `size_of`.");

static PyObject *
bind_sizes(PyObject *module, PyObject *args)
{
    PyObject *tensor, *mapping, *dtypes;
    if (!PyArg_UnpackTuple(args, "bind_sizes", 3, 3, &tensor, &mapping, &dtypes))
        return NULL;
    Py_XSETREF(g_tensor, Py_NewRef(tensor));
    Py_XSETREF(g_mapping, Py_NewRef(mapping));
    Py_XSETREF(g_token_dtypes, Py_NewRef(dtypes));
    Py_RETURN_NONE;
}

PyDoc_STRVAR(set_replay_doc,
"set_replay(facts)\n--\n\n"
"`detect.batch`: the facts of the call it replays next, `(grad_enabled, training, batch_size,\n"
"step_wrapper_frame, callers, zero_grad_place)`, read instead of the live ones; None after it.");

static PyObject *
set_replay(PyObject *module, PyObject *facts)
{
    if (facts != Py_None && (!PyTuple_CheckExact(facts) || PyTuple_GET_SIZE(facts) != RP_N)) {
        PyErr_SetString(PyExc_TypeError, "set_replay() takes a tuple of 6 facts or None");
        return NULL;
    }
    Py_XSETREF(g_replay, facts == Py_None ? NULL : Py_NewRef(facts));
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"set_replay", set_replay, METH_O, set_replay_doc},
    {"gaps", (PyCFunction)(void (*)(void))gaps, METH_FASTCALL, gaps_doc},
    {"resolve", (PyCFunction)(void (*)(void))resolve, METH_FASTCALL, resolve_doc},
    {"resolve_pending", (PyCFunction)(void (*)(void))resolve_pending, METH_FASTCALL, resolve_pending_doc},
    {"bind_machine", bind_machine, METH_VARARGS, bind_machine_doc},
    {"train_activity", (PyCFunction)(void (*)(void))train_activity, METH_FASTCALL, train_activity_doc},
    {"bind_train_activity", bind_train_activity, METH_VARARGS, bind_train_activity_doc},
    {"close", (PyCFunction)(void (*)(void))close_, METH_FASTCALL, close_doc},
    {"bind_close", bind_close, METH_VARARGS, bind_close_doc},
    {"forward_begin", forward_begin, METH_O, forward_begin_doc},
    {"forward_end", forward_end, METH_O, forward_end_doc},
    {"bind_forward", bind_forward, METH_VARARGS, bind_forward_doc},
    {"backward_run", (PyCFunction)(void (*)(void))backward_run, METH_FASTCALL, backward_run_doc},
    {"bind_backward", bind_backward, METH_VARARGS, bind_backward_doc},
    {"fetch", (PyCFunction)(void (*)(void))fetch, METH_FASTCALL, fetch_doc},
    {"bind_fetch", bind_fetch, METH_VARARGS, bind_fetch_doc},
    {"bind_state", bind_state, METH_O, bind_state_doc},
    {"user_frames", user_frames, METH_O, user_frames_doc},
    {"decided_place", decided_place_, METH_NOARGS, decided_place_doc},
    {"size_of", size_of, METH_O, size_of_doc},
    {"fetch_busy", fetch_busy, METH_O, fetch_busy_doc},
    {"backward_busy", backward_busy, METH_O, backward_busy_doc},
    {"aux_busy", aux_busy, METH_O, aux_busy_doc},
    {"bind", bind, METH_VARARGS, bind_doc},
    {"bind_sizes", bind_sizes, METH_VARARGS, bind_sizes_doc},
    {"part_begin", (PyCFunction)(void (*)(void))part_begin, METH_FASTCALL, part_begin_doc},
    {"part_end", (PyCFunction)(void (*)(void))part_end, METH_FASTCALL, part_end_doc},
    {"phase_end", (PyCFunction)(void (*)(void))phase_end, METH_FASTCALL, phase_end_doc},
    {"optimizer_begin", (PyCFunction)(void (*)(void))optimizer_begin, METH_FASTCALL, optimizer_begin_doc},
    {"optimizer_end", (PyCFunction)(void (*)(void))optimizer_end, METH_FASTCALL, optimizer_end_doc},
    {"zero_grad_run", (PyCFunction)(void (*)(void))zero_grad_run, METH_FASTCALL, zero_grad_run_doc},
    {"clip_run", (PyCFunction)(void (*)(void))clip_run, METH_FASTCALL, clip_run_doc},
    {"bind_phase", bind_phase, METH_VARARGS, bind_phase_doc},
    {"bind_optimizer", bind_optimizer, METH_VARARGS, bind_optimizer_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "otel_train.detect._loops",
    "Detection's per-step work in C: the hooks' and the step machine's common paths, and their loops.",
    -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__loops(void)
{
    g_name_key = PyUnicode_InternFromString("__name__");
    g_torch = PyUnicode_InternFromString("torch");
    g_input_ids = PyUnicode_InternFromString("input_ids");
    g_shape = PyUnicode_InternFromString("shape");
    g_dtype = PyUnicode_InternFromString("dtype");
    g_one = PyLong_FromLong(1);
    g_epoch_zero = PyLong_FromLong(0);
    g_zero = PyLong_FromLong(0);
    if (g_name_key == NULL || g_torch == NULL || g_input_ids == NULL || g_shape == NULL || g_dtype == NULL
        || g_one == NULL || g_epoch_zero == NULL || g_zero == NULL)
        return NULL;
    struct {
        PyObject **slot;
        const char *name;
    } names[] = {{&s_mb, "mb"}, {&s_step, "step"}, {&s_cover, "cover"}, {&s_train_src, "train_src"},
                 {&s_pending, "pending"}, {&s_data_driven, "data_driven"}, {&s_seq, "seq"}, {&s_rec, "rec"},
                 {&s_ref, "ref"}, {&s_append, "append"}, {&s_attrs, "attrs"}, {&s_phase, "phase"},
                 {&s_eval_t0, "eval_t0"}, {&s_eval_explicit, "eval_explicit"}, {&s_mb_fwd, "mb_fwd"},
                 {&s_mb_bwd, "mb_bwd"}, {&s_opt_end, "opt_end"},
                 {&s_uses_opt, "uses_opt"}, {&s_fwd_depth, "fwd_depth"}, {&s_fetching, "fetching"},
                 {&s_copying, "copying"}, {&s_discovering, "discovering"}, {&s_rec_, "_rec"}, {&s_now, "now"},
                 {&s_training, "training"}, {&s_fwd_kind, "fwd_kind"}, {&s_opt_depth, "opt_depth"},
                 {&s_fwd_nested, "fwd_nested"}, {&s_fwd_region, "fwd_region"}, {&s_enter, "__enter__"},
                 {&s_exit, "__exit__"}, {&s_micro_batches, "micro_batches"}, {&s_t0, "t0"}, {&s_t1, "t1"},
                 {&s_parent, "parent"}, {&s_last_end, "last_end"},
                 {&s_bwd_depth, "bwd_depth"}, {&s_part_phase, "part_phase"}, {&s_unseen, "unseen"}, {&s_n, "n"},
                 {&s_opt_closure, "opt_closure"}, {&s_index_sampler, "_index_sampler"}, {&s_needed, "needed"},
                 {&s_decide, "decide"}, {&s_boundary, "boundary"}, {&s_after, "after"}, {&s_stepped, "stepped"},
                 {&s_epoch, "epoch"}, {&s_epoch_fixed, "epoch_fixed"}, {&s_train_iter, "train_iter"},
                 {&s_step_closed, "step_closed"},
                 {&s_rediscover_every, "REDISCOVER_EVERY"}, {&s_aux_depth, "aux_depth"}, {&s_closure, "closure"},
                 {&s_dev, "dev"}, {&s_evaluations, "evaluations"}, {&s_events, "events"},
                 {&s_last_callers, "last_callers"}, {&s_nest, "nest"}, {&s_opt_frame, "opt_frame"},
                 {&s_opt_owner, "opt_owner"}, {&s_opt_t0, "opt_t0"}, {&s_phase_end, "phase_end"},
                 {&s_phase_parts, "phase_parts"}, {&s_site_probe, "site_probe"}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if ((*names[i].slot = PyUnicode_InternFromString(names[i].name)) == NULL)
            return NULL;
    }
    PyObject *hotpath = PyImport_ImportModule("otel_train.record._hotpath");
    if (hotpath == NULL) { /* not built: the generic calls */
        PyErr_Clear();
    } else {
        g_c_region = (PyTypeObject *)PyObject_GetAttrString(hotpath, "Region");
        g_c_step = (PyTypeObject *)PyObject_GetAttrString(hotpath, "Step");
        Py_DECREF(hotpath);
        if ((g_api = PyCapsule_Import(HOTPATH_API_NAME, 0)) == NULL)
            PyErr_Clear();
        if (g_c_region == NULL || g_c_step == NULL || !PyType_Check(g_c_region) || !PyType_Check(g_c_step)) {
            PyErr_Clear();
            Py_CLEAR(g_c_region);
            Py_CLEAR(g_c_step);
        }
    }
    return PyModule_Create(&module_def);
}
