/* A region's record: the 10-field tuple a region's exit appends to the recorder's buffer, and
 * what every C builder and reader of one indexes by. `wire/schema.py`'s `RegionRecord` is the
 * same layout for Python (`tests/test_wire_record.py` holds the two to the same fields in the
 * same order). A plain tuple, not a struct sequence: the packed ring takes only exact tuples
 * (`_hotpath_recorder.c`), and a plain tuple pickles smallest on its way to the exporter. */
#ifndef OTEL_TRAIN_RECORD_H
#define OTEL_TRAIN_RECORD_H

#include <Python.h>

enum {
    REC_KIND,   /* KIND_SPAN (`wire/schema.py`): tells a region from a step or a note */
    REC_NAME,   /* the span's name (str) */
    REC_SEQ,    /* the region's number in this process: its span id (`wire/ids.py`) */
    REC_PARENT, /* the enclosing region's number, or None: the step (or no parent) is the parent */
    REC_STEP,   /* (step_n, step_seq), the step it ran in: its trace; NO_STEP before the first */
    REC_T0,     /* start, perf-counter ns */
    REC_T1,     /* end, perf-counter ns */
    REC_ATTRS,  /* its attributes (dict), or None */
    REC_EXC,    /* the exception class it ended with (its name, once pickled), `Truncated`, or None */
    REC_EVENTS, /* its events, [(name, t, attrs)], or None */
    REC_FIELDS
};

/* A region's record from its fields (new references taken to each), or NULL with an error. */
static inline PyObject *
region_pack(PyObject *kind, PyObject *name, PyObject *seq, PyObject *parent, PyObject *step, PyObject *t0,
            PyObject *t1, PyObject *attrs, PyObject *exc, PyObject *events)
{
    PyObject *record = PyTuple_New(REC_FIELDS);
    if (record == NULL)
        return NULL;
    PyTuple_SET_ITEM(record, REC_KIND, Py_NewRef(kind));
    PyTuple_SET_ITEM(record, REC_NAME, Py_NewRef(name));
    PyTuple_SET_ITEM(record, REC_SEQ, Py_NewRef(seq));
    PyTuple_SET_ITEM(record, REC_PARENT, Py_NewRef(parent));
    PyTuple_SET_ITEM(record, REC_STEP, Py_NewRef(step));
    PyTuple_SET_ITEM(record, REC_T0, Py_NewRef(t0));
    PyTuple_SET_ITEM(record, REC_T1, Py_NewRef(t1));
    PyTuple_SET_ITEM(record, REC_ATTRS, Py_NewRef(attrs));
    PyTuple_SET_ITEM(record, REC_EXC, Py_NewRef(exc));
    PyTuple_SET_ITEM(record, REC_EVENTS, Py_NewRef(events));
    return record;
}

#endif
