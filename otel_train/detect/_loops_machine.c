/* Part of `_loops.c`, compiled in it as one translation unit (`_loops.h` says why): the step machine's common paths: a training phase's activity, a step's close and begin, the epoch (`machine`). */

/* --- machine.train_activity -------------------------------------------------------------- */
static PyObject *begin(PyObject *r, PyObject *s, PyObject *t);
/* Its common paths here: a phase of the open step, a new micro-batch, the update's phase ended
 * by the next phase, and the next step begun by a forward after an update where no batch fetch
 * closes steps (a loop without a `DataLoader`). Anything else (an evaluation to end, a step to
 * close for a manual update, gradient accumulation to tell from one) calls the Python function,
 * from its start before anything is changed here, or once the update's phase is ended (its
 * first line, which it then skips): so the two cannot disagree. */
static PyObject *g_train_activity_rest, *g_step_type, *g_one;
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
"`machine.train_activity_rest`'s common paths (a phase of the open step, a new micro-batch,\n"
"its fetches resolved, the update's phase ended, the next step after an update with no fetch to\n"
"close it); the Python function for anything else.");

static PyObject *
train_activity(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 4 || nargs > 5) {
        PyErr_SetString(PyExc_TypeError, "train_activity() takes 4 or 5 arguments");
        return NULL;
    }
    if (g_train_activity_rest == NULL) {
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
        return PyObject_Vectorcall(g_train_activity_rest, args, nargs, NULL);
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
        return PyObject_Vectorcall(g_train_activity_rest, args, nargs, NULL);
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
"`machine.train_activity_rest`, `recorder.Step` and the phase kinds PH_FWD and PH_OPT.");

static PyObject *
bind_train_activity(PyObject *module, PyObject *args)
{
    PyObject *fn, *step_type;
    long fwd, opt;
    if (!PyArg_ParseTuple(args, "OOll:bind_train_activity", &fn, &step_type, &fwd, &opt))
        return NULL;
    Py_XSETREF(g_train_activity_rest, Py_NewRef(fn));
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
"`machine.close`: close the step detection opened at `t1`, which becomes the next\n"
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

