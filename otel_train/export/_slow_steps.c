/* The slow-step rule's window in C: `goodput.RecentSteps.observe` and `bound`, the same floats.
 *
 * Why: the exporter judges every step of a run (median + 3 MAD of the 100 before it), and in
 * Python that was ~1.3 us a step, the largest single part of a step's ~7 us of assembly there
 * (docs/benchmarks/2026-11-27-exporter-steps.md). The Python methods stay the reference and the
 * fallback where this module was not built; `tests/test_export_goodput.py` holds the two to the
 * same verdicts and bounds, to the bit.
 *
 * The window is the rule's own two objects, as Python keeps them: `recent` (a deque of the
 * step times in arrival order, with a maxlen) and `ordered` (a list of the same floats,
 * sorted). A window holding anything but floats is not taken: the call returns NotImplemented
 * and Python does it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *g_append; /* "append", interned */
static PyObject *g_maxlen; /* "maxlen", interned */

/* The float at `i` of `ordered` (a list of exact floats: checked by `all_floats`). */
#define AT(ordered, i) PyFloat_AS_DOUBLE(PyList_GET_ITEM((ordered), (i)))

/* Whether `ordered` (which must be a list) holds only floats: 1 or 0, -1 with an error. */
static int all_floats(PyObject *ordered) {
    if (!PyList_CheckExact(ordered)) {
        PyErr_SetString(PyExc_TypeError, "ordered must be a list");
        return -1;
    }
    Py_ssize_t n = PyList_GET_SIZE(ordered);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyFloat_CheckExact(PyList_GET_ITEM(ordered, i))) {
            return 0;
        }
    }
    return 1;
}

static double median(PyObject *ordered, Py_ssize_t n) {
    Py_ssize_t half = n / 2;
    return n % 2 ? AT(ordered, half) : (AT(ordered, half - 1) + AT(ordered, half)) / 2.0;
}

/* `bisect.bisect_right` / `bisect_left` on `ordered` for `x`. */
static Py_ssize_t bisect_right(PyObject *ordered, double x) {
    Py_ssize_t lo = 0, hi = PyList_GET_SIZE(ordered);
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (x < AT(ordered, mid)) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    return lo;
}

static Py_ssize_t bisect_left(PyObject *ordered, double x) {
    Py_ssize_t lo = 0, hi = PyList_GET_SIZE(ordered);
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (AT(ordered, mid) < x) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo;
}

/* Python's `x // 2`. */
static Py_ssize_t floor_half(Py_ssize_t x) {
    return x >= 0 ? x / 2 : -((1 - x) / 2);
}

/* `goodput._kth_deviation`: the `k`-th smallest (from 0) of |x - m| over `ordered`, whose first
 * `split` items are at most `m`, as the k-th of the two sorted runs either side of `split`. */
static double kth_deviation(PyObject *ordered, double m, Py_ssize_t split, Py_ssize_t k) {
    Py_ssize_t a = split, b = PyList_GET_SIZE(ordered) - split;
    Py_ssize_t lo = k + 1 - b > 0 ? k + 1 - b : 0, hi = a < k + 1 ? a : k + 1;
    for (;;) {
        Py_ssize_t i = floor_half(lo + hi);
        Py_ssize_t j = k + 1 - i;
        if (i < a && j > 0 && AT(ordered, split + j - 1) - m > m - AT(ordered, split - 1 - i)) {
            lo = i + 1;
        } else if (i > 0 && j < b && m - AT(ordered, split - i) > AT(ordered, split + j) - m) {
            hi = i - 1;
        } else {
            double below = i > 0 ? m - AT(ordered, split - i) : -1.0;
            double above = j > 0 ? AT(ordered, split + j - 1) - m : -1.0;
            return below > above ? below : above;
        }
    }
}

/* `RecentSteps.bound` of `ordered` (n >= min_history, checked by the caller). */
static double window_bound(PyObject *ordered, double k, double floor) {
    Py_ssize_t n = PyList_GET_SIZE(ordered), half = n / 2;
    double m = median(ordered, n);
    Py_ssize_t split = bisect_right(ordered, m);
    double mad = n % 2 ? kth_deviation(ordered, m, split, half)
                       : (kth_deviation(ordered, m, split, half - 1) + kth_deviation(ordered, m, split, half)) / 2.0;
    double spread = k * mad, least = floor * m;
    return m + (least > spread ? least : spread); /* Python's max(spread, least), NaN included */
}


