/*
 * Types shared by the native codec's units. Nothing here (or in any unit but module.c) depends on
 * Python, so the fuzz harness links the units alone.
 *
 * Every length read from input is checked against the bytes that remain before it is used, and
 * nothing is allocated from an untrusted length.
 */
#ifndef RT_COMMON_H
#define RT_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "ray_tfrecord's native codec assumes a little-endian host (TFRecord and protobuf are little-endian)"
#endif

/* Helpers that one unit uses and another does not. */
#define RT_MAYBE_UNUSED __attribute__((unused))

/* The units' entry points have external linkage when each unit is compiled alone (the fuzz
 * harness links them); module.c defines RT_API as static before including them all, so the
 * extension is one translation unit whose functions the compiler may inline and lay out as it
 * would a single file's. */
#ifdef RT_API
#define RT_EXTERN RT_API
#else
#define RT_API
#define RT_EXTERN extern
#endif

/* Every way a native call can fail, with the text users see. One list, so the enum, the messages
 * and the names the module exports to Python cannot drift apart. Statuses named MALFORMED_* are
 * protobuf wire-format violations ("malformed record"). */
#define RT_STATUS_LIST(X)                                                                          \
    X(OK, "ok")                                                                                     \
    /* framing */                                                                                   \
    X(TRUNCATED_HEADER, "truncated record header")                                                  \
    X(TRUNCATED_DATA, "truncated record")                                                           \
    X(BAD_LENGTH_CRC, "corrupted record: length CRC mismatch")                                      \
    X(BAD_DATA_CRC, "corrupted record: data CRC mismatch")                                          \
    /* protobuf wire format */                                                                      \
    X(MALFORMED_TAG, "field tag varint runs past its message")                                      \
    X(MALFORMED_FIELD_NUMBER, "invalid field number")                                               \
    X(MALFORMED_VARINT, "varint runs past its message")                                             \
    X(MALFORMED_FIXED64, "fixed64 field runs past its message")                                     \
    X(MALFORMED_FIXED32, "fixed32 field runs past its message")                                     \
    X(MALFORMED_LENGTH, "length varint runs past its message")                                      \
    X(MALFORMED_OVERRUN, "length-delimited field overruns its parent message")                      \
    X(MALFORMED_WIRE_TYPE, "unsupported wire type (groups or invalid)")                             \
    X(MALFORMED_PACKED_INT64, "packed int64 varint runs past its list")                             \
    X(MALFORMED_PACKED_FLOAT, "packed float list length is not a multiple of 4")                    \
    /* a feature that does not fit its column */                                                    \
    X(KIND_MISMATCH, "feature kind differs from the column's kind")                                 \
    X(COUNT_MISMATCH, "feature holds the wrong number of values for its column")                    \
    /* a serialized tensor (tf.io.serialize_tensor's TensorProto) in a tensor column (tensor.h) */  \
    X(TENSOR_MALFORMED, "bytes_list value is not a well-formed serialized tensor (TensorProto)")    \
    X(TENSOR_DTYPE_MISMATCH, "serialized tensor's dtype differs from the column's")                 \
    X(TENSOR_SHAPE_MISMATCH, "serialized tensor's shape differs from the column's")                 \
    X(TENSOR_CONTENT_SIZE, "serialized tensor's tensor_content is not its shape's size")            \
    X(TENSOR_TOO_MANY_VALUES, "serialized tensor lists more values than its shape holds")           \
    X(TENSOR_VALUE_RANGE, "serialized tensor value outside its dtype's range")                      \
    /* a value the encoder cannot write */                                                          \
    X(NULL_INNER_LIST, "null inner list")                                                           \
    X(NULL_LIST_ELEMENT, "null list element")                                                       \
    /* limits of one call (32-bit Arrow offsets) */                                                 \
    X(BYTES_TOO_LARGE, "bytes values exceed 2 GiB in one batch")                                    \
    X(TOO_MANY_VALUES, "more than 2^31 values in one batch")                                        \
    X(RECORDS_TOO_LARGE, "records exceed 2 GiB in one batch")                                       \
    X(OUT_OF_MEMORY, "out of memory")                                                               \
    /* inconsistent arguments from the caller */                                                    \
    X(BAD_SPAN, "record span lies outside the buffer")                                              \
    X(BAD_SPEC, "invalid column spec")                                                              \
    X(VALIDITY_TOO_SHORT, "validity bitmap too short")                                              \
    X(BYTES_OFFSETS_OUT_OF_RANGE, "bytes offsets out of range")                                     \
    X(FEWER_VALUES_THAN_ROWS, "fewer values than rows")                                             \
    X(FEWER_LIST_OFFSETS_THAN_ROWS, "fewer list offsets than rows")                                 \
    X(SEQUENCE_OFFSETS_OUT_OF_RANGE, "sequence offsets out of range")                               \
    X(INNER_OFFSETS_OUT_OF_RANGE, "inner list offsets out of range")                                \
    X(NULL_LIST_HOLDS_VALUES, "null-typed list holds values")                                       \
    X(LIST_OFFSETS_OUT_OF_RANGE, "list offsets out of range")                                       \
    /* images (jpeg.c) */                                                                          \
    X(JPEG_CORRUPT, "not a decodable JPEG")                                                         \
    X(JPEG_UNSUPPORTED, "a JPEG the window decode leaves to another decoder (CMYK, YCCK, 12-bit)")  \
    X(JPEG_BAD_WINDOW, "crop window outside the image")                                             \
    /* a codec bug, reported rather than written out */                                             \
    X(SIZE_MISMATCH, "internal error: encoded size mismatch")

