/* Part of `_batch.c`, compiled in it as one translation unit (`_batch.h`): the replay, the notes run through detection's bodies in order, the recorder's clock pinned to each note's times. */

/* --- the replay ------------------------------------------------------------------------ */

/* `bind_replay`: the detection state, the busy checks of a fetch, a backward and a zero_grad or
 * clipping, the GC pause body, `_loops.set_replay`, and `batch._PLAIN`. */
static PyObject *g_data_busy, *g_backward_busy, *g_aux_busy, *g_gc_pause, *g_set_replay, *g_plain;
static PyObject *s_real, *s_replay, *s_int, *s_generation, *s_forward_begin, *s_forward_end, *s_backward_run,
    *s_fetch, *s_optimizer_begin, *s_optimizer_end, *s_zero_grad_run, *s_clip_run;

static Py_ssize_t replay_span(PyObject *notes, Py_ssize_t i, Py_ssize_t end, PyObject *r);

/* `State.replay`, read and written where it lies (`_member.h`). */
static Member m_replay = {&s_replay}, m_replay_w = {&s_replay};

/* `batch._facts(facts)`: what the bodies read instead of the live values. */
static int
facts_set(PyObject *facts)
{
    PyObject *was = mget(g_s, &m_replay);
    if (was == NULL)
        return -1;
    Py_DECREF(was);
    if (was == facts)
        return 0;
    if (mset(g_s, &m_replay_w, facts) < 0)
        return -1;
    PyObject *out = PyObject_CallOneArg(g_set_replay, facts);
    Py_XDECREF(out);
    return out == NULL ? -1 : 0;
}

/* `r.now = t.__int__`: the recorder's clock reads `t`. */
static int
clock_at(PyObject *r, PyObject *t)
{
    return recorder_pin(g_api, &g_rec_type, r, t, s_now, s_int);
}

/* A stand-in: the user's function as a replayed body calls it (the notes made during the call,
 * then its end). */
typedef struct {
    PyObject_HEAD
    PyObject *notes, *r, *note, *facts;
    Py_ssize_t i, end;
} StandIn;

