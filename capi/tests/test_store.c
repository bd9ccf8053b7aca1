/* The store API against a real store: MC_TEST_MASTER is the address of a
 * running master with at least one storage node (scripts/test-capi.sh
 * starts `mooncake up`). */
#include <pthread.h>
#include <stdint.h>
#include <unistd.h>

#include "harness.h"

/* Mooncake's local_hostname, as "host" or "host:port" */
static const char *store_host = "127.0.0.1";

static mc_status_t open_store(mc_store_t *s, mc_engine_t engine, mc_error_t *err) {
    mc_store_config_t cfg;
    mc_store_config_init(&cfg);
    cfg.master = getenv("MC_TEST_MASTER");
    cfg.local_hostname = store_host;
    cfg.protocol = "tcp";
    cfg.segment_size = 16 << 20;
    cfg.local_buffer_size = 16 << 20;
    cfg.engine = engine;
    return mc_store_create(&cfg, s, err);
}

static void unique_key(char *out, size_t n, const char *what) {
    static int seq;
    snprintf(out, n, "capi-%d-%s-%d", (int)getpid(), what, __sync_add_and_fetch(&seq, 1));
}

void test_store_basic(void) {
    mc_store_t s = 0;
    REQUIRE_MC(MC_OK, open_store(&s, 0, &E));
    CHECK(s != 0);
    char name[128], key[96];
    CHECK_MC(MC_OK, mc_store_name(s, name, sizeof name, NULL, &E));
    CHECK(strncmp(name, "127.0.0.1:", 10) == 0);

    /* put / exist / size / get */
    unique_key(key, sizeof key, "basic");
    uint8_t val[100000], out[100000];
    fill(val, 0, sizeof val, 50);
    int32_t ex = -1;
    CHECK_MC(MC_OK, mc_store_exist(s, key, &ex, &E));
    CHECK_EQ(ex, 0);
    CHECK_MC(MC_OK, mc_store_put(s, key, val, sizeof val, NULL, &E));
    CHECK_MC(MC_OK, mc_store_exist(s, key, &ex, &E));
    CHECK_EQ(ex, 1);
    uint64_t n = 0;
    CHECK_MC(MC_OK, mc_store_get_size(s, key, &n, &E));
    CHECK_EQ(n, sizeof val);
    memset(out, 0, sizeof out);
    CHECK_MC(MC_OK, mc_store_get(s, key, out, sizeof out, &n, &E));
    CHECK_EQ(n, sizeof val);
    CHECK(memcmp(out, val, sizeof val) == 0);
    /* get with no buffer asks the size; a short buffer gets it too */
    CHECK_MC(MC_ERR_BUFFER_TOO_SMALL, mc_store_get(s, key, NULL, 0, &n, &E));
    CHECK_EQ(n, sizeof val);
    CHECK_MC(MC_ERR_BUFFER_TOO_SMALL, mc_store_get(s, key, out, 10, &n, &E));
    CHECK_EQ(n, sizeof val);
    /* get_into: a short buffer is invalid params */
    CHECK_MC(MC_STORE_ERR_INVALID_PARAMS, mc_store_get_into(s, key, out, 10, &n, &E));
    memset(out, 0, sizeof out);
    CHECK_MC(MC_OK, mc_store_get_into(s, key, out, sizeof out, &n, &E));
    CHECK(memcmp(out, val, sizeof val) == 0);

    /* write-once put, upsert replaces */
    uint8_t other[5000];
    fill(other, 0, sizeof other, 51);
    CHECK_MC(MC_OK, mc_store_put(s, key, other, sizeof other, NULL, &E));
    CHECK_MC(MC_OK, mc_store_get(s, key, out, sizeof out, &n, &E));
    CHECK_EQ(n, sizeof val);
    CHECK_MC(MC_OK, mc_store_upsert(s, key, other, sizeof other, NULL, &E));
    CHECK_MC(MC_OK, mc_store_get(s, key, out, sizeof out, &n, &E));
    CHECK_EQ(n, sizeof other);
    CHECK(memcmp(out, other, sizeof other) == 0);

    /* replicate config */
    mc_replicate_config_t rc;
    mc_replicate_config_init(&rc);
    rc.replicas = 1;
    rc.soft_pin = 1;
    const char *pref[1] = {name};
    rc.preferred_segments = pref;
    rc.n_preferred = 1;
    char key2[96];
    unique_key(key2, sizeof key2, "pinned");
    CHECK_MC(MC_OK, mc_store_put(s, key2, val, 4096, &rc, &E));
    CHECK_MC(MC_OK, mc_store_get(s, key2, out, sizeof out, &n, &E));
    CHECK_EQ(n, 4096);

    /* remove: a fresh read leases the object; force removes anyway */
    mc_error_t err;
    mc_status_t st = mc_store_remove(s, key, 0, &err);
    CHECK(st == MC_OK || st == MC_STORE_ERR_OBJECT_HAS_LEASE);
    CHECK_MC(MC_OK, mc_store_remove(s, key2, 1, &E));
    if (st == MC_STORE_ERR_OBJECT_HAS_LEASE) CHECK_MC(MC_OK, mc_store_remove(s, key, 1, &E));
    CHECK_MC(MC_STORE_ERR_OBJECT_NOT_FOUND, mc_store_remove(s, key, 1, &E));
    CHECK_EQ(mc_store_get(s, key, out, sizeof out, &n, &err), MC_STORE_ERR_OBJECT_NOT_FOUND);
    CHECK_EQ(err.domain, MC_DOMAIN_STORE);
    CHECK_MC(MC_OK, mc_store_exist(s, key, &ex, &E));
    CHECK_EQ(ex, 0);
    CHECK_MC(MC_STORE_ERR_OBJECT_NOT_FOUND, mc_store_get_size(s, key, &n, &E));

    /* remove_by_regex: only the keys the pattern matches go */
    char pfx[64], ka[96], kb[96], keep[96], pat[80];
    unique_key(pfx, sizeof pfx, "rx");
    snprintf(ka, sizeof ka, "%s-a", pfx);
    snprintf(kb, sizeof kb, "%s-b", pfx);
    snprintf(keep, sizeof keep, "x%s-a", pfx);
    snprintf(pat, sizeof pat, "^%s-[ab]$", pfx);
    CHECK_MC(MC_OK, mc_store_put(s, ka, val, 100, NULL, &E));
    CHECK_MC(MC_OK, mc_store_put(s, kb, val, 100, NULL, &E));
    CHECK_MC(MC_OK, mc_store_put(s, keep, val, 100, NULL, &E));
    uint64_t rx = 99;
    CHECK_MC(MC_OK, mc_store_remove_by_regex(s, pat, 0, &rx, &E));
    CHECK_EQ(rx, 2);
    CHECK_MC(MC_OK, mc_store_exist(s, ka, &ex, &E));
    CHECK_EQ(ex, 0);
    CHECK_MC(MC_OK, mc_store_exist(s, keep, &ex, &E));
    CHECK_EQ(ex, 1);
    CHECK_MC(MC_OK, mc_store_remove_by_regex(s, pat, 1, NULL, &E));
    /* batch_remove: one code per key, the first failure returned */
    const char *bkeys[] = {keep, ka};
    mc_status_t bcodes[2] = {-1, -1};
    CHECK_MC(MC_STORE_ERR_OBJECT_NOT_FOUND, mc_store_batch_remove(s, bkeys, 2, 1, bcodes, &E));
    CHECK_EQ(bcodes[0], MC_OK);
    CHECK_EQ(bcodes[1], MC_STORE_ERR_OBJECT_NOT_FOUND);
    CHECK_MC(MC_OK, mc_store_exist(s, keep, &ex, &E));
    CHECK_EQ(ex, 0);
    CHECK_MC(MC_OK, mc_store_put(s, keep, val, 100, NULL, &E));
    CHECK_MC(MC_OK, mc_store_batch_remove(s, bkeys, 0, 1, NULL, &E));
    CHECK_MC(MC_STORE_ERR_INVALID_PARAMS, mc_store_remove_by_regex(s, "(", 1, &rx, &E));
    CHECK_MC(MC_STORE_ERR_INVALID_PARAMS, mc_store_remove_by_regex(s, "", 1, &rx, &E));
    CHECK_MC(MC_ERR_NULL_ARGUMENT, mc_store_remove_by_regex(s, NULL, 1, &rx, &E));
    CHECK_MC(MC_OK, mc_store_exist(s, keep, &ex, &E));
    CHECK_EQ(ex, 1);

    /* remove_all */
    char k3[96];
    unique_key(k3, sizeof k3, "all");
    CHECK_MC(MC_OK, mc_store_put(s, k3, val, 1000, NULL, &E));
    uint64_t removed = 0;
    CHECK_MC(MC_OK, mc_store_remove_all(s, 1, &removed, &E));
    CHECK(removed >= 1);
    CHECK_MC(MC_OK, mc_store_exist(s, k3, &ex, &E));
    CHECK_EQ(ex, 0);

    CHECK_MC(MC_OK, mc_store_close(s, &E));
    CHECK_MC(MC_ERR_INVALID_HANDLE, mc_store_close(s, &E));
}