typedef enum {
#define RT_STATUS_ENUM(name, message) RT_##name,
    RT_STATUS_LIST(RT_STATUS_ENUM)
#undef RT_STATUS_ENUM
    RT_STATUS_COUNT
} rt_status;

static inline const char *rt_status_message(rt_status s) {
    static const char *const messages[] = {
#define RT_STATUS_MESSAGE(name, message) message,
        RT_STATUS_LIST(RT_STATUS_MESSAGE)
#undef RT_STATUS_MESSAGE
    };
    return (unsigned)s < RT_STATUS_COUNT ? messages[s] : "unknown status";
}

/* The codes Python mirrors as IntEnums, each named once: X(prefix, name, value) makes the C
 * constant prefix_name, and module.c exports {"name": value} under the list's Python name. */
/* A feature's kind (NONE: no kind set, or not seen yet); the column's leaf type. */
#define RT_KIND_LIST(X) X(K, NONE, -1) X(K, BYTES, 0) X(K, FLOAT, 1) X(K, INT64, 2) X(K, NULL, 3)
/* A column's shape: scalar, list, fixed-size list, or a SequenceExample feature_list. */
#define RT_SHAPE_LIST(X) X(S, SCALAR, 0) X(S, LIST, 1) X(S, FIXED, 2) X(S, SEQUENCE, 3)
#define RT_RECORD_TYPE_LIST(X) X(R, EXAMPLE, 0) X(R, SEQUENCE_EXAMPLE, 1) X(R, BYTE_ARRAY, 2)
/* TensorFlow's DataType codes (tensorflow/core/framework/types.proto) of the tensors a tensor
 * column reads: numbers and bool, the dtypes tf.io.serialize_tensor writes as tensor_content. */
#define RT_TF_DTYPE_LIST(X)                                                                         \
    X(DT, FLOAT, 1) X(DT, DOUBLE, 2) X(DT, INT32, 3) X(DT, UINT8, 4) X(DT, INT16, 5) X(DT, INT8, 6)     \
    X(DT, INT64, 9) X(DT, BOOL, 10) X(DT, BFLOAT16, 14) X(DT, UINT16, 17) X(DT, HALF, 19)             \
    X(DT, UINT32, 22) X(DT, UINT64, 23)
/* The most dimensions a tensor column's shape may have (TensorFlow's own limit is 254). */
#define RT_TENSOR_MAX_RANK 32
/* The map of a record a feature lives in. */
#define RT_SECTION_LIST(X) X(SECTION, CONTEXT, 0) X(SECTION, FEATURE_LISTS, 1)

/* A TFRecord frame: the payload's length (uint64), its masked CRC-32C (uint32), the payload, the
 * payload's masked CRC-32C (uint32). Python's framing reads these sizes from the extension. */
#define RT_FRAME_LIST(X) X(RT, LENGTH_BYTES, 8) X(RT, HEADER_BYTES, 12) X(RT, FOOTER_BYTES, 4)

#define RT_CONST_ENUM(prefix, name, value) prefix##_##name = value,
enum { RT_KIND_LIST(RT_CONST_ENUM) };
enum { RT_SHAPE_LIST(RT_CONST_ENUM) };
enum { RT_RECORD_TYPE_LIST(RT_CONST_ENUM) };
enum { RT_SECTION_LIST(RT_CONST_ENUM) };
enum { RT_TF_DTYPE_LIST(RT_CONST_ENUM) };
enum { RT_FRAME_LIST(RT_CONST_ENUM) };
/* What a frame adds to its payload. */
#define RT_FRAME_OVERHEAD (RT_HEADER_BYTES + RT_FOOTER_BYTES)
#undef RT_CONST_ENUM

