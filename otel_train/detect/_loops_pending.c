/* Part of `_loops.c`, compiled in it as one translation unit (`_loops.h` says why): the fetches and zero_grads pending before a training phase, recorded into its step (`machine.resolve_pending`). */

PyDoc_STRVAR(resolve_doc,
"resolve(pending, data, data_attrs, parent, ref, seq, append, kind, cover, train_src)\n--\n\n"
"`resolve_pending`'s loop: each pending entry ([name, t0, t1, src, iterator, size]) appended as\n"
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
"`machine.resolve_pending`: the batches fetched (and zero_grads made) before this\n"
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

