/* `detect.batch`'s noting entry points in C: what the hooks call every micro-batch while
 * detection's calls are batched (forward begin and end, a backward, a batch fetch, the beginning
 * and the end of an optimizer step, a zero_grad, a gradient clipping), past their checks, note
 * the call and return.
 *
 * Each has its Python function of the same name in `batch.py`: the fallback where this module
 * cannot be built, and what anything uncommon calls from its start, before the C code changed
 * anything (a call that goes straight to its body, an error reading a check). Why: a note made
 * in Python costs each hook three to five Python calls of its own (the entry point, `_can`,
 * `_note`, `_wrapped`, `_done`, `_inside`), about 45 a step of issue 31's loop, each run with
 * cold caches between torch's operations. tests/test_detect_batch.py holds both forms to the
 * same spans, to the nanosecond.
 *
 * A note is made between two of torch's operations, so whatever it reads is cold: each read is
 * where it lies rather than by a lookup. `b`'s slots and the flags `can` checks are read at
 * their offsets (`_member.h`), the recorder's clock through the hot path's own
 * (`_hotpath_api.h`: no lookup, no call), and `BATCH_CALLS`, `MAX_WAIT_NS` and the first
 * note's time once a batch, when its first note is made
 * (docs/benchmarks/2026-11-27-lean-notes.md).
 *
 * `bind` gives this module `batch.b` (whose `__slots__` it reads and writes where they lie, as
 * `_loops.c` does the detection state's), `batch`'s module dict (`BATCH_CALLS` and
 * `MAX_WAIT_NS`, read as each batch begins: tests change them), the recorder module's dict
 * (`_rec`), discovery's `roots`, the compile flag's holder, `_hotpath.set_settle`,
 * `batch.settle`, `torch.is_grad_enabled`, zero_grad's `sites.decided_place`,
 * `batch_size.size_of` and the Python entry points; `bind_replay` the detection state, which
 * the optimizer's begin also reads (`site_probe`). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <pythread.h>

#include "_member.h"
#include "_update.h"
#include "../record/_hotpath_api.h"

/* The note kinds and a wrapped note's fields: their one numbering, which `batch.py` takes from
 * this module's constants. */
enum { FWD_BEGIN, FWD_END, BACKWARD, FETCH, OPT_BEGIN, OPT_END, ZERO_GRAD, GC, CLIP, KINDS };
enum { T1 = 2, INDEX = 3, INNER = 4, ERROR = 5 };

/* `batch.Batch`'s slots this module reads or writes. */
enum { B_NOTES, B_TAKEN, B_ON, B_THREAD, B_FAILED, B_OPT_DEPTH, B_OPT_NOTE, B_OPT_FRAME, B_FWD_SEEN, B_FETCHING,
       B_WAITED, B_REAL, B_N };
static const char *const b_names[B_N] = {"notes", "taken", "on", "thread", "failed", "opt_depth", "opt_note",
                                         "opt_frame", "fwd_seen", "fetching", "waited", "real"};
static Py_ssize_t b_off[B_N];

/* The Python entry points, the fallback for what the C code does not take. */
enum { P_FORWARD_BEGIN, P_FORWARD_END, P_BACKWARD_RUN, P_FETCH, P_OPTIMIZER_END, P_ZERO_GRAD_RUN, P_CLIP_RUN,
       P_OPTIMIZER_BEGIN, P_N };

static PyObject *g_b, *g_batch_dict, *g_rec_dict, *g_roots, *g_compiled, *g_set_settle, *g_settle, *g_grad_enabled,
    *g_decided_place, *g_size_of, *g_python[P_N];
static PyObject *g_kind[KINDS];
static PyObject *s_rec, *s_now, *s_discovering, *s_seen, *s_training, *s_batch_calls, *s_max_wait, *s_closure,
    *s_site_probe;

/* `b.<slot>`: borrowed, NULL where unset (no error set). */
static inline PyObject *
bget(int i)
{
    return *(PyObject **)((char *)g_b + b_off[i]);
}

static inline void
bset(int i, PyObject *v)
{
    Py_XSETREF(*(PyObject **)((char *)g_b + b_off[i]), Py_NewRef(v));
}

static int
truthy(PyObject *v)
{
    return v == Py_True ? 1 : v == Py_False || v == Py_None || v == NULL ? 0 : PyObject_IsTrue(v);
}

/* A small int slot (`opt_depth`, `fetching`, `taken`): its value, -1 with an error otherwise. */
static Py_ssize_t
bint(int i)
{
    PyObject *v = bget(i);
    if (v == NULL || !PyLong_CheckExact(v)) {
        PyErr_SetString(PyExc_TypeError, "otel_train: batch state is not an int");
        return -1;
    }
    return PyLong_AsSsize_t(v);
}

static int
bset_int(int i, Py_ssize_t n)
{
    PyObject *v = PyLong_FromSsize_t(n);
    if (v == NULL)
        return -1;
    Py_XSETREF(*(PyObject **)((char *)g_b + b_off[i]), v);
    return 0;
}

/* The main thread's id as `b.thread` last held it (the object, a strong reference, and its value). */
static PyObject *g_thread;
static unsigned long g_thread_id;
/* `roots.discovering` and `compiled.seen`, read where they lie (`_member.h`). */
static Member m_discovering = {&s_discovering}, m_seen = {&s_seen};

/* `batch._can()`, and the recorder it found: 1 (a new reference in *rec), 0, -1 with an error.
 * Every call reads these between torch's operations, cold: each is read where it lies. */