/* The error convention of every entry point of the units: it returns an rt_status (RT_OK, or why
 * it failed), and one that reads records or columns takes an rt_error *, which on a failure holds
 * the same status and where it happened (the record, the column, the byte in the record).
 * Internal helpers return 0 or -1 and leave the details in that rt_error. */

/* Where a call failed: the status plus what Python needs to name the file offset and column.
 * The last three are set only for the statuses named beside them. */
typedef struct {
    rt_status status;
    int64_t record;       /* record index within the call, -1 if none */
    int col;              /* column index, -1 if none */
    int64_t offset;       /* byte offset within the record, -1 if none */
    int64_t actual;       /* KIND_MISMATCH: the feature's kind; COUNT_MISMATCH: its value count; the
                           * TENSOR_* statuses: the tensor's (MALFORMED: the wire status inside it;
                           * DTYPE: its dtype; SHAPE: its rank, or the size of dimension `index`;
                           * CONTENT_SIZE: its bytes; TOO_MANY_VALUES: its values; VALUE_RANGE: the value) */
    int64_t expected;     /* KIND_MISMATCH: the column's kind; COUNT_MISMATCH: the count it needs; the
                           * TENSOR_* statuses: the column's (dtype, rank or dimension, bytes, values) */
    int64_t other_record; /* inspect's KIND_MISMATCH: the record where the column got its kind */
    int64_t index;        /* TENSOR_SHAPE_MISMATCH: the dimension that differs, -1 for the rank */
} rt_error;

/* An rt_error before anything failed: no status, no place. */
#define RT_ERROR_INIT {.status = RT_OK, .record = -1, .col = -1, .offset = -1, .other_record = -1, .index = -1}

/* The records a call reads: count records whose headers start at pos[] in buf[0, n), with payload
 * lengths lens[], as the scan found them. The caller's word is not trusted: each span is checked
 * against n before its record is read (rt_span_ok). */
typedef struct {
    const uint8_t *buf;
    size_t n;
    const int64_t *pos, *lens;
    int64_t count;
} rt_records;

static inline uint64_t rd64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static inline uint32_t rd32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }

/* Whether the record whose header starts at pos, with a payload of len bytes, lies inside n bytes. */
static inline int rt_span_ok(size_t n, int64_t pos, int64_t len) {
    return pos >= 0 && len >= 0 && (uint64_t)pos <= n && (uint64_t)len <= n - (uint64_t)pos &&
           n - (uint64_t)pos - (uint64_t)len >= RT_HEADER_BYTES;
}

/* Growable output: filled while decoding or encoding, then handed to the caller as is. */
typedef struct {
    uint8_t *p;
    size_t len, cap;
} Buf;

/* Buffers of RT_POOL_MIN and up come from and go back to a cache of recycled ones (pool.c):
 * memory from rt_pool_alloc may be released with free() or rt_pool_free(p, cap), the latter
 * recycling it. */
#define RT_POOL_MIN ((size_t)256 << 10)
#define RT_POOL_BYTES ((size_t)256 << 20) /* the most the pool holds, in all threads together */
RT_API void *rt_pool_alloc(size_t want, size_t *cap);
RT_API void rt_pool_free(void *p, size_t cap);
/* Bytes the pool holds for reuse (at most RT_POOL_BYTES), in all threads' caches. */
RT_API size_t rt_pool_held(void);

/* Afterwards b->p is never NULL, so callers may form b->p + b->len even to write nothing. */
static RT_MAYBE_UNUSED int buf_reserve(Buf *b, size_t extra) {
    if (extra <= b->cap - b->len && b->p) return 0;
    if (extra > SIZE_MAX / 4 - b->len) return -1;
    size_t want = b->len + extra, cap = b->cap ? b->cap : 256;
    while (cap < want) cap *= 2;
    if (cap < RT_POOL_MIN) {
        uint8_t *np = realloc(b->p, cap);
        if (!np) return -1;
        b->p = np;
        b->cap = cap;
        return 0;
    }
    uint8_t *np = rt_pool_alloc(cap, &cap);
    if (!np) return -1;
    if (b->len) memcpy(np, b->p, b->len);
    rt_pool_free(b->p, b->cap);
    b->p = np;
    b->cap = cap;
    return 0;
}

static RT_MAYBE_UNUSED void buf_free(Buf *b) {
    rt_pool_free(b->p, b->cap);
    b->p = NULL;
    b->len = b->cap = 0;
}

/* Memory lent by the caller for the length of one call. */
typedef struct {
    const void *buf;
    size_t len;
} Mem;

#endif
