/* Part of `_loops.c`, compiled in it as one translation unit (`_loops.h` says why): the frame walk that finds the user's frames calling an update or a zero_grad (`sites`). */

/* --- sites.user_frames ------------------------------------------------------------------- */
static PyObject *g_name_key;      /* "__name__" */
static PyObject *g_own_prefixes;  /* `sites._OURS`, from `bind` */
static PyObject *g_torch;         /* "torch" */
static int g_max_depth = 16;      /* `sites._MAX_DEPTH` */

/* 1 where `frame` runs code of torch or otel_train, 0 where not, -1 with an error. */
static int
frame_is_ours(PyFrameObject *frame)
{
#if PY_VERSION_HEX >= 0x030B0000
    PyObject *globals = PyFrame_GetGlobals(frame);
#else
    PyObject *globals = Py_XNewRef(frame->f_globals);
#endif
    if (globals == NULL)
        return -1;
    PyObject *name = PyDict_Check(globals) ? PyDict_GetItemWithError(globals, g_name_key) : NULL;
    int ours = 0;
    if (name != NULL && PyUnicode_Check(name)) {
        Py_ssize_t n = PyTuple_GET_SIZE(g_own_prefixes);
        for (Py_ssize_t i = 0; i < n && !ours; i++) {
            ours = (int)PyUnicode_Tailmatch(name, PyTuple_GET_ITEM(g_own_prefixes, i), 0, PY_SSIZE_T_MAX, -1);
            if (ours < 0)
                break;
        }
        if (ours == 0)
            ours = PyUnicode_Compare(name, g_torch) == 0;
    } else if (name == NULL && PyErr_Occurred()) {
        ours = -1;
    }
    Py_DECREF(globals);
    return ours;
}

PyDoc_STRVAR(user_frames_doc,
"user_frames(limit)\n--\n\n"
"`sites.user_frames`: the innermost `limit` frames of the calling Python stack (its\n"
"innermost frame first) outside torch and otel_train, looking through at most `_MAX_DEPTH`.");

static PyObject *
user_frames(PyObject *module, PyObject *arg)
{
    if (g_own_prefixes == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_loops.bind() was not called");
        return NULL;
    }
    Py_ssize_t limit = PyLong_AsSsize_t(arg);
    if (limit == -1 && PyErr_Occurred())
        return NULL;
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    PyFrameObject *frame = PyEval_GetFrame(); /* borrowed: the Python function that called us */
    Py_XINCREF(frame);
    for (int depth = 0; depth < g_max_depth && frame != NULL; depth++) {
        int ours = frame_is_ours(frame);
        if (ours < 0 || (!ours && PyList_Append(out, (PyObject *)frame) < 0)) {
            Py_DECREF(frame);
            Py_DECREF(out);
            return NULL;
        }
        if (PyList_GET_SIZE(out) == limit)
            break;
        PyFrameObject *back = PyFrame_GetBack(frame);
        Py_DECREF(frame);
        frame = back;
    }
    Py_XDECREF(frame);
    return out;
}

