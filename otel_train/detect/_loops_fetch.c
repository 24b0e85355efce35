/* Part of `_loops.c`, compiled in it as one translation unit (`_loops.h` says why): a DataLoader batch fetch's common path, and a batch's size (`data`, `batch_size`). */

/* --- data.next_patch's `__next__`, after its checks --------------------------------------- */
static PyObject *g_fetch_rest, *g_close, *g_manual, *g_phase_end, *g_copy_edge;
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
 * optimizer) its backward was. `data.fetch_rest`'s close rules; 0, or -1 with an error. */
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
"`data.fetch_rest`: `original(iterator)` timed as a batch fetch, held pending for the next\n"
"training phase (or evaluation) to claim.");

static PyObject *
fetch(PyObject *module_, PyObject *const *args, Py_ssize_t nargs)
{
    if (call_ok(nargs == 2, "fetch(original, iterator)", g_fetch_rest != NULL && g_state != NULL, "bind_fetch") < 0)
        return NULL;
    PyObject *s = g_state, *original = args[0], *it = args[1], *batch = NULL, *t0 = NULL, *t1 = NULL, *src = NULL;
    PyObject *r = module_attr(g_recorder_module, s_rec_);
    if (r == NULL)
        return NULL;
    if (r == Py_None) {
        Py_DECREF(r);
        return PyObject_CallFunctionObjArgs(g_fetch_rest, original, it, NULL);
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
"bind_fetch(state, recorder_module, fetch_rest, close, manual, phase_end, copy_edge)\n--\n\n"
"What `fetch` reads: detection's state, the `otel_train.record.recorder` module,\n"
"`data.fetch_rest` (called as (original, iterator)), `machine.close`, `machine.manual`,\n"
"`phase.end` and `data.copy_edge`. After `bind_machine` and `bind_sizes`.");

static PyObject *
bind_fetch(PyObject *module, PyObject *args)
{
    PyObject *o[7];
    if (!PyArg_UnpackTuple(args, "bind_fetch", 7, 7, &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6]))
        return NULL;
    PyObject **slots[7] = {&g_state, &g_recorder_module, &g_fetch_rest, &g_close, &g_manual, &g_phase_end,
                           &g_copy_edge};
    for (int i = 0; i < 7; i++)
        Py_XSETREF(*slots[i], Py_NewRef(o[i]));
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

PyDoc_STRVAR(size_of_doc,
"size_of(batch)\n--\n\n"
"`batch_size.size_of`: (samples, tokens) of a batch from its shape; None when unknown.");

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

