/* Part of `_loops.c`, compiled in it as one translation unit (`_loops.h` says why): a closing step's largest gaps between its phases, as `train.other` (`coverage`). */

typedef struct {
    int64_t a, b;
} Interval;

typedef struct {
    int64_t length, a, b;
} Gap;

static int
interval_cmp(const void *x, const void *y)
{
    const Interval *p = x, *q = y;
    if (p->a != q->a)
        return p->a < q->a ? -1 : 1;
    return (p->b > q->b) - (p->b < q->b);
}

/* Descending (length, a, b): Python's `gaps.sort(reverse=True)` on those tuples. */
static int
gap_cmp_desc(const void *x, const void *y)
{
    const Gap *p = x, *q = y;
    if (p->length != q->length)
        return p->length > q->length ? -1 : 1;
    if (p->a != q->a)
        return p->a > q->a ? -1 : 1;
    return (p->b < q->b) - (p->b > q->b);
}

static int
append_gap(PyObject *append, PyObject *seq, PyObject *kind, PyObject *name, PyObject *ref, const Gap *gap)
{
    PyObject *t0 = PyLong_FromLongLong(gap->a), *t1 = PyLong_FromLongLong(gap->b);
    int err = t0 == NULL || t1 == NULL || append_record(append, seq, kind, name, Py_None, ref, t0, t1, Py_None) < 0;
    Py_XDECREF(t0);
    Py_XDECREF(t1);
    return err ? -1 : 0;
}

PyDoc_STRVAR(gaps_doc,
"gaps(cover, t0, t1, max_uncovered, min_gap_ns, append, seq, kind, name, ref)\n--\n\n"
"`coverage`'s gaps: the step [t0, t1]'s largest gaps between the intervals in `cover`\n"
"([a, b, a, b, ...]) appended as `name` records until what stays uncovered is at most\n"
"`max_uncovered` of the step; returns the uncovered nanoseconds left.");

static int gaps_of(PyObject *cover, int64_t t0, int64_t t1, double share, int64_t min_gap, PyObject *append,
                   PyObject *seq, PyObject *kind, PyObject *name, PyObject *ref, int64_t *total_out);

static PyObject *
gaps(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "gaps() takes 10 arguments");
        return NULL;
    }
    int64_t t0, t1, min_gap, total;
    double share = PyFloat_AsDouble(args[3]);
    if (as_i64(args[1], &t0) < 0 || as_i64(args[2], &t1) < 0 || (share == -1.0 && PyErr_Occurred())
        || as_i64(args[4], &min_gap) < 0
        || gaps_of(args[0], t0, t1, share, min_gap, args[5], args[6], args[7], args[8], args[9], &total) < 0)
        return NULL;
    return PyLong_FromLongLong(total);
}

/* `gaps` on C values: the uncovered nanoseconds left in `*total`. 0, or -1 with an error. */
static int
gaps_of(PyObject *cover, int64_t t0, int64_t t1, double share, int64_t min_gap, PyObject *append, PyObject *seq,
        PyObject *kind, PyObject *name, PyObject *ref, int64_t *total_out)
{
    if (!PyList_Check(cover) || PyList_GET_SIZE(cover) % 2) {
        PyErr_SetString(PyExc_TypeError, "cover must be a list of interval bounds");
        return -1;
    }
    Py_ssize_t n = PyList_GET_SIZE(cover) / 2;
    Interval stack_iv[32];
    Gap stack_gap[33];
    Interval *iv = n <= 32 ? stack_iv : PyMem_Malloc(n * sizeof(Interval));
    Gap *gap = n <= 32 ? stack_gap : PyMem_Malloc((n + 1) * sizeof(Gap));
    int result = -1;
    if (iv == NULL || gap == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    int sorted = 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (as_i64(PyList_GET_ITEM(cover, 2 * i), &iv[i].a) < 0 || as_i64(PyList_GET_ITEM(cover, 2 * i + 1), &iv[i].b) < 0)
            goto done;
        if (i && interval_cmp(&iv[i - 1], &iv[i]) > 0)
            sorted = 0;
    }
    if (!sorted)
        qsort(iv, n, sizeof(Interval), interval_cmp);
    Py_ssize_t ngaps = 0;
    int64_t total = 0, cursor = t0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (iv[i].a > cursor) {
            int64_t end = iv[i].a < t1 ? iv[i].a : t1;
            if (end > cursor) {
                gap[ngaps++] = (Gap){end - cursor, cursor, end};
                total += end - cursor;
            }
        }
        if (iv[i].b > cursor)
            cursor = iv[i].b;
    }
    if (t1 > cursor) {
        gap[ngaps++] = (Gap){t1 - cursor, cursor, t1};
        total += t1 - cursor;
    }
    double allowed = (double)(t1 - t0) * share;
    if ((double)total > allowed) {
        qsort(gap, ngaps, sizeof(Gap), gap_cmp_desc);
        for (Py_ssize_t i = 0; i < ngaps; i++) {
            if ((double)total <= allowed || gap[i].length < min_gap)
                break;
            if (append_gap(append, seq, kind, name, ref, &gap[i]) < 0)
                goto done;
            total -= gap[i].length;
        }
    }
    *total_out = total;
    result = 0;
done:
    if (iv != stack_iv)
        PyMem_Free(iv);
    if (gap != stack_gap)
        PyMem_Free(gap);
    return result;
}