/* Registered buffers: put_from and get_into move bytes without staging;
 * put_from of unregistered memory is refused. A store that adopts an
 * engine handle. */
void test_store_buffers(void) {
    mc_engine_t e = 0;
    REQUIRE_MC(MC_OK, test_engine(NULL, &e, &E));
    mc_store_t s = 0;
    REQUIRE_MC(MC_OK, open_store(&s, e, &E));
    size_t len = 4u << 20;
    uint8_t *buf = NULL, *loose = malloc(4096);
    REQUIRE(posix_memalign((void **)&buf, 4096, len) == 0);
    CHECK_MC(MC_OK, mc_store_register_buffer(s, buf, len, &E));
    char key[96];
    unique_key(key, sizeof key, "from");
    fill(buf, 0, 1u << 20, 60);
    CHECK_MC(MC_OK, mc_store_put_from(s, key, buf, 1u << 20, NULL, &E));
    CHECK_MC(MC_OK, mc_store_put_from(s, key, buf + 10, 100, NULL, &E)); /* inside the buffer: fine */
    CHECK_MC(MC_STORE_ERR_INVALID_PARAMS, mc_store_put_from(s, key, loose, 4096, NULL, &E));
    uint64_t n = 0;
    CHECK_MC(MC_OK, mc_store_get_into(s, key, buf + (2u << 20), 2u << 20, &n, &E));
    CHECK_EQ(n, 1u << 20);
    CHECK(memcmp(buf, buf + (2u << 20), 1u << 20) == 0);
    /* get_into unregistered memory goes through the staging buffer */
    uint8_t *plain = malloc(1u << 20);
    CHECK_MC(MC_OK, mc_store_get_into(s, key, plain, 1u << 20, NULL, &E));
    CHECK(memcmp(buf, plain, 1u << 20) == 0);
    /* register twice overlaps; unregister unknown */
    CHECK_MC(MC_STORE_ERR_INVALID_PARAMS, mc_store_register_buffer(s, buf + 4096, 4096, &E));
    CHECK_MC(MC_STORE_ERR_INVALID_PARAMS, mc_store_unregister_buffer(s, loose, &E));
    CHECK_MC(MC_OK, mc_store_unregister_buffer(s, buf, &E));
    CHECK_MC(MC_STORE_ERR_INVALID_PARAMS, mc_store_put_from(s, key, buf, 100, NULL, &E));
    CHECK_MC(MC_OK, mc_store_remove(s, key, 1, &E));
    CHECK_MC(MC_OK, mc_store_close(s, &E));
    /* the adopted engine is the caller's: still alive */
    char name[128];
    CHECK_MC(MC_OK, mc_engine_name(e, name, sizeof name, NULL, &E));
    CHECK_MC(MC_OK, mc_engine_destroy(e, &E));
    free(buf);
    free(loose);
    free(plain);
}

#define NB 16

