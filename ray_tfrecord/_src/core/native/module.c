/*
 * ray_tfrecord._src.core._native: the Python face of the native codec, and the only file that includes
 * Python.h. It parses arguments, releases the GIL around the Python-free cores, and hands results
 * back as named struct sequences over zero-copy buffers (pa.py_buffer wraps them).
 *
 * The cores are compiled into this translation unit (a unity build, their entry points static),
 * so their hot loops inline exactly as when they were one file; each still compiles and links
 * alone (the fuzz harness).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <structmember.h>

#include <limits.h>
#include <stdarg.h>
#include <time.h>

#define RT_API static
#include "pool.c"
#include "crc32c.c"
#include "scan.c"
#include "table.c"
#include "decode.c"
#include "inspect.c"
#include "encode.c"
#include "arrow.c"
#include "jpeg.c"

/* ------------------------------------------------------------------------------------------ */
/* Buffers: memory the cores allocated, owned by a Python object from here on                 */

typedef struct {
    PyObject_HEAD
    uint8_t *data;
    Py_ssize_t size;
    size_t cap;
} NativeBuffer;

static void nb_dealloc(NativeBuffer *self) {
    rt_pool_free(self->data, self->cap);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int nb_getbuffer(NativeBuffer *self, Py_buffer *view, int flags) {
    static uint8_t empty;
    return PyBuffer_FillInfo(view, (PyObject *)self, self->data ? self->data : &empty, self->size, 1, flags);
}

static Py_ssize_t nb_len(NativeBuffer *self) { return self->size; }

static PyBufferProcs nb_as_buffer = {(getbufferproc)nb_getbuffer, NULL};
static PySequenceMethods nb_as_seq = {.sq_length = (lenfunc)nb_len};

static PyTypeObject NativeBufferType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ray_tfrecord._src.core._native.Buffer",
    .tp_basicsize = sizeof(NativeBuffer),
    .tp_dealloc = (destructor)nb_dealloc,
    .tp_as_buffer = &nb_as_buffer,
    .tp_as_sequence = &nb_as_seq,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Read-only memory owned by the native codec (supports the buffer protocol).",
};

/* Takes ownership of b's memory; b is left empty. */
static PyObject *buf_to_py(Buf *b) {
    NativeBuffer *o = PyObject_New(NativeBuffer, &NativeBufferType);
    if (!o) return NULL;
    o->data = b->p;
    o->size = (Py_ssize_t)b->len;
    o->cap = b->cap;
    b->p = NULL;
    b->len = b->cap = 0;
    return (PyObject *)o;
}

/* ------------------------------------------------------------------------------------------ */
/* Named results                                                                               */

static PyStructSequence_Field scan_fields[] = {
    {"positions", "offset of each record's header in the buffer (int64 buffer)"},
    {"lengths", "each record's payload length (int64 buffer)"},
    {"consumed", "bytes scanned: the next scan starts here"},
    {"errors", "the first framing defects found (FrameError)"},
    {"error_count", "all framing defects found, including those not listed"},
    {"need", "bytes the next scan needs from `consumed` on to make progress (0: none)"},
    {"resyncing", "whether the next scan must first search for a record boundary"},
    {NULL, NULL}};
static PyStructSequence_Field frame_error_fields[] = {
    {"status", "what is wrong (a Status)"},
    {"offset", "where the record's header starts in the buffer"},
    {"length", "what the length field claims (TRUNCATED_DATA, BAD_DATA_CRC)"},
    {"available", "the bytes left after the header (TRUNCATED_HEADER: the bytes left)"},
    {NULL, NULL}};
static PyStructSequence_Field inspected_fields[] = {
    {"name", "the feature's name"},
    {"section", "the map it lives in (a Section)"},
    {"kind", "its kind (a Kind; NONE if no record set one)"},
    {"present", "records that hold it"},
    {"min_count", "fewest values (steps, for a feature_list) in a record that holds it"},
    {"max_count", "most values (steps, for a feature_list) in a record that holds it"},
    {"kind_record", "the record that gave it its kind, -1 if none"},
    {NULL, NULL}};
static PyStructSequence_Field encoded_fields[] = {
    {"data", "framed records"},
    {"offsets", "where each record starts in data (int64 buffer)"},
    {NULL, NULL}};
static PyStructSequence_Field byte_array_fields[] = {
    {"offsets", "int32 offsets of each payload in data"},
    {"data", "the records' payloads, end to end"},
    {NULL, NULL}};

static PyStructSequence_Desc scan_desc = {"ray_tfrecord._src.core._native.ScanResult", "What scan() found.", scan_fields, 7};
static PyStructSequence_Desc frame_error_desc = {"ray_tfrecord._src.core._native.FrameError", "A framing defect.",
                                                 frame_error_fields, 4};
static PyStructSequence_Desc inspected_desc = {"ray_tfrecord._src.core._native.InspectedColumn",
                                               "One feature's statistics, from inspect().", inspected_fields, 7};
static PyStructSequence_Desc encoded_desc = {"ray_tfrecord._src.core._native.Encoded", "What encode() wrote.", encoded_fields, 2};
static PyStructSequence_Desc byte_array_desc = {"ray_tfrecord._src.core._native.ByteArray",
                                                "Records' payloads as one binary column.", byte_array_fields, 2};

static PyTypeObject *ScanResultType, *FrameErrorType, *InspectedColumnType, *EncodedType,
    *ByteArrayType;

/* A struct sequence of type from Py_BuildValue's fmt (a tuple format; N steals as usual). */
static PyObject *new_struct(PyTypeObject *type, const char *fmt, ...) {
    va_list va;
    va_start(va, fmt);
    PyObject *t = Py_VaBuildValue(fmt, va);
    va_end(va);
    if (!t) return NULL;
    PyObject *s = PyStructSequence_New(type);
    if (s)
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(t); i++)
            PyStructSequence_SET_ITEM(s, i, Py_NewRef(PyTuple_GET_ITEM(t, i)));
    Py_DECREF(t);
    return s;
}

/* ------------------------------------------------------------------------------------------ */
/* Errors                                                                                      */

static PyObject *CodecError;

/* Raises CodecError(message) with the core's error as attributes; column: the column's name;
 * message: the status's own when NULL. */