static int
can(PyObject **rec)
{
    if (g_b == NULL || !truthy(bget(B_ON)) || truthy(bget(B_FAILED)))
        return 0;
    PyObject *thread = bget(B_THREAD);
    if (thread != g_thread) {
        if (thread == NULL || !PyLong_CheckExact(thread))
            return 0;
        unsigned long ident = PyLong_AsUnsignedLong(thread);
        if (ident == (unsigned long)-1 && PyErr_Occurred())
            return -1;
        Py_XSETREF(g_thread, Py_NewRef(thread));
        g_thread_id = ident;
    }
    if (g_thread_id != PyThread_get_thread_ident())
        return 0;
    PyObject *r = PyDict_GetItemWithError(g_rec_dict, s_rec); /* borrowed */
    if (r == NULL || r == Py_None)
        return PyErr_Occurred() ? -1 : 0;
    int no = true_of(mget(g_roots, &m_discovering));
    if (no == 0)
        no = true_of(mget(g_compiled, &m_seen));
    if (no)
        return no < 0 ? -1 : 0;
    *rec = Py_NewRef(r);
    return 1;
}

/* The hot path's capsule (`_hotpath_api.h`), NULL where it is not built; the recorder type last
 * found to be its `RecorderBase`. */
static const HotpathAPI *g_api;
static PyTypeObject *g_rec_type;

/* `r.now()`: a new int, or NULL with an error. */
static PyObject *
now(PyObject *r)
{
    return recorder_now(g_api, &g_rec_type, r, s_now);
}

static Py_ssize_t
module_int(PyObject *name)
{
    PyObject *v = PyDict_GetItemWithError(g_batch_dict, name);
    if (v == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetObject(PyExc_AttributeError, name);
        return -1;
    }
    return PyLong_AsSsize_t(v);
}

static int
settle(void)
{
    PyObject *out = PyObject_CallNoArgs(g_settle);
    Py_XDECREF(out);
    return out == NULL ? -1 : 0;
}

/* What a batch's first note (a strong reference) set for the batch: `BATCH_CALLS`, `MAX_WAIT_NS`
 * and its time, read once a batch rather than once a note. */
static PyObject *g_first;
static Py_ssize_t g_most, g_bound;
static int64_t g_first_t;

/* A note's time (its item 1) as a C integer: 0, or -1 with an error. */
static int
time_of(PyObject *n, int64_t *out)
{
    return as_i64(PySequence_Fast_GET_ITEM(n, 1), out);
}

/* The batch begun by note `first`: its limits read. 0, or -1 with an error. */
static int
batch_begun(PyObject *first)
{
    Py_ssize_t most = module_int(s_batch_calls), bound = most == -1 && PyErr_Occurred() ? -1 : module_int(s_max_wait);
    int64_t t;
    if ((bound == -1 && PyErr_Occurred()) || time_of(first, &t) < 0)
        return -1;
    Py_XSETREF(g_first, Py_NewRef(first));
    g_most = most;
    g_bound = bound;
    g_first_t = t;
    return 0;
}

/* `batch._note(note)`: 0, or -1 with an error. */
static int
note(PyObject *n)
{
    PyObject *notes = bget(B_NOTES);
    if (notes == NULL || !PyList_CheckExact(notes)) {
        PyErr_SetString(PyExc_TypeError, "otel_train: batch notes are not a list");
        return -1;
    }
    Py_ssize_t len = PyList_GET_SIZE(notes);
    if (len) {
        int64_t t;
        /* a batch begun by a note made elsewhere (in Python) is read now */
        if ((PyList_GET_ITEM(notes, 0) != g_first && batch_begun(PyList_GET_ITEM(notes, 0)) < 0) ||
            time_of(n, &t) < 0)
            return -1;
        if (len >= g_most) {
            if (settle() < 0)
                return -1;
        } else if (t - g_first_t > g_bound) {
            bset(B_WAITED, Py_True); /* slow steps: a small batch here says nothing of reads */
            if (settle() < 0)
                return -1;
        }
        if ((notes = bget(B_NOTES)) == NULL || !PyList_CheckExact(notes)) {
            PyErr_SetString(PyExc_TypeError, "otel_train: batch notes are not a list");
            return -1;
        }
    }
    if (PyList_GET_SIZE(notes) == 0) {
        if (batch_begun(n) < 0)
            return -1;
        if (g_set_settle != Py_None) {
            PyObject *out = PyObject_CallOneArg(g_set_settle, g_settle);
            if (out == NULL)
                return -1;
            Py_DECREF(out);
        }
    }
    if (PyList_CheckExact(n) && PyList_GET_ITEM(n, 0) != g_kind[OPT_BEGIN]) {
        Py_ssize_t taken = bint(B_TAKEN);
        if (taken == -1 && PyErr_Occurred())
            return -1;
        PyObject *index = PyLong_FromSsize_t(taken + PyList_GET_SIZE(notes));
        if (index == NULL)
            return -1;
        PyList_SetItem(n, INDEX, index); /* steals */
    }
    return PyList_Append(notes, n);
}

/* `batch._wrapped(kind, t0, *rest)`: the note, noted (a new reference), or NULL. */
static PyObject *
wrapped(int kind, PyObject *t0, PyObject *a, PyObject *b)
{
    Py_ssize_t n = 6 + (a != NULL) + (b != NULL);
    PyObject *w = PyList_New(n);
    if (w == NULL)
        return NULL;
    PyList_SET_ITEM(w, 0, Py_NewRef(g_kind[kind]));
    PyList_SET_ITEM(w, 1, Py_NewRef(t0));
    PyList_SET_ITEM(w, T1, Py_NewRef(Py_None));
    PyList_SET_ITEM(w, INDEX, PyLong_FromLong(0));
    PyList_SET_ITEM(w, INNER, PyLong_FromLong(0));
    PyList_SET_ITEM(w, ERROR, Py_NewRef(Py_None));
    if (a != NULL)
        PyList_SET_ITEM(w, 6, Py_NewRef(a));
    if (b != NULL)
        PyList_SET_ITEM(w, 7, Py_NewRef(b));
    if (PyList_GET_ITEM(w, INDEX) == NULL || PyList_GET_ITEM(w, INNER) == NULL || note(w) < 0) {
        Py_DECREF(w);
        return NULL;
    }
    return w;
}

