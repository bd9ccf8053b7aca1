/* The store API with GPU buffers, as vLLM's store connector passes them on
 * a GPU host: device pointers registered with mc_store_register_buffer
 * (and not), put_from/get_into and their batch forms. The GPU is the CUDA
 * driver test double MC_CUDA_DRIVER names (scripts/test-capi.sh builds
 * it): this test loads it as a framework would load libcuda, and the
 * library finds the device pointers by asking it. The CPU cannot touch
 * the double's device memory (any access faults), so a library that
 * copied such a buffer itself would kill this process. */
#include <dlfcn.h>
#include <stdint.h>
#include <unistd.h>

#include "harness.h"
#include "transfer_engine_c.h"

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;

static struct {
    CUresult (*init)(unsigned int);
    CUresult (*retain)(CUcontext *, int);
    CUresult (*set_current)(CUcontext);
    CUresult (*alloc)(CUdeviceptr *, size_t);
    CUresult (*free)(CUdeviceptr);
    CUresult (*copy)(CUdeviceptr, CUdeviceptr, size_t);
    void (*fail)(const char *, int, int);
    void (*reset)(void);
} cu;

/* load_driver opens the driver and makes GPU 0's context current. */
static int load_driver(void) {
    const char *path = getenv("MC_CUDA_DRIVER");
    if (path == NULL || path[0] == 0) return 0;
    void *h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (h == NULL) {
        fprintf(stderr, "  dlopen %s: %s\n", path, dlerror());
        return 0;
    }
    *(void **)&cu.init = dlsym(h, "cuInit");
    *(void **)&cu.retain = dlsym(h, "cuDevicePrimaryCtxRetain");
    *(void **)&cu.set_current = dlsym(h, "cuCtxSetCurrent");
    *(void **)&cu.alloc = dlsym(h, "cuMemAlloc_v2");
    *(void **)&cu.free = dlsym(h, "cuMemFree_v2");
    *(void **)&cu.copy = dlsym(h, "cuMemcpy");
    *(void **)&cu.fail = dlsym(h, "fakecuda_fail");
    *(void **)&cu.reset = dlsym(h, "fakecuda_reset");
    if (!cu.init || !cu.retain || !cu.set_current || !cu.alloc || !cu.free || !cu.copy || !cu.fail || !cu.reset)
        return 0;
    CUcontext ctx = NULL;
    return cu.init(0) == 0 && cu.retain(&ctx, 0) == 0 && cu.set_current(ctx) == 0;
}

static void *gpu_alloc(size_t n) {
    CUdeviceptr p = 0;
    return cu.alloc(&p, n) == 0 ? (void *)(uintptr_t)p : NULL;
}

