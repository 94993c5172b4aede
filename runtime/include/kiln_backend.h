/*
 * kiln_backend.h — the C ABI of kiln backend plugins, version 2.
 *
 * A plugin is a shared library exporting one symbol, `kiln_backend_entry`, which receives the host's ABI version
 * and returns a pointer to a `kiln_backend_vtable`. The host accepts plugins of every version from
 * KILN_BACKEND_ABI_MIN_VERSION to KILN_BACKEND_ABI_VERSION: it checks `abi_version` and `struct_size` (which must
 * equal sizeof(kiln_backend_vtable) of that version) before reading anything else, and speaks each plugin's own
 * version to it. Any change to a struct or to a function's meaning bumps the version.
 *
 * Version 2 (this header) changed, from version 1:
 *   - kiln_backend_entry takes the host's ABI version (a version-1 entry takes no argument; calling it with one
 *     is harmless in the C calling conventions kiln runs on, so version-1 plugins still load);
 *   - kiln_run_args.remaining_tokens is the count of prompt tokens the prefix state does not cover (the seed
 *     contract's meaning); the tokens to generate moved to the new field max_new_tokens, after error_cap.
 *     A version-1 plugin gets struct_size of the version-1 struct and, in remaining_tokens, the tokens to
 *     generate, as before.
 *
 * Ownership in one paragraph: the host owns every buffer that crosses the boundary. Inputs are borrowed for one
 * call. Outputs are allocated by the host through a callback and filled by the plugin. Error messages are
 * written into a host buffer. States are the only plugin-owned objects the host holds: it releases each exactly
 * once through `release_state`. The vtable and its strings belong to the plugin and must stay valid until
 * `destroy`. See docs/plugins.md for the full contract.
 *
 * This file mirrors runtime/src/plugin/abi.rs field for field.
 */
#ifndef KILN_BACKEND_H
#define KILN_BACKEND_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_BACKEND_ABI_VERSION 2u
/* The oldest plugin ABI version this header's host still loads. */
#define KILN_BACKEND_ABI_MIN_VERSION 1u
#define KILN_BACKEND_ENTRY_SYMBOL "kiln_backend_entry"

/* Status codes returned by run/export_state/import_state. */
#define KILN_STATUS_OK 0
#define KILN_STATUS_ERROR 1       /* failed; message in the error buffer */
#define KILN_STATUS_UNSUPPORTED 2 /* cannot do this (op, dtype, non-portable state); message says what */

/* Capability flags (kiln_backend_vtable.capabilities). */
#define KILN_CAP_TENSOR (1u << 0)       /* runs the tensor ops listed in `ops` */
#define KILN_CAP_TOKEN (1u << 1)        /* runs token (decoding) nodes */
#define KILN_CAP_CACHE (1u << 2)        /* resumes token nodes from a prefix state */
#define KILN_CAP_STATE_EXPORT (1u << 3) /* export_state/import_state round-trip */
#define KILN_CAP_ALL_OPS (1u << 4)      /* every tensor op; `ops` is ignored */

/* Dtype codes. */
#define KILN_DTYPE_F32 0u
#define KILN_DTYPE_F16 1u
#define KILN_DTYPE_BF16 2u
#define KILN_DTYPE_F64 3u
#define KILN_DTYPE_I8 4u
#define KILN_DTYPE_U8 5u
#define KILN_DTYPE_I32 6u
#define KILN_DTYPE_I64 7u
#define KILN_DTYPE_BOOL 8u /* one byte per element, 0 or 1 */
#define KILN_DTYPE_I16 9u
#define KILN_DTYPE_U16 10u
#define KILN_DTYPE_U32 11u
#define KILN_DTYPE_U64 12u
/* One element per byte: float8 bit patterns, float4 in the low nibble, int4/int2 sign-extended. */
#define KILN_DTYPE_F8E4M3FN 13u
#define KILN_DTYPE_F8E4M3FNUZ 14u
#define KILN_DTYPE_F8E5M2 15u
#define KILN_DTYPE_F8E5M2FNUZ 16u
#define KILN_DTYPE_F8E8M0 17u
#define KILN_DTYPE_F4E2M1 18u
#define KILN_DTYPE_I4 19u
#define KILN_DTYPE_U4 20u
#define KILN_DTYPE_I2 21u
#define KILN_DTYPE_U2 22u

/* One input tensor, borrowed for the duration of one run call. */
typedef struct kiln_tensor_desc {
    uint32_t dtype;         /* KILN_DTYPE_* */
    uint32_t rank;          /* 0 for a scalar */
    const int64_t *shape;   /* rank extents (may be NULL when rank == 0) */
    const int64_t *strides; /* rank strides in ELEMENTS; honour them, they need not be contiguous */
    const void *data;       /* first element, little-endian; NULL only when there are no elements */
    uint64_t byte_len;      /* bytes readable from data; every element reached lies inside */
} kiln_tensor_desc;

/* Counters reported by run; zeroed by the host before the call. */
typedef struct kiln_counters {
    uint32_t reused_prefix_len;
    uint32_t compute_steps;
    uint32_t tokens_sent;
    uint32_t tokens_saved;
    uint32_t used_cached_state; /* non-zero: a prefix state was used */
} kiln_counters;

