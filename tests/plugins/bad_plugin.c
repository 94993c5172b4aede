/*
 * Deliberately broken kiln plugins for tests/plugins.rs, one per define:
 *   BAD_NO_ENTRY     exports no kiln_backend_entry (a misspelt one instead)
 *   BAD_NULL_ENTRY   kiln_backend_entry returns NULL
 *   BAD_VERSION      claims ABI version 99
 *   BAD_SIZE         claims a struct_size smaller than the vtable
 *   BAD_NO_RUN       has no run function
 *   BAD_UNKNOWN_OP   lists an op mnemonic kiln does not have
 *   BAD_ALWAYS_FAILS (or no define) well-formed, but every run returns an error status with a message
 *   OLD_V1           speaks ABI version 1 (entry without an argument); every run fails with a message showing the
 *                    struct_size and remaining_tokens the host passed, so a test can see version 1 spoken to it
 */
#include <stdio.h>

#include "kiln_backend.h"

int32_t bad_plugin_run(void *instance, kiln_run_args *args) {
    (void)instance;
#ifdef OLD_V1
    snprintf(args->error, (size_t)args->error_cap, "v1 run: struct_size=%u remaining_tokens=%u", args->struct_size,
             args->remaining_tokens);
    return KILN_STATUS_ERROR;
#endif
    snprintf(args->error, (size_t)args->error_cap, "always-fails refuses node `%s` (%s) on purpose", args->node_name,
             args->kind);
    return KILN_STATUS_ERROR;
}

const char *const bad_plugin_ops[] = {"matmul", "matmull"};

const kiln_backend_vtable bad_plugin_vtable = {
#ifdef BAD_VERSION
    .abi_version = 99,
#elif defined(OLD_V1)
    .abi_version = 1,
#else
    .abi_version = KILN_BACKEND_ABI_VERSION,
#endif
#ifdef BAD_SIZE
    .struct_size = sizeof(kiln_backend_vtable) - 8,
#else
    .struct_size = sizeof(kiln_backend_vtable),
#endif
    .name = "bad",
#ifdef BAD_UNKNOWN_OP
    .capabilities = KILN_CAP_TENSOR,
    .op_count = 2,
    .ops = bad_plugin_ops,
#else
    .capabilities = KILN_CAP_TENSOR | KILN_CAP_ALL_OPS,
#endif
#ifdef BAD_NO_RUN
    .run = NULL,
#else
    .run = bad_plugin_run,
#endif
};

#ifdef BAD_NO_ENTRY
const kiln_backend_vtable *kiln_backend_entry_misspelt(void) { return &bad_plugin_vtable; }
#elif defined(BAD_NULL_ENTRY)
const kiln_backend_vtable *kiln_backend_entry(uint32_t host_abi_version) {
    (void)host_abi_version;
    return NULL;
}
#elif defined(OLD_V1)
/* Version 1's entry took no argument (declared here without the header's prototype in scope of the call). */
const kiln_backend_vtable *kiln_backend_entry_v1(void) { return &bad_plugin_vtable; }
const kiln_backend_vtable *kiln_backend_entry(uint32_t host_abi_version) __attribute__((alias("kiln_backend_entry_v1")));
#else
const kiln_backend_vtable *kiln_backend_entry(uint32_t host_abi_version) {
    (void)host_abi_version;
    return &bad_plugin_vtable;
}
#endif
