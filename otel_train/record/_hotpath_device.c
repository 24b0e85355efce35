/* Part of `_hotpath.c` (see `_hotpath.h`): device events recorded from C.
 *
 * What is timed and when is `record/device.py`'s; this is its hot path. While a device is timed,
 * a region whose name is timed (or that asked with `device_time=True`) takes an event from the
 * pool's free list at entry (`dev`) and one at exit (`ev1`), and a step one at its end (`dev`),
 * each recorded on the current stream with one call of the event's `record()`: no Python frame of
 * ours between `otel_train.span(...)` and the device. Worth it on the GPU path: on the CPU proxy
 * of issue 51's launch-bound loop the Python device region (`device._DeviceRegion` and its pool's
 * `take`) added 20 Python calls a step to explicit spans, now 0, and automatic mode's 22.8 became
 * 5.6 against its host path's 3.4 (docs/benchmarks/2026-11-28-device-path-proxy.md); on CUDA
 * `torch.cuda.Event.record` and the capture check added ~5 more an event, gone with `torch.Event`.
 *
 * The pool stays the Python `EventPool`: C pops from its free list (a list: `pop` and `append`
 * are atomic under the GIL, as the worker gives events back) and calls its `take` only when the
 * list is empty (it creates events, counts the skipped), while a CUDA graph is captured, or to
 * report a failed `record()`. Nothing here raises into the training loop: an error costs the
 * region its device time. */

static PyObject *g_dev_free;   /* the pool's free list, or NULL: no device timed */
static PyObject *g_dev_take;   /* the pool's `take()` (an event recorded, or None) */
static PyObject *g_dev_fail;   /* the pool's `_fail(err)`: recording failed, device timing stops */
static PyObject *g_dev_skip;   /* () -> bool: no event while true (CUDA graph capture), or NULL */
static PyObject *g_dev_timed;  /* the names timed by default (a frozenset) */
static PyObject *g_dev_probe;  /* () -> bool: a timed region looks for a device, or NULL */
static PyObject *g_dev_drop;   /* events of regions that will not be resolved: appended for the worker */
static PyObject *s_record;

/* Whether device timing may act on a region now: a device is timed, or regions still look. */
#define DEV_ON (g_dev_free != NULL || g_dev_probe != NULL)

/* A Python call whose failure must not reach the loop: its error is dropped (the pool's own
 * functions log what they must). A new reference, or NULL. */
static PyObject *
dev_quiet(PyObject *result)
{
    if (result == NULL)
        PyErr_Clear();
    return result;
}

/* An event recorded on the current stream now (a new reference), or None. Never fails. */
static PyObject *
dev_take(void)
{
    if (g_dev_free == NULL)
        return Py_NewRef(Py_None);
    if (g_dev_skip != NULL) {
        PyObject *skip = dev_quiet(PyObject_CallNoArgs(g_dev_skip));
        int yes = skip != NULL ? PyObject_IsTrue(skip) : 1;
        Py_XDECREF(skip);
        if (yes != 0) {
            PyErr_Clear();
            PyObject *none = dev_quiet(PyObject_CallNoArgs(g_dev_take));  /* counts it skipped */
            return none != NULL ? none : Py_NewRef(Py_None);
        }
    }
    Py_ssize_t n = PyList_GET_SIZE(g_dev_free);
    if (n == 0) {
        PyObject *event = dev_quiet(PyObject_CallNoArgs(g_dev_take));  /* creates one, or skips */
        return event != NULL ? event : Py_NewRef(Py_None);
    }
    PyObject *event = Py_NewRef(PyList_GET_ITEM(g_dev_free, n - 1));
    if (PyList_SetSlice(g_dev_free, n - 1, n, NULL) < 0) {
        PyErr_Clear();
        Py_DECREF(event);
        return Py_NewRef(Py_None);
    }
    PyObject *done = PyObject_CallMethodNoArgs(event, s_record);
    if (done == NULL) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        if (g_dev_fail != NULL && value != NULL)
            Py_XDECREF(dev_quiet(PyObject_CallOneArg(g_dev_fail, value)));
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        Py_DECREF(event);
        return Py_NewRef(Py_None);
    }
    Py_DECREF(done);
    return event;
}

/* A step closed this much after its end (`t1`) had its end event recorded late: automatic
 * detection closes a step at the next one's start, with its last phase's end as `t1`. */
#define DEV_LATE_NS 100000

/* The step's end event (a new reference, or None), as `(event, recorded at)` when it was
 * recorded more than DEV_LATE_NS after `t1`: its boundary is then no later than the step's own
 * device work (`export/step_timeline.py`), the device having idled or run the next step's work
 * since. Never fails. */
static PyObject *
dev_step_end(RecorderObject *rec, PyObject *t1)
{
    PyObject *event = dev_take();
    int64_t end, now;
    if (event == Py_None || !int64_of(t1, &end))
        return event;
    if (rec_now_ns(rec, &now) < 0) {
        PyErr_Clear();
        return event;
    }
    if (now - end <= DEV_LATE_NS)
        return event;
    PyObject *at = PyLong_FromLongLong(now);
    PyObject *pair = at != NULL ? PyTuple_Pack(2, event, at) : NULL;
    Py_XDECREF(at);
    if (pair == NULL) {
        PyErr_Clear();
        return event;
    }
    Py_DECREF(event);
    return pair;
}