void test_store_batches(void) {
    mc_store_t s = 0;
    store_host = "127.0.0.1:0";
    REQUIRE_MC(MC_OK, open_store(&s, 0, &E));
    store_host = "127.0.0.1";
    char keys_buf[NB][96];
    const char *keys[NB];
    const void *vals[NB];
    void *dsts[NB];
    uint64_t lens[NB], caps[NB], got[NB];
    mc_status_t codes[NB];
    int32_t ex[NB];
    uint8_t *src = malloc(NB * 65536), *dst = malloc(NB * 65536);
    for (int i = 0; i < NB; i++) {
        unique_key(keys_buf[i], sizeof keys_buf[i], "batch");
        keys[i] = keys_buf[i];
        lens[i] = 1000 + (uint64_t)i * 3000;
        vals[i] = src + i * 65536;
        dsts[i] = dst + i * 65536;
        caps[i] = 65536;
        fill(src, (uint64_t)i * 65536, lens[i], 70 + i);
    }
    /* batch_exist before: none */
    CHECK_MC(MC_OK, mc_store_batch_exist(s, keys, NB, ex, codes, &E));
    for (int i = 0; i < NB; i++) CHECK_EQ(ex[i], 0);
    /* batch_put of the first half (any memory) */
    CHECK_MC(MC_OK, mc_store_batch_put(s, keys, vals, lens, NB / 2, NULL, codes, &E));
    for (int i = 0; i < NB / 2; i++) CHECK_EQ(codes[i], MC_OK);
    /* batch_put_from of the second half: registered memory */
    CHECK_MC(MC_OK, mc_store_register_buffer(s, src, NB * 65536, &E));
    CHECK_MC(MC_OK, mc_store_batch_put_from(s, keys + NB / 2, vals + NB / 2, lens + NB / 2, NB / 2, NULL, codes, &E));
    CHECK_MC(MC_OK, mc_store_batch_exist(s, keys, NB, ex, NULL, &E));
    for (int i = 0; i < NB; i++) CHECK_EQ(ex[i], 1);
    /* batch_get_into all, with one missing key and one short buffer */
    char missing[96];
    unique_key(missing, sizeof missing, "missing");
    const char *k2[NB];
    memcpy(k2, keys, sizeof k2);
    k2[3] = missing;
    caps[5] = 10;
    memset(dst, 0, NB * 65536);
    mc_error_t err;
    mc_status_t st = mc_store_batch_get_into(s, k2, dsts, caps, NB, got, codes, &err);
    CHECK_EQ(st, MC_STORE_ERR_OBJECT_NOT_FOUND); /* the first failure */
    CHECK(strstr(err.message, missing) != NULL);
    for (int i = 0; i < NB; i++) {
        if (i == 3) {
            CHECK_EQ(codes[i], MC_STORE_ERR_OBJECT_NOT_FOUND);
            CHECK_EQ(got[i], 0);
        } else if (i == 5) {
            CHECK_EQ(codes[i], MC_STORE_ERR_INVALID_PARAMS);
        } else {
            CHECK_EQ(codes[i], MC_OK);
            CHECK_EQ(got[i], lens[i]);
            CHECK_EQ(check_pattern(dst, (uint64_t)i * 65536, lens[i], 70 + i), -1);
        }
    }
    caps[5] = 65536;
    /* batch_upsert replaces; batch_put_from of unregistered memory fails
     * per key */
    for (int i = 0; i < NB; i++) fill(src, (uint64_t)i * 65536, lens[i], 90 + i);
    CHECK_MC(MC_OK, mc_store_batch_upsert(s, keys, vals, lens, NB, NULL, codes, &E));
    CHECK_MC(MC_OK, mc_store_batch_get_into(s, keys, dsts, caps, NB, got, codes, &E));
    for (int i = 0; i < NB; i++) CHECK_EQ(check_pattern(dst, (uint64_t)i * 65536, lens[i], 90 + i), -1);
    const void *mixed[2] = {src, dst};
    char kk[2][96];
    unique_key(kk[0], sizeof kk[0], "mixed");
    unique_key(kk[1], sizeof kk[1], "mixed");
    const char *mk[2] = {kk[0], kk[1]};
    uint64_t ml[2] = {100, 100};
    CHECK_MC(MC_STORE_ERR_INVALID_PARAMS, mc_store_batch_put_from(s, mk, mixed, ml, 2, NULL, codes, &E));
    CHECK_EQ(codes[0], MC_OK);
    CHECK_EQ(codes[1], MC_STORE_ERR_INVALID_PARAMS);
    /* empty batches are no-ops */
    CHECK_MC(MC_OK, mc_store_batch_put(s, NULL, NULL, NULL, 0, NULL, NULL, &E));
    CHECK_MC(MC_OK, mc_store_batch_exist(s, NULL, 0, NULL, NULL, &E));
    for (int i = 0; i < NB; i++) CHECK_MC(MC_OK, mc_store_remove(s, keys[i], 1, &E));
    CHECK_MC(MC_OK, mc_store_remove(s, kk[0], 1, &E));
    CHECK_MC(MC_OK, mc_store_unregister_buffer(s, src, &E));
    CHECK_MC(MC_OK, mc_store_close(s, &E));
    free(src);
    free(dst);
}

/* Bad input to the store API that needs no running store. */
void test_store_bad_input(void) {
    mc_store_t s = 77;
    mc_store_config_t cfg;
    CHECK_MC(MC_ERR_NULL_ARGUMENT, mc_store_create(NULL, &s, &E));
    mc_store_config_init(&cfg);
    CHECK_MC(MC_ERR_NULL_ARGUMENT, mc_store_create(&cfg, NULL, &E));
    CHECK_MC(MC_STORE_ERR_INVALID_PARAMS, mc_store_create(&cfg, &s, &E)); /* no master */
    CHECK_EQ(s, 0);
    cfg.master = "127.0.0.1:1";
    cfg.struct_size = 4;
    CHECK_MC(MC_ERR_STRUCT_SIZE, mc_store_create(&cfg, &s, &E));
    mc_store_config_init(&cfg);
    cfg.master = "127.0.0.1:1";
    cfg.protocol = "carrier-pigeon";
    CHECK_MC(MC_STORE_ERR_INVALID_PARAMS, mc_store_create(&cfg, &s, &E));
    cfg.protocol = NULL;
    cfg.segment_size = -5; /* below zero means none */
    cfg.local_buffer_size = -1;
    CHECK_MC(MC_STORE_ERR_INVALID_PARAMS, mc_store_create(&cfg, &s, &E));
    mc_store_config_init(&cfg);
    cfg.master = "127.0.0.1:1";
    cfg.engine = 0x5151; /* not an engine */
    CHECK_MC(MC_ERR_INVALID_HANDLE, mc_store_create(&cfg, &s, &E));
    mc_store_config_init(&cfg);
    cfg.master = "etcd://";
    CHECK_MC(MC_STORE_ERR_INVALID_PARAMS, mc_store_create(&cfg, &s, &E));
}

