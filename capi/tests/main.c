/* capi_test: the C test suite of libmooncake.so. Run with no arguments for
 * every test, or name tests to run. "--peer MODE" is the remote side of
 * the two-process tests (peer.c), "--fork MODE" the process of a fork test
 * (test_fork.c). Store tests need MC_TEST_MASTER (the master address of a
 * running store; scripts/test-capi.sh starts one). */
#include <stdarg.h>
#include <string.h>
#include <time.h>

#include "harness.h"

/* test_fork.c */
void test_fork_before_use(void);
void test_fork_after_use(void);
void test_copy_shares_runtime(void);
void test_other_build_refused(void);
int fork_main(const char *mode);

int h_failures, h_checks;
const char *h_test = "";

void fill(void *p, uint64_t off, uint64_t len, unsigned seed) {
    uint8_t *b = (uint8_t *)p + off;
    for (uint64_t i = 0; i < len; i++) b[i] = pattern(off + i, seed);
}

long long check_pattern(const void *p, uint64_t off, uint64_t len, unsigned seed) {
    const uint8_t *b = (const uint8_t *)p + off;
    for (uint64_t i = 0; i < len; i++)
        if (b[i] != pattern(off + i, seed)) return (long long)(off + i);
    return -1;
}

mc_status_t test_engine(const char *transport, mc_engine_t *out, mc_error_t *err) {
    mc_engine_config_t cfg;
    mc_engine_config_init(&cfg);
    cfg.host = "127.0.0.1";
    cfg.transport = transport;
    cfg.timeout_ms = 10000;
    return mc_engine_create(&cfg, out, err);
}

static const struct {
    const char *name;
    void (*fn)(void);
    int store; /* needs MC_TEST_MASTER */
} tests[] = {
    {"abi_version", test_abi_version, 0},
    {"native_two_process_tcp", test_native_two_process_tcp, 0},
    {"native_two_process_auto", test_native_two_process_auto, 0},
    {"native_notifications", test_native_notifications, 0},
    {"native_loopback_and_local", test_native_loopback_and_local, 0},
    {"nixl_sequence", test_nixl_sequence, 0},
    {"trtllm_sequence", test_trtllm_sequence, 0},
    {"compat_cross_api", test_compat_cross_api, 0},
    {"compat_register_after_open", test_compat_register_after_open, 0},
    {"bad_handles", test_bad_handles, 0},
    {"bad_arguments", test_bad_arguments, 0},
    {"silent_peer", test_silent_peer, 0},
    {"use_after_destroy", test_use_after_destroy, 0},
    {"compat_bad_input", test_compat_bad_input, 0},
    {"panic_recovered", test_panic_recovered, 0},
    {"threads_one_engine", test_threads_one_engine, 0},
    {"threads_destroy_race", test_threads_destroy_race, 0},
    {"store_basic", test_store_basic, 1},
    {"store_buffers", test_store_buffers, 1},
    {"store_batches", test_store_batches, 1},
    {"store_bad_input", test_store_bad_input, 0},
    {"store_threads", test_store_threads, 1},
    {"store_parts", test_store_parts, 1},
    {"store_put_session", test_store_put_session, 1},
    {"store_report_existing", test_store_report_existing, 1},
    {"store_close_race", test_store_close_race, 1},
    {"struct_versions", test_struct_versions, 0},
    {"store_struct_versions", test_store_struct_versions, 1},
    {"store_tenants", test_store_tenants, 1},
    {"store_stripes", test_store_stripes, 1},
    {"destroy_cancels", test_destroy_cancels, 0},
    {"store_silent_peer", test_store_silent_peer, 1},
    {"store_device", test_store_device, 1},
    {"engine_device", test_engine_device, 0},
    {"copy_device", test_copy_device, 0},
    {"fork_before_use", test_fork_before_use, 0},
    {"fork_after_use", test_fork_after_use, 0},
    {"copy_shares_runtime", test_copy_shares_runtime, 0},
    {"other_build_refused", test_other_build_refused, 0},
    /* last: every handle the tests made is gone */
    {"no_leaks", test_no_leaks, 0},
};

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--peer") == 0) return peer_main(argv[2]);
    if (argc == 3 && strcmp(argv[1], "--fork") == 0) return fork_main(argv[2]);
    int ran = 0, failed = 0, skipped = 0;
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
        int wanted = argc == 1;
        for (int a = 1; a < argc; a++)
            if (strcmp(argv[a], tests[i].name) == 0) wanted = 1;
        if (!wanted) continue;
        if (tests[i].store && getenv("MC_TEST_MASTER") == NULL) {
            printf("SKIP %s (MC_TEST_MASTER is not set)\n", tests[i].name);
            skipped++;
            continue;
        }
        h_test = tests[i].name;
        int before = h_failures;
        double t0 = now();
        printf("RUN  %s\n", tests[i].name);
        fflush(stdout);
        tests[i].fn();
        ran++;
        if (h_failures != before) {
            failed++;
            printf("FAIL %s (%.2fs)\n", tests[i].name, now() - t0);
        } else {
            printf("ok   %s (%.2fs)\n", tests[i].name, now() - t0);
        }
        fflush(stdout);
    }
    printf("%d tests, %d failed, %d skipped, %d checks\n", ran, failed, skipped, h_checks);
    return failed ? 1 : 0;
}
