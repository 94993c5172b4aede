/*
 * An example kiln backend plugin in C (see docs/plugins.md). Built by tests/plugins.rs with the system C compiler.
 *
 * Tensor ops, f32 only, honouring the input strides:
 *   - matmul: 2-D [m,k] x [k,n] -> [m,n]
 *   - softmax: along the last axis (attribute "axis" read from the node's JSON; any other axis is unsupported)
 * A toy token model, "count", to exercise states: the state is the token history; running a prompt reuses the
 * longest common prefix with the prefix state, then generates `max_new_tokens` tokens (ABI version 2), each the previous plus
 * one (mod 1000). States export as their tokens' little-endian i64 bytes.
 *
 * reduce_plugin_live_states() reports how many states are alive, so tests can check the host releases each one.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln_backend.h"

static long live_states = 0;

long reduce_plugin_live_states(void) { return __atomic_load_n(&live_states, __ATOMIC_SEQ_CST); }

typedef struct token_state {
    int64_t *tokens;
    uint64_t n;
} token_state;

static token_state *state_new(uint64_t n) {
    token_state *s = malloc(sizeof *s);
    if (!s) return NULL;
    s->tokens = malloc((n ? n : 1) * sizeof(int64_t));
    if (!s->tokens) {
        free(s);
        return NULL;
    }
    s->n = n;
    __atomic_add_fetch(&live_states, 1, __ATOMIC_SEQ_CST);
    return s;
}

static void release_state(void *instance, void *state) {
    (void)instance;
    token_state *s = state;
    if (!s) return;
    free(s->tokens);
    free(s);
    __atomic_sub_fetch(&live_states, 1, __ATOMIC_SEQ_CST);
}

static int32_t fail(char *buf, uint64_t cap, int32_t status, const char *fmt, ...) {
    if (buf && cap > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(buf, (size_t)cap, fmt, ap);
        va_end(ap);
    }
    return status;
}

#define ERR(...) fail(args->error, args->error_cap, KILN_STATUS_ERROR, __VA_ARGS__)
#define UNSUPPORTED(...) fail(args->error, args->error_cap, KILN_STATUS_UNSUPPORTED, __VA_ARGS__)

/* Reads element at multi-index (i, j) of a rank-2 descriptor, bounds-checked against byte_len. */
static int at2(const kiln_tensor_desc *d, int64_t i, int64_t j, float *out) {
    int64_t off = i * d->strides[0] + j * d->strides[1];
    if (off < 0 || (uint64_t)(off + 1) * sizeof(float) > d->byte_len) return 0;
    *out = ((const float *)d->data)[off];
    return 1;
}

static int32_t run_matmul(kiln_run_args *args) {
    if (args->input_count != 2) return ERR("matmul takes 2 operands, got %u", args->input_count);
    const kiln_tensor_desc *a = &args->inputs[0], *b = &args->inputs[1];
    if (a->dtype != KILN_DTYPE_F32 || b->dtype != KILN_DTYPE_F32)
        return UNSUPPORTED("matmul: only f32 (dtype codes %u, %u)", a->dtype, b->dtype);
    if (a->rank != 2 || b->rank != 2)
        return ERR("matmul: this plugin takes rank-2 operands only, got ranks %u and %u", a->rank, b->rank);
    int64_t m = a->shape[0], k = a->shape[1], n = b->shape[1];
    if (b->shape[0] != k)
        return ERR("matmul: inner dims differ ([%lld,%lld] x [%lld,%lld])", (long long)m, (long long)k,
                   (long long)b->shape[0], (long long)n);
    int64_t shape[2] = {m, n};
    float *out = args->outputs->alloc(args->outputs->ctx, 0, KILN_DTYPE_F32, 2, shape);
    if (!out) return ERR("matmul: the host refused the output");
    for (int64_t i = 0; i < m; i++) {
        for (int64_t j = 0; j < n; j++) {
            double acc = 0.0;
            for (int64_t p = 0; p < k; p++) {
                float x, y;
                if (!at2(a, i, p, &x) || !at2(b, p, j, &y)) return ERR("matmul: operand out of bounds");
                acc += (double)x * (double)y;
            }
            out[i * n + j] = (float)acc;
        }
    }
    return KILN_STATUS_OK;
}

static int32_t run_softmax(kiln_run_args *args) {
    if (args->input_count != 1) return ERR("softmax takes 1 operand, got %u", args->input_count);
    const kiln_tensor_desc *x = &args->inputs[0];
    if (x->dtype != KILN_DTYPE_F32) return UNSUPPORTED("softmax: only f32 (dtype code %u)", x->dtype);
    if (x->rank == 0) return ERR("softmax of a scalar");
    const char *p = strstr(args->attrs_json, "\"axis\":");
    if (!p) return ERR("softmax: no axis in %s", args->attrs_json);
    long axis = strtol(p + 7, NULL, 10);
    if (axis != -1 && axis != (long)x->rank - 1)
        return UNSUPPORTED("softmax: only the last axis (got axis %ld of rank %u)", axis, x->rank);
    float *out = args->outputs->alloc(args->outputs->ctx, 0, KILN_DTYPE_F32, x->rank, x->shape);
    if (!out) return ERR("softmax: the host refused the output");
    int64_t last = x->shape[x->rank - 1], rows = 1;
    for (uint32_t d = 0; d + 1 < x->rank; d++) rows *= x->shape[d];
    const float *data = x->data;
    for (int64_t r = 0; r < rows; r++) {
        /* The row's base offset from its multi-index over the leading dims. */
        int64_t base = 0, rem = r;
        for (int d = (int)x->rank - 2; d >= 0; d--) {
            base += (rem % x->shape[d]) * x->strides[d];
            rem /= x->shape[d];
        }
        int64_t step = x->strides[x->rank - 1];
        for (int64_t j = 0; j < last; j++) {
            int64_t off = base + j * step;
            if (off < 0 || (uint64_t)(off + 1) * sizeof(float) > x->byte_len) return ERR("softmax: out of bounds");
        }
        float mx = -INFINITY;
        for (int64_t j = 0; j < last; j++) mx = fmaxf(mx, data[base + j * step]);
        double sum = 0.0;
        for (int64_t j = 0; j < last; j++) sum += exp((double)data[base + j * step] - mx);
        for (int64_t j = 0; j < last; j++) out[r * last + j] = (float)(exp((double)data[base + j * step] - mx) / sum);
    }
    return KILN_STATUS_OK;
}