/* Bad arguments on a live store. */
static void store_bad_arguments(mc_store_t s) {
    uint8_t v[16];
    uint64_t n;
    int32_t ex;
    CHECK_MC(MC_ERR_NULL_ARGUMENT, mc_store_put(s, NULL, v, 16, NULL, &E));
    CHECK_MC(MC_ERR_NULL_ARGUMENT, mc_store_put(s, "k", NULL, 16, NULL, &E));
    CHECK_MC(MC_STORE_ERR_INVALID_PARAMS, mc_store_put(s, "k", v, 0, NULL, &E));
    CHECK_MC(MC_STORE_ERR_INVALID_PARAMS, mc_store_put(s, "", v, 16, NULL, &E));
    mc_replicate_config_t rc;
    mc_replicate_config_init(&rc);
    rc.struct_size = 3;
    CHECK_MC(MC_ERR_STRUCT_SIZE, mc_store_put(s, "k", v, 16, &rc, &E));
    mc_replicate_config_init(&rc);
    rc.n_preferred = 2;
    CHECK_MC(MC_ERR_NULL_ARGUMENT, mc_store_put(s, "k", v, 16, &rc, &E));
    CHECK_MC(MC_ERR_NULL_ARGUMENT, mc_store_get(s, NULL, v, 16, &n, &E));
    CHECK_MC(MC_ERR_NULL_ARGUMENT, mc_store_get(s, "k", v, 16, NULL, &E));
    CHECK_MC(MC_ERR_NULL_ARGUMENT, mc_store_get(s, "k", NULL, 16, &n, &E));
    CHECK_MC(MC_ERR_NULL_ARGUMENT, mc_store_get_into(s, "k", NULL, 16, &n, &E));
    CHECK_MC(MC_ERR_NULL_ARGUMENT, mc_store_exist(s, "k", NULL, &E));
    CHECK_MC(MC_ERR_NULL_ARGUMENT, mc_store_get_size(s, NULL, &n, &E));
    CHECK_MC(MC_ERR_NULL_ARGUMENT, mc_store_remove(s, NULL, 0, &E));
    CHECK_MC(MC_ERR_NULL_ARGUMENT, mc_store_register_buffer(s, NULL, 10, &E));
    CHECK_MC(MC_STORE_ERR_INVALID_PARAMS, mc_store_register_buffer(s, v, 0, &E));
    CHECK_MC(MC_ERR_NULL_ARGUMENT, mc_store_unregister_buffer(s, NULL, &E));
    const char *keys[2] = {"a", NULL};
    const void *vals[2] = {v, v};
    uint64_t lens[2] = {16, 16};
    CHECK_MC(MC_ERR_NULL_ARGUMENT, mc_store_batch_put(s, keys, vals, lens, 2, NULL, NULL, &E));
    CHECK_MC(MC_ERR_NULL_ARGUMENT, mc_store_batch_put(s, NULL, vals, lens, 2, NULL, NULL, &E));
    keys[1] = "b";
    CHECK_MC(MC_ERR_NULL_ARGUMENT, mc_store_batch_put(s, keys, vals, NULL, 2, NULL, NULL, &E));
    CHECK_MC(MC_STORE_ERR_INVALID_PARAMS, mc_store_batch_put(s, keys, vals, lens, (size_t)1 << 40, NULL, NULL, &E));
    CHECK_MC(MC_ERR_NULL_ARGUMENT, mc_store_batch_exist(s, keys, 2, NULL, NULL, &E));
    CHECK_MC(MC_ERR_NULL_ARGUMENT, mc_store_batch_get_into(s, keys, NULL, lens, 2, NULL, NULL, &E));
    char small[3];
    size_t need;
    CHECK_MC(MC_ERR_BUFFER_TOO_SMALL, mc_store_name(s, small, sizeof small, &need, &E));
    CHECK(need > 3);
    CHECK_MC(MC_OK, mc_store_exist(s, "never-put-key", &ex, &E));
    CHECK_EQ(ex, 0);
}

/* Threads share one store: puts and gets of their own keys at once. */
static mc_store_t shared_store;
static int store_thread_errors;

static void *store_worker(void *arg) {
    int id = (int)(intptr_t)arg;
    uint8_t val[20000], out[20000];
    for (int i = 0; i < 20; i++) {
        char key[96];
        snprintf(key, sizeof key, "capi-%d-thread-%d-%d", (int)getpid(), id, i);
        fill(val, 0, sizeof val, (unsigned)(id * 50 + i));
        mc_error_t err;
        uint64_t n = 0;
        if (mc_store_put(shared_store, key, val, sizeof val, NULL, &err) != MC_OK ||
            mc_store_get(shared_store, key, out, sizeof out, &n, &err) != MC_OK || n != sizeof val ||
            memcmp(val, out, sizeof val) != 0 || mc_store_remove(shared_store, key, 1, &err) != MC_OK) {
            fprintf(stderr, "  store thread %d round %d: %s\n", id, i, err.message);
            __sync_add_and_fetch(&store_thread_errors, 1);
        }
    }
    return NULL;
}

void test_store_threads(void) {
    REQUIRE_MC(MC_OK, open_store(&shared_store, 0, &E));
    store_bad_arguments(shared_store);
    pthread_t th[6];
    for (int i = 0; i < 6; i++) pthread_create(&th[i], NULL, store_worker, (void *)(intptr_t)i);
    for (int i = 0; i < 6; i++) pthread_join(th[i], NULL);
    CHECK_EQ(store_thread_errors, 0);
    CHECK_MC(MC_OK, mc_store_close(shared_store, &E));
    /* closed: stale */
    uint64_t n;
    CHECK_MC(MC_ERR_INVALID_HANDLE, mc_store_get_size(shared_store, "k", &n, &E));
}

/* Values made of parts (ABI 1.1): put from several registered buffers per
 * key, read whole or into another layout of parts; guards between parts
 * stay untouched; unregistered parts and short layouts are refused. */
/* ABI 1.3: ranged reads, get sessions and replica descriptors. The value
 * holds the pattern of seed 41 (byte i is pattern(i, 41)), so the bytes a
 * range at src reads are checked against pattern(src + j, 41). */
static int range_holds(const uint8_t *dst, uint64_t src, uint64_t n) {
    for (uint64_t j = 0; j < n; j++)
        if (dst[j] != pattern(src + j, 41)) return 0;
    return 1;
}