/*
 * Host allocator for outputs. Call it once per output, in order (index 0, 1, ...). Returns a zero-filled,
 * dtype-aligned, host-owned buffer for the row-major contiguous elements, valid until run returns (never free it), or NULL when
 * the request is refused (out of order, bad dtype or shape, too large) — then return an error. For a
 * zero-element output the pointer is non-NULL but must not be written through.
 */
typedef void *(*kiln_alloc_output_fn)(void *ctx, uint32_t index, uint32_t dtype, uint32_t rank,
                                      const int64_t *shape);

typedef struct kiln_output_sink {
    void *ctx;                  /* pass back unchanged */
    kiln_alloc_output_fn alloc; /* never NULL */
} kiln_output_sink;

/* Host allocator for exported state bytes: same ownership as kiln_alloc_output_fn; call at most once. */
typedef uint8_t *(*kiln_alloc_bytes_fn)(void *ctx, uint64_t len);

typedef struct kiln_byte_sink {
    void *ctx;
    kiln_alloc_bytes_fn alloc;
} kiln_byte_sink;

/* Everything one run call gets and gives back. Host-owned; (out) fields start zeroed/NULL. */
typedef struct kiln_run_args {
    uint32_t struct_size;      /* sizeof(kiln_run_args) as the host compiled it */
    uint32_t input_count;      /* entries in inputs */
    uint32_t remaining_tokens; /* token nodes: prompt tokens the prefix state does not cover; tensor nodes: 0 */
    kiln_counters counters;    /* (out) */
    const char *node_name;     /* for messages; NUL-terminated UTF-8 */
    const char *kind;          /* op mnemonic ("add", "matmul", "softmax", ...) or "token" */
    const char *attrs_json;    /* ops: serde JSON of kiln's ir::Op, e.g. {"op":"softmax","attrs":{"axis":-1}},
                                  {"op":"binary","attrs":"Add"}; token nodes: {"model":"NAME"} */
    const kiln_tensor_desc *inputs;
    const kiln_output_sink *outputs;
    void *prefix_state;    /* a state this plugin returned before, or NULL; BORROWED: do not release */
    void *state_out;       /* (out) new state or NULL; ownership passes to the host (released via release_state) */
    uint64_t state_bytes;  /* (out) bytes state_out holds */
    uint64_t state_tokens; /* (out) prefix tokens state_out covers */
    char *error;           /* host buffer for a NUL-terminated message; truncate to fit */
    uint64_t error_cap;    /* capacity of error, including the NUL */
    uint32_t max_new_tokens; /* (version 2) token nodes: tokens to generate; tensor nodes: 0 */
    uint32_t reserved;       /* zero */
} kiln_run_args;

/* Runs one node; returns KILN_STATUS_*. May be called from several threads at once. */
typedef int32_t (*kiln_run_fn)(void *instance, kiln_run_args *args);
/* Optional: externalizes a (borrowed) state through sink; KILN_STATUS_UNSUPPORTED: not portable. */
typedef int32_t (*kiln_export_state_fn)(void *instance, void *state, const kiln_byte_sink *sink, char *error,
                                        uint64_t error_cap);
/* Optional: rebuilds a state from bytes (borrowed); the new state is host-owned like run's state_out. */
typedef int32_t (*kiln_import_state_fn)(void *instance, const uint8_t *bytes, uint64_t len, void **state_out,
                                        uint64_t *state_bytes, uint64_t *state_tokens, char *error,
                                        uint64_t error_cap);
/* Frees a state handed to the host; called exactly once per state, from any thread. */
typedef void (*kiln_release_state_fn)(void *instance, void *state);
/* Optional teardown: called once, after every state is released, before the library is unloaded. */
typedef void (*kiln_destroy_fn)(void *instance);

/* Returned by kiln_backend_entry; plugin-owned, valid and unchanged until destroy. */
typedef struct kiln_backend_vtable {
    uint32_t abi_version;            /* the version the plugin speaks: KILN_BACKEND_ABI_VERSION when built here */
    uint32_t struct_size;            /* sizeof(kiln_backend_vtable) */
    const char *name;                /* the plugin's name, non-NULL */
    const char *tensor_backend_type; /* "cpu", "cuda", ... or NULL */
    uint32_t capabilities;           /* KILN_CAP_* */
    uint32_t op_count;               /* entries in ops */
    const char *const *ops;          /* op mnemonics (KILN_CAP_TENSOR without KILN_CAP_ALL_OPS) */
    void *instance;                  /* first argument of every function below */
    kiln_run_fn run;                 /* required */
    kiln_export_state_fn export_state;   /* optional (NULL) */
    kiln_import_state_fn import_state;   /* optional (NULL) */
    kiln_release_state_fn release_state; /* required if states are ever returned */
    kiln_destroy_fn destroy;             /* optional (NULL) */
} kiln_backend_vtable;

/* The one exported symbol: receives the host's KILN_BACKEND_ABI_VERSION (a plugin may return a vtable of any
 * version the host accepts, or NULL when it cannot serve this host or cannot initialize). */
typedef const kiln_backend_vtable *(*kiln_backend_entry_fn)(uint32_t host_abi_version);
const kiln_backend_vtable *kiln_backend_entry(uint32_t host_abi_version);

#ifdef __cplusplus
}
#endif

#endif /* KILN_BACKEND_H */