/* `batch._done(note, t1, error)`: 0, or -1 with an error. */
static int
done(PyObject *w, PyObject *t1, PyObject *error)
{
    PyObject *notes = bget(B_NOTES);
    Py_ssize_t taken = bint(B_TAKEN), index = PyLong_AsSsize_t(PyList_GET_ITEM(w, INDEX));
    if (PyErr_Occurred())
        return -1;
    PyObject *inner = PyLong_FromSsize_t(taken + PyList_GET_SIZE(notes) - index - 1);
    if (inner == NULL)
        return -1;
    PyList_SetItem(w, INNER, inner);
    PyList_SetItem(w, ERROR, Py_NewRef(error));
    PyList_SetItem(w, T1, Py_NewRef(t1));
    return 0;
}

/* The user's call in wrapped note `w` raised (the error set): the note completed with the end's
 * time and the error, which goes on as it came, traceback and all (no frame of ours is in it).
 * Returns NULL. */
static PyObject *
raised(PyObject *w, PyObject *r)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL)
        PyException_SetTraceback(value, tb);
    PyObject *t1 = now(r);
    if (t1 != NULL && done(w, t1, value) == 0) {
        PyErr_Restore(type, value, tb);
    } else { /* an error of ours, set, in place of the call's */
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
    }
    Py_XDECREF(t1);
    return NULL;
}

/* `batch._inside`: the user's function called inside its wrapped call's note, which its end
 * completes (the end's time, what it raised). */
static PyObject *
inside(PyObject *w, PyObject *r, PyObject *original, PyObject *args, PyObject *kwargs)
{
    PyObject *out = PyObject_Call(original, args, kwargs == Py_None ? NULL : kwargs);
    if (out == NULL)
        return raised(w, r);
    PyObject *t1 = now(r);
    if (t1 == NULL || done(w, t1, Py_None) < 0) {
        Py_XDECREF(t1);
        Py_DECREF(out);
        return NULL;
    }
    Py_DECREF(t1);
    return out;
}

/* The Python entry point `p` with these arguments, from its start. */
static PyObject *
python(int p, PyObject *const *args, Py_ssize_t nargs)
{
    if (g_python[p] == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "otel_train: detect._batch called while not bound");
        return NULL;
    }
    return PyObject_Vectorcall(g_python[p], args, nargs, NULL);
}

/* Not taken here (`ok` 0), or a check failed with an error (`ok` -1, the error dropped: the
 * Python entry point will meet the same state, and say what it must): the Python entry point
 * `p` decides, from its start. */
static PyObject *
not_taken(int ok, int p, PyObject *const *args, Py_ssize_t nargs)
{
    if (ok < 0)
        PyErr_Clear();
    return python(p, args, nargs);
}

/* --- the entry points ------------------------------------------------------------------- */

/* `forward_begin(module)` and `forward_end(module)`. */
static PyObject *
forward_mark(int kind, int p, PyObject *module)
{
    PyObject *r = NULL, *t = NULL, *n = NULL;
    int ok = can(&r);
    if (ok > 0 && kind == FWD_BEGIN) {
        Py_ssize_t depth = bint(B_OPT_DEPTH);
        PyObject *grad = depth == 0 ? PyObject_CallNoArgs(g_grad_enabled) : NULL;
        PyObject *training = grad == Py_True ? PyObject_GetAttr(module, s_training) : NULL;
        ok = PyErr_Occurred() ? -1 : depth == 0 && grad == Py_True && training == Py_True;
        Py_XDECREF(grad);
        Py_XDECREF(training);
    }
    if (ok <= 0) {
        Py_XDECREF(r);
        return not_taken(ok, p, &module, 1);
    }
    if (kind == FWD_BEGIN)
        bset(B_FWD_SEEN, Py_True);
    if ((t = now(r)) != NULL && (n = PyTuple_Pack(3, g_kind[kind], t, module)) != NULL && note(n) == 0) {
        Py_DECREF(n);
        Py_DECREF(t);
        Py_DECREF(r);
        Py_RETURN_NONE;
    }
    Py_XDECREF(n);
    Py_XDECREF(t);
    Py_DECREF(r);
    return NULL;
}

static PyObject *
forward_begin(PyObject *self, PyObject *module)
{
    return forward_mark(FWD_BEGIN, P_FORWARD_BEGIN, module);
}

static PyObject *
forward_end(PyObject *self, PyObject *module)
{
    return forward_mark(FWD_END, P_FORWARD_END, module);
}

/* `backward_run(original, args, kwargs)`. */
static PyObject *
backward_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3)
        return python(P_BACKWARD_RUN, args, nargs);
    PyObject *r = NULL;
    int ok = can(&r);
    if (ok > 0) {
        Py_ssize_t depth = bint(B_OPT_DEPTH);
        ok = PyErr_Occurred() ? -1 : depth == 0 && truthy(bget(B_FWD_SEEN)) && PyTuple_Check(args[1]);
    }
    if (ok <= 0) { /* no forward seen: the body looks for the model now */
        Py_XDECREF(r);
        return not_taken(ok, P_BACKWARD_RUN, args, nargs);
    }
    bset(B_FWD_SEEN, Py_False);
    PyObject *out = NULL, *t = now(r), *w = t != NULL ? wrapped(BACKWARD, t, NULL, NULL) : NULL;
    if (w != NULL)
        out = inside(w, r, args[0], args[1], args[2]);
    Py_XDECREF(w);
    Py_XDECREF(t);
    Py_DECREF(r);
    return out;
}

