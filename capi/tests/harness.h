/* A tiny test harness for the C suite of libmooncake.so: CHECK records a
 * failure and goes on, REQUIRE returns from the test. Tests register in
 * main.c; peer processes (peer.c) play the remote side of two-process
 * tests. */
#ifndef MC_TEST_HARNESS_H
#define MC_TEST_HARNESS_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "mooncake.h"

extern int h_failures;
extern int h_checks;
extern const char *h_test;

#define CHECK(cond)                                                                                   \
    do {                                                                                              \
        h_checks++;                                                                                   \
        if (!(cond)) {                                                                                \
            h_failures++;                                                                             \
            fprintf(stderr, "  FAIL %s:%d [%s]: %s\n", __FILE__, __LINE__, h_test, #cond);            \
        }                                                                                             \
    } while (0)

#define CHECK_EQ(a, b)                                                                                \
    do {                                                                                              \
        long long a_ = (long long)(a), b_ = (long long)(b);                                           \
        h_checks++;                                                                                   \
        if (a_ != b_) {                                                                               \
            h_failures++;                                                                             \
            fprintf(stderr, "  FAIL %s:%d [%s]: %s == %s (%lld != %lld)\n", __FILE__, __LINE__, h_test, \
                    #a, #b, a_, b_);                                                                  \
        }                                                                                             \
    } while (0)

/* CHECK_MC runs a mooncake.h call whose last argument is &E (declared by
 * the macro) and checks its status, printing the error message if not. */
#define CHECK_MC(want, call_with_e)                                                                   \
    do {                                                                                              \
        mc_error_t E;                                                                                 \
        memset(&E, 0x5a, sizeof E);                                                                   \
        mc_status_t st_ = (call_with_e);                                                              \
        h_checks++;                                                                                   \
        if (st_ != (want) || E.code != st_) {                                                         \
            h_failures++;                                                                             \
            fprintf(stderr, "  FAIL %s:%d [%s]: %s -> %d (want %d), err.code %d: %.*s\n", __FILE__,   \
                    __LINE__, h_test, #call_with_e, st_, (int)(want), E.code, MC_ERROR_MESSAGE_SIZE,  \
                    E.message);                                                                       \
        } else if (st_ == MC_OK && (E.domain != MC_DOMAIN_NONE || E.message[0] != 0)) {               \
            h_failures++;                                                                             \
            fprintf(stderr, "  FAIL %s:%d [%s]: success left an error behind\n", __FILE__, __LINE__,  \
                    h_test);                                                                          \
        } else if (st_ != MC_OK && (memchr(E.message, 0, sizeof E.message) == NULL || E.message[0] == 0)) { \
            h_failures++;                                                                             \
            fprintf(stderr, "  FAIL %s:%d [%s]: error without a NUL-terminated message\n", __FILE__,  \
                    __LINE__, h_test);                                                                \
        }                                                                                             \
    } while (0)

#define REQUIRE(cond)                                                                                 \
    do {                                                                                              \
        h_checks++;                                                                                   \
        if (!(cond)) {                                                                                \
            h_failures++;                                                                             \
            fprintf(stderr, "  FAIL %s:%d [%s]: required %s\n", __FILE__, __LINE__, h_test, #cond);   \
            return;                                                                                   \
        }                                                                                             \
    } while (0)

/* REQUIRE_MC is CHECK_MC that returns from the test on failure. */
#define REQUIRE_MC(want, call_with_e)                                                                 \
    do {                                                                                              \
        int before_ = h_failures;                                                                     \
        CHECK_MC(want, call_with_e);                                                                  \
        if (h_failures != before_) return;                                                            \
    } while (0)

/* Byte pattern of a seed: what peers fill and check. */
static inline uint8_t pattern(uint64_t i, unsigned seed) { return (uint8_t)((i * 131u + seed * 7u + (i >> 9)) & 0xff); }
void fill(void *p, uint64_t off, uint64_t len, unsigned seed);
/* check_pattern returns -1 when [p+off, p+off+len) holds the pattern of
 * seed, else the offset of the first wrong byte. */
long long check_pattern(const void *p, uint64_t off, uint64_t len, unsigned seed);

/* A peer process: the same test binary run as "--peer MODE", driven by
 * one-line commands (see peer.c). */
typedef struct peer {
    pid_t pid;
    FILE *to;
    FILE *from;
    char name[128];  /* its segment name */
    uint64_t addr;   /* its registered buffer */
    uint64_t len;
} peer_t;

/* peer_start runs a peer in mode "native", "native-auto", "compat" or
 * "compat-auto" and waits for its READY line. */
int peer_start(peer_t *p, const char *mode);
/* peer_cmd sends one command line and reads one reply line into reply. */
int peer_cmd(peer_t *p, char *reply, size_t n, const char *fmt, ...);
/* peer_stop sends QUIT and returns the peer's exit status (0 = clean). */
int peer_stop(peer_t *p);
int peer_main(const char *mode);
/* store_peer_main is peer_main of mode "store" (test_abi.c). */
int store_peer_main(void);

/* mc_engine_create with the settings of the tests: loopback, transport. */
mc_status_t test_engine(const char *transport, mc_engine_t *out, mc_error_t *err);

/* Tests. */
void test_abi_version(void);
void test_native_two_process_tcp(void);
void test_native_two_process_auto(void);
void test_native_notifications(void);
void test_native_loopback_and_local(void);
void test_nixl_sequence(void);
void test_trtllm_sequence(void);
void test_compat_cross_api(void);
void test_compat_register_after_open(void);
void test_bad_handles(void);
void test_bad_arguments(void);
void test_silent_peer(void);
void test_use_after_destroy(void);
void test_compat_bad_input(void);
void test_panic_recovered(void);
void test_threads_one_engine(void);
void test_threads_destroy_race(void);
void test_store_basic(void);
void test_store_buffers(void);
void test_store_batches(void);
void test_store_bad_input(void);
void test_store_threads(void);
void test_store_parts(void);
void test_store_put_session(void);
void test_store_report_existing(void);
void test_store_close_race(void);
void test_struct_versions(void);
void test_store_struct_versions(void);
void test_store_tenants(void);
void test_store_stripes(void);
void test_destroy_cancels(void);
void test_store_silent_peer(void);
void test_store_device(void);
void test_engine_device(void);
void test_copy_device(void);
void test_no_leaks(void);

#endif