static void store_ranges(mc_store_t s) {
    CHECK((mc_abi_version() & 0xffff) >= 3);
    char kb[2][96];
    unique_key(kb[0], sizeof kb[0], "ranges");
    unique_key(kb[1], sizeof kb[1], "ranges-missing");
    const char *keys[2] = {kb[0], kb[1]};
    uint64_t vlen = 300000;
    uint8_t *val = malloc(vlen), *dst = malloc(65536);
    fill(val, 0, vlen, 41);
    CHECK_MC(MC_OK, mc_store_put(s, kb[0], val, vlen, NULL, &E));

    /* session start: the present key is readable, the other is not */
    mc_status_t codes[2] = {-1, -1};
    CHECK_MC(MC_STORE_ERR_OBJECT_NOT_FOUND, mc_store_batch_get_session_start(s, keys, 2, codes, &E));
    CHECK_EQ(codes[0], MC_OK);
    CHECK_EQ(codes[1], MC_STORE_ERR_OBJECT_NOT_FOUND);

    /* three ranges of key 0 (one ending at the value's end), one of key 1 */
    memset(dst, 0xee, 65536);
    void *bufs[4] = {dst, dst + 1000, dst + 20000, dst + 60000};
    uint64_t lens[4] = {10, 4096, 1000, 8};
    uint64_t srcs[4] = {0, 123457, vlen - 1000, 0};
    size_t counts[2] = {3, 1};
    uint64_t got[2] = {77, 77};
    CHECK_MC(MC_STORE_ERR_OBJECT_NOT_FOUND,
             mc_store_batch_get_ranges(s, keys, bufs, lens, srcs, counts, 2, got, codes, &E));
    CHECK_EQ(codes[0], MC_OK);
    CHECK_EQ(got[0], 10 + 4096 + 1000);
    CHECK_EQ(codes[1], MC_STORE_ERR_OBJECT_NOT_FOUND);
    CHECK_EQ(got[1], 0);
    for (int j = 0; j < 3; j++) CHECK(range_holds(bufs[j], srcs[j], lens[j]));
    CHECK_EQ(dst[10], 0xee); /* nothing past a range */
    CHECK_EQ(dst[60000], 0xee); /* nor for the failed key */
    /* a range past the end fails the key */
    uint64_t past = vlen - 5;
    CHECK_MC(MC_STORE_ERR_INVALID_PARAMS, mc_store_batch_get_ranges(s, keys, bufs, lens, &past, counts + 1, 1, got, codes, &E));
    CHECK_MC(MC_ERR_NULL_ARGUMENT, mc_store_batch_get_ranges(s, keys, bufs, lens, NULL, counts, 1, got, codes, &E));
    CHECK_MC(MC_OK, mc_store_batch_get_ranges(s, NULL, NULL, NULL, NULL, NULL, 0, NULL, NULL, &E));
    CHECK_MC(MC_OK, mc_store_batch_get_session_end(s, keys, 2, &E));

    /* replicas: one, complete, in memory of this store's segment */
    mc_replica_desc_t reps[2];
    size_t nrep = 0;
    char name[128];
    CHECK_MC(MC_OK, mc_store_get_replicas(s, kb[0], reps, 2, &nrep, &E));
    CHECK_EQ(nrep, 1);
    CHECK_EQ(reps[0].kind, MC_REPLICA_MEMORY);
    CHECK_EQ(reps[0].status, 3);
    CHECK_EQ(reps[0].size, vlen);
    CHECK(reps[0].buffer_address != 0);
    CHECK_MC(MC_OK, mc_store_name(s, name, sizeof name, NULL, &E));
    CHECK(reps[0].segment_name[0] != 0 && reps[0].transport_endpoint[0] != 0);
    CHECK_MC(MC_ERR_BUFFER_TOO_SMALL, mc_store_get_replicas(s, kb[0], NULL, 0, &nrep, &E));
    CHECK_EQ(nrep, 1);
    CHECK_MC(MC_STORE_ERR_OBJECT_NOT_FOUND, mc_store_get_replicas(s, kb[1], reps, 2, &nrep, &E));
    CHECK_EQ(nrep, 0);
    CHECK_MC(MC_ERR_NULL_ARGUMENT, mc_store_get_replicas(s, NULL, reps, 2, &nrep, &E));

    CHECK_MC(MC_OK, mc_store_remove(s, kb[0], 1, &E));
    free(val);
    free(dst);
}

