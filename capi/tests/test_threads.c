/* Many threads in one engine at once: each its own batches into its own
 * region of a second engine, plus notifications and status polls racing
 * them; and a destroy racing calls in flight. */
#include <pthread.h>
#include <unistd.h>

#include "harness.h"

#define THREADS 8
#define ROUNDS 20
#define REGION (256u << 10)

static struct {
    mc_engine_t a, b;
    mc_segment_t seg;
    uint8_t *src, *dst;
    char bname[128];
} tt;

static int thread_errors;
static pthread_mutex_t thread_mu = PTHREAD_MUTEX_INITIALIZER;

static void thread_fail(const char *what, mc_status_t st, const char *msg) {
    pthread_mutex_lock(&thread_mu);
    thread_errors++;
    fprintf(stderr, "  thread: %s -> %d %s\n", what, st, msg);
    pthread_mutex_unlock(&thread_mu);
}

static void *writer(void *arg) {
    int id = (int)(intptr_t)arg;
    mc_error_t err;
    mc_status_t st;
    for (int round = 0; round < ROUNDS; round++) {
        uint64_t off = (uint64_t)id * REGION;
        unsigned seed = (unsigned)(id * 100 + round);
        fill(tt.src, off, REGION, seed);
        mc_batch_t b;
        if ((st = mc_engine_allocate_batch(tt.a, 4, &b, &err)) != MC_OK) {
            thread_fail("allocate", st, err.message);
            return NULL;
        }
        /* four requests, a quarter region each */
        mc_request_t r[4];
        for (int i = 0; i < 4; i++)
            r[i] = (mc_request_t){.opcode = MC_OP_WRITE, .local = tt.src + off + i * (REGION / 4), .segment = tt.seg,
                                  .remote_addr = (uint64_t)(uintptr_t)(tt.dst + off + i * (REGION / 4)),
                                  .length = REGION / 4};
        if ((st = mc_engine_submit(tt.a, b, r, 4, &err)) != MC_OK) thread_fail("submit", st, err.message);
        if (round % 2) {
            /* poll like a C++ agent */
            mc_transfer_status_t ts = {0};
            for (int spin = 0; spin < 1000000 && ts.state != MC_TRANSFER_COMPLETED; spin++) {
                if ((st = mc_engine_batch_status(tt.a, b, &ts, &err)) != MC_OK) {
                    thread_fail("status", st, err.message);
                    break;
                }
                if (ts.state > MC_TRANSFER_COMPLETED) break;
            }
            if (ts.state != MC_TRANSFER_COMPLETED) thread_fail("poll", ts.state, "not completed");
        } else if ((st = mc_engine_wait(tt.a, b, 10000, NULL, &err)) != MC_OK) {
            thread_fail("wait", st, err.message);
        }
        if ((st = mc_engine_free_batch(tt.a, b, &err)) != MC_OK) thread_fail("free", st, err.message);
        long long bad = check_pattern(tt.dst, off, REGION, seed);
        if (bad >= 0) thread_fail("bytes", (mc_status_t)bad, "differ");
        /* notifications through the same engine, concurrently */
        if ((st = mc_engine_send_notify(tt.a, tt.seg, "writer", "round", &err)) != MC_OK)
            thread_fail("notify", st, err.message);
    }
    return NULL;
}

void test_threads_one_engine(void) {
    memset(&tt, 0, sizeof tt);
    thread_errors = 0;
    REQUIRE_MC(MC_OK, test_engine("tcp", &tt.a, &E));
    REQUIRE_MC(MC_OK, test_engine("tcp", &tt.b, &E));
    tt.src = malloc(THREADS * REGION);
    tt.dst = malloc(THREADS * REGION);
    CHECK_MC(MC_OK, mc_engine_register_memory(tt.a, tt.src, THREADS * REGION, NULL, 0, &E));
    CHECK_MC(MC_OK, mc_engine_register_memory(tt.b, tt.dst, THREADS * REGION, NULL, 1, &E));
    CHECK_MC(MC_OK, mc_engine_name(tt.b, tt.bname, sizeof tt.bname, NULL, &E));
    CHECK_MC(MC_OK, mc_engine_open_segment(tt.a, tt.bname, &tt.seg, &E));
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++) pthread_create(&th[i], NULL, writer, (void *)(intptr_t)i);
    /* meanwhile: the receiving engine drains notifications */
    size_t got = 0;
    for (int spins = 0; spins < 20000 && got < THREADS * ROUNDS; spins++) {
        mc_notify_t *ns;
        size_t n;
        CHECK_MC(MC_OK, mc_engine_get_notifies(tt.b, &ns, &n, &E));
        got += n;
        mc_notifies_free(ns, n);
        if (got < THREADS * ROUNDS) usleep(500);
    }
    for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
    CHECK_EQ(thread_errors, 0);
    CHECK_EQ(got, THREADS * ROUNDS);
    CHECK_MC(MC_OK, mc_engine_destroy(tt.a, &E));
    CHECK_MC(MC_OK, mc_engine_destroy(tt.b, &E));
    free(tt.src);
    free(tt.dst);
}

/* Threads keep calling into an engine while another destroys it: every
 * call returns (success before, an error after), nothing crashes. */
static volatile int racing;

static void *racer(void *arg) {
    mc_engine_t e = *(mc_engine_t *)arg;
    uint8_t mem[8192];
    while (racing) {
        mc_batch_t b;
        char name[128];
        if (mc_engine_allocate_batch(e, 2, &b, NULL) == MC_OK) {
            mc_request_t r = {.opcode = MC_OP_WRITE, .local = mem, .segment = MC_LOCAL_SEGMENT,
                              .remote_addr = (uint64_t)(uintptr_t)(mem + 4096), .length = 64};
            mc_engine_register_memory(e, mem, sizeof mem, NULL, 1, NULL);
            mc_engine_submit(e, b, &r, 1, NULL);
            mc_engine_wait(e, b, 1000, NULL, NULL);
            mc_engine_free_batch(e, b, NULL);
            mc_engine_unregister_memory(e, mem, NULL);
        }
        mc_engine_name(e, name, sizeof name, NULL, NULL);
        mc_notify_t *ns;
        size_t n;
        if (mc_engine_get_notifies(e, &ns, &n, NULL) == MC_OK) mc_notifies_free(ns, n);
    }
    return NULL;
}

void test_threads_destroy_race(void) {
    for (int round = 0; round < 5; round++) {
        mc_engine_t e;
        REQUIRE_MC(MC_OK, test_engine("tcp", &e, &E));
        racing = 1;
        pthread_t th[4];
        for (int i = 0; i < 4; i++) pthread_create(&th[i], NULL, racer, &e);
        usleep(20000);
        CHECK_MC(MC_OK, mc_engine_destroy(e, &E));
        usleep(5000);
        racing = 0;
        for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
        CHECK_MC(MC_ERR_INVALID_HANDLE, mc_engine_destroy(e, &E));
    }
}
