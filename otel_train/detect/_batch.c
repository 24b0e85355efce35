/* `detect.batch`'s noting entry points and replay in C: what the hooks call every micro-batch while
 * detection's calls are batched (forward begin and end, a backward, a batch fetch, the beginning
 * and the end of an optimizer step, a zero_grad, a gradient clipping), past their checks, note
 * the call and return (`_batch_notes.c`); a batch of notes is later run through detection's
 * bodies in order (`_batch_replay.c`). Anything uncommon (a call that goes straight to its body,
 * an error reading a check) calls the Python entry point of the same name in `batch.py` from its
 * start, before the C code changed anything. There is no Python twin: where this module cannot
 * be imported, automatic detection stays off (`native.py`).
 *
 * Why C, measured (docs/benchmarks/2026-11-28-what-detection-c-buys.md; the 2-core host, issue
 * 31's CPU loop, `python -m benchmarks.auto_cost`, in-process alternation): automatic mode added
 * +90 us a step (CI95 51-119) batched with this module, +143 us (109-187) with the notes made
 * and replayed in Python and +163 us (140-225) per call, unbatched: batching in C is worth ~73 us
 * a step on that loop, what keeps it under issue 52's +90 us cap there. It never runs on the GPU
 * path: batching is off wherever torch has an accelerator (`batch.install`).
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
 * the optimizer's begin also reads (`site_probe`). This file is the module: binding, the method
 * table, init. */
#include "_batch.h"

#include "_batch_notes.c"   /* the noting entry points */
#include "_batch_replay.c"  /* the replay */

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
        Py_CLEAR(g_rest[i]);
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
        g_rest[i] = Py_NewRef(PyTuple_GET_ITEM(py, i));
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
     "replay(notes, i, end, r) -> the index reached: notes[i:end] run through detection's bodies."},
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
