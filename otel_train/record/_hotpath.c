/* The hot path in C: the region and step types and the recorder fields they read.
 *
 * Same behaviour as the pure-Python `recorder._PyRegion` / `_PyStep` (the fallback when this
 * module cannot be built), with no Python frame between `otel_train.span(...)` and the tuple
 * in the buffer. Why: between framework ops a region runs with cold caches, and there the Python
 * version's bytecode costs 10-14 us a region against 0.86 us back to back
 * (docs/benchmarks/2026-11-22-hot-path-c.md). The record is the same tuple, so nothing
 * downstream knows which one made it. On the GPU path (its CPU proxy: issue 51's launch-bound
 * loop with events that cost CUDA's), device events recorded from C took explicit spans' added
 * Python calls a step from 20 to 0 and automatic mode's from 22.8 to 5.6
 * (docs/benchmarks/2026-11-28-device-path-proxy.md, `_hotpath_device.c`); its wall-clock share of
 * a GPU step is not yet measured on a GPU.
 *
 * `recorder.py` binds the module-level objects this reads (`bind`, `bind_steps`) and the
 * recorder in force (`install`); everything else (tags, events, links, the worker) stays in
 * Python. This file is the module (its functions, the span numbers, init); the types are its
 * parts, compiled with it as one translation unit (`_hotpath.h` says why).
 */
#include "_hotpath.h"
#include "_hotpath_api.h"

#include "_hotpath_recorder.c"  /* RecorderBase: the buffer, the packed ring, the drains */
#include "_hotpath_device.c"    /* device events recorded from C (regions and steps call it) */
#include "_hotpath_region.c"    /* Region: enter, exit, the current region */
#include "_hotpath_step.c"      /* Step and After */

/* --- the span numbers ----------------------------------------------------------------------- */
/* `_hotpath.seq`: an iterator over `g_next_seq`, so that Python's `next(_seq_counter)` and the C
 * regions and steps draw from one sequence, as they did from one `itertools.count`. */
static PyObject *
seq_next(PyObject *self)
{
    return PyLong_FromLongLong(g_next_seq++);
}

static PyTypeObject SeqType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "otel_train.record._hotpath.Seq",
    .tp_doc = "The numbers that name span ids, shared by the C and Python regions and steps.",
    .tp_basicsize = sizeof(PyObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = seq_next,
};

/* --- module ------------------------------------------------------------------------------ */
static PyObject *
mod_bind(PyObject *module, PyObject *args)
{
    PyObject *current, *no_step, *kind_span, *auto_init, *decorate, *aenter, *aexit, *misused = NULL, *name_of = NULL;
    if (!PyArg_UnpackTuple(args, "bind", 7, 9, &current, &no_step, &kind_span, &auto_init, &decorate,
                           &aenter, &aexit, &misused, &name_of))
        return NULL;
    Py_XSETREF(g_misused, misused != NULL && misused != Py_None ? Py_NewRef(misused) : NULL);
    Py_XSETREF(g_name_of, name_of != NULL && name_of != Py_None ? Py_NewRef(name_of) : NULL);
    Py_XSETREF(g_current, Py_NewRef(current));
    Py_XSETREF(g_no_step, Py_NewRef(no_step));
    Py_XSETREF(g_kind_span, Py_NewRef(kind_span));
    Py_XSETREF(g_auto_init, Py_NewRef(auto_init));
    Py_XSETREF(g_decorate, Py_NewRef(decorate));
    Py_XSETREF(g_aenter, Py_NewRef(aenter));
    Py_XSETREF(g_aexit, Py_NewRef(aexit));
    Py_RETURN_NONE;
}

static PyObject *
mod_install(PyObject *module, PyObject *rec)
{
    if (rec == Py_None) {
        Py_CLEAR(g_rec);
        Py_RETURN_NONE;
    }
    if (!PyObject_TypeCheck(rec, &RecorderType)) {
        PyErr_SetString(PyExc_TypeError, "install() takes a RecorderBase or None");
        return NULL;
    }
    Py_XSETREF(g_rec, Py_NewRef(rec));
    Py_RETURN_NONE;
}