void test_store_parts(void) {
    CHECK((mc_abi_version() & 0xffff) >= 1);
    mc_store_t s = 0;
    REQUIRE_MC(MC_OK, open_store(&s, 0, &E));
    size_t len = 2u << 20;
    uint8_t *src = NULL, *dst = NULL, *loose = malloc(4096);
    REQUIRE(posix_memalign((void **)&src, 4096, len) == 0);
    REQUIRE(posix_memalign((void **)&dst, 4096, len) == 0);
    CHECK_MC(MC_OK, mc_store_register_buffer(s, src, len, &E));
    CHECK_MC(MC_OK, mc_store_register_buffer(s, dst, len, &E));

    /* key 0: 3 parts; key 1: one; key 2: four, one of them empty (NULL) */
    char kb[3][96];
    const char *keys[3];
    for (int i = 0; i < 3; i++) {
        unique_key(kb[i], sizeof kb[i], "parts");
        keys[i] = kb[i];
    }
    const void *parts[8] = {src + 1, src + 10, src + 5000, src + 70000, src + 200000, NULL, src + 210000, src + 250000};
    uint64_t plens[8] = {1, 4097, 60000, 100000, 7, 0, 33333, 5};
    size_t counts[3] = {3, 1, 4};
    uint64_t totals[3] = {1 + 4097 + 60000, 100000, 7 + 33333 + 5};
    for (int j = 0; j < 8; j++)
        if (plens[j]) fill((void *)parts[j], 0, plens[j], 200 + j);
    mc_status_t codes[3] = {-1, -1, -1};
    CHECK_MC(MC_OK, mc_store_batch_put_from_parts(s, keys, parts, plens, counts, 3, NULL, codes, &E));
    for (int i = 0; i < 3; i++) CHECK_EQ(codes[i], MC_OK);

    /* a whole read of key 0 is the concatenation */
    uint8_t *whole = malloc(totals[0]);
    uint64_t n = 0;
    CHECK_MC(MC_OK, mc_store_get(s, keys[0], whole, totals[0], &n, &E));
    CHECK_EQ(n, totals[0]);
    CHECK(memcmp(whole, src + 1, 1) == 0);
    CHECK(memcmp(whole + 1, src + 10, 4097) == 0);
    CHECK(memcmp(whole + 4098, src + 5000, 60000) == 0);

    /* read into another layout: key 0 in two parts, key 1 in three (with a
     * spare tail), key 2 in one; 0xee guards around every part */
    memset(dst, 0xee, len);
    void *into[6] = {dst + 3, dst + 30003, dst + 100000, dst + 150000, dst + 200000, dst + 400000};
    uint64_t ilens[6] = {30000, totals[0] - 30000, 40000, 40000, 50000, totals[2]};
    size_t icounts[3] = {2, 3, 1};
    uint64_t got[3] = {0, 0, 0};
    CHECK_MC(MC_OK, mc_store_batch_get_into_parts(s, keys, into, ilens, icounts, 3, got, codes, &E));
    for (int i = 0; i < 3; i++) {
        CHECK_EQ(codes[i], MC_OK);
        CHECK_EQ(got[i], totals[i]);
    }
    /* key 0 back to back: [3, 3+totals[0]) holds the concatenation */
    CHECK(memcmp(dst + 3, whole, totals[0]) == 0);
    /* key 1 (100000 bytes): 40000 + 40000 + the first 20000 of the third */
    CHECK(memcmp(dst + 100000, src + 70000, 40000) == 0);
    CHECK(memcmp(dst + 150000, src + 110000, 40000) == 0);
    CHECK(memcmp(dst + 200000, src + 150000, 20000) == 0);
    CHECK_EQ(dst[200000 + 20000], 0xee); /* past the value: untouched */
    CHECK(memcmp(dst + 400000, src + 200000, 7) == 0);
    CHECK(memcmp(dst + 400007, src + 210000, 33333) == 0);
    CHECK(memcmp(dst + 400007 + 33333, src + 250000, 5) == 0);
    int guards_ok = 1;
    for (size_t i = 0; i < len; i++) {
        int inside = (i >= 3 && i < 3 + totals[0]) || (i >= 100000 && i < 140000) || (i >= 150000 && i < 190000) ||
                     (i >= 200000 && i < 220000) || (i >= 400000 && i < 400000 + totals[2]);
        if (!inside && dst[i] != 0xee) guards_ok = 0;
    }
    CHECK(guards_ok);

    /* parts too small for the value: refused, nothing read */
    memset(dst, 0xee, len);
    void *small[2] = {dst, dst + 1000};
    uint64_t slens[2] = {500, 500};
    size_t scount = 2;
    CHECK_MC(MC_STORE_ERR_INVALID_PARAMS,
             mc_store_batch_get_into_parts(s, keys + 1, small, slens, &scount, 1, got, codes, &E));
    CHECK_EQ(codes[0], MC_STORE_ERR_INVALID_PARAMS);
    CHECK_EQ(got[0], 0);
    int untouched = 1;
    for (size_t i = 0; i < 4096; i++)
        if (dst[i] != 0xee) untouched = 0;
    CHECK(untouched);

    /* a part outside registered memory fails its key only */
    char fresh[2][96];
    unique_key(fresh[0], sizeof fresh[0], "parts-ok");
    unique_key(fresh[1], sizeof fresh[1], "parts-loose");
    const char *fk[2] = {fresh[0], fresh[1]};
    const void *fp[3] = {src, src + 100, loose};
    uint64_t fl[3] = {10, 10, 4096};
    size_t fc[2] = {1, 2};
    mc_error_t err;
    CHECK_EQ(mc_store_batch_put_from_parts(s, fk, fp, fl, fc, 2, NULL, codes, &err), MC_STORE_ERR_INVALID_PARAMS);
    CHECK(strstr(err.message, "registered") != NULL);
    CHECK_EQ(codes[0], MC_OK);
    CHECK_EQ(codes[1], MC_STORE_ERR_INVALID_PARAMS);
    void *gp[1] = {loose};
    uint64_t gl[1] = {4096};
    size_t gc[1] = {1};
    CHECK_MC(MC_STORE_ERR_INVALID_PARAMS, mc_store_batch_get_into_parts(s, fk, gp, gl, gc, 1, NULL, NULL, &E));

    /* bad arguments */
    CHECK_MC(MC_ERR_NULL_ARGUMENT, mc_store_batch_put_from_parts(s, keys, parts, plens, NULL, 3, NULL, NULL, &E));
    CHECK_MC(MC_ERR_NULL_ARGUMENT, mc_store_batch_put_from_parts(s, keys, NULL, plens, counts, 3, NULL, NULL, &E));
    CHECK_MC(MC_ERR_NULL_ARGUMENT, mc_store_batch_get_into_parts(s, keys, into, NULL, icounts, 3, NULL, NULL, &E));
    CHECK_MC(MC_ERR_NULL_ARGUMENT, mc_store_batch_get_into_parts(s, NULL, into, ilens, icounts, 3, NULL, NULL, &E));
    size_t huge[1] = {(size_t)1 << 40};
    CHECK_MC(MC_STORE_ERR_INVALID_PARAMS, mc_store_batch_put_from_parts(s, keys, parts, plens, huge, 1, NULL, NULL, &E));
    size_t none[1] = {0};
    CHECK_MC(MC_STORE_ERR_INVALID_PARAMS, mc_store_batch_put_from_parts(s, keys, NULL, NULL, none, 1, NULL, codes, &E));
    CHECK_EQ(codes[0], MC_STORE_ERR_INVALID_PARAMS); /* an empty value */
    CHECK_MC(MC_OK, mc_store_batch_put_from_parts(s, NULL, NULL, NULL, NULL, 0, NULL, NULL, &E));
    CHECK_MC(MC_OK, mc_store_batch_get_into_parts(s, NULL, NULL, NULL, NULL, 0, NULL, NULL, &E));
    CHECK_MC(MC_ERR_INVALID_HANDLE, mc_store_batch_put_from_parts(0x5151, keys, parts, plens, counts, 3, NULL, NULL, &E));

    for (int i = 0; i < 3; i++) CHECK_MC(MC_OK, mc_store_remove(s, keys[i], 1, &E));
    CHECK_MC(MC_OK, mc_store_remove(s, fresh[0], 1, &E));
    store_ranges(s);
    CHECK_MC(MC_OK, mc_store_close(s, &E));
    CHECK_MC(MC_ERR_INVALID_HANDLE, mc_store_batch_get_into_parts(s, keys, into, ilens, icounts, 3, NULL, NULL, &E));
    free(src);
    free(dst);
    free(loose);
    free(whole);
}

/* ABI 1.4: put sessions. Two keys are reserved, written layer by layer
 * (last layer first; key 0 from unregistered memory through the local
 * buffer, key 1 from registered memory), sealed and read back whole by
 * another store; then the refusals, a revoke (the key stays absent, its
 * session is gone) and a session left open at close (the close revokes
 * it, so the key can be put at once). */
