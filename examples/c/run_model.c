/*
 * run_model: run a model through kiln's C API (include/kiln.h) on .npy inputs and write .npy outputs.
 *
 *     cc -I include examples/c/run_model.c -L target/debug -lkiln_c -Wl,-rpath,$PWD/target/debug -o run_model
 *     ./run_model MODEL.onnx|ARTIFACT_DIR OUT_DIR INPUT0.npy [INPUT1.npy ...]
 *
 * Inputs are given in the model's input order (little-endian, C-order .npy files, as numpy.save writes them);
 * each output is written to OUT_DIR/<index>.npy. The buffers are the caller's: kiln reads the inputs where they
 * lie and writes the outputs into buffers allocated here (grown once if an output is bigger than guessed).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln.h"

#define MAX_RANK 16

typedef struct {
    kiln_dtype dtype;
    size_t rank;
    int64_t dims[MAX_RANK];
    void *data;
    size_t bytes;
} array;

static const struct {
    const char *descr;
    kiln_dtype dtype;
} DESCRS[] = {
    {"<f4", KILN_FLOAT32}, {"<f2", KILN_FLOAT16}, {"<f8", KILN_FLOAT64}, {"|i1", KILN_INT8}, {"|u1", KILN_UINT8},
    {"<i4", KILN_INT32},   {"<i8", KILN_INT64},   {"|b1", KILN_BOOL},
};

static int fail(const char *what, kiln_status status) {
    fprintf(stderr, "%s: status %d: %s\n", what, (int)status, kiln_last_error());
    return 1;
}

/* Reads a .npy file (format 1.0 or 2.0, C order, a dtype of DESCRS). */
static int read_npy(const char *path, array *a) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "%s: %s\n", path, strerror(errno));
        return 1;
    }
    unsigned char magic[10];
    if (fread(magic, 1, 10, f) != 10 || memcmp(magic, "\x93NUMPY", 6) != 0) {
        fprintf(stderr, "%s: not a .npy file\n", path);
        fclose(f);
        return 1;
    }
    size_t header_len = magic[8] | (magic[9] << 8);
    if (magic[6] >= 2) {
        unsigned char more[2];
        if (fread(more, 1, 2, f) != 2) {
            fclose(f);
            return 1;
        }
        header_len |= ((size_t)more[0] << 16) | ((size_t)more[1] << 24);
    }
    if (header_len > 65536) {
        fprintf(stderr, "%s: header too long\n", path);
        fclose(f);
        return 1;
    }
    char *header = calloc(header_len + 1, 1);
    if (!header || fread(header, 1, header_len, f) != header_len) {
        fprintf(stderr, "%s: truncated header\n", path);
        free(header);
        fclose(f);
        return 1;
    }
    a->dtype = 0;
    for (size_t i = 0; i < sizeof DESCRS / sizeof DESCRS[0]; i++) {
        if (strstr(header, DESCRS[i].descr)) a->dtype = DESCRS[i].dtype;
    }
    const char *shape = strstr(header, "'shape': (");
    if (!a->dtype || strstr(header, "'fortran_order': True") || !shape) {
        fprintf(stderr, "%s: unsupported .npy header: %s\n", path, header);
        free(header);
        fclose(f);
        return 1;
    }
    a->rank = 0;
    size_t count = 1;
    for (const char *p = shape + 10; *p && *p != ')';) {
        char *end;
        long long d = strtoll(p, &end, 10);
        if (end == p) {
            p++;
            continue;
        }
        if (a->rank == MAX_RANK || d < 0) {
            free(header);
            fclose(f);
            return 1;
        }
        a->dims[a->rank++] = d;
        count *= (size_t)d;
        p = end;
    }
    free(header);
    a->bytes = count * kiln_dtype_size(a->dtype);
    a->data = malloc(a->bytes ? a->bytes : 1);
    if (!a->data || fread(a->data, 1, a->bytes, f) != a->bytes) {
        fprintf(stderr, "%s: truncated data\n", path);
        fclose(f);
        return 1;
    }
    fclose(f);
    return 0;
}