static void raise_codec_error(const rt_error *e, PyObject *column, PyObject *message) {
    PyObject *exc = message ? PyObject_CallOneArg(CodecError, message)
                            : PyObject_CallFunction(CodecError, "s", rt_status_message(e->status));
    if (!exc) return;
    struct {
        const char *name;
        PyObject *value;
    } attrs[] = {
        {"status", PyLong_FromLong(e->status)},
        {"record", PyLong_FromLongLong(e->record)},
        {"column", Py_NewRef(column ? column : Py_None)},
        {"offset", PyLong_FromLongLong(e->offset)},
        {"actual", PyLong_FromLongLong(e->actual)},
        {"expected", PyLong_FromLongLong(e->expected)},
        {"other_record", PyLong_FromLongLong(e->other_record)},
        {"index", PyLong_FromLongLong(e->index)},
    };
    int ok = 1;
    for (size_t i = 0; i < sizeof(attrs) / sizeof(attrs[0]); i++) {
        ok = ok && attrs[i].value && PyObject_SetAttrString(exc, attrs[i].name, attrs[i].value) == 0;
        Py_XDECREF(attrs[i].value);
    }
    if (ok) PyErr_SetObject(CodecError, exc);
    Py_DECREF(exc);
}

/* The exception for a status that is not about a record (no CodecError): MemoryError for
 * OUT_OF_MEMORY, ValueError for the caller's inconsistent arguments, RuntimeError for a codec bug. */
static PyObject *raise_status(rt_status s) {
    if (s == RT_OUT_OF_MEMORY) return PyErr_NoMemory();
    PyErr_SetString(s == RT_SIZE_MISMATCH ? PyExc_RuntimeError : PyExc_ValueError, rt_status_message(s));
    return NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* Arguments                                                                                   */

/* The common arguments of decode/inspect/byte_array: buffer, positions, lengths, and the records
 * the core reads from their views. */
typedef struct {
    Py_buffer buf, pos, lens;
    rt_records rs;
} Spans;

static int spans_get(PyObject *b, PyObject *p, PyObject *l, Spans *s) {
    memset(s, 0, sizeof(*s));
    if (PyObject_GetBuffer(b, &s->buf, PyBUF_SIMPLE) < 0) return -1;
    if (PyObject_GetBuffer(p, &s->pos, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&s->buf);
        return -1;
    }
    if (PyObject_GetBuffer(l, &s->lens, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&s->buf);
        PyBuffer_Release(&s->pos);
        return -1;
    }
    if (s->pos.len != s->lens.len || s->pos.len % 8) {
        PyBuffer_Release(&s->buf);
        PyBuffer_Release(&s->pos);
        PyBuffer_Release(&s->lens);
        PyErr_SetString(PyExc_ValueError, "positions and lengths must be int64 arrays of equal length");
        return -1;
    }
    s->rs = (rt_records){s->buf.buf, (size_t)s->buf.len, s->pos.buf, s->lens.buf, s->pos.len / 8};
    return 0;
}

static void spans_release(Spans *s) {
    PyBuffer_Release(&s->buf);
    PyBuffer_Release(&s->pos);
    PyBuffer_Release(&s->lens);
}

/* Specs are read by field name, so any object with those attributes (the NamedTuples of
 * ray_tfrecord._src.core._contract) will do. */
static int attr_ll(PyObject *o, const char *name, long long *out) {
    PyObject *v = PyObject_GetAttrString(o, name);
    if (!v) return -1;
    *out = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

static int attr_int(PyObject *o, const char *name, int *out) {
    long long v;
    if (attr_ll(o, name, &v)) return -1;
    if (v < INT_MIN || v > INT_MAX) {
        PyErr_Format(PyExc_OverflowError, "%s out of range", name);
        return -1;
    }
    *out = (int)v;
    return 0;
}

/* A new reference to the spec's name, which must be bytes. */
static PyObject *attr_name(PyObject *o) {
    PyObject *v = PyObject_GetAttrString(o, "name");
    if (v && !PyBytes_Check(v)) {
        PyErr_Format(PyExc_TypeError, "column name must be bytes, not %.100s", Py_TYPE(v)->tp_name);
        Py_CLEAR(v);
    }
    return v;
}

/* ------------------------------------------------------------------------------------------ */
/* scan, masked_crc32c                                                                         */

static PyObject *py_scan(PyObject *Py_UNUSED(self), PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"buffer", "verify", "final", "skip", "limit", "resync", NULL};
    Py_buffer view;
    rt_scan s = {.verify = 1, .final = 1};
    rt_status st;
    long long limit = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "y*|pppLp", kwlist, &view, &s.verify, &s.final, &s.skip, &limit,
                                     &s.resync))
        return NULL;
    s.limit = limit < 0 ? (size_t)view.len : (size_t)limit;

    Py_BEGIN_ALLOW_THREADS
    st = rt_scan_run(&s, view.buf, (size_t)view.len);
    Py_END_ALLOW_THREADS

    PyBuffer_Release(&view);
    PyObject *errlist = st == RT_OK ? PyList_New(s.nerr) : NULL;
    for (int i = 0; errlist && i < s.nerr; i++) {
        const rt_frame_error *e = &s.errs[i];
        PyObject *t = new_struct(FrameErrorType, "(iLLL)", (int)e->status, (long long)e->offset, (long long)e->length,
                                 (long long)e->available);
        if (!t) Py_CLEAR(errlist);
        else PyList_SET_ITEM(errlist, i, t);
    }
    if (!errlist) {
        buf_free(&s.pos);
        buf_free(&s.lens);
        return st == RT_OK ? NULL : raise_status(st);
    }
    PyObject *result = new_struct(ScanResultType, "(NNnNLnO)", buf_to_py(&s.pos), buf_to_py(&s.lens),
                                  (Py_ssize_t)s.consumed, errlist, (long long)s.nerr_total,
                                  (Py_ssize_t)(s.need > (size_t)PY_SSIZE_T_MAX ? PY_SSIZE_T_MAX : s.need),
                                  s.resyncing ? Py_True : Py_False);
    buf_free(&s.pos); /* still set only if buf_to_py failed */
    buf_free(&s.lens);
    return result;
}

static PyObject *py_masked_crc32c(PyObject *Py_UNUSED(self), PyObject *arg) {
    Py_buffer v;
    if (PyObject_GetBuffer(arg, &v, PyBUF_SIMPLE) < 0) return NULL;
    uint32_t c;
    Py_BEGIN_ALLOW_THREADS
    c = masked_crc(v.buf, (size_t)v.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&v);
    return PyLong_FromUnsignedLong(c);
}