void test_store_put_session(void) {
    CHECK((mc_abi_version() & 0xffff) >= 4);
    mc_store_t s = 0, r = 0, w = 0;
    REQUIRE_MC(MC_OK, open_store(&s, 0, &E));
    REQUIRE_MC(MC_OK, open_store(&r, 0, &E));
    enum { LAYERS = 8, PAGE = 50000, SIZE = LAYERS * PAGE };
    uint8_t *loose = malloc(SIZE), *reg = NULL, *out = malloc(SIZE);
    REQUIRE(posix_memalign((void **)&reg, 4096, SIZE) == 0);
    CHECK_MC(MC_OK, mc_store_register_buffer(s, reg, SIZE, &E));
    fill(loose, 0, SIZE, 61);
    fill(reg, 0, SIZE, 62);
    char kb[2][96];
    const char *keys[2];
    for (int i = 0; i < 2; i++) {
        unique_key(kb[i], sizeof kb[i], "put-session");
        keys[i] = kb[i];
    }
    uint64_t sizes[2] = {SIZE, SIZE};
    mc_status_t codes[2] = {-1, -1};
    CHECK_MC(MC_OK, mc_store_batch_put_session_start(s, keys, sizes, 2, NULL, codes, &E));
    CHECK_EQ(codes[0], MC_OK);
    CHECK_EQ(codes[1], MC_OK);
    int32_t exists = 1;
    CHECK_MC(MC_OK, mc_store_exist(r, keys[0], &exists, &E));
    CHECK_EQ(exists, 0); /* reserved, not readable */
    for (int l = LAYERS - 1; l >= 0; l--) {
        const void *bufs[2] = {loose + l * PAGE, reg + l * PAGE};
        uint64_t lens[2] = {PAGE, PAGE}, offs[2] = {(uint64_t)l * PAGE, (uint64_t)l * PAGE}, got[2] = {0, 0};
        size_t counts[2] = {1, 1};
        CHECK_MC(MC_OK, mc_store_batch_put_ranges(s, keys, bufs, lens, offs, counts, 2, got, codes, &E));
        CHECK_EQ(got[0], PAGE);
        CHECK_EQ(got[1], PAGE);
    }
    CHECK_MC(MC_OK, mc_store_batch_put_session_end(s, keys, 2, codes, &E));
    for (int i = 0; i < 2; i++) {
        uint64_t n = 0;
        memset(out, 0, SIZE);
        CHECK_MC(MC_OK, mc_store_get(r, keys[i], out, SIZE, &n, &E));
        CHECK_EQ(n, SIZE);
        CHECK_EQ(check_pattern(out, 0, SIZE, 61 + i), -1);
    }

    /* refusals: a session already open, a zero size, a key that exists; a
     * range of a key without a session, one past the size, NULL arrays */
    char fresh[96], gone[96];
    unique_key(fresh, sizeof fresh, "put-session-fresh");
    unique_key(gone, sizeof gone, "put-session-never");
    const char *fk[1] = {fresh}, *nk[1] = {gone};
    uint64_t one = 100, zero = 0;
    CHECK_MC(MC_OK, mc_store_batch_put_session_start(s, fk, &one, 1, NULL, codes, &E));
    CHECK_MC(MC_STORE_ERR_INVALID_PARAMS, mc_store_batch_put_session_start(s, fk, &one, 1, NULL, codes, &E));
    CHECK_MC(MC_STORE_ERR_INVALID_PARAMS, mc_store_batch_put_session_start(s, nk, &zero, 1, NULL, codes, &E));
    CHECK_MC(MC_STORE_ERR_OBJECT_ALREADY_EXISTS, mc_store_batch_put_session_start(s, keys, &one, 1, NULL, codes, &E));
    CHECK_MC(MC_ERR_NULL_ARGUMENT, mc_store_batch_put_session_start(s, nk, NULL, 1, NULL, codes, &E));
    const void *b1[1] = {loose};
    uint64_t l1 = 10, o1 = 95, o0 = 0, got = 77;
    size_t c1 = 1;
    CHECK_MC(MC_STORE_ERR_INVALID_PARAMS, mc_store_batch_put_ranges(s, nk, b1, &l1, &o0, &c1, 1, &got, codes, &E));
    CHECK_EQ(got, 0);
    CHECK_MC(MC_STORE_ERR_INVALID_PARAMS, mc_store_batch_put_ranges(s, fk, b1, &l1, &o1, &c1, 1, &got, codes, &E));
    CHECK_MC(MC_ERR_NULL_ARGUMENT, mc_store_batch_put_ranges(s, fk, b1, &l1, NULL, &c1, 1, &got, codes, &E));
    CHECK_MC(MC_OK, mc_store_batch_put_ranges(s, NULL, NULL, NULL, NULL, NULL, 0, NULL, NULL, &E));
    CHECK_MC(MC_STORE_ERR_INVALID_PARAMS, mc_store_batch_put_session_end(s, nk, 1, codes, &E));
    CHECK_MC(MC_STORE_ERR_INVALID_PARAMS, mc_store_batch_put_session_revoke(s, nk, 1, codes, &E));

    /* revoke: the key never becomes readable and its session is gone */
    CHECK_MC(MC_OK, mc_store_batch_put_ranges(s, fk, b1, &l1, &o0, &c1, 1, &got, codes, &E));
    CHECK_MC(MC_OK, mc_store_batch_put_session_revoke(s, fk, 1, codes, &E));
    CHECK_EQ(codes[0], MC_OK);
    exists = 1;
    CHECK_MC(MC_OK, mc_store_exist(r, fresh, &exists, &E));
    CHECK_EQ(exists, 0);
    CHECK_MC(MC_STORE_ERR_INVALID_PARAMS, mc_store_batch_put_session_end(s, fk, 1, codes, &E));

    /* a session open at close is revoked by the close */
    REQUIRE_MC(MC_OK, open_store(&w, 0, &E));
    CHECK_MC(MC_OK, mc_store_batch_put_session_start(w, nk, &one, 1, NULL, codes, &E));
    CHECK_MC(MC_OK, mc_store_close(w, &E));
    CHECK_MC(MC_OK, mc_store_put(s, gone, loose, 100, NULL, &E));
    uint64_t n = 0;
    CHECK_MC(MC_OK, mc_store_get(r, gone, out, SIZE, &n, &E));
    CHECK_EQ(n, 100);
    CHECK_EQ(check_pattern(out, 0, 100, 61), -1);

    for (int i = 0; i < 2; i++) CHECK_MC(MC_OK, mc_store_remove(s, keys[i], 1, &E));
    CHECK_MC(MC_OK, mc_store_remove(s, gone, 1, &E));
    CHECK_MC(MC_OK, mc_store_close(r, &E));
    CHECK_MC(MC_OK, mc_store_close(s, &E));
    CHECK_MC(MC_ERR_INVALID_HANDLE, mc_store_batch_put_session_end(s, keys, 2, codes, &E));
    free(loose);
    free(reg);
    free(out);
}

/* Threads keep putting and reading through a store while another thread
 * closes it: every call returns (success before, an error after), nothing
 * crashes (the close waits for calls in progress before it frees the
 * store's memory). */
static volatile int store_racing;
static mc_store_t racing_store;

static void *store_racer(void *arg) {
    int id = (int)(intptr_t)arg;
    uint8_t *val = malloc(256 << 10), *out = malloc(256 << 10);
    fill(val, 0, 256 << 10, (unsigned)id);
    for (int i = 0; store_racing; i++) {
        char key[96];
        snprintf(key, sizeof key, "capi-%d-race-%d-%d", (int)getpid(), id, i % 8);
        uint64_t n;
        int32_t ex;
        if (i < 8) mc_store_put(racing_store, key, val, 256 << 10, NULL, NULL);
        /* reads mostly: they are served from the lease cache, without the
         * master, straight from the store's memory */
        for (int j = 0; j < 16; j++) mc_store_get_into(racing_store, key, out, 256 << 10, &n, NULL);
        mc_store_get(racing_store, key, out, 256 << 10, &n, NULL);
        mc_store_exist(racing_store, key, &ex, NULL);
    }
    free(val);
    free(out);
    return NULL;
}

