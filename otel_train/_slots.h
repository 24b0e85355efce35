/* The packed ring's slot: its layout and how one becomes a record again, shared by the recorder
 * (`_hotpath.c`, which packs slots and unpacks them in the training process when it must) and
 * the exporter's fast path (`_encode.c`, which encodes them straight to OTLP bytes). See "the
 * packed ring" in `_hotpath.c`. Static functions: each module gets its own copy. */
#ifndef OTEL_TRAIN_SLOTS_H
#define OTEL_TRAIN_SLOTS_H

#include <Python.h>
#include <stdint.h>

#define SLOT_SIDE 0
#define SLOT_REGION 1
#define F_PARENT 1
#define F_STEP_N 2
#define F_STEP_SEQ 4
enum { A_NONE, A_INT, A_FLOAT, A_TRUE, A_FALSE, A_STR };
#define MAX_STRINGS 4096

typedef struct Slot {
    uint8_t tag, flags, attr, unused;
    uint32_t name, key, unused2;
    int64_t seq, parent, step_n, step_seq, t0, t1;
    union { int64_t i; double f; } value;
} Slot;

/* The step reference of the slot unpacked last, which the next one usually shares. */
typedef struct {
    PyObject *ref;  /* (step_n, step_seq), or NULL before the first slot */
    int64_t n, seq;
    uint8_t flags;
} LastStep;

/* One slot back as the tuple it was packed from (`strings` by index). */
static PyObject *
unpack_slot(const Slot *slot, PyObject *strings, LastStep *last, PyObject *kind_span)
{
    Py_ssize_t n_strings = PyList_GET_SIZE(strings);
    if (slot->name >= n_strings || ((slot->attr != A_NONE) && slot->key >= n_strings) ||
        (slot->attr == A_STR && (slot->value.i < 0 || slot->value.i >= n_strings))) {
        PyErr_SetString(PyExc_ValueError, "a packed record refers to a string the table does not have");
        return NULL;
    }
    uint8_t step_flags = slot->flags & (F_STEP_N | F_STEP_SEQ);
    if (last->ref == NULL || step_flags != last->flags || slot->step_n != last->n || slot->step_seq != last->seq) {
        PyObject *n = step_flags & F_STEP_N ? PyLong_FromLongLong(slot->step_n) : Py_NewRef(Py_None);
        PyObject *s = step_flags & F_STEP_SEQ ? PyLong_FromLongLong(slot->step_seq) : Py_NewRef(Py_None);
        PyObject *ref = n != NULL && s != NULL ? PyTuple_Pack(2, n, s) : NULL;
        Py_XDECREF(n);
        Py_XDECREF(s);
        if (ref == NULL)
            return NULL;
        Py_XSETREF(last->ref, ref);
        last->flags = step_flags;
        last->n = slot->step_n;
        last->seq = slot->step_seq;
    }
    PyObject *attrs = Py_None;
    if (slot->attr != A_NONE) {
        PyObject *value;
        switch (slot->attr) {
        case A_INT: value = PyLong_FromLongLong(slot->value.i); break;
        case A_FLOAT: value = PyFloat_FromDouble(slot->value.f); break;
        case A_TRUE: value = Py_NewRef(Py_True); break;
        case A_FALSE: value = Py_NewRef(Py_False); break;
        default: value = Py_NewRef(PyList_GET_ITEM(strings, slot->value.i)); break;
        }
        if (value == NULL || (attrs = PyDict_New()) == NULL) {
            Py_XDECREF(value);
            return NULL;
        }
        int err = PyDict_SetItem(attrs, PyList_GET_ITEM(strings, slot->key), value);
        Py_DECREF(value);
        if (err < 0) {
            Py_DECREF(attrs);
            return NULL;
        }
    }
    else
        Py_INCREF(attrs);
    PyObject *record = PyTuple_New(10);
    PyObject *seq = PyLong_FromLongLong(slot->seq), *t0 = PyLong_FromLongLong(slot->t0);
    PyObject *t1 = PyLong_FromLongLong(slot->t1);
    PyObject *parent = slot->flags & F_PARENT ? PyLong_FromLongLong(slot->parent) : Py_NewRef(Py_None);
    if (record == NULL || seq == NULL || t0 == NULL || t1 == NULL || parent == NULL) {
        Py_XDECREF(record);
        Py_XDECREF(seq);
        Py_XDECREF(t0);
        Py_XDECREF(t1);
        Py_XDECREF(parent);
        Py_DECREF(attrs);
        return NULL;
    }
    PyTuple_SET_ITEM(record, 0, Py_NewRef(kind_span));
    PyTuple_SET_ITEM(record, 1, Py_NewRef(PyList_GET_ITEM(strings, slot->name)));
    PyTuple_SET_ITEM(record, 2, seq);
    PyTuple_SET_ITEM(record, 3, parent);
    PyTuple_SET_ITEM(record, 4, Py_NewRef(last->ref));
    PyTuple_SET_ITEM(record, 5, t0);
    PyTuple_SET_ITEM(record, 6, t1);
    PyTuple_SET_ITEM(record, 7, attrs);
    PyTuple_SET_ITEM(record, 8, Py_NewRef(Py_None));
    PyTuple_SET_ITEM(record, 9, Py_NewRef(Py_None));
    return record;
}

#endif