static PyObject *
mod_current(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    PyObject *from_var;
    if (g_settle != NULL && settle_pending() < 0)
        return NULL;
    return current_region(&from_var);
}

static PyObject *
mod_set_settle(PyObject *module, PyObject *fn)
{
    Py_XSETREF(g_settle, fn == Py_None ? NULL : Py_NewRef(fn));
    Py_RETURN_NONE;
}

static PyObject *
mod_settle(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    if (settle_pending() < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
mod_leave(PyObject *module, PyObject *region)
{
    if (!PyObject_TypeCheck(region, &RegionType)) {
        PyErr_SetString(PyExc_TypeError, "leave() takes a Region");
        return NULL;
    }
    if (region_leave((RegionObject *)region) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
mod_make_current(PyObject *module, PyObject *region)
{
    if (!PyObject_TypeCheck(region, &RegionType)) {
        PyErr_SetString(PyExc_TypeError, "make_current() takes a Region");
        return NULL;
    }
    if (region_make_current((RegionObject *)region) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
mod_bind_steps(PyObject *module, PyObject *args)
{
    PyObject *kind_step, *reopened, *step_number = NULL;
    if (!PyArg_UnpackTuple(args, "bind_steps", 2, 3, &kind_step, &reopened, &step_number))
        return NULL;
    Py_XSETREF(g_kind_step, Py_NewRef(kind_step));
    Py_XSETREF(g_reopened, Py_NewRef(reopened));
    Py_XSETREF(g_step_number, step_number != NULL ? Py_NewRef(step_number) : NULL);
    Py_RETURN_NONE;
}

static PyObject *
mod_unpack(PyObject *module, PyObject *args)
{
    return unpack_segments(args, g_kind_span);
}

static PyMethodDef mod_methods[] = {
    {"bind_steps", mod_bind_steps, METH_VARARGS, "bind_steps(kind_step, reopened, step_number=None)"},
    {"step", (PyCFunction)(void (*)(void))mod_step, METH_FASTCALL | METH_KEYWORDS,
     "step(n=None, epoch=None, **attrs)\n--\n\nMark one training step: `with otel_train.step(n):` "
     "(n defaults to the previous step + 1)."},
    {"close_step", (PyCFunction)(void (*)(void))mod_close_step, METH_FASTCALL,
     "close_step(recorder, step, t1, exc_type): end the open step at t1 and append its record."},
    {"bind", mod_bind, METH_VARARGS,
     "bind(current, no_step, kind_span, auto_init, decorate, aenter, aexit, misused=None, name_of=None)"},
    {"current", mod_current, METH_NOARGS, "The innermost open region here (either kind of region), or None."},
    {"set_settle", mod_set_settle, METH_O,
     "set_settle(fn or None): called with no arguments before a region or step is entered or the current "
     "region read, while detection's calls wait to run (`detect.batch`)."},
    {"settle", mod_settle, METH_NOARGS, "Call what `set_settle` set, if anything: detection's waiting calls run."},
    {"leave", mod_leave, METH_O, "Take an entered C region off the current-region pointer without recording it."},
    {"make_current", mod_make_current, METH_O,
     "Put an entered C region that was left (`leave`) back on the current-region pointer, as entering would."},
    {"install", mod_install, METH_O, "install(recorder or None): the recorder regions record to."},
    {"set_span_target", mod_set_span_target, METH_O,
     "set_span_target(target): what Region(...) makes from now on: None a Region, a Region subclass an "
     "instance of it, anything else that object."},
    {"set_device", mod_set_device, METH_VARARGS,
     "set_device(free, take, fail, skip, timed, probe, drop): time regions with events from a pool (free None: "
     "none)."},
    {"end_event", mod_end_event, METH_O,
     "end_event(region): record a device-timed region's end event now; the one it replaces is dropped."},
    {"drop_events", mod_drop_events, METH_O,
     "drop_events(region): a region that will never be recorded hands its device events to the worker."},
    {"unpack", mod_unpack, METH_VARARGS,
     "unpack(slots, side, wire, strings): what RecorderBase.drain_packed gave, back as runs of records."},
    {NULL}
};

static struct PyModuleDef hotpath_module = {
    PyModuleDef_HEAD_INIT, "otel_train.record._hotpath", "The region type and recorder fields in C.", -1, mod_methods,
};

/* The capsule other C modules read (`_hotpath_api.h`). */
static int
api_now_ns(PyObject *r, int64_t *out)
{
    return rec_now_ns((RecorderObject *)r, out);
}

/* `r.now = t.__int__` without the objects: the clock reads `t` until `now` is set again. */
static void
api_pin(PyObject *r, int64_t t)
{
    RecorderObject *rec = (RecorderObject *)r;
    rec->pinned = 1;
    rec->pinned_ns = t;
    rec->fast_clock = 0;
}

static const HotpathAPI g_api = {&RecorderType, api_now_ns, api_pin};

PyMODINIT_FUNC
PyInit__hotpath(void)
{
    PyObject *time = PyImport_ImportModule("time");
    if (time == NULL)
        return NULL;
    g_perf_counter_ns = PyObject_GetAttrString(time, "perf_counter_ns");
    Py_DECREF(time);
    if (g_perf_counter_ns == NULL)
        return NULL;
    s_ref = PyUnicode_InternFromString("ref");
    s_append = PyUnicode_InternFromString("append");
    s_device_time = PyUnicode_InternFromString("device_time");
    s_asyncio_events = PyUnicode_InternFromString("asyncio.events");
    s_record = PyUnicode_InternFromString("record");
    if (s_record == NULL)
        return NULL;
    if (s_ref == NULL || s_append == NULL || s_device_time == NULL || s_asyncio_events == NULL)
        return NULL;
    s_zero = PyLong_FromLong(0);
    s_one = PyLong_FromLong(1);
    if (s_zero == NULL || s_one == NULL)
        return NULL;
    RecorderType.tp_methods = rec_methods;
    if (PyType_Ready(&RecorderType) < 0 || PyType_Ready(&RegionType) < 0 || PyType_Ready(&SelfDescrType) < 0 ||
        PyType_Ready(&StepType) < 0 || PyType_Ready(&AfterType) < 0 || PyType_Ready(&SeqType) < 0)
        return NULL;
    if (add_self_descr(&RegionType, &unbound_defs[0]) < 0 || add_self_descr(&RegionType, &unbound_defs[1]) < 0 ||
        add_self_descr(&StepType, &step_unbound_defs[0]) < 0 || add_self_descr(&StepType, &step_unbound_defs[1]) < 0)
        return NULL;
    PyType_Modified(&RegionType);
    PyType_Modified(&StepType);
    PyObject *m = PyModule_Create(&hotpath_module);
    if (m == NULL)
        return NULL;
    PyObject *seq = PyType_GenericAlloc(&SeqType, 0);
    if (seq == NULL || PyModule_AddObject(m, "seq", seq) < 0) {
        Py_XDECREF(seq);
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddObjectRef(m, "RecorderBase", (PyObject *)&RecorderType) < 0 ||
        PyModule_AddObjectRef(m, "Region", (PyObject *)&RegionType) < 0 ||
        PyModule_AddObjectRef(m, "Step", (PyObject *)&StepType) < 0 ||
        PyModule_AddObjectRef(m, "After", (PyObject *)&AfterType) < 0 ||
        PyModule_AddIntConstant(m, "MAX_STRINGS", MAX_STRINGS) < 0 ||
        PyModule_AddIntConstant(m, "SLOT_SIZE", (long)sizeof(Slot)) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    PyObject *api = PyCapsule_New((void *)&g_api, HOTPATH_API_NAME, NULL);
    if (api == NULL || PyModule_AddObject(m, "_C_API", api) < 0) {
        Py_XDECREF(api);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