void test_store_close_race(void) {
    for (int round = 0; round < 6; round++) {
        REQUIRE_MC(MC_OK, open_store(&racing_store, 0, &E));
        store_racing = 1;
        pthread_t th[4];
        for (int i = 0; i < 4; i++) pthread_create(&th[i], NULL, store_racer, (void *)(intptr_t)i);
        usleep(30000 + round * 10000);
        CHECK_MC(MC_OK, mc_store_close(racing_store, &E));
        usleep(5000);
        store_racing = 0;
        for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
        uint64_t n;
        CHECK_MC(MC_ERR_INVALID_HANDLE, mc_store_get_size(racing_store, "k", &n, &E));
    }
}

/* report_existing (ABI 1.7): a put of a key that exists fails with
 * MC_STORE_ERR_OBJECT_ALREADY_EXISTS and leaves the value; without it (a
 * caller of the version 2 struct, whatever lies past it) the put succeeds
 * without writing, as Mooncake's; an upsert replaces the value either way. */
void test_store_report_existing(void) {
    typedef struct {
        unsigned char bytes[sizeof(mc_store_config_t) + 64];
    } blob_t;
    mc_store_config_t cfg;
    mc_store_config_init(&cfg);
    cfg.master = getenv("MC_TEST_MASTER");
    cfg.local_hostname = store_host;
    cfg.protocol = "tcp";
    cfg.segment_size = -1;
    cfg.local_buffer_size = 16 << 20;
    cfg.report_existing = 1;
    mc_store_t s = 0, old = 0;
    REQUIRE_MC(MC_OK, mc_store_create(&cfg, &s, &E));
    blob_t b;
    memset(b.bytes, 0xff, sizeof b.bytes);
    memcpy(b.bytes, &cfg, MC_STORE_CONFIG_SIZE_V2);
    ((mc_store_config_t *)b.bytes)->struct_size = (uint32_t)MC_STORE_CONFIG_SIZE_V2;
    REQUIRE_MC(MC_OK, mc_store_create((mc_store_config_t *)b.bytes, &old, &E));

    char key[96];
    unique_key(key, sizeof key, "existing");
    uint8_t v1[100], v2[200], out[200];
    fill(v1, 0, sizeof v1, 1);
    fill(v2, 0, sizeof v2, 2);
    uint64_t n = 0;
    CHECK_MC(MC_OK, mc_store_put(s, key, v1, sizeof v1, NULL, &E));
    CHECK_MC(MC_STORE_ERR_OBJECT_ALREADY_EXISTS, mc_store_put(s, key, v2, sizeof v2, NULL, &E));
    CHECK_MC(MC_OK, mc_store_put(old, key, v2, sizeof v2, NULL, &E));
    CHECK_MC(MC_OK, mc_store_get(s, key, out, sizeof out, &n, &E));
    CHECK_EQ(n, sizeof v1);
    CHECK(memcmp(out, v1, sizeof v1) == 0);
    CHECK_MC(MC_OK, mc_store_upsert(s, key, v2, sizeof v2, NULL, &E));
    CHECK_MC(MC_OK, mc_store_get(s, key, out, sizeof out, &n, &E));
    CHECK_EQ(n, sizeof v2);
    CHECK(memcmp(out, v2, sizeof v2) == 0);
    CHECK_MC(MC_OK, mc_store_remove(s, key, 1, &E));
    CHECK_MC(MC_OK, mc_store_close(old, &E));
    CHECK_MC(MC_OK, mc_store_close(s, &E));
}

/* ABI 1.11's stripe_count: a value put in two stripes (this store's
 * segment and the storage node's) reads back whole, and its replica is
 * described by its first piece, whose size is less than the value's; a
 * put in one stripe is described whole. */
void test_store_stripes(void) {
    mc_store_t s = 0;
    REQUIRE_MC(MC_OK, open_store(&s, 0, &E));
    const uint64_t vlen = (1 << 20) + 5;
    uint8_t *val = malloc(vlen), *out = malloc(vlen);
    REQUIRE(val != NULL && out != NULL);
    fill(val, 0, vlen, 7);
    mc_replicate_config_t rc;
    mc_replicate_config_init(&rc);
    CHECK_EQ(rc.struct_size, sizeof rc);
    CHECK(MC_REPLICATE_CONFIG_SIZE_V2 <= sizeof rc);
    char key[96], whole[96];
    unique_key(key, sizeof key, "stripes");
    unique_key(whole, sizeof whole, "stripes-whole");
    rc.stripe_count = 2;
    CHECK_MC(MC_OK, mc_store_put(s, key, val, vlen, &rc, &E));
    rc.stripe_count = 1;
    CHECK_MC(MC_OK, mc_store_put(s, whole, val, vlen, &rc, &E));
    uint64_t n = 0;
    memset(out, 0, vlen);
    CHECK_MC(MC_OK, mc_store_get(s, key, out, vlen, &n, &E));
    CHECK_EQ(n, vlen);
    CHECK(memcmp(out, val, vlen) == 0);

    mc_replica_desc_t reps[2];
    size_t nrep = 0;
    CHECK_MC(MC_OK, mc_store_get_replicas(s, key, reps, 2, &nrep, &E));
    CHECK_EQ(nrep, 1);
    CHECK_EQ(reps[0].kind, MC_REPLICA_MEMORY);
    CHECK(reps[0].buffer_address != 0);
    CHECK(reps[0].size > 0 && reps[0].size < vlen); /* the first piece */
    CHECK(reps[0].segment_name[0] != 0);
    CHECK_MC(MC_OK, mc_store_get_replicas(s, whole, reps, 2, &nrep, &E));
    CHECK_EQ(nrep, 1);
    CHECK_EQ(reps[0].size, vlen);

    /* out of range: the master takes at most 64 */
    rc.stripe_count = 0x80000000u;
    CHECK_MC(MC_STORE_ERR_INVALID_PARAMS, mc_store_put(s, key, val, vlen, &rc, &E));
    CHECK_MC(MC_OK, mc_store_remove(s, key, 1, &E));
    CHECK_MC(MC_OK, mc_store_remove(s, whole, 1, &E));
    CHECK_MC(MC_OK, mc_store_close(s, &E));
    free(val);
    free(out);
}