/* ------------------------------------------------------------------------------------------ */
/* decode, inspect, byte_array                                                                 */

/* After a reader's failure: MemoryError, or the located CodecError naming the column (names:
 * the columns' names, NULL when the reader has no columns). */
static void raise_record_error(const rt_error *e, const rt_table *names) {
    if (e->status == RT_OUT_OF_MEMORY) {
        PyErr_NoMemory();
        return;
    }
    const rt_key *k = names && e->col >= 0 ? &names->keys[e->col] : NULL;
    PyObject *name = k ? PyBytes_FromStringAndSize((const char *)k->name, (Py_ssize_t)k->len) : NULL;
    if (!k || name) raise_codec_error(e, name, NULL);
    Py_XDECREF(name);
}

/* A decode's result: the chunk's record batch as an Arrow C data interface array and schema,
 * handed to pyarrow (once) through the PyCapsule protocol's __arrow_c_array__. */
typedef struct {
    PyObject_HEAD
    struct ArrowArray array;
    struct ArrowSchema schema;
    int null_column;
} BatchObject;

static void batch_dealloc(BatchObject *self) {
    if (self->array.release) self->array.release(&self->array);
    if (self->schema.release) self->schema.release(&self->schema);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static void array_capsule_free(PyObject *capsule) {
    struct ArrowArray *a = PyCapsule_GetPointer(capsule, "arrow_array");
    if (a && a->release) a->release(a);
    PyMem_Free(a);
}

static void schema_capsule_free(PyObject *capsule) {
    struct ArrowSchema *s = PyCapsule_GetPointer(capsule, "arrow_schema");
    if (s && s->release) s->release(s);
    PyMem_Free(s);
}

/* The (schema, array) capsules, moving the batch into them: a batch is imported once. The
 * requested schema is ignored, as the protocol allows: the codec casts what it must itself. */
static PyObject *batch_arrow_c_array(BatchObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"requested_schema", NULL};
    PyObject *requested = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|O", kwlist, &requested)) return NULL;
    if (!self->array.release) {
        PyErr_SetString(PyExc_ValueError, "the batch was already imported");
        return NULL;
    }
    struct ArrowArray *a = PyMem_Malloc(sizeof(*a));
    struct ArrowSchema *sc = PyMem_Malloc(sizeof(*sc));
    PyObject *ac = a ? PyCapsule_New(a, "arrow_array", array_capsule_free) : NULL;
    PyObject *scc = sc && ac ? PyCapsule_New(sc, "arrow_schema", schema_capsule_free) : NULL;
    if (!scc) {
        if (ac) {
            a->release = NULL; /* the capsule frees a, and the batch still owns its contents */
            Py_DECREF(ac);
        } else {
            PyMem_Free(a);
        }
        PyMem_Free(sc);
        return PyErr_NoMemory();
    }
    *a = self->array;
    *sc = self->schema;
    self->array.release = NULL;
    self->schema.release = NULL;
    return Py_BuildValue("(NN)", scc, ac);
}

static PyMethodDef batch_methods[] = {
    {"__arrow_c_array__", (PyCFunction)(void (*)(void))batch_arrow_c_array, METH_VARARGS | METH_KEYWORDS,
     "__arrow_c_array__(requested_schema=None) -> (schema capsule, array capsule); once per batch"},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef batch_members[] = {
    {"null_column", T_INT, offsetof(BatchObject, null_column), READONLY,
     "the first column declared not nullable that holds a null row, -1 if none"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject BatchType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ray_tfrecord._src.core._native.Batch",
    .tp_basicsize = sizeof(BatchObject),
    .tp_dealloc = (destructor)batch_dealloc,
    .tp_methods = batch_methods,
    .tp_members = batch_members,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A decoded chunk as an Arrow struct array (pa.record_batch(batch) imports it, once).",
};

/* A decoder for one schema: the columns' specs and the name table, built once and then only read,
 * so several threads may decode with it at once. */
typedef struct {
    PyObject_HEAD
    Cols tmpl;
    PyObject *names; /* the columns' names (bytes), which tmpl's table borrows */
    uint8_t *not_null;
    int rtype;
    unsigned long long nogil_ns;
} DecoderObject;

static void decoder_dealloc(DecoderObject *self) {
    rt_decode_free(&self->tmpl);
    Py_XDECREF(self->names);
    PyMem_Free(self->not_null);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* A spec's tensor fields (tensor_dtype: a DT_* code, 0 for none; tensor_shape: a sequence of ints;
 * tensor_widen), applied to column ci: -1 with a Python error, else 0 with *st the core's status. */
static int decoder_tensor_spec(PyObject *col, Cols *cs, int ci, rt_status *st) {
    int dtype, widen;
    if (attr_int(col, "tensor_dtype", &dtype) || attr_int(col, "tensor_widen", &widen)) return -1;
    if (!dtype) return 0;
    PyObject *shape = PyObject_GetAttrString(col, "tensor_shape");
    PyObject *seq = shape ? PySequence_Fast(shape, "tensor_shape must be a sequence") : NULL;
    Py_XDECREF(shape);
    if (!seq) return -1;
    int64_t dims[RT_TENSOR_MAX_RANK];
    Py_ssize_t rank = PySequence_Fast_GET_SIZE(seq);
    for (Py_ssize_t k = 0; k < rank && k < RT_TENSOR_MAX_RANK; k++) {
        dims[k] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, k));
        if (dims[k] == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            return -1;
        }
    }
    Py_DECREF(seq);
    *st = rank > RT_TENSOR_MAX_RANK ? RT_BAD_SPEC : rt_decode_set_tensor(cs, ci, dtype, (int)rank, dims, widen);
    return 0;
}