/* bound(ordered, min_history, k, floor) -> float | None | NotImplemented */
static PyObject *bound(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "bound(ordered, min_history, k, floor)");
        return NULL;
    }
    PyObject *ordered = args[0];
    int floats = all_floats(ordered);
    if (floats < 0) {
        return NULL;
    }
    Py_ssize_t min_history = PyLong_AsSsize_t(args[1]);
    double k = PyFloat_AsDouble(args[2]), floor = PyFloat_AsDouble(args[3]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    if (!floats) {
        Py_RETURN_NOTIMPLEMENTED;
    }
    if (PyList_GET_SIZE(ordered) < min_history || PyList_GET_SIZE(ordered) == 0) {
        Py_RETURN_NONE;
    }
    return PyFloat_FromDouble(window_bound(ordered, k, floor));
}

/* observe(recent, ordered, step_time, min_history, k, floor) -> bool | NotImplemented:
 * whether `step_time` is over the window's bound, then the window moved on by it. */
static PyObject *observe(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "observe(recent, ordered, step_time, min_history, k, floor)");
        return NULL;
    }
    PyObject *recent = args[0], *ordered = args[1], *step_obj = args[2];
    int floats = all_floats(ordered);
    if (floats < 0) {
        return NULL;
    }
    if (!floats || !PyFloat_CheckExact(step_obj)) {
        Py_RETURN_NOTIMPLEMENTED;
    }
    Py_ssize_t min_history = PyLong_AsSsize_t(args[3]);
    double k = PyFloat_AsDouble(args[4]), floor = PyFloat_AsDouble(args[5]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    PyObject *maxlen_obj = PyObject_GetAttr(recent, g_maxlen); /* a deque's; None: unbounded */
    if (maxlen_obj == NULL) {
        return NULL;
    }
    Py_ssize_t maxlen = maxlen_obj == Py_None ? -1 : PyLong_AsSsize_t(maxlen_obj);
    Py_DECREF(maxlen_obj);
    if (maxlen == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Py_ssize_t held = PySequence_Size(recent);
    if (held < 0) {
        return NULL;
    }
    if (held != PyList_GET_SIZE(ordered)) {
        Py_RETURN_NOTIMPLEMENTED; /* not a window this rule kept: Python says what it is */
    }
    double t = PyFloat_AS_DOUBLE(step_obj);
    int slow = 0;
    if (held >= min_history && held > 0) {
        double m = median(ordered, held);
        if (t > m + floor * m) {
            slow = t > window_bound(ordered, k, floor);
        }
    }
    if (held == maxlen) {
        PyObject *oldest = PySequence_GetItem(recent, 0);
        if (oldest == NULL) {
            return NULL;
        }
        double old = PyFloat_AsDouble(oldest);
        Py_DECREF(oldest);
        if (old == -1.0 && PyErr_Occurred()) {
            return NULL;
        }
        if (PySequence_DelItem(ordered, bisect_left(ordered, old)) < 0) {
            return NULL;
        }
    }
    PyObject *done = PyObject_CallMethodOneArg(recent, g_append, step_obj);
    if (done == NULL) {
        return NULL;
    }
    Py_DECREF(done);
    if (PyList_Insert(ordered, bisect_right(ordered, t), step_obj) < 0) {
        return NULL;
    }
    return PyBool_FromLong(slow);
}

static PyMethodDef methods[] = {
    {"observe", (PyCFunction)(void (*)(void))observe, METH_FASTCALL,
     "observe(recent, ordered, step_time, min_history, k, floor): RecentSteps.observe"},
    {"bound", (PyCFunction)(void (*)(void))bound, METH_FASTCALL,
     "bound(ordered, min_history, k, floor): RecentSteps.bound"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_slow_steps", NULL, -1, methods};

PyMODINIT_FUNC PyInit__slow_steps(void) {
    g_append = PyUnicode_InternFromString("append");
    g_maxlen = PyUnicode_InternFromString("maxlen");
    if (g_append == NULL || g_maxlen == NULL) {
        return NULL;
    }
    return PyModule_Create(&module);
}
