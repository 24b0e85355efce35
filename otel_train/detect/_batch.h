/* What `_batch.c` and its parts share: the note kinds, `batch.b`'s slots read where they lie, the
 * bound objects. Private to `_batch.c`, which includes it and then each part as one translation
 * unit, as `_loops.c` does (`_loops.h` says why). */
#ifndef OTEL_TRAIN_BATCH_H
#define OTEL_TRAIN_BATCH_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <pythread.h>

#include "_member.h"
#include "_update.h"
#include "../record/_hotpath_api.h"

/* The note kinds and a wrapped note's fields: their one numbering, which `batch.py` takes from
 * this module's constants. */
enum { FWD_BEGIN, FWD_END, BACKWARD, FETCH, OPT_BEGIN, OPT_END, ZERO_GRAD, GC, CLIP, KINDS };
enum { T1 = 2, INDEX = 3, INNER = 4, ERROR = 5 };

/* `batch.Batch`'s slots this module reads or writes. */
enum { B_NOTES, B_TAKEN, B_ON, B_THREAD, B_FAILED, B_OPT_DEPTH, B_OPT_NOTE, B_OPT_FRAME, B_FWD_SEEN, B_FETCHING,
       B_WAITED, B_REAL, B_N };
static const char *const b_names[B_N] = {"notes", "taken", "on", "thread", "failed", "opt_depth", "opt_note",
                                         "opt_frame", "fwd_seen", "fetching", "waited", "real"};
static Py_ssize_t b_off[B_N];

/* The Python entry points (`batch.py`), what the C code calls from their start for what it does not take. */
enum { P_FORWARD_BEGIN, P_FORWARD_END, P_BACKWARD_RUN, P_FETCH, P_OPTIMIZER_END, P_ZERO_GRAD_RUN, P_CLIP_RUN,
       P_OPTIMIZER_BEGIN, P_N };

static PyObject *g_b, *g_batch_dict, *g_rec_dict, *g_roots, *g_compiled, *g_set_settle, *g_settle, *g_grad_enabled,
    *g_decided_place, *g_size_of, *g_rest[P_N];
static PyObject *g_kind[KINDS];
static PyObject *s_rec, *s_now, *s_discovering, *s_seen, *s_training, *s_batch_calls, *s_max_wait, *s_closure,
    *s_site_probe;

/* `b.<slot>`: borrowed, NULL where unset (no error set). */
static inline PyObject *
bget(int i)
{
    return *(PyObject **)((char *)g_b + b_off[i]);
}

static inline void
bset(int i, PyObject *v)
{
    Py_XSETREF(*(PyObject **)((char *)g_b + b_off[i]), Py_NewRef(v));
}

static int
truthy(PyObject *v)
{
    return v == Py_True ? 1 : v == Py_False || v == Py_None || v == NULL ? 0 : PyObject_IsTrue(v);
}

/* A small int slot (`opt_depth`, `fetching`, `taken`): its value, -1 with an error otherwise. */
static Py_ssize_t
bint(int i)
{
    PyObject *v = bget(i);
    if (v == NULL || !PyLong_CheckExact(v)) {
        PyErr_SetString(PyExc_TypeError, "otel_train: batch state is not an int");
        return -1;
    }
    return PyLong_AsSsize_t(v);
}

static int
bset_int(int i, Py_ssize_t n)
{
    PyObject *v = PyLong_FromSsize_t(n);
    if (v == NULL)
        return -1;
    Py_XSETREF(*(PyObject **)((char *)g_b + b_off[i]), v);
    return 0;
}

/* The main thread's id as `b.thread` last held it (the object, a strong reference, and its value). */
static PyObject *g_thread;
static unsigned long g_thread_id;
/* `roots.discovering` and `compiled.seen`, read where they lie (`_member.h`). */
static Member m_discovering = {&s_discovering}, m_seen = {&s_seen};

#endif /* OTEL_TRAIN_BATCH_H */
