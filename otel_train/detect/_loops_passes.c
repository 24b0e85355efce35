/* Part of `_loops.c`, compiled in it as one translation unit (`_loops.h` says why): the forward hooks' and the backward's common paths (`forward`, `backward`). */

/* --- forward.forward_pre_hook / forward_hook, after their compile check ------------------ */
/* Their common path (a training forward of the open step begins; the outermost forward ends);
 * anything else calls the Python body from its start, before anything is changed here. The
 * hooks themselves stay Python functions: Dynamo traces them (`compile`). */
static PyObject *g_state, *g_roots, *g_recorder_module, *g_loss_type, *g_grad_enabled, *g_region_type, *g_forward;
static PyObject *g_begin_rest, *g_end_rest;
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
"`forward.forward_begin_rest`'s common path: a training forward of the open step begins.");

static PyObject *
forward_begin(PyObject *module_, PyObject *module)
{
    if (g_begin_rest == NULL) {
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
        return PyObject_CallOneArg(g_begin_rest, module);
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
 * it. `forward.forward_end_rest`'s rule; 0, or -1 with an error. */
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
"`forward.forward_end_rest`'s common path: the outermost forward in flight ends.");

static PyObject *
forward_end(PyObject *module_, PyObject *module)
{
    if (g_end_rest == NULL) {
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
        return PyObject_CallOneArg(g_end_rest, module);
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
"             begin_rest, end_rest, fwd_train, fwd_eval)\n--\n\n"
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
                           &g_forward, &g_begin_rest, &g_end_rest};
    for (int i = 0; i < 9; i++)
        Py_XSETREF(*slots[i], Py_NewRef(o[i]));
    g_fwd_train = train;
    g_fwd_eval = eval;
    Py_RETURN_NONE;
}

/* --- backward.backward, after its compile check ------------------------------------------ */
static PyObject *g_backward, *g_backward_rest, *g_part_begin, *g_part_step;

/* The backward region ends (its exception, if any, pending and kept) and the state moves on:
 * `backward.backward_rest`'s finally block. 0, or -1 with a new error. */
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
"`backward.backward_rest`'s common path: `original(*args, **kwargs)` as the open step's\n"
"`train.backward`.");

static PyObject *
backward_run(PyObject *module_, PyObject *const *args, Py_ssize_t nargs)
{
    if (call_ok(nargs == 3 && PyTuple_Check(args[1]) && (args[2] == Py_None || PyDict_Check(args[2])),
                "backward_run(original, args, kwargs)", g_backward_rest != NULL, "bind_backward") < 0)
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
        return PyObject_CallFunctionObjArgs(g_backward_rest, original, args[1], args[2], NULL);
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
"bind_backward(state, roots, recorder_module, region_type, backward_name, backward_rest, part_begin,\n"
"              part_step, ph_bwd)\n--\n\n"
"What `backward_run` reads: detection's state, `roots.roots`, the `otel_train.record.recorder`\n"
"module, `recorder.Region` (the same objects `bind_forward` takes), the backward span's name,\n"
"`backward.backward_rest` (called as (original, args, kwargs)), `phase.part_begin` and\n"
"`phase.STEP`, PH_BWD.");

static PyObject *
bind_backward(PyObject *module, PyObject *args)
{
    PyObject *o[8];
    long bwd;
    if (!PyArg_ParseTuple(args, "OOOOOOOOl:bind_backward", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7],
                          &bwd))
        return NULL;
    PyObject **slots[8] = {&g_state, &g_roots, &g_recorder_module, &g_region_type, &g_backward, &g_backward_rest,
                           &g_part_begin, &g_part_step};
    for (int i = 0; i < 8; i++)
        Py_XSETREF(*slots[i], Py_NewRef(o[i]));
    g_ph_bwd = bwd;
    Py_RETURN_NONE;
}