static int to_gpu(void *dst, const void *src, size_t n) {
    return cu.copy((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, n) == 0;
}

/* gpu_holds reports whether the n bytes at the GPU address p hold the
 * pattern of seed, copying them out with the driver. */
static int gpu_holds(const void *p, size_t n, unsigned seed) {
    uint8_t *out = malloc(n);
    int ok = out && cu.copy((CUdeviceptr)(uintptr_t)out, (CUdeviceptr)(uintptr_t)p, n) == 0 &&
             check_pattern(out, 0, n, seed) < 0;
    free(out);
    return ok;
}

static mc_status_t open_store(mc_store_t *s, mc_error_t *err) {
    mc_store_config_t cfg;
    mc_store_config_init(&cfg);
    cfg.master = getenv("MC_TEST_MASTER");
    cfg.local_hostname = "127.0.0.1";
    cfg.protocol = "tcp";
    cfg.segment_size = 16 << 20;
    cfg.local_buffer_size = 16 << 20;
    return mc_store_create(&cfg, s, err);
}

void test_store_device(void) {
    if (!load_driver()) {
        printf("     (no CUDA driver test double: MC_CUDA_DRIVER is not set or not the double)\n");
        REQUIRE(getenv("MC_CUDA_DRIVER") == NULL);
        return;
    }
    mc_store_t s = 0;
    REQUIRE_MC(MC_OK, open_store(&s, &E));
    const size_t n = (3u << 20) + 5; /* more than a staging piece */
    uint8_t *src = gpu_alloc(n), *dst = gpu_alloc(n), *loose = gpu_alloc(n);
    uint8_t *host = malloc(n), *back = malloc(n);
    REQUIRE(src && dst && loose && host && back);
    char key[96], key2[96], key3[96];
    snprintf(key, sizeof key, "capi-%d-gpu", (int)getpid());
    snprintf(key2, sizeof key2, "capi-%d-gpu-2", (int)getpid());
    snprintf(key3, sizeof key3, "capi-%d-gpu-loose", (int)getpid());

    /* put_from and get_into with registered device buffers */
    fill(host, 0, n, 90);
    REQUIRE(to_gpu(src, host, n));
    CHECK_MC(MC_OK, mc_store_register_buffer(s, src, n, &E));
    CHECK_MC(MC_OK, mc_store_register_buffer(s, dst, n, &E));
    CHECK_MC(MC_OK, mc_store_put_from(s, key, src, n, NULL, &E));
    uint64_t got = 0;
    CHECK_MC(MC_OK, mc_store_get_into(s, key, dst, n, &got, &E));
    CHECK_EQ(got, n);
    CHECK(gpu_holds(dst, n, 90));
    /* read as host bytes: the checksum the put took from the transfer holds */
    CHECK_MC(MC_OK, mc_store_get(s, key, back, n, &got, &E));
    CHECK(check_pattern(back, 0, n, 90) < 0);
    /* into device memory nobody registered: staged, copied out by the driver */
    CHECK_MC(MC_OK, mc_store_get_into(s, key, loose, n, &got, &E));
    CHECK(gpu_holds(loose, n, 90));

    /* put from unregistered device memory: staged through the driver */
    fill(host, 0, n, 91);
    REQUIRE(to_gpu(loose, host, n));
    CHECK_MC(MC_STORE_ERR_INVALID_PARAMS, mc_store_put_from(s, key3, loose, n, NULL, &E));
    CHECK_MC(MC_OK, mc_store_put(s, key3, loose, n, NULL, &E));
    CHECK_MC(MC_OK, mc_store_get(s, key3, back, n, &got, &E));
    CHECK(check_pattern(back, 0, n, 91) < 0);

    /* batch_put_from / batch_get_into of two halves of one device buffer */
    const size_t half = n / 2;
    fill(host, 0, n, 92);
    REQUIRE(to_gpu(src, host, n));
    const char *keys[2] = {key2, key3};
    char key4[96];
    snprintf(key4, sizeof key4, "capi-%d-gpu-4", (int)getpid());
    keys[1] = key4;
    const void *vals[2] = {src, src + half};
    uint64_t lens[2] = {half, n - half}, caps[2] = {half, n - half}, outs[2] = {0, 0};
    void *dsts[2] = {dst, dst + half};
    mc_status_t codes[2] = {-1, -1};
    CHECK_MC(MC_OK, mc_store_batch_put_from(s, keys, vals, lens, 2, NULL, codes, &E));
    CHECK_EQ(codes[0], MC_OK);
    CHECK_EQ(codes[1], MC_OK);
    CHECK_MC(MC_OK, mc_store_batch_get_into(s, keys, dsts, caps, 2, outs, codes, &E));
    CHECK_EQ(outs[0], half);
    CHECK_EQ(outs[1], n - half);
    uint8_t *whole = malloc(n);
    REQUIRE(whole);
    CHECK(cu.copy((CUdeviceptr)(uintptr_t)whole, (CUdeviceptr)(uintptr_t)dst, n) == 0);
    CHECK(check_pattern(whole, 0, n, 92) < 0);
    free(whole);

    /* a driver copy failing mid-put fails the put: the key never becomes
     * readable, and putting it again writes it */
    char key5[96];
    snprintf(key5, sizeof key5, "capi-%d-gpu-fail", (int)getpid());
    cu.reset();
    cu.fail("cuMemcpy", 1, 0);
    mc_error_t err;
    CHECK(mc_store_put_from(s, key5, src, n, NULL, &err) != MC_OK);
    int32_t ex = -1;
    CHECK_MC(MC_OK, mc_store_exist(s, key5, &ex, &E));
    CHECK_EQ(ex, 0);
    cu.reset();
    CHECK_MC(MC_OK, mc_store_put_from(s, key5, src, n, NULL, &E));
    /* and mid-get, the get fails */
    cu.fail("cuMemcpy", 1, 0);
    CHECK(mc_store_get_into(s, key5, dst, n, &got, &err) != MC_OK);
    cu.reset();
    CHECK_MC(MC_OK, mc_store_get_into(s, key5, dst, n, &got, &E));
    CHECK(gpu_holds(dst, n, 92));

    const char *all[] = {key, key2, key3, key4, key5};
    CHECK_MC(MC_OK, mc_store_batch_remove(s, all, 5, 1, NULL, &E));
    CHECK_MC(MC_OK, mc_store_unregister_buffer(s, src, &E));
    CHECK_MC(MC_OK, mc_store_unregister_buffer(s, dst, &E));
    CHECK_MC(MC_OK, mc_store_close(s, &E));
    cu.free((CUdeviceptr)(uintptr_t)src);
    cu.free((CUdeviceptr)(uintptr_t)dst);
    cu.free((CUdeviceptr)(uintptr_t)loose);
    free(host);
    free(back);
}

/* te_wait polls the n tasks of batch b until all completed (1) or one
 * failed (0). */
static int te_wait(transfer_engine_t te, batch_id_t b, size_t n) {
    for (int spins = 0; spins < 200000; spins++) {
        size_t done = 0;
        for (size_t i = 0; i < n; i++) {
            struct transfer_status st = {-1, 0};
            if (getTransferStatus(te, b, i, &st) != 0) return 0;
            if (st.status == STATUS_COMPLETED)
                done++;
            else if (st.status != STATUS_WAITING && st.status != STATUS_PENDING)
                return 0;
        }
        if (done == n) return 1;
        usleep(100);
    }
    return 0;
}

/* The engine APIs with GPU memory, as NIXL's Mooncake plugin passes VRAM
 * (registerLocalMemory with location "*") and as the native API names it
 * ("cuda:N"): bytes written from and read into GPU memory against a peer
 * process, over the default paths and (in the MC_FORCE_TCP rerun) TCP. */
void test_engine_device(void) {
    REQUIRE(load_driver());
    const size_t n = 3 << 20;
    void *gpu = gpu_alloc(n);
    REQUIRE(gpu != NULL);
    uint8_t *host = malloc(n);
    REQUIRE(host != NULL);
    peer_t peer;
    REQUIRE(peer_start(&peer, "native") == 0);
    REQUIRE(peer.len >= n);
    char reply[256];

    transfer_engine_t te = createTransferEngine("P2PHANDSHAKE", "127.0.0.1", "127.0.0.1", 0, 0);
    REQUIRE(te != NULL);
    CHECK_EQ(registerLocalMemory(te, gpu, n, "*", 1), 0);
    segment_id_t seg = openSegment(te, peer.name);
    CHECK(seg > 0);
    fill(host, 0, n, 61);
    CHECK(to_gpu(gpu, host, n));
    batch_id_t b = allocateBatchID(te, 1);
    struct transfer_request w = {.opcode = OPCODE_WRITE, .source = gpu, .target_id = seg,
                                 .target_offset = peer.addr, .length = n};
    CHECK_EQ(submitTransfer(te, b, &w, 1), 0);
    CHECK(te_wait(te, b, 1));
    CHECK_EQ(freeBatchID(te, b), 0);
    CHECK(peer_cmd(&peer, reply, sizeof reply, "CHECK 0 %zu 61", n) == 0);
    CHECK(strcmp(reply, "OK") == 0);

    CHECK(peer_cmd(&peer, reply, sizeof reply, "FILL 0 %zu 62", n) == 0);
    b = allocateBatchID(te, 1);
    struct transfer_request r = {.opcode = OPCODE_READ, .source = gpu, .target_id = seg,
                                 .target_offset = peer.addr, .length = n};
    CHECK_EQ(submitTransfer(te, b, &r, 1), 0);
    CHECK(te_wait(te, b, 1));
    CHECK_EQ(freeBatchID(te, b), 0);
    CHECK(gpu_holds(gpu, n, 62));
    CHECK_EQ(unregisterLocalMemory(te, gpu), 0);
    destroyTransferEngine(te);

    /* The native API: "cuda:0" is this memory; a GPU the host lacks and
     * host memory named as a GPU are refused. */
    mc_engine_t e = 0;
    REQUIRE_MC(MC_OK, test_engine("tcp", &e, &E));
    CHECK_MC(MC_TE_ERR_DEVICE_NOT_FOUND, mc_engine_register_memory(e, gpu, n, "cuda:9", 1, &E));
    CHECK_MC(MC_TE_ERR_INVALID_ARGUMENT, mc_engine_register_memory(e, host, n, "cuda:0", 1, &E));
    CHECK_MC(MC_OK, mc_engine_register_memory(e, gpu, n, "cuda:0", 1, &E));
    CHECK_MC(MC_OK, mc_engine_unregister_memory(e, gpu, &E));
    CHECK_MC(MC_OK, mc_engine_destroy(e, &E));

    CHECK_EQ(peer_stop(&peer), 0);
    cu.free((CUdeviceptr)(uintptr_t)gpu);
    free(host);
}

/* mc_copy between host and GPU memory in every direction, through the
 * driver (the CPU cannot touch the double's device memory, so a copy by
 * the CPU would kill this process); a failing driver copy is an error. */
void test_copy_device(void) {
    REQUIRE(load_driver());
    const size_t n = 1 << 20;
    void *g1 = gpu_alloc(n), *g2 = gpu_alloc(n);
    REQUIRE(g1 != NULL && g2 != NULL);
    uint8_t *h1 = malloc(n), *h2 = malloc(n);
    REQUIRE(h1 != NULL && h2 != NULL);
    fill(h1, 0, n, 71);
    CHECK_MC(MC_OK, mc_copy(g1, h1, n, &E));     /* host to GPU */
    CHECK_MC(MC_OK, mc_copy(g2, g1, n, &E));     /* GPU to GPU */
    memset(h2, 0, n);
    CHECK_MC(MC_OK, mc_copy(h2, g2, n, &E));     /* GPU to host */
    CHECK_EQ(check_pattern(h2, 0, n, 71), -1);
    memset(h2, 0, n);
    CHECK_MC(MC_OK, mc_copy(h2, h1, n, &E));     /* host to host */
    CHECK_EQ(check_pattern(h2, 0, n, 71), -1);
    CHECK_MC(MC_OK, mc_copy(NULL, NULL, 0, &E)); /* nothing to copy */
    CHECK_MC(MC_ERR_NULL_ARGUMENT, mc_copy(NULL, h1, 1, &E));
    cu.fail("cuMemcpy", 1, 0);
    CHECK_MC(MC_TE_ERR_MEMORY, mc_copy(h2, g2, n, &E));
    cu.reset();
    cu.free((CUdeviceptr)(uintptr_t)g1);
    cu.free((CUdeviceptr)(uintptr_t)g2);
    free(h1);
    free(h2);
}