/* `fetch(original, iterator)`. */
static PyObject *
fetch(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2)
        return python(P_FETCH, args, nargs);
    PyObject *r = NULL;
    int ok = can(&r);
    if (ok <= 0)
        return not_taken(ok, P_FETCH, args, nargs);
    PyObject *batch = NULL, *t1 = NULL, *t = now(r), *w = t != NULL ? wrapped(FETCH, t, args[1], Py_None) : NULL;
    Py_ssize_t fetching;
    if (w == NULL || (fetching = bint(B_FETCHING)) < 0 || bset_int(B_FETCHING, fetching + 1) < 0)
        goto end;
    batch = PyObject_CallOneArg(args[0], args[1]);
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb); /* the fetch's error, if any, aside while the count goes back */
    if ((fetching = bint(B_FETCHING)) < 0 || bset_int(B_FETCHING, fetching - 1) < 0) {
        Py_XDECREF(type); /* an error of ours, set, in place of the fetch's */
        Py_XDECREF(value);
        Py_XDECREF(tb);
        Py_CLEAR(batch);
        goto end;
    }
    PyErr_Restore(type, value, tb);
    if (batch == NULL) {
        raised(w, r);
        goto end;
    }
    PyObject *size = NULL;
    if ((t1 = now(r)) == NULL || (size = PyObject_CallOneArg(g_size_of, batch)) == NULL ||
        PyList_SetItem(w, 7, size) < 0 || done(w, t1, Py_None) < 0)
        Py_CLEAR(batch);
end:
    Py_XDECREF(t1);
    Py_XDECREF(w);
    Py_XDECREF(t);
    Py_DECREF(r);
    return batch;
}

/* The detection state (`bind_replay`), and its `site_probe` read where it lies. */
static PyObject *g_s;
static Member m_site_probe = {&s_site_probe};

/* `optimizer_begin(opt, args, kwargs)`, called straight from the optimizer's pre-hook (whose
 * caller is torch's step wrapper): the outermost update, with no closure, its call site not
 * being probed. */
static PyObject *
optimizer_begin(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3)
        return python(P_OPTIMIZER_BEGIN, args, nargs);
    PyObject *r = NULL;
    int ok = can(&r);
    if (ok > 0) {
        Py_ssize_t depth = bint(B_OPT_DEPTH);
        PyObject *closure = depth == 0 ? closure_of(args[1], args[2], s_closure) : NULL; /* borrowed */
        ok = PyErr_Occurred() ? -1 : depth == 0 && (closure == NULL || closure == Py_None);
        if (ok > 0) { /* probing the call site: the body reads the whole stack, now */
            int probing = g_s != NULL ? true_of(mget(g_s, &m_site_probe)) : 1;
            ok = probing < 0 ? -1 : !probing;
        }
    }
    PyFrameObject *wrapper = NULL, *caller = NULL;
    if (ok > 0)
        update_frames(&wrapper, &caller);
    if (ok <= 0 || wrapper == NULL) {
        Py_XDECREF(r);
        Py_XDECREF(wrapper);
        Py_XDECREF(caller);
        return not_taken(ok, P_OPTIMIZER_BEGIN, args, nargs);
    }
    PyObject *callers = caller != NULL ? callers_of(caller) : Py_NewRef(Py_None), *t = NULL, *n = NULL;
    if (callers != NULL && (t = now(r)) != NULL && (n = PyList_New(7)) != NULL) {
        PyObject *const items[7] = {g_kind[OPT_BEGIN], t, args[0], args[1], args[2], (PyObject *)wrapper, callers};
        for (int i = 0; i < 7; i++)
            PyList_SET_ITEM(n, i, Py_NewRef(items[i]));
        if (bset_int(B_OPT_DEPTH, 1) == 0) {
            bset(B_OPT_FRAME, (PyObject *)wrapper);
            if (note(n) == 0)
                bset(B_OPT_NOTE, n);
        }
    }
    int failed = PyErr_Occurred() != NULL;
    Py_XDECREF(n);
    Py_XDECREF(t);
    Py_XDECREF(callers);
    Py_XDECREF(caller);
    Py_DECREF(wrapper);
    Py_DECREF(r);
    if (failed)
        return NULL;
    Py_RETURN_NONE;
}

/* `optimizer_end(opt, args, kwargs)`. */
static PyObject *
optimizer_end(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3)
        return python(P_OPTIMIZER_END, args, nargs);
    PyObject *r = NULL;
    int ok = can(&r);
    if (ok <= 0)
        return not_taken(ok, P_OPTIMIZER_END, args, nargs);
    Py_ssize_t depth = bint(B_OPT_DEPTH);
    if (depth < 0) {
        Py_DECREF(r);
        return not_taken(-1, P_OPTIMIZER_END, args, nargs);
    }
    if (depth) {
        if (bset_int(B_OPT_DEPTH, depth - 1) < 0) {
            Py_DECREF(r);
            return NULL;
        }
        if (depth == 1) {
            PyObject *held = bget(B_OPT_NOTE);
            /* step() is over: its frame would keep the caller's alive */
            if (held != NULL && held != Py_None && PyList_CheckExact(held) && PyList_GET_SIZE(held) > 5)
                PyList_SetItem(held, 5, Py_NewRef(Py_None));
            bset(B_OPT_NOTE, Py_None);
            bset(B_OPT_FRAME, Py_None);
        }
    }
    PyObject *n = NULL, *t = now(r);
    int failed = t == NULL || (n = PyTuple_Pack(5, g_kind[OPT_END], t, args[0], args[1], args[2])) == NULL ||
                 note(n) < 0;
    Py_XDECREF(n);
    Py_XDECREF(t);
    Py_DECREF(r);
    if (failed)
        return NULL;
    Py_RETURN_NONE;
}