static PyObject *decoder_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"columns", "record_type", NULL};
    PyObject *spec;
    int rtype;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Oi", kwlist, &spec, &rtype)) return NULL;
    if (rtype != R_EXAMPLE && rtype != R_SEQUENCE_EXAMPLE) {
        PyErr_SetString(PyExc_ValueError, "a Decoder decodes Example or SequenceExample records");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(spec, "columns must be a sequence");
    if (!seq) return NULL;
    DecoderObject *self = (DecoderObject *)type->tp_alloc(type, 0);
    Py_ssize_t ncols = PySequence_Fast_GET_SIZE(seq);
    if (!self) goto fail;
    self->rtype = rtype;
    rt_status st = rt_decode_init(&self->tmpl, ncols > INT_MAX ? INT_MAX : (int)ncols);
    if (st != RT_OK || ncols > INT_MAX) {
        raise_status(st != RT_OK ? st : RT_BAD_SPEC);
        goto fail;
    }
    if (!(self->names = PyList_New(ncols)) || !(self->not_null = PyMem_Calloc((size_t)(ncols ? ncols : 1), 1))) {
        if (self->names) PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t i = 0; i < ncols; i++) {
        PyObject *col = PySequence_Fast_GET_ITEM(seq, i), *name = attr_name(col);
        int kind, shape, section, nullable;
        long long fixed_n;
        if (!name) goto fail;
        PyList_SET_ITEM(self->names, i, name);
        if (attr_int(col, "kind", &kind) || attr_int(col, "shape", &shape) || attr_ll(col, "fixed_size", &fixed_n) ||
            attr_int(col, "section", &section) || attr_int(col, "nullable", &nullable))
            goto fail;
        self->not_null[i] = !nullable;
        st = rt_decode_add_column(&self->tmpl, (const uint8_t *)PyBytes_AS_STRING(name), (size_t)PyBytes_GET_SIZE(name),
                                  kind, shape, fixed_n, section);
        if (st == RT_OK && decoder_tensor_spec(col, &self->tmpl, (int)i, &st)) goto fail;
        if (st != RT_OK) {
            raise_status(st);
            goto fail;
        }
    }
    Py_DECREF(seq);
    return (PyObject *)self;
fail:
    Py_XDECREF(self);
    Py_DECREF(seq);
    return NULL;
}

static unsigned long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (unsigned long long)t.tv_sec * 1000000000ull + (unsigned long long)t.tv_nsec;
}

/* Decoding and assembling the batch both run without the GIL: what is left with it is argument
 * parsing and one import into pyarrow, whatever the number of columns. */
static PyObject *decoder_decode(DecoderObject *self, PyObject *args) {
    PyObject *b, *p, *l;
    if (!PyArg_ParseTuple(args, "OOO", &b, &p, &l)) return NULL;
    Spans s;
    if (spans_get(b, p, l, &s)) return NULL;
    BatchObject *batch = PyObject_New(BatchObject, &BatchType);
    if (!batch) {
        spans_release(&s);
        return NULL;
    }
    batch->array.release = NULL;
    batch->schema.release = NULL;
    batch->null_column = -1;
    Cols cs;
    rt_error err = RT_ERROR_INIT; /* set by the decode alone: the batch's assembly fails only for memory */
    rt_status st;
    unsigned long long t0 = now_ns();
    Py_BEGIN_ALLOW_THREADS
    st = rt_decode_start(&cs, &self->tmpl);
    if (st == RT_OK) st = rt_decode_records(&cs, self->rtype, &s.rs, &err);
    for (int i = 0; st == RT_OK && i < cs.ncols && batch->null_column < 0; i++)
        if (self->not_null[i] && cs.cols[i].nulls) batch->null_column = i;
    if (st == RT_OK) st = rt_arrow_schema(&cs, self->not_null, &batch->schema);
    if (st == RT_OK) st = rt_arrow_export(&cs, &batch->array);
    rt_decode_free(&cs);
    Py_END_ALLOW_THREADS
    self->nogil_ns += now_ns() - t0;
    spans_release(&s);
    if (st != RT_OK) {
        if (err.status != RT_OK) raise_record_error(&err, &self->tmpl.names);
        else raise_status(st);
        Py_DECREF(batch);
        return NULL;
    }
    return (PyObject *)batch;
}

