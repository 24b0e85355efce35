/* Detection's per-step work in C: the common paths of the hooks and patched functions that run
 * every micro-batch (the forward hooks, `backward`, the DataLoader fetch, the optimizer's hooks
 * and `zero_grad`, past their compile checks), of the step machine they call (a step's
 * `train_activity`, `close` and `begin`, the optimizer phase's parts), and the loops they run (a
 * closing step's gaps, the fetches a training phase takes over, the frame walk that places a
 * `zero_grad()`, a batch's size). Anything uncommon calls a Python function from its start
 * (`*_rest`, named in each doc string) before the C code changed anything; there is no Python
 * twin: where this module cannot be imported, automatic detection stays off (`native.py`).
 *
 * Why C, measured (docs/benchmarks/2026-11-28-what-detection-c-buys.md; the 2-core host, issue
 * 31's CPU loop, `python -m benchmarks.auto_cost --per-call`, in-process alternation): on the
 * per-call path, which automatic mode takes wherever torch has an accelerator (the GPU path),
 * automatic mode added +163 us a step (CI95 140-225) with this module and +226 us (193-253)
 * with detection's C removed, 59 Python calls a step added against ~3; the GPU path's CPU proxy
 * (`otel-train bench overhead --device-path 3`) added ~5 Python calls a step with it, 42
 * without. So it is worth ~63 us a step where a GPU step runs it: ~1.4 % of issue 51's 4.5 ms
 * launch-bound step, over issue 52's 1 % bar.
 *
 * This file is the module: its parts (below), the wrappers' guards, the state's binding, the
 * method table and init.
 */
#include "_loops.h"

#include "_loops_gaps.c"      /* a closing step's gaps: `train.other` (`coverage`) */
#include "_loops_pending.c"   /* pending fetches resolved into the step (`machine.resolve_pending`) */
#include "_loops_machine.c"   /* train_activity, close, begin, the epoch (`machine`) */
#include "_loops_passes.c"    /* the forward hooks and backward (`forward`, `backward`) */
#include "_loops_fetch.c"     /* a batch fetch and its size (`data`, `batch_size`) */
#include "_loops_frames.c"    /* the user's frames (`sites`) */
#include "_loops_optimizer.c" /* the optimizer phase, hooks, zero_grad, clipping (`phase`, `optimizer`) */

/* --- the wrappers' guards ------------------------------------------------------------------ */
/* Whether a call of a patched function is part of something else, which each wrapper asks every
 * call and the replay of each noted call (`detect.batch`) asks again: `data.busy`,
 * `backward.busy` and `optimizer.aux_busy`, here a C call rather than a Python
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

PyDoc_STRVAR(fetch_busy_doc, "fetch_busy(s)\n--\n\n`data.busy`: a fetch now is not a training batch.");

static PyObject *
fetch_busy(PyObject *module, PyObject *s)
{
    return busy_of(s, g_fetch_busy, 3);
}

PyDoc_STRVAR(backward_busy_doc, "backward_busy(s)\n--\n\n`backward.busy`: a backward now is no micro-batch's.");

static PyObject *
backward_busy(PyObject *module, PyObject *s)
{
    return busy_of(s, g_backward_busy, 2);
}

PyDoc_STRVAR(aux_busy_doc,
"aux_busy(s)\n--\n\n`optimizer.aux_busy`: a zero_grad or clipping now is part of something else.");

static PyObject *
aux_busy(PyObject *module, PyObject *s)
{
    return busy_of(s, g_aux_busy, 4);
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