static void
standin_dealloc(StandIn *self)
{
    Py_XDECREF(self->notes);
    Py_XDECREF(self->r);
    Py_XDECREF(self->note);
    Py_XDECREF(self->facts);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
standin_call(StandIn *self, PyObject *args, PyObject *kwargs)
{
    if (self->end > self->i) {
        if (replay_span(self->notes, self->i, self->end, self->r) < 0 || facts_set(self->facts) < 0)
            return NULL;
    }
    if (clock_at(self->r, PyList_GET_ITEM(self->note, T1)) < 0)
        return NULL;
    PyObject *error = PyList_GET_ITEM(self->note, ERROR);
    if (error != Py_None) {
        PyErr_SetObject((PyObject *)Py_TYPE(error), error);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyTypeObject StandInType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "otel_train.detect._batch.StandIn",
    .tp_basicsize = sizeof(StandIn),
    .tp_dealloc = (destructor)standin_dealloc,
    .tp_call = (ternaryfunc)standin_call,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The user's function, as a replayed body calls it.",
};

/* A wrapped call's body, replayed; what the call raised comes back through the
 * body and stops here, the exception left as the user's code holds it. 0, or -1 with an error. */
static int
call_body(StandIn *stand_in, PyObject *body, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *error = PyList_GET_ITEM(stand_in->note, ERROR);
    if (error == Py_None) {
        PyObject *out = PyObject_Vectorcall(body, args, nargs, NULL);
        Py_XDECREF(out);
        return out == NULL ? -1 : 0;
    }
    Py_INCREF(error);
    PyObject *tb = PyException_GetTraceback(error), *context = PyException_GetContext(error),
             *cause = PyException_GetCause(error);
    char suppress = ((PyBaseExceptionObject *)error)->suppress_context;
    PyObject *out = PyObject_Vectorcall(body, args, nargs, NULL);
    int failed = 0;
    if (out == NULL) {
        PyObject *type, *value, *trace;
        PyErr_Fetch(&type, &value, &trace);
        PyErr_NormalizeException(&type, &value, &trace);
        if (value == error) { /* the call's own error: it stops here */
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(trace);
        } else {
            PyErr_Restore(type, value, trace);
            failed = 1;
        }
    }
    Py_XDECREF(out);
    PyException_SetTraceback(error, tb != NULL ? tb : Py_None);
    Py_XDECREF(tb);
    PyException_SetContext(error, context); /* steals */
    PyException_SetCause(error, cause);     /* steals */
    ((PyBaseExceptionObject *)error)->suppress_context = suppress;
    Py_DECREF(error);
    return failed ? -1 : 0;
}

static PyObject *
real(PyObject *name)
{
    PyObject *table = bget(B_REAL);
    PyObject *fn = table != NULL && PyDict_CheckExact(table) ? PyDict_GetItemWithError(table, name) : NULL;
    if (fn == NULL && !PyErr_Occurred())
        PyErr_SetObject(PyExc_KeyError, name);
    return fn; /* borrowed */
}

static int
call_real(PyObject *name, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *fn = real(name);
    if (fn == NULL)
        return -1;
    PyObject *out = PyObject_Vectorcall(fn, args, nargs, NULL);
    Py_XDECREF(out);
    return out == NULL ? -1 : 0;
}

/* One wrapped note at notes[i] (its end reached): its body around a stand-in, or its inner notes
 * alone where its wrapper would have called the user's function alone. */
static int
replay_wrapped(PyObject *notes, Py_ssize_t i, Py_ssize_t inner, PyObject *r, int kind, PyObject *note)
{
    PyObject *busy_fn = kind == FETCH ? g_data_busy : kind == BACKWARD ? g_backward_busy : g_aux_busy;
    PyObject *v = PyObject_CallOneArg(busy_fn, g_s);
    if (v == NULL)
        return -1;
    int busy = PyObject_IsTrue(v);
    Py_DECREF(v);
    if (busy < 0)
        return -1;
    if (busy)
        return replay_span(notes, i + 1, i + 1 + inner, r) < 0 ? -1 : 0;
    PyObject *facts;
    if (kind == FETCH || kind == ZERO_GRAD) {
        facts = PyTuple_Pack(6, Py_True, Py_True, kind == FETCH ? PyList_GET_ITEM(note, 7) : Py_None, Py_None, Py_None,
                             kind == FETCH ? g_kind[0] : PyList_GET_ITEM(note, 7));
        if (facts == NULL)
            return -1;
    } else {
        facts = Py_NewRef(g_plain);
    }
    StandIn *stand_in = PyObject_New(StandIn, &StandInType);
    if (stand_in == NULL) {
        Py_DECREF(facts);
        return -1;
    }
    stand_in->notes = Py_NewRef(notes);
    stand_in->r = Py_NewRef(r);
    stand_in->note = Py_NewRef(note);
    stand_in->facts = facts;
    stand_in->i = i + 1;
    stand_in->end = i + 1 + inner;
    int out = facts_set(facts);
    PyObject *body = NULL;
    if (out == 0) {
        body = real(kind == FETCH ? s_fetch : kind == BACKWARD ? s_backward_run : kind == CLIP ? s_clip_run
                                                                                                : s_zero_grad_run);
        out = body == NULL ? -1 : 0;
    }
    if (out == 0) {
        PyObject *self = (PyObject *)stand_in;
        if (kind == FETCH) {
            PyObject *args[2] = {self, PyList_GET_ITEM(note, 6)};
            out = call_body(stand_in, body, args, 2);
        } else if (kind == BACKWARD) {
            PyObject *none_args = PyTuple_New(0);
            PyObject *args[3] = {self, none_args, Py_None};
            out = none_args == NULL ? -1 : call_body(stand_in, body, args, 3);
            Py_XDECREF(none_args);
        } else {
            PyObject *empty = PyTuple_New(0), *kw = PyDict_New();
            PyObject *args[5] = {PyList_GET_ITEM(note, 6), g_s, self, empty, kw};
            out = empty == NULL || kw == NULL ? -1 : call_body(stand_in, body, args, 5);
            Py_XDECREF(empty);
            Py_XDECREF(kw);
        }
    }
    Py_DECREF(stand_in);
    return out;
}

/* notes[i:end] to recorder `r`; the index reached (a wrapped call still running
 * stops it), or -1 with an error. */
static Py_ssize_t
replay_span(PyObject *notes, Py_ssize_t i, Py_ssize_t end, PyObject *r)
{
    while (i < end) {
        if (i >= PyList_GET_SIZE(notes)) {
            PyErr_SetString(PyExc_IndexError, "otel_train: a note past the batch");
            return -1;
        }
        PyObject *note = Py_NewRef(PyList_GET_ITEM(notes, i));
        PyObject *item = PySequence_Fast_GET_ITEM(note, 0);
        long kind = PyLong_AsLong(item);
        int failed = (kind == -1 && PyErr_Occurred()) || clock_at(r, PySequence_Fast_GET_ITEM(note, 1)) < 0;
        if (!failed && (kind == BACKWARD || kind == FETCH || kind == ZERO_GRAD || kind == CLIP)) {
            if (PyList_GET_ITEM(note, T1) == Py_None) {
                Py_DECREF(note);
                return i;
            }
            Py_ssize_t inner = PyLong_AsSsize_t(PyList_GET_ITEM(note, INNER));
            failed = (inner == -1 && PyErr_Occurred()) || replay_wrapped(notes, i, inner, r, (int)kind, note) < 0;
            Py_DECREF(note);
            if (failed)
                return -1;
            i += 1 + inner;
            continue;
        }
        if (!failed) {
            PyObject *const *f = PySequence_Fast_ITEMS(note);
            if (kind == FWD_BEGIN || kind == FWD_END)
                failed = facts_set(g_plain) < 0 || call_real(kind == FWD_BEGIN ? s_forward_begin : s_forward_end,
                                                             f + 2, 1) < 0;
            else if (kind == OPT_BEGIN) {
                PyObject *facts = PyTuple_Pack(6, Py_True, Py_True, Py_None, f[5], f[6], g_kind[0]);
                failed = facts == NULL || facts_set(facts) < 0 || call_real(s_optimizer_begin, f + 2, 3) < 0;
                Py_XDECREF(facts);
            } else if (kind == OPT_END)
                failed = facts_set(g_plain) < 0 || call_real(s_optimizer_end, f + 2, 3) < 0;
            else {
                PyObject *info = Py_BuildValue("{OO}", s_generation, f[3]);
                PyObject *args[2] = {f[2], info};
                PyObject *out = info != NULL ? PyObject_Vectorcall(g_gc_pause, args, 2, NULL) : NULL;
                failed = out == NULL;
                Py_XDECREF(out);
                Py_XDECREF(info);
            }
        }
        Py_DECREF(note);
        if (failed)
            return -1;
        i += 1;
    }
    return i;
}

static PyObject *
replay(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyList_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "replay(notes: list, i, end, r)");
        return NULL;
    }
    if (g_s == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "replay: bind_replay first");
        return NULL;
    }
    Py_ssize_t i = PyLong_AsSsize_t(args[1]), end = PyLong_AsSsize_t(args[2]);
    if (PyErr_Occurred())
        return NULL;
    Py_ssize_t reached = replay_span(args[0], i, end, args[3]);
    return reached < 0 ? NULL : PyLong_FromSsize_t(reached);
}