static PyMethodDef decoder_methods[] = {
    {"decode", (PyCFunction)decoder_decode, METH_VARARGS,
     "decode(buffer, positions, lengths) -> Batch: the records at positions (payload lengths) in buffer"},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef decoder_members[] = {
    {"nogil_ns", T_ULONGLONG, offsetof(DecoderObject, nogil_ns), READONLY,
     "nanoseconds all decode calls together spent without the GIL"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject DecoderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ray_tfrecord._src.core._native.Decoder",
    .tp_basicsize = sizeof(DecoderObject),
    .tp_dealloc = (destructor)decoder_dealloc,
    .tp_new = decoder_new,
    .tp_methods = decoder_methods,
    .tp_members = decoder_members,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Decoder(columns, record_type): columns are objects with name, kind, shape, fixed_size, section,\n"
              "tensor_dtype, tensor_shape, tensor_widen, "
              "nullable (a DecodeSpec); record_type an Example or SequenceExample code.",
};

static PyObject *py_pool_held(PyObject *Py_UNUSED(self), PyObject *Py_UNUSED(args)) {
    return PyLong_FromSize_t(rt_pool_held());
}

static PyObject *py_inspect(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *b, *p, *l;
    int rtype;
    if (!PyArg_ParseTuple(args, "OOOi", &b, &p, &l, &rtype)) return NULL;
    Spans s;
    if (spans_get(b, p, l, &s)) return NULL;
    Stats st = {0};
    rt_error err = RT_ERROR_INIT;
    rt_status status;
    Py_BEGIN_ALLOW_THREADS
    status = rt_inspect_records(&st, rtype, &s.rs, &err);
    Py_END_ALLOW_THREADS
    PyObject *result = NULL;
    if (status != RT_OK) {
        raise_record_error(&err, &st.names);
        goto done;
    }
    result = PyList_New(st.ncols);
    for (int i = 0; result && i < st.ncols; i++) {
        const Stat *c = &st.cols[i];
        const rt_key *k = &st.names.keys[i];
        PyObject *t = new_struct(InspectedColumnType, "(y#iiLLLL)", (const char *)k->name, (Py_ssize_t)k->len,
                                 c->section, c->kind, (long long)c->present, (long long)c->min_count,
                                 (long long)c->max_count, (long long)c->kind_record);
        if (!t) Py_CLEAR(result);
        else PyList_SET_ITEM(result, i, t);
    }
done:
    rt_inspect_free(&st);
    spans_release(&s);
    return result;
}

static PyObject *py_byte_array(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *b, *p, *l;
    if (!PyArg_ParseTuple(args, "OOO", &b, &p, &l)) return NULL;
    Spans s;
    if (spans_get(b, p, l, &s)) return NULL;
    Buf off = {0}, data = {0};
    rt_error err = RT_ERROR_INIT;
    rt_status st;
    Py_BEGIN_ALLOW_THREADS
    st = rt_byte_array(&s.rs, &off, &data, &err);
    Py_END_ALLOW_THREADS
    spans_release(&s);
    if (st != RT_OK) {
        buf_free(&off);
        buf_free(&data);
        raise_record_error(&err, NULL);
        return NULL;
    }
    PyObject *result = new_struct(ByteArrayType, "(NN)", buf_to_py(&off), buf_to_py(&data));
    buf_free(&off); /* still set only if buf_to_py failed */
    buf_free(&data);
    return result;
}

/* ------------------------------------------------------------------------------------------ */
/* encode                                                                                      */

/* Borrows attribute name's memory for m (None: absent), keeping the view in v for release. */
static int attr_buffer(PyObject *o, const char *name, Py_buffer *v, Mem *m, int *has) {
    *has = 0;
    PyObject *b = PyObject_GetAttrString(o, name);
    if (!b) return -1;
    int rc = 0;
    if (b != Py_None) {
        rc = PyObject_GetBuffer(b, v, PyBUF_SIMPLE);
        if (rc == 0) {
            *m = (Mem){v->buf, (size_t)v->len};
            *has = 1;
        }
    }
    Py_DECREF(b);
    return rc < 0 ? -1 : 0;
}

/* Column c from an EncodeColumn (read by attribute), its buffers' views kept in v[0..4] for
 * release and its name (a new reference) in *name. */
static int ecol_from_attrs(PyObject *col, ECol *c, Py_buffer v[5], PyObject **name) {
    long long voff;
    if (!(*name = attr_name(col))) return -1;
    c->key = (const uint8_t *)PyBytes_AS_STRING(*name);
    c->key_len = (size_t)PyBytes_GET_SIZE(*name);
    if (attr_int(col, "kind", &c->kind) || attr_int(col, "shape", &c->shape) ||
        attr_ll(col, "validity_offset", &voff) || attr_buffer(col, "validity", &v[0], &c->valid, &c->has_valid) ||
        attr_buffer(col, "row_offsets", &v[1], &c->rowoff, &c->has_rowoff) ||
        attr_buffer(col, "inner_offsets", &v[2], &c->inner, &c->has_inner) ||
        attr_buffer(col, "values", &v[3], &c->vals, &c->has_vals) ||
        attr_buffer(col, "data", &v[4], &c->data, &c->has_data))
        return -1;
    c->valid_off = voff;
    return 0;
}

/* Raises the CodecError of a column the encoder refused (status in e->status). */
static void raise_column_error(rt_error *e, PyObject *name) {
    PyObject *msg = PyUnicode_FromFormat("column %R: %s", name, rt_status_message(e->status));
    if (msg) raise_codec_error(e, name, msg);
    Py_XDECREF(msg);
}

/* The columns of one encode call: ECols, the views of the Python buffers behind them, and the
 * int64 offsets widened from an Arrow batch's. */
typedef struct {
    Py_ssize_t n;
    ECol *cols;
    Py_buffer (*views)[5]; /* valid, rowoff, inner, vals, data */
    Buf (*owned)[3];
    uint8_t *from_batch; /* whether column i is read from an Arrow batch */
} EncodeCall;

static int call_init(EncodeCall *k, Py_ssize_t n) {
    k->n = n;
    k->cols = calloc((size_t)(n ? n : 1), sizeof(ECol));
    k->views = calloc((size_t)(n ? n : 1), sizeof(*k->views));
    k->owned = calloc((size_t)(n ? n : 1), sizeof(*k->owned));
    k->from_batch = calloc((size_t)(n ? n : 1), 1);
    if (k->cols && k->views && k->owned && k->from_batch && n <= INT_MAX) return 0;
    raise_status(n > INT_MAX ? RT_BAD_SPEC : RT_OUT_OF_MEMORY);
    return -1;
}

static void call_free(EncodeCall *k) {
    for (Py_ssize_t i = 0; i < k->n && k->views; i++)
        for (int j = 0; j < 5; j++)
            if (k->views[i][j].obj) PyBuffer_Release(&k->views[i][j]);
    for (Py_ssize_t i = 0; i < k->n && k->owned; i++)
        for (int j = 0; j < 3; j++) buf_free(&k->owned[i][j]);
    free(k->cols);
    free(k->views);
    free(k->owned);
    free(k->from_batch);
}

/* Encodes the prepared columns (GIL released): an Encoded, or NULL with the error raised. */
static PyObject *encode_columns(EncodeCall *k, int rtype, long long nrows, PyObject *names) {
    Buf out = {0}, offs = {0};
    rt_error e = RT_ERROR_INIT;
    rt_status st;
    Py_BEGIN_ALLOW_THREADS
    st = rt_encode(k->cols, (int)k->n, rtype, nrows, &out, &offs, &e);
    Py_END_ALLOW_THREADS
    PyObject *result = NULL;
    if (st != RT_OK && e.col >= 0) {
        raise_column_error(&e, PyList_GET_ITEM(names, e.col));
    } else if (st != RT_OK) {
        raise_status(st);
    } else {
        result = new_struct(EncodedType, "(NN)", buf_to_py(&out), buf_to_py(&offs));
    }
    buf_free(&out);
    buf_free(&offs);
    return result;
}

static int encode_args_ok(int rtype, long long nrows) {
    if (nrows >= 0 && rtype >= R_EXAMPLE && rtype <= R_BYTE_ARRAY) return 1;
    PyErr_SetString(PyExc_ValueError, "invalid record type or row count");
    return 0;
}

static PyObject *py_encode(PyObject *Py_UNUSED(self), PyObject *args) {
    int rtype;
    long long nrows;
    PyObject *spec;
    if (!PyArg_ParseTuple(args, "iLO", &rtype, &nrows, &spec) || !encode_args_ok(rtype, nrows)) return NULL;
    PyObject *seq = PySequence_Fast(spec, "columns must be a sequence");
    if (!seq) return NULL;
    Py_ssize_t ncols = PySequence_Fast_GET_SIZE(seq);
    EncodeCall k;
    PyObject *result = NULL, *names = PyList_New(ncols); /* names keeps the columns' names alive */
    if (call_init(&k, ncols) || !names) goto done;
    for (Py_ssize_t i = 0; i < ncols; i++) {
        PyObject *name = NULL;
        int rc = ecol_from_attrs(PySequence_Fast_GET_ITEM(seq, i), &k.cols[i], k.views[i], &name);
        if (name) PyList_SET_ITEM(names, i, name);
        if (rc) goto done;
        if (rt_encode_prepare(&k.cols[i], rtype, ncols) != RT_OK) {
            PyErr_Format(PyExc_ValueError, "invalid encode spec for column %R", name);
            goto done;
        }
    }
    result = encode_columns(&k, rtype, nrows, names);
done:
    call_free(&k);
    Py_XDECREF(names);
    Py_DECREF(seq);
    return result;
}

/* An encoder for one schema: each column's name, kind and shape, read once. */
typedef struct {
    int kind, shape;
    int64_t fixed_n;
} ESpec;

typedef struct {
    PyObject_HEAD
    PyObject *names; /* bytes, one a column */
    ESpec *specs;
    int rtype;
} EncoderObject;

static void encoder_dealloc(EncoderObject *self) {
    Py_XDECREF(self->names);
    PyMem_Free(self->specs);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *encoder_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"columns", "record_type", NULL};
    PyObject *spec;
    int rtype;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Oi", kwlist, &spec, &rtype) || !encode_args_ok(rtype, 0)) return NULL;
    PyObject *seq = PySequence_Fast(spec, "columns must be a sequence");
    if (!seq) return NULL;
    Py_ssize_t ncols = PySequence_Fast_GET_SIZE(seq);
    EncoderObject *self = (EncoderObject *)type->tp_alloc(type, 0);
    if (!self) goto fail;
    self->rtype = rtype;
    if (!(self->names = PyList_New(ncols))) goto fail;
    if (!(self->specs = PyMem_Calloc((size_t)(ncols ? ncols : 1), sizeof(ESpec)))) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t i = 0; i < ncols; i++) {
        PyObject *col = PySequence_Fast_GET_ITEM(seq, i), *name = attr_name(col);
        ESpec *e = &self->specs[i];
        long long fixed_n;
        if (!name) goto fail;
        PyList_SET_ITEM(self->names, i, name);
        if (attr_int(col, "kind", &e->kind) || attr_int(col, "shape", &e->shape) ||
            attr_ll(col, "fixed_size", &fixed_n))
            goto fail;
        e->fixed_n = fixed_n;
        if (e->kind < K_BYTES || e->kind > K_NULL || e->shape < S_SCALAR || e->shape > S_SEQUENCE || fixed_n < 0) {
            raise_status(RT_BAD_SPEC);
            goto fail;
        }
    }
    Py_DECREF(seq);
    return (PyObject *)self;
fail:
    Py_XDECREF(self);
    Py_DECREF(seq);
    return NULL;
}

