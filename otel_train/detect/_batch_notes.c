/* Part of `_batch.c`, compiled in it as one translation unit (`_batch.h`): the noting entry points, each noting its call (or handing it to the Python entry point of the same name in `batch.py`). */

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
rest(int p, PyObject *const *args, Py_ssize_t nargs)
{
    if (g_rest[p] == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "otel_train: detect._batch called while not bound");
        return NULL;
    }
    return PyObject_Vectorcall(g_rest[p], args, nargs, NULL);
}

/* Not taken here (`ok` 0), or a check failed with an error (`ok` -1, the error dropped: the
 * Python entry point will meet the same state, and say what it must): the Python entry point
 * `p` decides, from its start. */
static PyObject *
not_taken(int ok, int p, PyObject *const *args, Py_ssize_t nargs)
{
    if (ok < 0)
        PyErr_Clear();
    return rest(p, args, nargs);
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
        return rest(P_BACKWARD_RUN, args, nargs);
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
        return rest(P_FETCH, args, nargs);
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
        return rest(P_OPTIMIZER_BEGIN, args, nargs);
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
        return rest(P_OPTIMIZER_END, args, nargs);
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
        return rest(p, args, nargs);
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

