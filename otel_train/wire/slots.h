/* The packed ring's slot: its layout and how one becomes a record again, used by the recorder
 * (`record/_hotpath.c`), which packs slots, and whose `unpack` reads them back, in the training
 * process when it must and in the exporter process for every packed drain
 * (`export/pipeline.py`). See "the packed ring" in `record/_hotpath_recorder.c`. The Python side
 * of the schema (record kinds, tuple layouts) is `wire/schema.py`. */
#ifndef OTEL_TRAIN_SLOTS_H
#define OTEL_TRAIN_SLOTS_H

#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "record.h"

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

/* A region's record (`record.h`) from its numbers, NULL for None
 * (`seq`, `parent_seq`, `t0`); the objects are borrowed. The C region's exit and `unpack_slot`
 * both make it. */
static PyObject *
region_record(PyObject *kind_span, PyObject *name, const int64_t *seq, const int64_t *parent_seq, PyObject *step_ref,
              const int64_t *t0, int64_t t1, PyObject *attrs, PyObject *exc, PyObject *events)
{
    PyObject *numbers[4] = {
        seq != NULL ? PyLong_FromLongLong(*seq) : Py_NewRef(Py_None),
        parent_seq != NULL ? PyLong_FromLongLong(*parent_seq) : Py_NewRef(Py_None),
        t0 != NULL ? PyLong_FromLongLong(*t0) : Py_NewRef(Py_None),
        PyLong_FromLongLong(t1),
    };
    PyObject *record = numbers[0] && numbers[1] && numbers[2] && numbers[3] ? PyTuple_New(REC_FIELDS) : NULL;
    if (record == NULL) {
        for (int i = 0; i < 4; i++)
            Py_XDECREF(numbers[i]);
        return NULL;
    }
    PyTuple_SET_ITEM(record, REC_KIND, Py_NewRef(kind_span));
    PyTuple_SET_ITEM(record, REC_NAME, Py_NewRef(name));
    PyTuple_SET_ITEM(record, REC_SEQ, numbers[0]);
    PyTuple_SET_ITEM(record, REC_PARENT, numbers[1]);
    PyTuple_SET_ITEM(record, REC_STEP, Py_NewRef(step_ref));
    PyTuple_SET_ITEM(record, REC_T0, numbers[2]);
    PyTuple_SET_ITEM(record, REC_T1, numbers[3]);
    PyTuple_SET_ITEM(record, REC_ATTRS, Py_NewRef(attrs));
    PyTuple_SET_ITEM(record, REC_EXC, Py_NewRef(exc));
    PyTuple_SET_ITEM(record, REC_EVENTS, Py_NewRef(events));
    return record;
}

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
    PyObject *record = region_record(kind_span, PyList_GET_ITEM(strings, slot->name), &slot->seq,
                                     slot->flags & F_PARENT ? &slot->parent : NULL, last->ref, &slot->t0, slot->t1,
                                     attrs, Py_None, Py_None);
    Py_DECREF(attrs);
    return record;
}

/* `obj`'s bytes as slots: 0 with `view` held and `*count` set, or -1 with an error (`who`, the
 * caller's name, begins its message). */
static int
slots_open(PyObject *obj, Py_buffer *view, Py_ssize_t *count, const char *who)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_SIMPLE) < 0)
        return -1;
    if (view->len % (Py_ssize_t)sizeof(Slot)) {
        PyErr_Format(PyExc_ValueError, "%s: not a whole number of slots", who);
        PyBuffer_Release(view);
        return -1;
    }
    *count = view->len / (Py_ssize_t)sizeof(Slot);
    return 0;
}

/* Slot `i` of `view`, copied out (a bytes object's data need not be aligned for one). */
static void
slot_at(const Py_buffer *view, Py_ssize_t i, Slot *slot)
{
    memcpy(slot, (const char *)view->buf + i * (Py_ssize_t)sizeof(Slot), sizeof *slot);
}

/* The side record the next SIDE slot stands for (borrowed; `*next` moves on), or NULL with an
 * error when `side` has no more. */
static PyObject *
side_record(PyObject *side, Py_ssize_t *next, const char *who)
{
    if (*next >= PyList_GET_SIZE(side)) {
        PyErr_Format(PyExc_ValueError, "%s: more side slots than side records", who);
        return NULL;
    }
    return PyList_GET_ITEM(side, (*next)++);
}

/* 0 when the slots took every side record, else -1 with an error. */
static int
sides_done(PyObject *side, Py_ssize_t next, const char *who)
{
    if (next == PyList_GET_SIZE(side))
        return 0;
    PyErr_Format(PyExc_ValueError, "%s: more side records than side slots", who);
    return -1;
}

/* `unpack(slots, side, wire, strings)`, the module function of both extensions: what
 * `RecorderBase.drain_packed` gave, back as `export.pipe.Segments`: runs of (is_wire, records),
 * a side record being wire where `wire` (flags by side index, or None) says so, slots unpacked
 * with `strings` into region records of kind `kind_span`. */
static PyObject *
unpack_segments(PyObject *args, PyObject *kind_span)
{
    PyObject *slots_obj, *side, *wire, *strings;
    if (!PyArg_ParseTuple(args, "OO!OO!:unpack", &slots_obj, &PyList_Type, &side, &wire, &PyList_Type, &strings))
        return NULL;
    if (wire != Py_None && (!PyList_Check(wire) || PyList_GET_SIZE(wire) != PyList_GET_SIZE(side))) {
        PyErr_SetString(PyExc_ValueError, "unpack: `wire` must be None or a list as long as `side`");
        return NULL;
    }
    Py_buffer view;
    Py_ssize_t n, next_side = 0;
    if (slots_open(slots_obj, &view, &n, "unpack") < 0)
        return NULL;
    PyObject *segments = PyList_New(0), *run = NULL;
    int run_wire = -1;
    LastStep last = {NULL, 0, 0, 0};
    if (segments == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        Slot slot;
        slot_at(&view, i, &slot);
        PyObject *record;
        int is_wire = 0;
        if (slot.tag == SLOT_SIDE) {
            Py_ssize_t at = next_side;
            PyObject *found = side_record(side, &next_side, "unpack");
            if (found == NULL)
                goto fail;
            if (wire != Py_None && (is_wire = PyObject_IsTrue(PyList_GET_ITEM(wire, at))) < 0)
                goto fail;
            record = Py_NewRef(found);
        }
        else if ((record = unpack_slot(&slot, strings, &last, kind_span)) == NULL)
            goto fail;
        if (is_wire != run_wire) {
            PyObject *fresh = PyList_New(0);
            PyObject *pair = fresh != NULL ? Py_BuildValue("(OO)", is_wire ? Py_True : Py_False, fresh) : NULL;
            if (pair == NULL || PyList_Append(segments, pair) < 0) {
                Py_XDECREF(fresh);
                Py_XDECREF(pair);
                Py_DECREF(record);
                goto fail;
            }
            Py_DECREF(pair);
            Py_XSETREF(run, fresh);
            run_wire = is_wire;
        }
        int err = PyList_Append(run, record);
        Py_DECREF(record);
        if (err < 0)
            goto fail;
    }
    if (sides_done(side, next_side, "unpack") < 0)
        goto fail;
    PyBuffer_Release(&view);
    Py_XDECREF(run);
    Py_XDECREF(last.ref);
    return segments;
fail:
    PyBuffer_Release(&view);
    Py_XDECREF(run);
    Py_XDECREF(last.ref);
    Py_XDECREF(segments);
    return NULL;
}

#endif