static int write_npy(const char *path, const array *a) {
    const char *descr = NULL;
    for (size_t i = 0; i < sizeof DESCRS / sizeof DESCRS[0]; i++) {
        if (DESCRS[i].dtype == a->dtype) descr = DESCRS[i].descr;
    }
    if (!descr) return 1;
    char header[512], shape[256] = "";
    for (size_t i = 0; i < a->rank; i++) {
        char d[32];
        snprintf(d, sizeof d, "%lld%s", (long long)a->dims[i], a->rank == 1 ? "," : (i + 1 < a->rank ? ", " : ""));
        strncat(shape, d, sizeof shape - strlen(shape) - 1);
    }
    int n = snprintf(header, sizeof header, "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }", descr, shape);
    size_t total = 10 + (size_t)n + 1;
    size_t pad = (64 - total % 64) % 64;
    FILE *f = fopen(path, "wb");
    if (!f) return 1;
    size_t len = (size_t)n + pad + 1;
    unsigned char magic[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(len & 0xff), (unsigned char)(len >> 8)};
    fwrite(magic, 1, 10, f);
    fwrite(header, 1, (size_t)n, f);
    for (size_t i = 0; i < pad; i++) fputc(' ', f);
    fputc('\n', f);
    fwrite(a->data, 1, a->bytes, f);
    return fclose(f) != 0;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL OUT_DIR INPUT0.npy [INPUT1.npy ...]\n", argv[0]);
        return 2;
    }
    if (kiln_api_version() != KILN_API_VERSION) {
        fprintf(stderr, "libkiln_c implements API %u, this program was built for %d\n", kiln_api_version(), KILN_API_VERSION);
        return 1;
    }
    kiln_options options = {0};
    options.struct_size = sizeof options;
    options.threads = 1;
    options.fallback = KILN_FALLBACK_DENY;
    kiln_session *session = NULL;
    kiln_status status = kiln_session_open(argv[1], &options, &session);
    if (status != KILN_OK) return fail("open", status);

    size_t n_in = 0, n_out = 0;
    kiln_session_input_count(session, &n_in);
    kiln_session_output_count(session, &n_out);
    if ((size_t)(argc - 3) != n_in) {
        fprintf(stderr, "the model has %zu inputs, %d given\n", n_in, argc - 3);
        kiln_session_close(session);
        return 2;
    }
    array *arrays = calloc(n_in + n_out, sizeof(array));
    kiln_tensor *tensors = calloc(n_in + n_out, sizeof(kiln_tensor));
    for (size_t i = 0; i < n_in; i++) {
        kiln_tensor_info info;
        kiln_session_input_info(session, i, &info);
        if (read_npy(argv[3 + i], &arrays[i])) return 1;
        tensors[i] = (kiln_tensor){info.name, arrays[i].dtype, arrays[i].rank, arrays[i].dims, arrays[i].data, arrays[i].bytes};
        printf("input %s: %zu-d, %zu bytes\n", info.name, arrays[i].rank, arrays[i].bytes);
    }
    for (size_t i = 0; i < n_out; i++) {
        kiln_tensor_info info;
        kiln_session_output_info(session, i, &info);
        array *a = &arrays[n_in + i];
        a->dtype = info.dtype;
        a->rank = info.rank;
        /* A first guess at the size: symbolic dims as 1; grown below if the run says so. */
        size_t count = 1;
        for (size_t d = 0; d < info.rank; d++) count *= info.dims[d] < 0 ? 1 : (size_t)info.dims[d];
        a->bytes = count * kiln_dtype_size(info.dtype);
        a->data = malloc(a->bytes ? a->bytes : 1);
        tensors[n_in + i] = (kiln_tensor){info.name, info.dtype, info.rank, a->dims, a->data, a->bytes};
    }
    status = kiln_session_run(session, tensors, n_in, tensors + n_in, n_out);
    if (status == KILN_BUFFER_TOO_SMALL) {
        for (size_t i = 0; i < n_out; i++) {
            array *a = &arrays[n_in + i];
            size_t count = 1;
            for (size_t d = 0; d < a->rank; d++) count *= (size_t)a->dims[d];
            a->bytes = count * kiln_dtype_size(a->dtype);
            a->data = realloc(a->data, a->bytes ? a->bytes : 1);
            tensors[n_in + i].data = a->data;
            tensors[n_in + i].capacity_bytes = a->bytes;
        }
        status = kiln_session_run(session, tensors, n_in, tensors + n_in, n_out);
    }
    if (status != KILN_OK) return fail("run", status);
    for (size_t i = 0; i < n_out; i++) {
        array *a = &arrays[n_in + i];
        size_t count = 1;
        for (size_t d = 0; d < a->rank; d++) count *= (size_t)a->dims[d];
        a->bytes = count * kiln_dtype_size(a->dtype);
        char path[4096];
        snprintf(path, sizeof path, "%s/%zu.npy", argv[2], i);
        if (write_npy(path, a)) {
            fprintf(stderr, "cannot write %s\n", path);
            return 1;
        }
        printf("output %s: %zu-d -> %s\n", tensors[n_in + i].name, a->rank, path);
    }
    kiln_session_close(session);
    for (size_t i = 0; i < n_in + n_out; i++) free(arrays[i].data);
    free(arrays);
    free(tensors);
    return 0;
}