/* The exported batch's struct array and schema, from the (schema, array) capsules of t. */
static int batch_import(PyObject *t, Py_ssize_t ncols, long long nrows, struct ArrowSchema **s, struct ArrowArray **a) {
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 2) {
        PyErr_SetString(PyExc_TypeError, "__arrow_c_array__ must return (schema capsule, array capsule)");
        return -1;
    }
    *s = PyCapsule_GetPointer(PyTuple_GET_ITEM(t, 0), "arrow_schema");
    *a = *s ? PyCapsule_GetPointer(PyTuple_GET_ITEM(t, 1), "arrow_array") : NULL;
    if (!*a) return -1;
    if (!(*s)->release || !(*a)->release) {
        PyErr_SetString(PyExc_ValueError, "the batch's Arrow export was already released (moved or consumed)");
        return -1;
    }
    if (strcmp((*s)->format, "+s") || (*s)->n_children != ncols || (*a)->n_children != ncols || (*a)->length < nrows) {
        PyErr_SetString(PyExc_ValueError, "the batch does not have the encoder's columns");
        return -1;
    }
    /* The columns are read from row 0 of each child and every row is written: a struct's own
     * offset or null rows would be ignored, which a record batch never has (null_count may be -1,
     * unknown: without a bitmap there are still no nulls). */
    if ((*a)->offset != 0 || ((*a)->null_count != 0 && (*a)->n_buffers > 0 && (*a)->buffers[0])) {
        PyErr_Format(PyExc_ValueError,
                     "the batch's Arrow struct array has offset %lld and null count %lld; the encoder reads "
                     "record batches (offset 0, no null rows)",
                     (long long)(*a)->offset, (long long)(*a)->null_count);
        return -1;
    }
    return 0;
}

/* Columns are read from batch (its Arrow C data interface export) but those that converted
 * gives as an EncodeColumn (None: read from the batch). Reading and encoding run without the GIL. */
