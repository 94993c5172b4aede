/*
 * kiln.h: kiln's C API (libkiln_c.so, built by `cargo build -p kiln-capi`).
 *
 * Load a model (ONNX, .kir) or an artifact directory of `kiln compile`, query its inputs and outputs, and run it on
 * caller-owned buffers: inputs are read where they lie, outputs are written into memory the caller provides (IO
 * binding). The semantics are those of the Python package's InferenceSession (docs/python.md); docs/c-api.md is the
 * guide.
 *
 * Every function returns a kiln_status; on failure, kiln_last_error() gives a one-line message for the calling
 * thread. Null pointers, wrong sizes, unknown names and closed sessions are errors (KILN_INVALID_ARGUMENT), never a
 * crash. Sessions are thread-safe: any number of threads may run one session at once. Handles are never reused:
 * a closed session's handle stays invalid.
 */
#ifndef KILN_H
#define KILN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The version of this header; kiln_api_version() returns the library's, which must match. */
#define KILN_API_VERSION 1

typedef enum kiln_status {
    KILN_OK = 0,
    /* A null pointer, a closed or unknown session, a bad option, a count or index out of range. */
    KILN_INVALID_ARGUMENT = 1,
    /* A file could not be read. */
    KILN_IO_ERROR = 2,
    /* The model, weights or artifact is malformed. */
    KILN_INVALID_MODEL = 3,
    /* The model uses an op, dtype or backend kiln does not support (or fallbacks were denied). */
    KILN_UNSUPPORTED = 4,
    /* The inputs do not fit the model: names, dtypes, shapes, sizes. */
    KILN_INVALID_INPUT = 5,
    /* An output buffer is too small: its dims were set to the output's shape, so the caller can grow it. */
    KILN_BUFFER_TOO_SMALL = 6,
    /* Running failed. */
    KILN_RUNTIME_ERROR = 7
} kiln_status;

typedef enum kiln_dtype {
    KILN_FLOAT32 = 1,
    KILN_FLOAT16 = 2,
    KILN_BFLOAT16 = 3,
    KILN_FLOAT64 = 4,
    KILN_INT8 = 5,
    KILN_UINT8 = 6,
    KILN_INT32 = 7,
    KILN_INT64 = 8,
    KILN_BOOL = 9, /* one byte, 0 or 1 */
    KILN_INT16 = 10,
    KILN_UINT16 = 11,
    KILN_UINT32 = 12,
    KILN_UINT64 = 13,
    /* One element per byte: float8/float4 bit patterns (float4 in the low nibble), int4/int2 sign-extended. */
    KILN_FLOAT8E4M3FN = 14,
    KILN_FLOAT8E4M3FNUZ = 15,
    KILN_FLOAT8E5M2 = 16,
    KILN_FLOAT8E5M2FNUZ = 17,
    KILN_FLOAT8E8M0 = 18,
    KILN_FLOAT4E2M1 = 19,
    KILN_INT4 = 20,
    KILN_UINT4 = 21,
    KILN_INT2 = 22,
    KILN_UINT2 = 23
} kiln_dtype;

typedef enum kiln_fallback {
    KILN_FALLBACK_WARN = 0,  /* run nodes kiln cannot compile on its interpreter, logging them */
    KILN_FALLBACK_ALLOW = 1, /* the same, quietly */
    KILN_FALLBACK_DENY = 2   /* refuse such a model (KILN_UNSUPPORTED) */
} kiln_fallback;

/* An open session (opaque). */
typedef struct kiln_session kiln_session;

/* Options of kiln_session_open; pass NULL for the defaults, or zero the struct and set struct_size. */
typedef struct kiln_options {
    size_t struct_size;     /* sizeof(kiln_options): lets later versions add fields */
    uint32_t threads;       /* worker threads; 0: all cores */
    const char *backend;    /* "cpu" (default when NULL), "cuda" or "interp" */
    kiln_fallback fallback; /* default KILN_FALLBACK_WARN */
} kiln_options;

/* An input or output of a model. Pointers stay valid until the session is closed. */
typedef struct kiln_tensor_info {
    const char *name;
    kiln_dtype dtype;
    size_t rank;
    const int64_t *dims;           /* rank extents; -1 for a symbolic dim */
    const char *const *dim_names;  /* rank entries: the symbolic dim's name, NULL for a static dim */
} kiln_tensor_info;

/* A tensor in caller memory. For an input, dims and data are read. For an output, data holds capacity_bytes
 * (writable) and dims has room for the output's rank; kiln writes the values and the extents. */
typedef struct kiln_tensor {
    const char *name;
    kiln_dtype dtype;
    size_t rank;
    int64_t *dims;
    void *data;
    size_t capacity_bytes; /* input: exactly the tensor's bytes; output: the buffer's size */
} kiln_tensor;

/* The library's API version (KILN_API_VERSION of the header it was built with) and its version string. */
uint32_t kiln_api_version(void);
const char *kiln_version(void);

/* The message of the calling thread's last failed call ("" if none); valid until its next call into kiln. */
const char *kiln_last_error(void);

/* Opens a model file or an artifact directory; *out receives the session. */
kiln_status kiln_session_open(const char *path, const kiln_options *options, kiln_session **out);

/* Closes a session (NULL is accepted). Runs in flight on other threads finish first. */
kiln_status kiln_session_close(kiln_session *session);

kiln_status kiln_session_input_count(const kiln_session *session, size_t *out);
kiln_status kiln_session_output_count(const kiln_session *session, size_t *out);
kiln_status kiln_session_input_info(const kiln_session *session, size_t index, kiln_tensor_info *out);
kiln_status kiln_session_output_info(const kiln_session *session, size_t index, kiln_tensor_info *out);

/* Runs the model: every input by name, and the outputs wanted (any subset, by name) written into caller buffers,
 * each with its dims set. An output too big for its buffer is not written and fails the call with
 * KILN_BUFFER_TOO_SMALL after the run; its dims hold the extents it needs (the outputs that fit are written). */
kiln_status kiln_session_run(kiln_session *session, const kiln_tensor *inputs, size_t input_count,
                             kiln_tensor *outputs, size_t output_count);

/* The size in bytes of one element of dtype (0 for an unknown dtype). */
size_t kiln_dtype_size(kiln_dtype dtype);

#ifdef __cplusplus
}
#endif

#endif /* KILN_H */
