/*
 * The C API under misuse: null pointers, wrong sizes and dtypes, unknown names, small buffers, closed and made-up
 * handles — each an error code with a message, never a crash — and one session run from several threads at once.
 * Built and run by python/tests/test_capi.py on the model it builds: x float32 [batch, 8], scale float32 [1] ->
 * y float32 [batch, 4].
 *
 *     api_misuse MODEL.onnx
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln.h"

static int failures = 0;

#define EXPECT(call, want)                                                                                   \
    do {                                                                                                     \
        kiln_status got_ = (call);                                                                           \
        if (got_ != (want)) {                                                                                \
            fprintf(stderr, "line %d: %s returned %d, expected %d (%s)\n", __LINE__, #call, (int)got_, (int)(want), \
                    kiln_last_error());                                                                      \
            failures++;                                                                                      \
        } else if ((want) != KILN_OK && kiln_last_error()[0] == '\0') {                                      \
            fprintf(stderr, "line %d: %s failed without a message\n", __LINE__, #call);                      \
            failures++;                                                                                      \
        }                                                                                                    \
    } while (0)

#define EXPECT_MESSAGE(part)                                                                                 \
    do {                                                                                                     \
        if (!strstr(kiln_last_error(), (part))) {                                                            \
            fprintf(stderr, "line %d: message `%s` lacks `%s`\n", __LINE__, kiln_last_error(), (part));      \
            failures++;                                                                                      \
        }                                                                                                    \
    } while (0)

static kiln_session *shared;
static float x[2 * 8], scale[1] = {0.5f};
static int64_t x_dims[2] = {2, 8}, scale_dims[1] = {1};

static kiln_status run_once(float *y, int64_t *y_dims) {
    kiln_tensor in[2] = {{"x", KILN_FLOAT32, 2, x_dims, x, sizeof x}, {"scale", KILN_FLOAT32, 1, scale_dims, scale, sizeof scale}};
    kiln_tensor out[1] = {{"y", KILN_FLOAT32, 2, y_dims, y, 2 * 4 * sizeof(float)}};
    return kiln_session_run(shared, in, 2, out, 1);
}

static void *worker(void *arg) {
    float *want = arg;
    for (int i = 0; i < 50; i++) {
        float y[8];
        int64_t dims[2];
        if (run_once(y, dims) != KILN_OK || memcmp(y, want, sizeof y) != 0) return (void *)1;
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s MODEL.onnx\n", argv[0]);
        return 2;
    }
    for (int i = 0; i < 16; i++) x[i] = (float)(i % 5) - 2.0f;
    kiln_session *s = NULL;
    kiln_options options = {0};

    /* Opening. */
    EXPECT(kiln_session_open(NULL, NULL, &s), KILN_INVALID_ARGUMENT);
    EXPECT(kiln_session_open(argv[1], NULL, NULL), KILN_INVALID_ARGUMENT);
    EXPECT(kiln_session_open("/nonexistent/model.onnx", NULL, &s), KILN_IO_ERROR);
    EXPECT_MESSAGE("/nonexistent/model.onnx");
    EXPECT(kiln_session_open("/etc/hostname", NULL, &s), KILN_INVALID_MODEL);
    EXPECT(kiln_session_open(argv[1], &options, &s), KILN_INVALID_ARGUMENT); /* struct_size 0 */
    EXPECT_MESSAGE("struct_size");
    options.struct_size = sizeof options;
    options.backend = "tpu";
    EXPECT(kiln_session_open(argv[1], &options, &s), KILN_INVALID_ARGUMENT);
    options.backend = NULL;
    options.fallback = 7;
    EXPECT(kiln_session_open(argv[1], &options, &s), KILN_INVALID_ARGUMENT);
    options.fallback = KILN_FALLBACK_DENY;
    options.threads = 1;
    EXPECT(kiln_session_open(argv[1], &options, &s), KILN_OK);
    if (!s) return 1;
    if (kiln_last_error()[0] != '\0') {
        fprintf(stderr, "a success left a message: %s\n", kiln_last_error());
        failures++;
    }

    /* Metadata. */
    size_t n = 0;
    kiln_tensor_info info;
    EXPECT(kiln_session_input_count(NULL, &n), KILN_INVALID_ARGUMENT);
    EXPECT(kiln_session_input_count(s, NULL), KILN_INVALID_ARGUMENT);
    EXPECT(kiln_session_input_count(s, &n), KILN_OK);
    if (n != 2) failures++;
    EXPECT(kiln_session_input_info(s, 0, &info), KILN_OK);
    if (strcmp(info.name, "x") || info.dtype != KILN_FLOAT32 || info.rank != 2 || info.dims[0] != -1 ||
        strcmp(info.dim_names[0], "batch") || info.dims[1] != 8 || info.dim_names[1] != NULL) {
        fprintf(stderr, "input 0 info is wrong\n");
        failures++;
    }
    EXPECT(kiln_session_input_info(s, 2, &info), KILN_INVALID_ARGUMENT);
    EXPECT_MESSAGE("out of range");
    EXPECT(kiln_session_output_info(s, 0, NULL), KILN_INVALID_ARGUMENT);

    /* Runs with bad arguments. */
    float y[8];
    int64_t y_dims[2] = {0, 0};
    kiln_tensor in[2] = {{"x", KILN_FLOAT32, 2, x_dims, x, sizeof x}, {"scale", KILN_FLOAT32, 1, scale_dims, scale, sizeof scale}};
    kiln_tensor out[1] = {{"y", KILN_FLOAT32, 2, y_dims, y, sizeof y}};
    EXPECT(kiln_session_run(s, NULL, 2, out, 1), KILN_INVALID_ARGUMENT);
    EXPECT(kiln_session_run(s, in, 2, NULL, 1), KILN_INVALID_ARGUMENT);
    EXPECT(kiln_session_run(s, in, 1, out, 1), KILN_INVALID_INPUT); /* scale missing */
    EXPECT_MESSAGE("input `scale` is missing");
    in[0].capacity_bytes = sizeof x - 4;
    EXPECT(kiln_session_run(s, in, 2, out, 1), KILN_INVALID_INPUT);
    EXPECT_MESSAGE("bytes");
    in[0].capacity_bytes = sizeof x;
    in[0].dtype = KILN_FLOAT64;
    EXPECT(kiln_session_run(s, in, 2, out, 1), KILN_INVALID_INPUT);
    in[0].dtype = 99;
    EXPECT(kiln_session_run(s, in, 2, out, 1), KILN_INVALID_INPUT);
    in[0].dtype = KILN_FLOAT32;
    in[0].name = "nope";
    EXPECT(kiln_session_run(s, in, 2, out, 1), KILN_INVALID_INPUT);
    EXPECT_MESSAGE("(inputs: `x`, `scale`)");
    in[0].name = NULL;
    EXPECT(kiln_session_run(s, in, 2, out, 1), KILN_INVALID_ARGUMENT);
    in[0].name = "x";
    in[0].dims = NULL;
    EXPECT(kiln_session_run(s, in, 2, out, 1), KILN_INVALID_ARGUMENT);
    in[0].dims = x_dims;
    in[0].data = NULL;
    EXPECT(kiln_session_run(s, in, 2, out, 1), KILN_INVALID_ARGUMENT);
    in[0].data = (char *)x + 1; /* misaligned: 14 floats from the second byte */
    in[0].capacity_bytes = 2 * 7 * sizeof(float);
    int64_t short_dims[2] = {2, 7};
    in[0].dims = short_dims;
    EXPECT(kiln_session_run(s, in, 2, out, 1), KILN_INVALID_INPUT);
    EXPECT_MESSAGE("aligned");
    in[0].data = x;
    in[0].capacity_bytes = sizeof x;
    in[0].dims = x_dims;
    int64_t bad_dims[2] = {2, -8};
    in[0].dims = bad_dims;
    EXPECT(kiln_session_run(s, in, 2, out, 1), KILN_INVALID_ARGUMENT);
    in[0].dims = x_dims;
    out[0].name = "nope";
    EXPECT(kiln_session_run(s, in, 2, out, 1), KILN_INVALID_INPUT);
    EXPECT_MESSAGE("(outputs: `y`)");
    out[0].name = "y";
    out[0].rank = 3;
    EXPECT(kiln_session_run(s, in, 2, out, 1), KILN_INVALID_INPUT);
    out[0].rank = 2;
    out[0].capacity_bytes = 4;
    EXPECT(kiln_session_run(s, in, 2, out, 1), KILN_BUFFER_TOO_SMALL);
    if (y_dims[0] != 2 || y_dims[1] != 4) {
        fprintf(stderr, "a too-small buffer did not get the output's dims\n");
        failures++;
    }
    out[0].capacity_bytes = sizeof y;

    /* A good run, then the same session from four threads at once. */
    EXPECT(kiln_session_run(s, in, 2, out, 1), KILN_OK);
    for (int i = 0; i < 8; i++) {
        if (y[i] < 0.0f) {
            fprintf(stderr, "y[%d] = %f: relu(..) * 0.5 cannot be negative\n", i, y[i]);
            failures++;
        }
    }
    shared = s;
    pthread_t threads[4];
    for (int i = 0; i < 4; i++) pthread_create(&threads[i], NULL, worker, y);
    for (int i = 0; i < 4; i++) {
        void *r;
        pthread_join(threads[i], &r);
        if (r) {
            fprintf(stderr, "thread %d: a run failed or differed\n", i);
            failures++;
        }
    }

    /* Closed and made-up handles. */
    EXPECT(kiln_session_close(s), KILN_OK);
    EXPECT(kiln_session_close(s), KILN_INVALID_ARGUMENT);
    EXPECT_MESSAGE("not open");
    EXPECT(kiln_session_run(s, in, 2, out, 1), KILN_INVALID_ARGUMENT);
    EXPECT(kiln_session_input_count(s, &n), KILN_INVALID_ARGUMENT);
    EXPECT(kiln_session_input_info((kiln_session *)0x1234, 0, &info), KILN_INVALID_ARGUMENT);
    EXPECT(kiln_session_close(NULL), KILN_OK);

    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("all C API checks passed\n");
    return 0;
}
