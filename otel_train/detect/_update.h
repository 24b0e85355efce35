/* What detection's C modules (`_loops.c`, `_batch.c`) read of an optimizer update's call as its
 * pre-hook sees it: the closure it was given, the frames above the hook, and the two frames that
 * called the update as `sites.callers` keeps them. Each includes this file (its functions are static). */
#ifndef OTEL_TRAIN_DETECT_UPDATE_H
#define OTEL_TRAIN_DETECT_UPDATE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#if PY_VERSION_HEX < 0x030B0000
#include <frameobject.h>
#endif

/* The closure `optimizer.step` was given: args[1], else kwargs["closure"] (borrowed; NULL: none
 * found or an error, told apart by PyErr_Occurred). `closure` is the interned "closure". */
static PyObject *
closure_of(PyObject *args, PyObject *kwargs, PyObject *closure)
{
    if (PyTuple_Check(args) && PyTuple_GET_SIZE(args) > 1)
        return PyTuple_GET_ITEM(args, 1);
    if (kwargs != Py_None && PyDict_Check(kwargs))
        return PyDict_GetItemWithError(kwargs, closure);
    return NULL;
}

/* The two frames above an optimizer's pre-hook that a C function called straight from it sees:
 * torch's step wrapper (*wrapper) and the update's call site (*caller), new references or NULL
 * where the stack ends. */
static void
update_frames(PyFrameObject **wrapper, PyFrameObject **caller)
{
    PyFrameObject *hook = PyEval_GetFrame(); /* borrowed: the pre-hook */
    *wrapper = hook != NULL ? PyFrame_GetBack(hook) : NULL;
    *caller = *wrapper != NULL ? PyFrame_GetBack(*wrapper) : NULL;
}

/* `sites.callers(caller, caller.f_back)`: the id, code and instruction offset of the frame that
 * called the update and of the one that called it, never the frames themselves (a new tuple, or
 * NULL with an error). */
static PyObject *
callers_of(PyFrameObject *caller)
{
    PyFrameObject *outer = PyFrame_GetBack(caller);
    PyCodeObject *caller_code = PyFrame_GetCode(caller), *outer_code = outer ? PyFrame_GetCode(outer) : NULL;
    PyObject *callers = Py_BuildValue("(NOiNOi)", PyLong_FromVoidPtr(caller), (PyObject *)caller_code,
                                      PyFrame_GetLasti(caller),
                                      outer != NULL ? PyLong_FromVoidPtr(outer) : Py_NewRef(Py_None),
                                      outer_code != NULL ? (PyObject *)outer_code : Py_None,
                                      outer != NULL ? PyFrame_GetLasti(outer) : -1);
    Py_DECREF(caller_code);
    Py_XDECREF(outer_code);
    Py_XDECREF(outer);
    return callers;
}

#endif