/* `zero_grad_run(r, s, original, args, kwargs)` and `clip_run(...)`: the same five arguments. */
static PyObject *
aux_run(int kind, int p, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5)
        return python(p, args, nargs);
    PyObject *r = NULL, *place = NULL;
    int ok = can(&r);
    if (ok > 0) {
        Py_ssize_t depth = bint(B_OPT_DEPTH);
        ok = PyErr_Occurred() ? -1 : depth == 0 && PyTuple_Check(args[3]);
    }
    if (ok > 0 && kind == ZERO_GRAD) {
        place = PyObject_CallNoArgs(g_decided_place);
        ok = place == NULL ? -1 : place != Py_None;
    }
    if (ok <= 0) {
        Py_XDECREF(r);
        Py_XDECREF(place);
        return not_taken(ok, p, args, nargs);
    }
    /* the noted recorder is the one the call was given, as in Python */
    PyObject *out = NULL, *t = now(args[0]), *w = t != NULL ? wrapped(kind, t, args[0], place) : NULL;
    if (w != NULL)
        out = inside(w, args[0], args[2], args[3], args[4]);
    Py_XDECREF(w);
    Py_XDECREF(t);
    Py_XDECREF(place);
    Py_DECREF(r);
    return out;
}

static PyObject *
zero_grad_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    return aux_run(ZERO_GRAD, P_ZERO_GRAD_RUN, args, nargs);
}

static PyObject *
clip_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    return aux_run(CLIP, P_CLIP_RUN, args, nargs);
}

/* --- the replay ------------------------------------------------------------------------ */

/* `bind_replay`: the detection state, the busy checks of a fetch, a backward and a zero_grad or
 * clipping, the GC pause body, `_loops.set_replay`, and `batch._PLAIN`. */
static PyObject *g_data_busy, *g_backward_busy, *g_aux_busy, *g_gc_pause, *g_set_replay, *g_plain;
static PyObject *s_real, *s_replay, *s_int, *s_generation, *s_forward_begin, *s_forward_end, *s_backward_run,
    *s_fetch, *s_optimizer_begin, *s_optimizer_end, *s_zero_grad_run, *s_clip_run;

static Py_ssize_t replay_span(PyObject *notes, Py_ssize_t i, Py_ssize_t end, PyObject *r);

/* `State.replay`, read and written where it lies (`_member.h`). */
static Member m_replay = {&s_replay}, m_replay_w = {&s_replay};

/* `batch._facts(facts)`: what the bodies read instead of the live values. */
static int
facts_set(PyObject *facts)
{
    PyObject *was = mget(g_s, &m_replay);
    if (was == NULL)
        return -1;
    Py_DECREF(was);
    if (was == facts)
        return 0;
    if (mset(g_s, &m_replay_w, facts) < 0)
        return -1;
    PyObject *out = PyObject_CallOneArg(g_set_replay, facts);
    Py_XDECREF(out);
    return out == NULL ? -1 : 0;
}

/* `r.now = t.__int__`: the recorder's clock reads `t`. */
static int
clock_at(PyObject *r, PyObject *t)
{
    return recorder_pin(g_api, &g_rec_type, r, t, s_now, s_int);
}

/* `batch._StandIn`: the user's function as a replayed body calls it. */
typedef struct {
    PyObject_HEAD
    PyObject *notes, *r, *note, *facts;
    Py_ssize_t i, end;
} StandIn;

