/* Part of `_loops.c`, compiled in it as one translation unit (`_loops.h` says why): the optimizer phase, the optimizer's hooks, zero_grad and clipping (`phase`, `optimizer`). */

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
static PyObject *g_opt_begin_rest, *g_opt_end_rest, *g_zero_grad_rest, *g_several_updates;
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
"`phase.part_begin`: a call of the update starts; the phase opens (if it is not open)\n"
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
"`phase.part_end`: that call is over; the phase is current no more and, for now, ends\n"
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
"`phase.end`: something else begins; the phase is recorded, from its first call's\n"
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
"`optimizer.optimizer_begin_rest`'s common path (the update of a step, no closure): called\n"
"by the optimizer's pre-hook after its compile check, straight from it (its caller's frame is\n"
"torch's step wrapper).");

static PyObject *
optimizer_begin(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (call_ok(nargs == 3, "optimizer_begin(optimizer, args, kwargs)",
                g_opt_begin_rest != NULL && g_opt_name != NULL && g_train_activity_rest != NULL,
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
        return PyObject_Vectorcall(g_opt_begin_rest, args, nargs, NULL);
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
"`optimizer.optimizer_end_rest`'s common path (the outermost update with no closure ends).");

static PyObject *
optimizer_end(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (call_ok(nargs == 3, "optimizer_end(optimizer, args, kwargs)", g_opt_end_rest != NULL && g_opt_name != NULL,
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
        return PyObject_Vectorcall(g_opt_end_rest, args, nargs, NULL);
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
"`sites.decided_place`: the place decided for the zero_grad being called (TOP, END, or\n"
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
"`optimizer.zero_grad_rest`'s common path (a zero_grad placed at the end of the open step's\n"
"update joins its `train.optimizer`): called by the patched zero_grad, straight from it.");

static PyObject *
zero_grad_run(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (aux_call_ok(args, nargs, "zero_grad_run(r, s, original, args, kwargs)",
                    g_zero_grad_rest != NULL && g_opt_name != NULL, "bind_optimizer() or bind_phase") < 0)
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
        return PyObject_Vectorcall(g_zero_grad_rest, args, nargs, NULL);
    return part_call(r, s, g_zero_grad_part, args[2], args[3], kwargs);
}

PyDoc_STRVAR(clip_run_doc,
"clip_run(r, s, original, args, kwargs)\n--\n\n"
"`optimizer.clip_run`: gradient clipping in a step is the first part of its update (as the patched\n"
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
"bind_optimizer(state, recorder_module, begin_rest, end_rest, zero_grad_rest, several_updates,\n"
"               decided, site_end)\n--\n\n"
"What the optimizer's hooks and zero_grad read: detection's state, the recorder module, the\n"
"Python functions `optimizer.optimizer_begin_rest`, `optimizer_end_rest`, `zero_grad_rest` and\n"
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
    PyObject **slots[7] = {&g_opt_state, &g_opt_recorder_module, &g_opt_begin_rest, &g_opt_end_rest,
                           &g_zero_grad_rest, &g_several_updates, &g_decided};
    for (int i = 0; i < 7; i++)
        Py_XSETREF(*slots[i], Py_NewRef(o[i]));
    g_site_end = end;
    Py_RETURN_NONE;
}

