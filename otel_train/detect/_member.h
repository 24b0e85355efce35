/* An attribute of an object read or written where it lies: shared by detection's C modules
 * (`_loops.c`, `_batch.c`), each of which includes it (its functions are static). */
#ifndef OTEL_TRAIN_DETECT_MEMBER_H
#define OTEL_TRAIN_DETECT_MEMBER_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

/* For the helpers called from dozens of places each step: one copy of their code, whose lines
 * stay cached between the calls of one hook, rather than a copy inlined at each. */
#if defined(__GNUC__)
#define NOINLINE __attribute__((noinline))
#else
#define NOINLINE
#endif

/* The truth of `v`, a new reference released here (NULL: an error already set): 1, 0 or -1.
 * As `true_of(mget(obj, &m))`, the truth of `obj.<m>`. */
static NOINLINE int
true_of(PyObject *v)
{
    if (v == NULL)
        return -1;
    /* detection's flags are True, False or None: no call for those */
    int truth = v == Py_True ? 1 : v == Py_False || v == Py_None ? 0 : PyObject_IsTrue(v);
    Py_DECREF(v);
    return truth;
}

/* Detection reads a few attributes of the recorder's and its own objects every call (`r.step`,
 * `r.now`, `step.ref`, `live.parent`, `live.t1`, `roots.discovering`...): object pointers at
 * fixed offsets (`PyMemberDef`) or C getters (`PyGetSetDef`), where a generic lookup (the type's method cache,
 * the descriptor, its getter) touches a dozen cold cache lines and takes indirect branches each
 * time. A `Member` is one attribute's cache at one kind of object: the type it last read (a
 * strong reference), that type's version tag (which changes whenever the type does) and where
 * the attribute lies, or its getter and setter. Any other type or a stale tag goes the generic
 * way and learns the type it saw; a type with a lookup of its own (`__getattr__`...) or an
 * attribute that is not an object member or a getter (a property, a method) is not learnt. */
typedef struct {
    PyObject **name;
    PyTypeObject *type; /* NULL: nothing learnt */
    unsigned int tag;
    Py_ssize_t off;       /* a member: its offset */
    int none_if_unset;    /* ... T_OBJECT: unset reads as None (T_OBJECT_EX: AttributeError) */
    PyGetSetDef *getset;  /* a getter (and setter), or NULL for a member */
} Member;

static int
version_valid(PyTypeObject *type)
{
#ifdef Py_TPFLAGS_VALID_VERSION_TAG
    return PyType_HasFeature(type, Py_TPFLAGS_VALID_VERSION_TAG);
#else
    return type->tp_version_tag != 0;
#endif
}

/* Learn where `type` keeps the attribute `m` names, for reading (or `writing`), or forget. */
static void
member_learn(PyTypeObject *type, Member *m, int writing)
{
    Py_CLEAR(m->type);
    if (writing ? type->tp_setattro != PyObject_GenericSetAttr : type->tp_getattro != PyObject_GenericGetAttr)
        return;
    PyObject *descr = _PyType_Lookup(type, *m->name); /* borrowed; assigns the version tag */
    if (descr == NULL || !version_valid(type))
        return;
    if (Py_IS_TYPE(descr, &PyGetSetDescr_Type)) {
        PyGetSetDef *def = ((PyGetSetDescrObject *)descr)->d_getset;
        if (writing ? def->set == NULL : def->get == NULL)
            return;
        m->getset = def;
    } else if (Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
        PyMemberDef *def = ((PyMemberDescrObject *)descr)->d_member;
        if ((def->type != T_OBJECT && def->type != T_OBJECT_EX) || (writing && (def->flags & READONLY)))
            return;
        m->getset = NULL;
        m->off = def->offset;
        m->none_if_unset = def->type == T_OBJECT;
    } else {
        return;
    }
    m->type = (PyTypeObject *)Py_NewRef((PyObject *)type);
    m->tag = type->tp_version_tag;
}

/* `obj.<m>`: a new reference, or NULL with an error. */
static NOINLINE PyObject *
mget(PyObject *obj, Member *m)
{
    PyTypeObject *type = Py_TYPE(obj);
    if (type == m->type && type->tp_version_tag == m->tag) {
        if (m->getset != NULL)
            return m->getset->get(obj, m->getset->closure);
        PyObject *v = *(PyObject **)((char *)obj + m->off);
        if (v != NULL)
            return Py_NewRef(v);
        if (m->none_if_unset)
            Py_RETURN_NONE;
    } else {
        member_learn(type, m, 0);
    }
    return PyObject_GetAttr(obj, *m->name);
}

/* `obj.<m> = v`: 0, or -1 with an error. (Unused where a module only reads.) */
#if defined(__GNUC__)
__attribute__((unused))
#endif
static NOINLINE int
mset(PyObject *obj, Member *m, PyObject *v)
{
    PyTypeObject *type = Py_TYPE(obj);
    if (type == m->type && type->tp_version_tag == m->tag) {
        if (m->getset != NULL)
            return m->getset->set(obj, v, m->getset->closure);
        Py_XSETREF(*(PyObject **)((char *)obj + m->off), Py_NewRef(v));
        return 0;
    }
    member_learn(type, m, 1);
    return PyObject_SetAttr(obj, *m->name, v);
}

#endif