static void
standin_dealloc(StandIn *self)
{
    Py_XDECREF(self->notes);
    Py_XDECREF(self->r);
    Py_XDECREF(self->note);
    Py_XDECREF(self->facts);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
standin_call(StandIn *self, PyObject *args, PyObject *kwargs)
{
    if (self->end > self->i) {
        if (replay_span(self->notes, self->i, self->end, self->r) < 0 || facts_set(self->facts) < 0)
            return NULL;
    }
    if (clock_at(self->r, PyList_GET_ITEM(self->note, T1)) < 0)
        return NULL;
    PyObject *error = PyList_GET_ITEM(self->note, ERROR);
    if (error != Py_None) {
        PyErr_SetObject((PyObject *)Py_TYPE(error), error);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyTypeObject StandInType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "otel_train.detect._batch.StandIn",
    .tp_basicsize = sizeof(StandIn),
    .tp_dealloc = (destructor)standin_dealloc,
    .tp_call = (ternaryfunc)standin_call,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The user's function, as a replayed body calls it (batch._StandIn).",
};

/* `batch._call`: a wrapped call's body, replayed; what the call raised comes back through the
 * body and stops here, the exception left as the user's code holds it. 0, or -1 with an error. */
static int
call_body(StandIn *stand_in, PyObject *body, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *error = PyList_GET_ITEM(stand_in->note, ERROR);
    if (error == Py_None) {
        PyObject *out = PyObject_Vectorcall(body, args, nargs, NULL);
        Py_XDECREF(out);
        return out == NULL ? -1 : 0;
    }
    Py_INCREF(error);
    PyObject *tb = PyException_GetTraceback(error), *context = PyException_GetContext(error),
             *cause = PyException_GetCause(error);
    char suppress = ((PyBaseExceptionObject *)error)->suppress_context;
    PyObject *out = PyObject_Vectorcall(body, args, nargs, NULL);
    int failed = 0;
    if (out == NULL) {
        PyObject *type, *value, *trace;
        PyErr_Fetch(&type, &value, &trace);
        PyErr_NormalizeException(&type, &value, &trace);
        if (value == error) { /* the call's own error: it stops here */
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(trace);
        } else {
            PyErr_Restore(type, value, trace);
            failed = 1;
        }
    }
    Py_XDECREF(out);
    PyException_SetTraceback(error, tb != NULL ? tb : Py_None);
    Py_XDECREF(tb);
    PyException_SetContext(error, context); /* steals */
    PyException_SetCause(error, cause);     /* steals */
    ((PyBaseExceptionObject *)error)->suppress_context = suppress;
    Py_DECREF(error);
    return failed ? -1 : 0;
}

static PyObject *
real(PyObject *name)
{
    PyObject *table = bget(B_REAL);
    PyObject *fn = table != NULL && PyDict_CheckExact(table) ? PyDict_GetItemWithError(table, name) : NULL;
    if (fn == NULL && !PyErr_Occurred())
        PyErr_SetObject(PyExc_KeyError, name);
    return fn; /* borrowed */
}

static int
call_real(PyObject *name, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *fn = real(name);
    if (fn == NULL)
        return -1;
    PyObject *out = PyObject_Vectorcall(fn, args, nargs, NULL);
    Py_XDECREF(out);
    return out == NULL ? -1 : 0;
}

/* One wrapped note at notes[i] (its end reached): its body around a stand-in, or its inner notes
 * alone where its wrapper would have called the user's function alone. */
static int
replay_wrapped(PyObject *notes, Py_ssize_t i, Py_ssize_t inner, PyObject *r, int kind, PyObject *note)
{
    PyObject *busy_fn = kind == FETCH ? g_data_busy : kind == BACKWARD ? g_backward_busy : g_aux_busy;
    PyObject *v = PyObject_CallOneArg(busy_fn, g_s);
    if (v == NULL)
        return -1;
    int busy = PyObject_IsTrue(v);
    Py_DECREF(v);
    if (busy < 0)
        return -1;
    if (busy)
        return replay_span(notes, i + 1, i + 1 + inner, r) < 0 ? -1 : 0;
    PyObject *facts;
    if (kind == FETCH || kind == ZERO_GRAD) {
        facts = PyTuple_Pack(6, Py_True, Py_True, kind == FETCH ? PyList_GET_ITEM(note, 7) : Py_None, Py_None, Py_None,
                             kind == FETCH ? g_kind[0] : PyList_GET_ITEM(note, 7));
        if (facts == NULL)
            return -1;
    } else {
        facts = Py_NewRef(g_plain);
    }
    StandIn *stand_in = PyObject_New(StandIn, &StandInType);
    if (stand_in == NULL) {
        Py_DECREF(facts);
        return -1;
    }
    stand_in->notes = Py_NewRef(notes);
    stand_in->r = Py_NewRef(r);
    stand_in->note = Py_NewRef(note);
    stand_in->facts = facts;
    stand_in->i = i + 1;
    stand_in->end = i + 1 + inner;
    int out = facts_set(facts);
    PyObject *body = NULL;
    if (out == 0) {
        body = real(kind == FETCH ? s_fetch : kind == BACKWARD ? s_backward_run : kind == CLIP ? s_clip_run
                                                                                                : s_zero_grad_run);
        out = body == NULL ? -1 : 0;
    }
    if (out == 0) {
        PyObject *self = (PyObject *)stand_in;
        if (kind == FETCH) {
            PyObject *args[2] = {self, PyList_GET_ITEM(note, 6)};
            out = call_body(stand_in, body, args, 2);
        } else if (kind == BACKWARD) {
            PyObject *none_args = PyTuple_New(0);
            PyObject *args[3] = {self, none_args, Py_None};
            out = none_args == NULL ? -1 : call_body(stand_in, body, args, 3);
            Py_XDECREF(none_args);
        } else {
            PyObject *empty = PyTuple_New(0), *kw = PyDict_New();
            PyObject *args[5] = {PyList_GET_ITEM(note, 6), g_s, self, empty, kw};
            out = empty == NULL || kw == NULL ? -1 : call_body(stand_in, body, args, 5);
            Py_XDECREF(empty);
            Py_XDECREF(kw);
        }
    }
    Py_DECREF(stand_in);
    return out;
}

/* `batch._replay`: notes[i:end] to recorder `r`; the index reached (a wrapped call still running
 * stops it), or -1 with an error. */
static Py_ssize_t
replay_span(PyObject *notes, Py_ssize_t i, Py_ssize_t end, PyObject *r)
{
    while (i < end) {
        if (i >= PyList_GET_SIZE(notes)) {
            PyErr_SetString(PyExc_IndexError, "otel_train: a note past the batch");
            return -1;
        }
        PyObject *note = Py_NewRef(PyList_GET_ITEM(notes, i));
        PyObject *item = PySequence_Fast_GET_ITEM(note, 0);
        long kind = PyLong_AsLong(item);
        int failed = (kind == -1 && PyErr_Occurred()) || clock_at(r, PySequence_Fast_GET_ITEM(note, 1)) < 0;
        if (!failed && (kind == BACKWARD || kind == FETCH || kind == ZERO_GRAD || kind == CLIP)) {
            if (PyList_GET_ITEM(note, T1) == Py_None) {
                Py_DECREF(note);
                return i;
            }
            Py_ssize_t inner = PyLong_AsSsize_t(PyList_GET_ITEM(note, INNER));
            failed = (inner == -1 && PyErr_Occurred()) || replay_wrapped(notes, i, inner, r, (int)kind, note) < 0;
            Py_DECREF(note);
            if (failed)
                return -1;
            i += 1 + inner;
            continue;
        }
        if (!failed) {
            PyObject *const *f = PySequence_Fast_ITEMS(note);
            if (kind == FWD_BEGIN || kind == FWD_END)
                failed = facts_set(g_plain) < 0 || call_real(kind == FWD_BEGIN ? s_forward_begin : s_forward_end,
                                                             f + 2, 1) < 0;
            else if (kind == OPT_BEGIN) {
                PyObject *facts = PyTuple_Pack(6, Py_True, Py_True, Py_None, f[5], f[6], g_kind[0]);
                failed = facts == NULL || facts_set(facts) < 0 || call_real(s_optimizer_begin, f + 2, 3) < 0;
                Py_XDECREF(facts);
            } else if (kind == OPT_END)
                failed = facts_set(g_plain) < 0 || call_real(s_optimizer_end, f + 2, 3) < 0;
            else {
                PyObject *info = Py_BuildValue("{OO}", s_generation, f[3]);
                PyObject *args[2] = {f[2], info};
                PyObject *out = info != NULL ? PyObject_Vectorcall(g_gc_pause, args, 2, NULL) : NULL;
                failed = out == NULL;
                Py_XDECREF(out);
                Py_XDECREF(info);
            }
        }
        Py_DECREF(note);
        if (failed)
            return -1;
        i += 1;
    }
    return i;
}

static PyObject *
replay(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyList_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "replay(notes: list, i, end, r)");
        return NULL;
    }
    if (g_s == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "replay: bind_replay first");
        return NULL;
    }
    Py_ssize_t i = PyLong_AsSsize_t(args[1]), end = PyLong_AsSsize_t(args[2]);
    if (PyErr_Occurred())
        return NULL;
    Py_ssize_t reached = replay_span(args[0], i, end, args[3]);
    return reached < 0 ? NULL : PyLong_FromSsize_t(reached);
}