static int32_t run_token(kiln_run_args *args) {
    if (!strstr(args->attrs_json, "\"model\":\"count\""))
        return UNSUPPORTED("token: this plugin only knows the model \"count\" (got %s)", args->attrs_json);
    if (args->input_count != 1 || args->inputs[0].dtype != KILN_DTYPE_I64 || args->inputs[0].rank != 1)
        return ERR("token: expects one i64 vector of prompt ids");
    const kiln_tensor_desc *in = &args->inputs[0];
    int64_t len = in->shape[0];
    if (len < 1) return ERR("token: empty prompt");
    const int64_t *prompt = in->data;
    const token_state *prefix = args->prefix_state;
    uint64_t reused = 0;
    if (prefix) {
        while (reused < prefix->n && reused < (uint64_t)len && prefix->tokens[reused] == prompt[reused * in->strides[0]])
            reused++;
    }
    uint64_t gen = args->max_new_tokens, total = (uint64_t)len + gen;
    token_state *s = state_new(total);
    if (!s) return ERR("token: out of memory");
    for (int64_t i = 0; i < len; i++) s->tokens[i] = prompt[i * in->strides[0]];
    int64_t shape[1] = {(int64_t)gen};
    int64_t *out = args->outputs->alloc(args->outputs->ctx, 0, KILN_DTYPE_I64, 1, shape);
    if (!out) {
        release_state(NULL, s);
        return ERR("token: the host refused the output");
    }
    for (uint64_t g = 0; g < gen; g++) {
        int64_t next = (s->tokens[len + g - 1] + 1) % 1000;
        s->tokens[len + g] = next;
        out[g] = next;
    }
    args->state_out = s;
    args->state_bytes = total * sizeof(int64_t);
    args->state_tokens = total;
    args->counters.reused_prefix_len = (uint32_t)reused;
    args->counters.tokens_saved = (uint32_t)reused;
    args->counters.tokens_sent = (uint32_t)((uint64_t)len - reused) + (uint32_t)gen;
    args->counters.compute_steps = ((uint64_t)len > reused ? 1u : 0u) + (uint32_t)gen;
    args->counters.used_cached_state = reused > 0;
    return KILN_STATUS_OK;
}

static int32_t run(void *instance, kiln_run_args *args) {
    (void)instance;
    if (args->struct_size != sizeof(kiln_run_args))
        return ERR("run args are %u bytes, this plugin was built for %u", args->struct_size,
                   (unsigned)sizeof(kiln_run_args));
    if (strcmp(args->kind, "matmul") == 0) return run_matmul(args);
    if (strcmp(args->kind, "softmax") == 0) return run_softmax(args);
    if (strcmp(args->kind, "token") == 0) return run_token(args);
    return UNSUPPORTED("op `%s` is not one of this plugin's (matmul, softmax, token)", args->kind);
}

static int32_t export_state(void *instance, void *state, const kiln_byte_sink *sink, char *error,
                            uint64_t error_cap) {
    (void)instance;
    const token_state *s = state;
    uint8_t *bytes = sink->alloc(sink->ctx, s->n * sizeof(int64_t));
    if (!bytes) return fail(error, error_cap, KILN_STATUS_ERROR, "the host refused %llu bytes",
                            (unsigned long long)(s->n * sizeof(int64_t)));
    memcpy(bytes, s->tokens, s->n * sizeof(int64_t));
    return KILN_STATUS_OK;
}

static int32_t import_state(void *instance, const uint8_t *bytes, uint64_t len, void **state_out,
                            uint64_t *state_bytes, uint64_t *state_tokens, char *error, uint64_t error_cap) {
    (void)instance;
    if (len == 0 || len % sizeof(int64_t) != 0)
        return fail(error, error_cap, KILN_STATUS_ERROR, "state of %llu bytes is not a whole number of tokens",
                    (unsigned long long)len);
    token_state *s = state_new(len / sizeof(int64_t));
    if (!s) return fail(error, error_cap, KILN_STATUS_ERROR, "out of memory");
    memcpy(s->tokens, bytes, len);
    *state_out = s;
    *state_bytes = len;
    *state_tokens = s->n;
    return KILN_STATUS_OK;
}

static const char *const OPS[] = {"matmul", "softmax"};

static const kiln_backend_vtable VTABLE = {
    .abi_version = KILN_BACKEND_ABI_VERSION,
    .struct_size = sizeof(kiln_backend_vtable),
    .name = "reduce-c",
    .tensor_backend_type = "cpu",
    .capabilities = KILN_CAP_TENSOR | KILN_CAP_TOKEN | KILN_CAP_CACHE | KILN_CAP_STATE_EXPORT,
    .op_count = 2,
    .ops = OPS,
    .instance = NULL,
    .run = run,
    .export_state = export_state,
    .import_state = import_state,
    .release_state = release_state,
    .destroy = NULL,
};

const kiln_backend_vtable *kiln_backend_entry(uint32_t host_abi_version) {
    (void)host_abi_version;
    return &VTABLE;
}