static PyObject *encoder_encode(EncoderObject *self, PyObject *args) {
    PyObject *batch, *conv;
    long long nrows;
    if (!PyArg_ParseTuple(args, "OLO", &batch, &nrows, &conv) || !encode_args_ok(self->rtype, nrows)) return NULL;
    PyObject *seq = PySequence_Fast(conv, "converted must be a sequence");
    if (!seq) return NULL;
    Py_ssize_t ncols = PyList_GET_SIZE(self->names);
    PyObject *result = NULL, *exported = NULL;
    struct ArrowSchema *sch = NULL;
    struct ArrowArray *arr = NULL;
    EncodeCall k;
    if (call_init(&k, ncols)) goto done;
    if (PySequence_Fast_GET_SIZE(seq) != ncols) {
        PyErr_SetString(PyExc_ValueError, "converted must hold one entry a column");
        goto done;
    }
    int native = 0;
    for (Py_ssize_t i = 0; i < ncols; i++) {
        PyObject *col = PySequence_Fast_GET_ITEM(seq, i), *name = NULL;
        if (col == Py_None) {
            native = k.from_batch[i] = 1;
            continue;
        }
        int rc = ecol_from_attrs(col, &k.cols[i], k.views[i], &name);
        Py_XDECREF(name); /* self->names holds the column's name; the converted one must match it */
        if (rc) goto done;
        if (rt_encode_prepare(&k.cols[i], self->rtype, ncols) != RT_OK) {
            PyErr_Format(PyExc_ValueError, "invalid encode spec for column %R", PyList_GET_ITEM(self->names, i));
            goto done;
        }
    }
    if (native && (!(exported = PyObject_CallMethod(batch, "__arrow_c_array__", NULL)) ||
                   batch_import(exported, ncols, nrows, &sch, &arr)))
        goto done;
    rt_status st = RT_OK;
    rt_error e = RT_ERROR_INIT;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < ncols && st == RT_OK; i++) {
        ECol *c = &k.cols[i];
        if (!k.from_batch[i]) continue;
        const ESpec *sp = &self->specs[i];
        st = rt_arrow_ecol(arr->children[i], sch->children[i], nrows, sp->kind, sp->shape, sp->fixed_n, c, k.owned[i], &e);
        if (st == RT_OK) st = rt_encode_prepare(c, self->rtype, ncols);
        e.col = (int)i;
    }
    Py_END_ALLOW_THREADS
    if (st == RT_NULL_INNER_LIST || st == RT_NULL_LIST_ELEMENT) {
        raise_column_error(&e, PyList_GET_ITEM(self->names, e.col));
        goto done;
    }
    if (st == RT_BAD_SPEC && e.col >= 0) {
        PyObject *name = PyList_GET_ITEM(self->names, e.col),
                 *text = PyUnicode_DecodeUTF8(PyBytes_AS_STRING(name), PyBytes_GET_SIZE(name), "replace");
        if (text)
            PyErr_Format(PyExc_ValueError, "column %R: %s: its Arrow array does not have the layout of the "
                         "encoder's type for it", text, rt_status_message(st));
        Py_XDECREF(text);
        goto done;
    }
    if (st != RT_OK) {
        raise_status(st);
        goto done;
    }
    for (Py_ssize_t i = 0; i < ncols; i++) {
        PyObject *name = PyList_GET_ITEM(self->names, i);
        k.cols[i].key = (const uint8_t *)PyBytes_AS_STRING(name);
        k.cols[i].key_len = (size_t)PyBytes_GET_SIZE(name);
    }
    result = encode_columns(&k, self->rtype, nrows, self->names);
done:
    call_free(&k);
    Py_XDECREF(exported);
    Py_DECREF(seq);
    return result;
}