/* --- binding ------------------------------------------------------------------------------ */

static void
unbind(void)
{
    Py_CLEAR(g_first);
    Py_CLEAR(g_thread);
    Py_CLEAR(g_b);
    Py_CLEAR(g_batch_dict);
    Py_CLEAR(g_rec_dict);
    Py_CLEAR(g_roots);
    Py_CLEAR(g_compiled);
    Py_CLEAR(g_set_settle);
    Py_CLEAR(g_settle);
    Py_CLEAR(g_grad_enabled);
    Py_CLEAR(g_decided_place);
    Py_CLEAR(g_size_of);
    for (int i = 0; i < P_N; i++)
        Py_CLEAR(g_python[i]);
    Py_CLEAR(g_s);
    Py_CLEAR(g_data_busy);
    Py_CLEAR(g_backward_busy);
    Py_CLEAR(g_aux_busy);
    Py_CLEAR(g_gc_pause);
    Py_CLEAR(g_set_replay);
    Py_CLEAR(g_plain);
}

static PyObject *
bind(PyObject *module, PyObject *args)
{
    PyObject *b, *batch_dict, *rec_dict, *roots, *compiled, *set_settle, *settle_, *grad, *decided, *size_of, *py;
    if (!PyArg_ParseTuple(args, "OO!O!OOOOOOOO!", &b, &PyDict_Type, &batch_dict, &PyDict_Type, &rec_dict, &roots,
                          &compiled, &set_settle, &settle_, &grad, &decided, &size_of, &PyTuple_Type, &py))
        return NULL;
    if (PyTuple_GET_SIZE(py) != P_N) {
        PyErr_Format(PyExc_ValueError, "bind: %d Python entry points expected", P_N);
        return NULL;
    }
    /* Where each slot of `b` lies: its class's member descriptors. */
    Py_ssize_t off[B_N];
    for (int i = 0; i < B_N; i++) {
        PyObject *name = PyUnicode_InternFromString(b_names[i]);
        if (name == NULL)
            return NULL;
        PyObject *descr = _PyType_Lookup(Py_TYPE(b), name); /* borrowed */
        Py_DECREF(name);
        if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type) ||
            ((PyMemberDescrObject *)descr)->d_member->type != T_OBJECT_EX) {
            PyErr_Format(PyExc_TypeError, "bind: %s is not a slot of the batch state", b_names[i]);
            return NULL;
        }
        off[i] = ((PyMemberDescrObject *)descr)->d_member->offset;
    }
    unbind();
    g_api = PyCapsule_Import(HOTPATH_API_NAME, 0);
    if (g_api == NULL)
        PyErr_Clear(); /* the hot path in Python: the recorder's clock is called as in Python */
    memcpy(b_off, off, sizeof off);
    g_b = Py_NewRef(b);
    g_batch_dict = Py_NewRef(batch_dict);
    g_rec_dict = Py_NewRef(rec_dict);
    g_roots = Py_NewRef(roots);
    g_compiled = Py_NewRef(compiled);
    g_set_settle = Py_NewRef(set_settle);
    g_settle = Py_NewRef(settle_);
    g_grad_enabled = Py_NewRef(grad);
    g_decided_place = Py_NewRef(decided);
    g_size_of = Py_NewRef(size_of);
    for (int i = 0; i < P_N; i++)
        g_python[i] = Py_NewRef(PyTuple_GET_ITEM(py, i));
    Py_RETURN_NONE;
}

static PyObject *
bind_replay(PyObject *module, PyObject *args)
{
    PyObject *st, *data_busy, *backward_busy, *aux_busy, *gc_pause, *set_replay, *plain;
    if (!PyArg_ParseTuple(args, "OOOOOOO!", &st, &data_busy, &backward_busy, &aux_busy, &gc_pause, &set_replay,
                          &PyTuple_Type, &plain))
        return NULL;
    Py_XSETREF(g_s, Py_NewRef(st));
    Py_XSETREF(g_data_busy, Py_NewRef(data_busy));
    Py_XSETREF(g_backward_busy, Py_NewRef(backward_busy));
    Py_XSETREF(g_aux_busy, Py_NewRef(aux_busy));
    Py_XSETREF(g_gc_pause, Py_NewRef(gc_pause));
    Py_XSETREF(g_set_replay, Py_NewRef(set_replay));
    Py_XSETREF(g_plain, Py_NewRef(plain));
    Py_RETURN_NONE;
}