/* Whether `self` asks for device time: its `device_time=` when given, else whether its name is
 * timed by default. */
static int
dev_timed(RegionObject *self)
{
    PyObject *timed = self->timed;
    int yes;
    if (timed == NULL || timed == Py_None)
        yes = g_dev_timed != NULL && self->name != NULL ? PySet_Contains(g_dev_timed, self->name) : 0;
    else
        yes = PyObject_IsTrue(timed);
    if (yes < 0) {
        PyErr_Clear();
        yes = 0;
    }
    return yes;
}

/* At entry, after t0 was read (the anchor relies on the host time coming first): the start event. */
static void
dev_region_enter(RegionObject *self)
{
    if (!dev_timed(self))
        return;
    if (g_dev_free == NULL) {  /* no device yet: the first timed regions look for one */
        PyObject *found = dev_quiet(PyObject_CallNoArgs(g_dev_probe));
        int yes = found != NULL && PyObject_IsTrue(found) > 0;
        PyErr_Clear();
        Py_XDECREF(found);
        if (!yes || g_dev_free == NULL)
            return;
    }
    Py_XSETREF(self->dev, dev_take());
}

/* At exit, before the record is appended (the worker must never see half of it): the end event. */
static void
dev_region_exit(RegionObject *self)
{
    Py_XSETREF(self->ev1, dev_take());
}

/* Hand `event` (a new reference, or None) to the worker, which gives it back once complete. */
static void
dev_drop(PyObject *event)
{
    if (event != NULL && event != Py_None && g_dev_drop != NULL)
        Py_XDECREF(dev_quiet(PyObject_CallOneArg(g_dev_drop, event)));
    Py_XDECREF(event);
}

/* `set_device(free, take, fail, skip, timed, probe, drop)`: time regions with events from the
 * pool whose free list, `take` and `_fail` these are (`free` None: no device timed), skipping
 * while `skip()` (None: never); `timed`, the names timed by default; `probe` (or None), what a
 * timed region calls while no device is timed; `drop(event)`, where the events of regions that
 * are never recorded go. */
static PyObject *
mod_set_device(PyObject *module, PyObject *args)
{
    PyObject *free_list, *take, *fail, *skip, *timed, *probe, *drop;
    if (!PyArg_UnpackTuple(args, "set_device", 7, 7, &free_list, &take, &fail, &skip, &timed, &probe, &drop))
        return NULL;
    if (free_list != Py_None && !PyList_CheckExact(free_list)) {
        PyErr_SetString(PyExc_TypeError, "set_device(): the free list is a list or None");
        return NULL;
    }
    if (timed != Py_None && !PyAnySet_Check(timed)) {
        PyErr_SetString(PyExc_TypeError, "set_device(): the timed names are a frozenset or None");
        return NULL;
    }
#define OR_NULL(o) ((o) == Py_None ? NULL : Py_NewRef(o))
    Py_XSETREF(g_dev_free, OR_NULL(free_list));
    Py_XSETREF(g_dev_take, OR_NULL(take));
    Py_XSETREF(g_dev_fail, OR_NULL(fail));
    Py_XSETREF(g_dev_skip, OR_NULL(skip));
    Py_XSETREF(g_dev_timed, OR_NULL(timed));
    Py_XSETREF(g_dev_probe, OR_NULL(probe));
    Py_XSETREF(g_dev_drop, OR_NULL(drop));
#undef OR_NULL
    if (g_dev_free != NULL && g_dev_take == NULL) {
        Py_CLEAR(g_dev_free);
        PyErr_SetString(PyExc_TypeError, "set_device(): a free list needs its pool's take");
        return NULL;
    }
    Py_RETURN_NONE;
}

/* `end_event(region)`: the end event of a region recorded later than it ends (the optimizer
 * phase, `device.end_event`): recorded now; the one it replaces goes to the worker (`drop`). */
static PyObject *
mod_end_event(PyObject *module, PyObject *region)
{
    if (!PyObject_TypeCheck(region, &RegionType)) {
        PyErr_SetString(PyExc_TypeError, "end_event() takes a Region");
        return NULL;
    }
    RegionObject *self = (RegionObject *)region;
    if (g_dev_free == NULL || self->dev == NULL || self->dev == Py_None)
        Py_RETURN_NONE;
    PyObject *old = self->ev1;
    self->ev1 = dev_take();
    dev_drop(old);
    Py_RETURN_NONE;
}

/* `drop_events(region)`: the region will never be recorded (`direct.abandon`): its events go to
 * the worker, which gives them back once complete. */
static PyObject *
mod_drop_events(PyObject *module, PyObject *region)
{
    if (!PyObject_TypeCheck(region, &RegionType)) {
        PyErr_SetString(PyExc_TypeError, "drop_events() takes a Region");
        return NULL;
    }
    RegionObject *self = (RegionObject *)region;
    PyObject *dev = self->dev, *ev1 = self->ev1;
    self->dev = Py_NewRef(Py_None);
    self->ev1 = NULL;
    dev_drop(dev);
    dev_drop(ev1);
    Py_RETURN_NONE;
}