static PyMethodDef encoder_methods[] = {
    {"encode", (PyCFunction)encoder_encode, METH_VARARGS,
     "encode(batch, nrows, converted) -> Encoded: nrows rows of batch (an object with __arrow_c_array__),\n"
     "column i read from the batch where converted[i] is None, else from converted[i] (an EncodeColumn)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject EncoderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ray_tfrecord._src.core._native.Encoder",
    .tp_basicsize = sizeof(EncoderObject),
    .tp_dealloc = (destructor)encoder_dealloc,
    .tp_new = encoder_new,
    .tp_methods = encoder_methods,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Encoder(columns, record_type): columns are objects with name, kind, shape, fixed_size\n"
              "(an EncodeSpec, shapes as decode's); record_type a record type code.",
};

/* ------------------------------------------------------------------------------------------ */
/* The module: functions, result types, and the constants Python mirrors as IntEnums          */

/* ------------------------------------------------------------------------------------------ */
/* Serialized tensors (tensor.h): what one declares, for inspect's hint                         */

/* The scratch row a described tensor's values are parsed into: larger ones are left unchecked. */
#define TENSOR_DESCRIBE_MAX_BYTES ((size_t)64 << 20)

static PyObject *py_tensor_describe(PyObject *Py_UNUSED(self), PyObject *arg) {
    Py_buffer data;
    if (PyObject_GetBuffer(arg, &data, PyBUF_SIMPLE) < 0) return NULL;
    rt_error err = {.status = RT_OK, .record = 0, .col = 0, .offset = -1};
    Ctx c = {.rec = data.buf, .record = 0, .err = &err};
    rt_tensor t;
    int64_t n = 0;
    const uint8_t *p = data.buf, *end = p + data.len;
    int ok = 0;
    Py_BEGIN_ALLOW_THREADS
    if (tensor_describe(&c, &t, &n, p, end, 0) == 0 && (size_t)n * (size_t)t.esize <= TENSOR_DESCRIBE_MAX_BYTES) {
        uint8_t *row = malloc((size_t)n * (size_t)t.esize + 1);
        ok = row && tensor_parse(&c, &t, n, p, end, row, 0) == 0 ? 1 : row ? 0 : -1;
        free(row);
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    if (ok < 0) return PyErr_NoMemory();
    if (!ok) Py_RETURN_NONE;
    PyObject *shape = PyTuple_New(t.rank);
    for (int i = 0; shape && i < t.rank; i++) {
        PyObject *d = PyLong_FromLongLong(t.dims[i]);
        if (!d) Py_CLEAR(shape);
        else PyTuple_SET_ITEM(shape, i, d);
    }
    if (!shape) return NULL;
    return Py_BuildValue("(iN)", t.dtype, shape);
}

/* ------------------------------------------------------------------------------------------ */
/* JPEG window decode (jpeg.c), where the build found libjpeg-turbo                            */

#ifdef RT_HAVE_JPEG
static PyObject *py_jpeg_window(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer data, out;
    int denom, channels, y, x, h, w;
    if (!PyArg_ParseTuple(args, "y*iiiiiiw*", &data, &denom, &channels, &y, &x, &h, &w, &out)) return NULL;
    char message[RT_JPEG_MESSAGE];
    rt_status s;
    if (!PyBuffer_IsContiguous(&out, 'C')) {
        s = RT_JPEG_BAD_WINDOW;
        message[0] = 0;
    } else {
        Py_BEGIN_ALLOW_THREADS
        s = rt_jpeg_decode_window(data.buf, (size_t)data.len, denom, channels, y, x, h, w, out.buf, (size_t)out.len,
                                  message);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&data);
    PyBuffer_Release(&out);
    if (s == RT_OUT_OF_MEMORY) return PyErr_NoMemory();
    return Py_BuildValue("(is)", (int)s, message[0] ? message : rt_status_message(s));
}
#endif

static PyMethodDef methods[] = {
    {"scan", (PyCFunction)(void (*)(void))py_scan, METH_VARARGS | METH_KEYWORDS,
     "scan(buffer, verify=True, final=True, skip=False, limit=-1, resync=False) -> ScanResult"},
    {"masked_crc32c", py_masked_crc32c, METH_O, "masked_crc32c(data) -> int"},
    {"pool_held", py_pool_held, METH_NOARGS, "pool_held() -> int: bytes of recycled buffers kept for reuse"},
    {"inspect", py_inspect, METH_VARARGS, "inspect(buffer, positions, lengths, record_type) -> list[InspectedColumn]"},
    {"byte_array", py_byte_array, METH_VARARGS, "byte_array(buffer, positions, lengths) -> ByteArray"},
    {"tensor_describe", py_tensor_describe, METH_O,
     "tensor_describe(data) -> (dtype, shape) | None: a serialized tensor's DT_* code and shape, where its values\n"
     "parse as that (None: not a serialized tensor of a dtype a tensor column reads, or over 64 MiB, unchecked)"},
#ifdef RT_HAVE_JPEG
    {"jpeg_window", py_jpeg_window, METH_VARARGS,
     "jpeg_window(data, denom, channels, y, x, h, w, out) -> (status, message): the window decoded into out"},
#endif
    {"encode", py_encode, METH_VARARGS,
     "encode(record_type, nrows, columns) -> Encoded\n"
     "columns: objects with name, kind, shape, validity, validity_offset, row_offsets, inner_offsets, values, data\n"
     "(an EncodeColumn); offsets are int64 arrays."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "_native", .m_doc = "Native TFRecord codec core.", .m_size = -1, .m_methods = methods};

typedef struct {
    const char *name;
    long value;
} Named;

static int add_names(PyObject *m, const char *attr, const Named *names, size_t n) {
    PyObject *d = PyDict_New();
    int rc = d ? 0 : -1;
    for (size_t i = 0; i < n && rc == 0; i++) {
        PyObject *v = PyLong_FromLong(names[i].value);
        rc = v ? PyDict_SetItemString(d, names[i].name, v) : -1;
        Py_XDECREF(v);
    }
    if (rc == 0) rc = PyModule_AddObjectRef(m, attr, d);
    Py_XDECREF(d);
    return rc;
}

static int add_constants(PyObject *m) {
    static const Named status[] = {
#define RT_STATUS_NAMED(name, message) {#name, RT_##name},
        RT_STATUS_LIST(RT_STATUS_NAMED)
#undef RT_STATUS_NAMED
    };
#define RT_CONST_NAMED(prefix, name, value) {#name, prefix##_##name},
    static const Named kinds[] = {RT_KIND_LIST(RT_CONST_NAMED)};
    static const Named shapes[] = {RT_SHAPE_LIST(RT_CONST_NAMED)};
    static const Named record_types[] = {RT_RECORD_TYPE_LIST(RT_CONST_NAMED)};
    static const Named sections[] = {RT_SECTION_LIST(RT_CONST_NAMED)};
    static const Named frame[] = {RT_FRAME_LIST(RT_CONST_NAMED)};
    static const Named tf_dtypes[] = {RT_TF_DTYPE_LIST(RT_CONST_NAMED)};
#undef RT_CONST_NAMED
#define N(a) (sizeof(a) / sizeof(a[0]))
    return add_names(m, "STATUS", status, N(status)) || add_names(m, "KINDS", kinds, N(kinds)) ||
                   add_names(m, "SHAPES", shapes, N(shapes)) ||
                   add_names(m, "RECORD_TYPES", record_types, N(record_types)) ||
                   add_names(m, "SECTIONS", sections, N(sections)) || add_names(m, "FRAME", frame, N(frame)) ||
                   add_names(m, "TF_DTYPES", tf_dtypes, N(tf_dtypes))
               ? -1
               : 0;
#undef N
}

/* {name: message} of every status, so Python can word a status it finds inside another's error. */
static int add_status_messages(PyObject *m) {
    static const char *const names[] = {
#define RT_STATUS_NAME(name, message) #name,
        RT_STATUS_LIST(RT_STATUS_NAME)
#undef RT_STATUS_NAME
    };
    PyObject *d = PyDict_New();
    int rc = d ? 0 : -1;
    for (int i = 0; i < RT_STATUS_COUNT && rc == 0; i++) {
        PyObject *v = PyUnicode_FromString(rt_status_message((rt_status)i));
        rc = v ? PyDict_SetItemString(d, names[i], v) : -1;
        Py_XDECREF(v);
    }
    if (rc == 0) rc = PyModule_AddObjectRef(m, "STATUS_MESSAGES", d);
    Py_XDECREF(d);
    return rc;
}

static int add_type(PyObject *m, PyTypeObject **type, PyStructSequence_Desc *desc) {
    *type = PyStructSequence_NewType(desc);
    if (!*type) return -1;
    const char *dot = strrchr(desc->name, '.');
    return PyModule_AddObjectRef(m, dot + 1, (PyObject *)*type);
}

PyMODINIT_FUNC PyInit__native(void) {
    rt_crc_init();
    if (PyType_Ready(&NativeBufferType) < 0 || PyType_Ready(&BatchType) < 0 || PyType_Ready(&DecoderType) < 0 ||
        PyType_Ready(&EncoderType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    CodecError = PyErr_NewException("ray_tfrecord._src.core._native.CodecError", PyExc_ValueError, NULL);
    if (!CodecError || PyModule_AddObjectRef(m, "CodecError", CodecError) < 0 ||
        PyModule_AddObjectRef(m, "Buffer", (PyObject *)&NativeBufferType) < 0 ||
        PyModule_AddObjectRef(m, "Batch", (PyObject *)&BatchType) < 0 ||
        PyModule_AddObjectRef(m, "Decoder", (PyObject *)&DecoderType) < 0 ||
        PyModule_AddObjectRef(m, "Encoder", (PyObject *)&EncoderType) < 0 ||
        add_type(m, &ScanResultType, &scan_desc) || add_type(m, &FrameErrorType, &frame_error_desc) ||
        add_type(m, &InspectedColumnType, &inspected_desc) ||
        add_type(m, &EncodedType, &encoded_desc) || add_type(m, &ByteArrayType, &byte_array_desc) ||
        add_constants(m) || add_status_messages(m) || PyModule_AddObjectRef(m, "HARDWARE_CRC", rt_crc32c_update != rt_crc32c_sw ? Py_True : Py_False) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