static PyObject *
unbind_(PyObject *module, PyObject *unused)
{
    unbind();
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"forward_begin", forward_begin, METH_O, "batch.forward_begin's common path: the call noted."},
    {"forward_end", forward_end, METH_O, "batch.forward_end's common path: the call noted."},
    {"backward_run", (PyCFunction)(void (*)(void))backward_run, METH_FASTCALL,
     "batch.backward_run's common path: the user's backward inside its note."},
    {"fetch", (PyCFunction)(void (*)(void))fetch, METH_FASTCALL,
     "batch.fetch's common path: the loader's __next__ inside its note."},
    {"optimizer_begin", (PyCFunction)(void (*)(void))optimizer_begin, METH_FASTCALL,
     "batch.optimizer_begin's common path: the call noted, with the frames that called the update."},
    {"optimizer_end", (PyCFunction)(void (*)(void))optimizer_end, METH_FASTCALL,
     "batch.optimizer_end's common path: the call noted."},
    {"zero_grad_run", (PyCFunction)(void (*)(void))zero_grad_run, METH_FASTCALL,
     "batch.zero_grad_run's common path: the user's zero_grad inside its note."},
    {"clip_run", (PyCFunction)(void (*)(void))clip_run, METH_FASTCALL,
     "batch.clip_run's common path: the user's clipping inside its note."},
    {"bind", bind, METH_VARARGS,
     "bind(b, batch_dict, recorder_dict, roots, compiled, set_settle, settle, is_grad_enabled, decided_place, "
     "size_of, python_entry_points)"},
    {"replay", (PyCFunction)(void (*)(void))replay, METH_FASTCALL,
     "replay(notes, i, end, r) -> the index reached: batch._replay (notes[i:end] through detection's bodies)."},
    {"bind_replay", bind_replay, METH_VARARGS,
     "bind_replay(state, data_busy, backward_busy, aux_busy, gc_pause, set_replay, plain) (after bind)"},
    {"unbind", unbind_, METH_NOARGS, "Drop every reference `bind` took."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef batch_module = {
    PyModuleDef_HEAD_INIT, "otel_train.detect._batch", "detect.batch's noting entry points in C.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__batch(void)
{
    for (int i = 0; i < KINDS; i++)
        if ((g_kind[i] = PyLong_FromLong(i)) == NULL)
            return NULL;
    if ((s_rec = PyUnicode_InternFromString("_rec")) == NULL || (s_now = PyUnicode_InternFromString("now")) == NULL ||
        (s_discovering = PyUnicode_InternFromString("discovering")) == NULL ||
        (s_seen = PyUnicode_InternFromString("seen")) == NULL ||
        (s_training = PyUnicode_InternFromString("training")) == NULL ||
        (s_batch_calls = PyUnicode_InternFromString("BATCH_CALLS")) == NULL ||
        (s_max_wait = PyUnicode_InternFromString("MAX_WAIT_NS")) == NULL ||
        (s_closure = PyUnicode_InternFromString("closure")) == NULL ||
        (s_site_probe = PyUnicode_InternFromString("site_probe")) == NULL ||
        (s_real = PyUnicode_InternFromString("real")) == NULL ||
        (s_replay = PyUnicode_InternFromString("replay")) == NULL ||
        (s_int = PyUnicode_InternFromString("__int__")) == NULL ||
        (s_generation = PyUnicode_InternFromString("generation")) == NULL ||
        (s_forward_begin = PyUnicode_InternFromString("forward_begin")) == NULL ||
        (s_forward_end = PyUnicode_InternFromString("forward_end")) == NULL ||
        (s_backward_run = PyUnicode_InternFromString("backward_run")) == NULL ||
        (s_fetch = PyUnicode_InternFromString("fetch")) == NULL ||
        (s_optimizer_begin = PyUnicode_InternFromString("optimizer_begin")) == NULL ||
        (s_optimizer_end = PyUnicode_InternFromString("optimizer_end")) == NULL ||
        (s_zero_grad_run = PyUnicode_InternFromString("zero_grad_run")) == NULL ||
        (s_clip_run = PyUnicode_InternFromString("clip_run")) == NULL)
        return NULL;
    if (PyType_Ready(&StandInType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&batch_module);
    /* The numbering's one source: `batch.py` takes these. */
    if (m == NULL || PyModule_AddIntMacro(m, FWD_BEGIN) < 0 || PyModule_AddIntMacro(m, FWD_END) < 0 ||
        PyModule_AddIntMacro(m, BACKWARD) < 0 || PyModule_AddIntMacro(m, FETCH) < 0 ||
        PyModule_AddIntMacro(m, OPT_BEGIN) < 0 || PyModule_AddIntMacro(m, OPT_END) < 0 ||
        PyModule_AddIntMacro(m, ZERO_GRAD) < 0 || PyModule_AddIntMacro(m, GC) < 0 || PyModule_AddIntMacro(m, CLIP) < 0 ||
        PyModule_AddIntMacro(m, T1) < 0 || PyModule_AddIntMacro(m, INDEX) < 0 || PyModule_AddIntMacro(m, INNER) < 0 ||
        PyModule_AddIntMacro(m, ERROR) < 0) {
        Py_XDECREF(m);
        return NULL;
    }
    return m;
}
