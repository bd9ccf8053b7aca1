//go:build ignore

/* selftest.c: checks every rule of the CUDA driver test double
 * (fakecuda.c, README.md) through the same door the engine uses: the
 * library is dlopen'ed and its entry points looked up by the driver's
 * names.
 *
 *   selftest LIB           every case, each in a fresh process
 *   selftest LIB -list     the case names
 *   selftest LIB CASE...   those cases, each in a fresh process
 *
 * A case runs in its own exec'ed process because the double reads its
 * environment once; the IPC case starts a second process (this program
 * again, as --ipc-peer) that maps the first one's memory. Exit status 0
 * means every case passed. The "go:build ignore" line keeps the Go tool
 * away from this file. */

#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../cudaabi.h"

static struct {
    mc_cuInit_t init;
    mc_cuGetErrorString_t error_string;
    mc_cuDeviceGetCount_t device_count;
    mc_cuDeviceGet_t device_get;
    mc_cuDevicePrimaryCtxRetain_t ctx_retain;
    mc_cuCtxSetCurrent_t ctx_set;
    mc_cuPointerGetAttribute_t attr;
    mc_cuMemGetAddressRange_t range;
    mc_cuMemcpy_t copy;
    mc_cuMemcpyHtoD_t htod;
    mc_cuMemcpyDtoH_t dtoh;
    mc_cuMemcpyDtoD_t dtod;
    mc_cuMemHostAlloc_t host_alloc;
    mc_cuMemFreeHost_t host_free;
    mc_cuIpcGetMemHandle_t ipc_get;
    mc_cuIpcOpenMemHandle_t ipc_open;
    mc_cuIpcCloseMemHandle_t ipc_close;
    mc_cuMemAlloc_t alloc;
    mc_cuMemFree_t free;
    mc_cuStreamSynchronize_t sync;
    int (*calls)(const char *);
    int (*pending)(void);
    int (*calls_without_context)(const char *);
    void (*fail)(const char *, int, int);
    void (*reset)(void);
} cu;

static const char *lib_path;
static const char *case_name = "main";

#define FAIL(...)                                                      \
    do {                                                               \
        fprintf(stderr, "%s: %s:%d: ", case_name, __FILE__, __LINE__); \
        fprintf(stderr, __VA_ARGS__);                                  \
        fprintf(stderr, "\n");                                         \
        exit(1);                                                       \
    } while (0)

#define CHECK(cond)                            \
    do {                                       \
        if (!(cond)) FAIL("failed: %s", #cond); \
    } while (0)

/* RC checks that a driver call returns want. */
#define RC(call, want)                                                  \
    do {                                                                \
        CUresult got_ = (call);                                         \
        if (got_ != (want)) FAIL("%s = %d, want %d", #call, got_, (int)(want)); \
    } while (0)

#define OK(call) RC(call, MC_CUDA_SUCCESS)

static void load(const char *path) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) FAIL("dlopen %s: %s", path, dlerror());
    struct {
        void **slot;
        const char *name;
    } syms[] = {
        {(void **)&cu.init, "cuInit"},
        {(void **)&cu.error_string, "cuGetErrorString"},
        {(void **)&cu.device_count, "cuDeviceGetCount"},
        {(void **)&cu.device_get, "cuDeviceGet"},
        {(void **)&cu.ctx_retain, "cuDevicePrimaryCtxRetain"},
        {(void **)&cu.ctx_set, "cuCtxSetCurrent"},
        {(void **)&cu.attr, "cuPointerGetAttribute"},
        {(void **)&cu.range, "cuMemGetAddressRange_v2"},
        {(void **)&cu.copy, "cuMemcpy"},
        {(void **)&cu.htod, "cuMemcpyHtoD_v2"},
        {(void **)&cu.dtoh, "cuMemcpyDtoH_v2"},
        {(void **)&cu.dtod, "cuMemcpyDtoD_v2"},
        {(void **)&cu.host_alloc, "cuMemHostAlloc"},
        {(void **)&cu.host_free, "cuMemFreeHost"},
        {(void **)&cu.ipc_get, "cuIpcGetMemHandle"},
        {(void **)&cu.ipc_open, "cuIpcOpenMemHandle_v2"},
        {(void **)&cu.ipc_close, "cuIpcCloseMemHandle"},
        {(void **)&cu.alloc, "cuMemAlloc_v2"},
        {(void **)&cu.free, "cuMemFree_v2"},
        {(void **)&cu.sync, "cuStreamSynchronize"},
        {(void **)&cu.pending, "fakecuda_pending"},
        {(void **)&cu.calls, "fakecuda_calls"},
        {(void **)&cu.calls_without_context, "fakecuda_calls_without_context"},
        {(void **)&cu.fail, "fakecuda_fail"},
        {(void **)&cu.reset, "fakecuda_reset"},
    };
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        *syms[i].slot = dlsym(h, syms[i].name);
        if (*syms[i].slot == NULL) FAIL("%s does not export %s", path, syms[i].name);
    }
}

/* ---- helpers ---- */

static CUcontext context(int dev) {
    CUcontext c = NULL;
    OK(cu.ctx_retain(&c, dev));
    CHECK(c != NULL);
    return c;
}

/* start: cuInit and device dev's primary context current on this thread. */
static void start(int dev) {
    OK(cu.init(0));
    OK(cu.ctx_set(context(dev)));
}

static CUdeviceptr dalloc(size_t n) {
    CUdeviceptr p = 0;
    OK(cu.alloc(&p, n));
    CHECK(p != 0);
    return p;
}

static void fill(unsigned char *b, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) b[i] = (unsigned char)(seed + i * 7);
}

static int filled(const unsigned char *b, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++)
        if (b[i] != (unsigned char)(seed + i * 7)) return 0;
    return 1;
}

static int all(const unsigned char *b, size_t n, unsigned char v) {
    for (size_t i = 0; i < n; i++)
        if (b[i] != v) return 0;
    return 1;
}

/* dset fills n bytes of device memory at p with seed's pattern. */
static void dset(CUdeviceptr p, size_t n, unsigned seed) {
    unsigned char *b = malloc(n);
    fill(b, n, seed);
    OK(cu.htod(p, b, n));
    free(b);
}

/* dfilled reports whether n bytes of device memory at p hold seed's
 * pattern. */
static int dfilled(CUdeviceptr p, size_t n, unsigned seed) {
    unsigned char *b = malloc(n);
    OK(cu.dtoh(b, p, n));
    int ok = filled(b, n, seed);
    free(b);
    return ok;
}

/* cpu_touch makes a forked child write (or read) p with the CPU and
 * returns the signal it died of, 0 if it survived. */
static int cpu_touch(CUdeviceptr p, int write) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) FAIL("fork: %s", strerror(errno));
    if (pid == 0) {
        struct rlimit no_core = {0, 0};
        setrlimit(RLIMIT_CORE, &no_core);
        volatile unsigned char *q = (volatile unsigned char *)(uintptr_t)p;
        if (write)
            *q = 1;
        else
            (void)*q;
        _exit(0);
    }
    int st;
    if (waitpid(pid, &st, 0) != pid) FAIL("waitpid: %s", strerror(errno));
    return WIFSIGNALED(st) ? WTERMSIG(st) : 0;
}

static unsigned mem_type(CUdeviceptr p, CUresult want) {
    unsigned t = 0;
    RC(cu.attr(&t, MC_CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p), want);
    return t;
}

/* ---- cases ---- */

static void case_uninitialized(void) {
    int n = -1;
    CUdevice d;
    CUcontext c;
    CUdeviceptr p = 0;
    void *h = NULL;
    unsigned t;
    char buf[8];
    CUipcMemHandle ih;
    memset(&ih, 0, sizeof ih);
    /* Before cuInit everything but cuInit and cuGetErrorString refuses. */
    RC(cu.device_count(&n), MC_CUDA_ERROR_NOT_INITIALIZED);
    RC(cu.device_get(&d, 0), MC_CUDA_ERROR_NOT_INITIALIZED);
    RC(cu.ctx_retain(&c, 0), MC_CUDA_ERROR_NOT_INITIALIZED);
    RC(cu.ctx_set(NULL), MC_CUDA_ERROR_NOT_INITIALIZED);
    RC(cu.attr(&t, MC_CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)(uintptr_t)buf), MC_CUDA_ERROR_NOT_INITIALIZED);
    RC(cu.range(NULL, NULL, 1), MC_CUDA_ERROR_NOT_INITIALIZED);
    RC(cu.copy((CUdeviceptr)(uintptr_t)buf, (CUdeviceptr)(uintptr_t)buf + 4, 4), MC_CUDA_ERROR_NOT_INITIALIZED);
    RC(cu.htod(1, buf, 1), MC_CUDA_ERROR_NOT_INITIALIZED);
    RC(cu.dtoh(buf, 1, 1), MC_CUDA_ERROR_NOT_INITIALIZED);
    RC(cu.dtod(1, 2, 1), MC_CUDA_ERROR_NOT_INITIALIZED);
    RC(cu.host_alloc(&h, 4096, 0), MC_CUDA_ERROR_NOT_INITIALIZED);
    RC(cu.host_free(buf), MC_CUDA_ERROR_NOT_INITIALIZED);
    RC(cu.ipc_get(&ih, 1), MC_CUDA_ERROR_NOT_INITIALIZED);
    RC(cu.ipc_open(&p, ih, 0), MC_CUDA_ERROR_NOT_INITIALIZED);
    RC(cu.ipc_close(1), MC_CUDA_ERROR_NOT_INITIALIZED);
    RC(cu.alloc(&p, 16), MC_CUDA_ERROR_NOT_INITIALIZED);
    RC(cu.free(1), MC_CUDA_ERROR_NOT_INITIALIZED);
    const char *s = NULL;
    OK(cu.error_string(MC_CUDA_ERROR_NOT_INITIALIZED, &s));
    CHECK(s != NULL && *s != 0);
    RC(cu.init(1), MC_CUDA_ERROR_INVALID_VALUE); /* flags must be 0 */
    RC(cu.device_count(&n), MC_CUDA_ERROR_NOT_INITIALIZED);
    OK(cu.init(0));
    OK(cu.init(0)); /* again: harmless */
    OK(cu.device_count(&n));
}

static void case_devices(void) {
    OK(cu.init(0));
    int n = -1;
    OK(cu.device_count(&n));
    CHECK(n == 2); /* the default */
    RC(cu.device_count(NULL), MC_CUDA_ERROR_INVALID_VALUE);
    CUdevice d = -1;
    OK(cu.device_get(&d, 1));
    CHECK(d == 1);
    RC(cu.device_get(&d, 2), MC_CUDA_ERROR_INVALID_DEVICE);
    RC(cu.device_get(&d, -1), MC_CUDA_ERROR_INVALID_DEVICE);
    CUcontext c = NULL;
    RC(cu.ctx_retain(&c, 2), MC_CUDA_ERROR_INVALID_DEVICE);
    RC(cu.ctx_retain(NULL, 0), MC_CUDA_ERROR_INVALID_VALUE);
    /* One primary context per device, the same one each time. */
    CUcontext c0 = context(0), c1 = context(1);
    CHECK(c0 != c1 && context(0) == c0);
    OK(cu.ctx_set(c1));
    OK(cu.ctx_set(NULL));
    RC(cu.ctx_set((CUcontext)&n), MC_CUDA_ERROR_INVALID_CONTEXT);
}

static void case_devices_env(void) {
    OK(cu.init(0));
    int n = -1;
    OK(cu.device_count(&n));
    CHECK(n == 5);
    CUdevice d;
    OK(cu.device_get(&d, 4));
    RC(cu.device_get(&d, 5), MC_CUDA_ERROR_INVALID_DEVICE);
}

static void case_no_device(void) {
    /* As the driver on a host without a GPU: cuInit says so and the
     * driver stays uninitialised. */
    RC(cu.init(0), MC_CUDA_ERROR_NO_DEVICE);
    int n = -1;
    RC(cu.device_count(&n), MC_CUDA_ERROR_NOT_INITIALIZED);
    RC(cu.init(0), MC_CUDA_ERROR_NO_DEVICE);
}

static void case_bad_env(void) {
    /* MC_FAKECUDA_DEVICES or MC_FAKECUDA_FAIL that cannot be parsed:
     * cuInit refuses rather than guessing. */
    RC(cu.init(0), MC_CUDA_ERROR_INVALID_VALUE);
    int n;
    RC(cu.device_count(&n), MC_CUDA_ERROR_NOT_INITIALIZED);
}

struct ctx_thread {
    int dev; /* -1: no context */
    CUresult alloc_rc;
    int ordinal;
    int copied;
};

static void *ctx_thread_main(void *arg) {
    struct ctx_thread *t = arg;
    if (t->dev >= 0) OK(cu.ctx_set(context(t->dev)));
    CUdeviceptr p = 0;
    t->alloc_rc = cu.alloc(&p, 100);
    if (t->alloc_rc == MC_CUDA_SUCCESS) {
        OK(cu.attr(&t->ordinal, MC_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p));
        OK(cu.free(p));
    }
    return NULL;
}

static void case_contexts(void) {
    OK(cu.init(0));
    CUdeviceptr p = 0;
    RC(cu.alloc(&p, 64), MC_CUDA_ERROR_INVALID_CONTEXT); /* none current */
    OK(cu.ctx_set(context(1)));
    /* The current context is per thread: a thread without one cannot
     * allocate; one with device 0's allocates there, while this thread's
     * stays device 1's. */
    struct ctx_thread none = {-1, 0, -1, 0}, zero = {0, 0, -1, 0};
    pthread_t a, b;
    CHECK(pthread_create(&a, NULL, ctx_thread_main, &none) == 0);
    CHECK(pthread_create(&b, NULL, ctx_thread_main, &zero) == 0);
    CHECK(pthread_join(a, NULL) == 0 && pthread_join(b, NULL) == 0);
    CHECK(none.alloc_rc == MC_CUDA_ERROR_INVALID_CONTEXT);
    CHECK(zero.alloc_rc == MC_CUDA_SUCCESS && zero.ordinal == 0);
    p = dalloc(64);
    int ord = -1;
    OK(cu.attr(&ord, MC_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p));
    CHECK(ord == 1);
    /* Copies need no context (unified addressing) but the double counts
     * the calls made without one. */
    unsigned char b64[64];
    fill(b64, sizeof b64, 3);
    OK(cu.ctx_set(NULL));
    RC(cu.alloc(&p, 64), MC_CUDA_ERROR_INVALID_CONTEXT);
    int before = cu.calls_without_context("cuMemcpyHtoD_v2");
    OK(cu.htod(p, b64, sizeof b64));
    CHECK(cu.calls_without_context("cuMemcpyHtoD_v2") == before + 1);
    OK(cu.ctx_set(context(0)));
    OK(cu.htod(p, b64, sizeof b64));
    CHECK(cu.calls_without_context("cuMemcpyHtoD_v2") == before + 1);
    CHECK(cu.calls("cuMemcpyHtoD_v2") == 2);
    CHECK(cu.calls_without_context("cuNoSuchCall") == -1);
}

static void case_require_context(void) {
    /* MC_FAKECUDA_REQUIRE_CONTEXT=1: calls that the real driver runs in
     * the current context refuse without one. */
    OK(cu.init(0));
    OK(cu.ctx_set(context(0)));
    CUdeviceptr p = dalloc(32);
    unsigned char b[32] = {0};
    OK(cu.ctx_set(NULL));
    RC(cu.htod(p, b, sizeof b), MC_CUDA_ERROR_INVALID_CONTEXT);
    RC(cu.dtoh(b, p, sizeof b), MC_CUDA_ERROR_INVALID_CONTEXT);
    void *h = NULL;
    RC(cu.host_alloc(&h, 32, 0), MC_CUDA_ERROR_INVALID_CONTEXT);
    RC(cu.free(p), MC_CUDA_ERROR_INVALID_CONTEXT);
    OK(cu.ctx_set(context(1)));
    OK(cu.htod(p, b, sizeof b));
    OK(cu.free(p));
}

static void case_attributes(void) {
    start(1);
    size_t n = 10000; /* not a whole number of pages */
    CUdeviceptr p = dalloc(n);
    CHECK(p % (CUdeviceptr)sysconf(_SC_PAGESIZE) == 0);
    CHECK(mem_type(p, MC_CUDA_SUCCESS) == MC_CU_MEMORYTYPE_DEVICE);
    CHECK(mem_type(p + n - 1, MC_CUDA_SUCCESS) == MC_CU_MEMORYTYPE_DEVICE);
    int ord = -1;
    OK(cu.attr(&ord, MC_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p + 17));
    CHECK(ord == 1);
    mem_type(p + n, MC_CUDA_ERROR_INVALID_VALUE); /* one past the end */
    RC(cu.attr(NULL, MC_CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p), MC_CUDA_ERROR_INVALID_VALUE);
    RC(cu.attr(&ord, 12345, p), MC_CUDA_ERROR_INVALID_VALUE); /* an attribute it does not keep */

    CUdeviceptr base = 0;
    size_t size = 0;
    OK(cu.range(&base, &size, p + 4321));
    CHECK(base == p && size == n);
    OK(cu.range(NULL, &size, p)); /* either output may be NULL */
    OK(cu.range(&base, NULL, p + n - 1));
    RC(cu.range(&base, &size, p + n), MC_CUDA_ERROR_NOT_FOUND);

    /* Pinned host memory is HOST; pageable memory the driver does not
     * know. */
    void *h = NULL;
    OK(cu.host_alloc(&h, 5000, 0));
    CHECK(mem_type((CUdeviceptr)(uintptr_t)h + 4999, MC_CUDA_SUCCESS) == MC_CU_MEMORYTYPE_HOST);
    RC(cu.attr(&ord, MC_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, (CUdeviceptr)(uintptr_t)h), MC_CUDA_ERROR_INVALID_VALUE);
    RC(cu.range(&base, &size, (CUdeviceptr)(uintptr_t)h), MC_CUDA_ERROR_NOT_FOUND);
    char stack[16];
    void *heap = malloc(100);
    mem_type((CUdeviceptr)(uintptr_t)stack, MC_CUDA_ERROR_INVALID_VALUE);
    mem_type((CUdeviceptr)(uintptr_t)heap, MC_CUDA_ERROR_INVALID_VALUE);
    RC(cu.range(&base, &size, (CUdeviceptr)(uintptr_t)heap), MC_CUDA_ERROR_NOT_FOUND);
    mem_type(0, MC_CUDA_ERROR_INVALID_VALUE);
    free(heap);

    /* Freed memory is nobody's. */
    OK(cu.free(p));
    mem_type(p, MC_CUDA_ERROR_INVALID_VALUE);
    RC(cu.range(&base, &size, p), MC_CUDA_ERROR_NOT_FOUND);
    OK(cu.host_free(h));
    mem_type((CUdeviceptr)(uintptr_t)h, MC_CUDA_ERROR_INVALID_VALUE);
}

static void case_alloc_free(void) {
    start(0);
    CUdeviceptr p = 0;
    RC(cu.alloc(&p, 0), MC_CUDA_ERROR_INVALID_VALUE);
    RC(cu.alloc(NULL, 16), MC_CUDA_ERROR_INVALID_VALUE);
    p = dalloc(4096);
    RC(cu.free(p + 1), MC_CUDA_ERROR_INVALID_VALUE); /* not the base */
    OK(cu.free(p));
    RC(cu.free(p), MC_CUDA_ERROR_INVALID_VALUE); /* twice */
    RC(cu.free(0x1000), MC_CUDA_ERROR_INVALID_VALUE);
    /* Freed addresses are not handed out again, so a stale pointer can
     * never alias a new allocation. */
    CUdeviceptr q = dalloc(4096);
    CHECK(q != p);

    void *h = NULL;
    RC(cu.host_alloc(&h, 0, 0), MC_CUDA_ERROR_INVALID_VALUE);
    RC(cu.host_alloc(&h, 16, 0x100), MC_CUDA_ERROR_INVALID_VALUE); /* unknown flag */
    RC(cu.host_alloc(NULL, 16, 0), MC_CUDA_ERROR_INVALID_VALUE);
    OK(cu.host_alloc(&h, 3000, 0x1 | 0x2)); /* PORTABLE | DEVICEMAP */
    CHECK((uintptr_t)h % (uintptr_t)sysconf(_SC_PAGESIZE) == 0);
    memset(h, 0xab, 3000); /* pinned host memory is the CPU's */
    RC(cu.host_free((char *)h + 1), MC_CUDA_ERROR_INVALID_VALUE);
    RC(cu.free((CUdeviceptr)(uintptr_t)h), MC_CUDA_ERROR_INVALID_VALUE);
    RC(cu.host_free((void *)(uintptr_t)q), MC_CUDA_ERROR_INVALID_VALUE);
    OK(cu.host_free(h));
    RC(cu.host_free(h), MC_CUDA_ERROR_INVALID_VALUE);
    OK(cu.free(q));
}

static void case_cpu_faults(void) {
    start(0);
    CUdeviceptr p = dalloc(8192);
    dset(p, 8192, 1);
    /* The CPU cannot touch device memory: loads and stores fault. */
    CHECK(cpu_touch(p, 1) == SIGSEGV);
    CHECK(cpu_touch(p + 8191, 0) == SIGSEGV);
    CHECK(dfilled(p, 8192, 1)); /* and the store changed nothing */
    OK(cu.free(p));
    CHECK(cpu_touch(p, 1) == SIGSEGV); /* nor after it is freed */
    /* The probe itself works: pinned host memory survives a store. */
    void *h = NULL;
    OK(cu.host_alloc(&h, 64, 0));
    CHECK(cpu_touch((CUdeviceptr)(uintptr_t)h, 1) == 0);
    OK(cu.host_free(h));
}

static void case_copies(void) {
    start(0);
    enum { N = 3 * 4096 + 100 };
    static unsigned char src[N], dst[N];
    CUdeviceptr a = dalloc(N), b = dalloc(N);
    fill(src, N, 11);
    OK(cu.htod(a, src, N));
    OK(cu.dtod(b, a, N));
    OK(cu.dtoh(dst, b, N));
    CHECK(filled(dst, N, 11));
    /* Interior offsets. */
    OK(cu.htod(a + 1000, src + 5, 2000));
    memset(dst, 0, N);
    OK(cu.dtoh(dst, a + 1000, 2000));
    CHECK(memcmp(dst, src + 5, 2000) == 0);
    dset(a, N, 11);

    /* cuMemcpy takes either side as device or host. */
    void *pin = NULL;
    OK(cu.host_alloc(&pin, N, 0));
    OK(cu.copy((CUdeviceptr)(uintptr_t)pin, a, N)); /* device to pinned */
    CHECK(filled(pin, N, 11));
    fill(src, N, 12);
    OK(cu.copy(b, (CUdeviceptr)(uintptr_t)src, N)); /* pageable to device */
    CHECK(dfilled(b, N, 12));
    OK(cu.copy(a, b, N)); /* device to device */
    CHECK(dfilled(a, N, 12));
    memset(dst, 0, N);
    OK(cu.copy((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)pin, N)); /* host to host */
    CHECK(filled(dst, N, 11));
    OK(cu.copy(a + 1, a, 10)); /* overlapping, like memmove */
    OK(cu.dtoh(dst, a, 11));
    CHECK(dst[0] == dst[1] && memcmp(dst + 1, src, 10) == 0);
    dset(a, N, 12);
    OK(cu.htod(a, src, 0)); /* nothing to do */

    /* Device ranges not inside one live allocation: refused, and nothing
     * moves (the destinations still hold pattern 12). */
    memset(dst, 0x5a, N);
    fill(src, N, 99);
    CUdeviceptr gone = dalloc(N);
    OK(cu.free(gone));
    struct {
        const char *what;
        CUresult rc;
    } bad[] = {
        {"HtoD past the end", cu.htod(a + 1, src, N)},
        {"HtoD into freed memory", cu.htod(gone, src, 16)},
        {"HtoD into freed memory at an offset", cu.htod(gone + 8, src, 16)},
        {"HtoD to a host pointer", cu.htod((CUdeviceptr)(uintptr_t)dst, src, 16)},
        {"HtoD to pinned host memory", cu.htod((CUdeviceptr)(uintptr_t)pin, src, 16)},
        {"HtoD from device memory", cu.htod(a, (const void *)(uintptr_t)b, 16)},
        {"HtoD to NULL", cu.htod(0, src, 16)},
        {"HtoD with a wrapping size", cu.htod(a, src, SIZE_MAX)},
        {"DtoH past the end", cu.dtoh(dst, b + N - 8, 9)},
        {"DtoH from freed memory", cu.dtoh(dst, gone, 16)},
        {"DtoH from host memory", cu.dtoh(dst, (CUdeviceptr)(uintptr_t)src, 16)},
        {"DtoH into device memory", cu.dtoh((void *)(uintptr_t)a, b, 16)},
        {"DtoH into a host range that runs into device memory", cu.dtoh((void *)(uintptr_t)(a - 8), b, 16)},
        {"DtoD past the end", cu.dtod(a, b + 1, N)},
        {"DtoD from freed memory", cu.dtod(a, gone, 16)},
        {"DtoD to a host pointer", cu.dtod((CUdeviceptr)(uintptr_t)dst, a, 16)},
        {"cuMemcpy past a device end", cu.copy(a + N - 1, (CUdeviceptr)(uintptr_t)src, 2)},
        {"cuMemcpy from freed memory", cu.copy((CUdeviceptr)(uintptr_t)dst, gone, 16)},
        {"cuMemcpy host range into device memory", cu.copy((CUdeviceptr)(uintptr_t)dst, a - 4, 8)},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (bad[i].rc != MC_CUDA_ERROR_INVALID_VALUE) FAIL("%s: rc %d, want INVALID_VALUE", bad[i].what, bad[i].rc);
    CHECK(dfilled(a, N, 12) && dfilled(b, N, 12));
    CHECK(all(dst, N, 0x5a));
    CHECK(filled(pin, N, 11));
    OK(cu.host_free(pin));
    OK(cu.free(a));
    OK(cu.free(b));
}

static void case_error_strings(void) {
    int codes[] = {MC_CUDA_SUCCESS,
                   MC_CUDA_ERROR_INVALID_VALUE,
                   MC_CUDA_ERROR_OUT_OF_MEMORY,
                   MC_CUDA_ERROR_NOT_INITIALIZED,
                   MC_CUDA_ERROR_NO_DEVICE,
                   MC_CUDA_ERROR_INVALID_DEVICE,
                   MC_CUDA_ERROR_INVALID_CONTEXT,
                   MC_CUDA_ERROR_MAP_FAILED,
                   MC_CUDA_ERROR_INVALID_HANDLE,
                   MC_CUDA_ERROR_NOT_FOUND,
                   MC_CUDA_ERROR_UNKNOWN};
    const char *seen[sizeof codes / sizeof codes[0]];
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
        const char *s = NULL;
        OK(cu.error_string(codes[i], &s));
        CHECK(s != NULL && *s != 0);
        for (size_t j = 0; j < i; j++) CHECK(strcmp(seen[j], s) != 0); /* each its own */
        seen[i] = s;
    }
    const char *s = "untouched";
    RC(cu.error_string(12345, &s), MC_CUDA_ERROR_INVALID_VALUE);
    CHECK(s == NULL);
    RC(cu.error_string(MC_CUDA_SUCCESS, NULL), MC_CUDA_ERROR_INVALID_VALUE);
}

/* Failures armed by MC_FAKECUDA_FAIL=cuInit:1,cuMemAlloc_v2:2:2,cuMemcpyHtoD_v2:2,cuMemcpyDtoH_v2:1:205 */
static void case_fail_env(void) {
    RC(cu.init(0), MC_CUDA_ERROR_UNKNOWN); /* the first call, default code */
    int n;
    RC(cu.device_count(&n), MC_CUDA_ERROR_NOT_INITIALIZED); /* it did nothing */
    start(0);
    CUdeviceptr p = dalloc(64), q = 0;
    RC(cu.alloc(&q, 64), MC_CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(q == 0);
    q = dalloc(64);
    unsigned char b[64];
    fill(b, 64, 1);
    OK(cu.htod(p, b, 64));
    fill(b, 64, 2);
    RC(cu.htod(p, b, 64), MC_CUDA_ERROR_UNKNOWN); /* copies nothing */
    unsigned char out[64];
    memset(out, 0, 64);
    RC(cu.dtoh(out, p, 64), MC_CUDA_ERROR_MAP_FAILED);
    CHECK(all(out, 64, 0));
    OK(cu.dtoh(out, p, 64));
    CHECK(filled(out, 64, 1));
    OK(cu.htod(p, b, 64)); /* the third works again */
    CHECK(dfilled(p, 64, 2));
    CHECK(cu.calls("cuInit") == 2 && cu.calls("cuMemAlloc_v2") == 3 && cu.calls("cuMemcpyHtoD_v2") == 3);
}

static void case_fail_hooks(void) {
    start(0);
    CUdeviceptr p = dalloc(64);
    unsigned char b[64];
    fill(b, 64, 5);
    OK(cu.htod(p, b, 64));
    CHECK(cu.calls("cuMemcpyHtoD_v2") == 1);
    CHECK(cu.calls("cuNoSuchCall") == -1);
    /* nth counts from now: 1 is the next call, whatever came before. */
    cu.fail("cuMemcpyHtoD_v2", 2, MC_CUDA_ERROR_INVALID_HANDLE);
    cu.fail("cuMemcpyDtoD_v2", 1, 0); /* 0: the default code */
    fill(b, 64, 6);
    OK(cu.htod(p, b, 64));
    fill(b, 64, 7);
    RC(cu.htod(p, b, 64), MC_CUDA_ERROR_INVALID_HANDLE);
    CHECK(dfilled(p, 64, 6)); /* nothing copied */
    CUdeviceptr q = dalloc(64);
    RC(cu.dtod(q, p, 64), MC_CUDA_ERROR_UNKNOWN);
    OK(cu.dtod(q, p, 64)); /* one shot */
    CHECK(dfilled(q, 64, 6));
    CHECK(cu.calls("cuMemcpyHtoD_v2") == 3);
    /* Injection comes first, even for calls that would fail otherwise. */
    cu.fail("cuMemFree_v2", 1, MC_CUDA_ERROR_NOT_FOUND);
    RC(cu.free(0x1000), MC_CUDA_ERROR_NOT_FOUND);
    /* reset zeroes counts and disarms. */
    cu.fail("cuMemcpyDtoH_v2", 1, 0);
    cu.reset();
    CHECK(cu.calls("cuMemcpyHtoD_v2") == 0 && cu.calls("cuMemAlloc_v2") == 0);
    CHECK(cu.calls_without_context("cuMemcpyHtoD_v2") == 0);
    CHECK(dfilled(p, 64, 6));
    CHECK(cu.calls("cuMemcpyDtoH_v2") == 1);
}

/* Threads hammer the table and the records at once. */
enum { THREADS = 4, ROUNDS = 200 };

struct worker {
    int id;
    int failures;
};

static void *worker_main(void *arg) {
    struct worker *w = arg;
    OK(cu.ctx_set(context(w->id % 2)));
    unsigned char in[1000], out[1000];
    for (int i = 0; i < ROUNDS; i++) {
        size_t n = 1 + (size_t)(w->id * 131 + i * 17) % sizeof in;
        CUdeviceptr a = dalloc(n), b = dalloc(n);
        fill(in, n, (unsigned)(w->id * 1000 + i));
        OK(cu.htod(a, in, n));
        CUresult r = cu.dtod(b, a, n);
        if (r != MC_CUDA_SUCCESS) {
            CHECK(r == MC_CUDA_ERROR_UNKNOWN);
            w->failures++;
            OK(cu.dtod(b, a, n));
        }
        OK(cu.dtoh(out, b, n));
        CHECK(filled(out, n, (unsigned)(w->id * 1000 + i)));
        int ord = -1;
        OK(cu.attr(&ord, MC_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, b + n - 1));
        CHECK(ord == w->id % 2);
        OK(cu.free(a));
        OK(cu.free(b));
    }
    return NULL;
}

static void case_threads(void) {
    OK(cu.init(0));
    /* Exactly one call among all threads' fails. */
    cu.fail("cuMemcpyDtoD_v2", THREADS * ROUNDS / 2, 0);
    pthread_t t[THREADS];
    struct worker w[THREADS];
    for (int i = 0; i < THREADS; i++) {
        w[i] = (struct worker){i, 0};
        CHECK(pthread_create(&t[i], NULL, worker_main, &w[i]) == 0);
    }
    int failures = 0;
    for (int i = 0; i < THREADS; i++) {
        CHECK(pthread_join(t[i], NULL) == 0);
        failures += w[i].failures;
    }
    CHECK(failures == 1);
    CHECK(cu.calls("cuMemAlloc_v2") == 2 * THREADS * ROUNDS);
    CHECK(cu.calls("cuMemcpyDtoD_v2") == THREADS * ROUNDS + 1);
    CHECK(cu.calls_without_context("cuMemcpyDtoD_v2") == 0);
}

/* ---- IPC ---- */

static void hex(const CUipcMemHandle *h, char out[129]) {
    for (int i = 0; i < 64; i++) sprintf(out + 2 * i, "%02x", (unsigned char)h->reserved[i]);
}

static CUipcMemHandle unhex(const char *s) {
    CUipcMemHandle h;
    if (strlen(s) != 128) FAIL("bad handle %s", s);
    for (int i = 0; i < 64; i++) {
        unsigned v;
        if (sscanf(s + 2 * i, "%2x", &v) != 1) FAIL("bad handle %s", s);
        h.reserved[i] = (char)v;
    }
    return h;
}

enum { IPC_N = 2 * 4096 + 333 };

/* ipc_peer runs in the second process: argv = LIB --ipc-peer LIVE STALE GONE. */
static int ipc_peer(char **argv) {
    case_name = "ipc (peer)";
    CUipcMemHandle live = unhex(argv[3]), stale = unhex(argv[4]), gone = unhex(argv[5]);
    start(0);
    CUdeviceptr p = 0;
    OK(cu.ipc_open(&p, live, MC_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
    CHECK(p != 0);
    /* The mapping is device memory of the owner's device (1). */
    CHECK(mem_type(p + IPC_N - 1, MC_CUDA_SUCCESS) == MC_CU_MEMORYTYPE_DEVICE);
    int ord = -1;
    OK(cu.attr(&ord, MC_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p));
    CHECK(ord == 1);
    CUdeviceptr base = 0;
    size_t size = 0;
    OK(cu.range(&base, &size, p + 100));
    CHECK(base == p && size == IPC_N);
    /* It holds what the owner wrote. */
    CHECK(dfilled(p, IPC_N, 41));
    static unsigned char buf[IPC_N];
    OK(cu.copy((CUdeviceptr)(uintptr_t)buf, p, IPC_N));
    CHECK(filled(buf, IPC_N, 41));
    /* The CPU cannot touch it here either. */
    CHECK(cpu_touch(p + 5, 1) == SIGSEGV);
    /* Bounds hold as for the owner's allocation. */
    RC(cu.dtoh(buf, p + 1, IPC_N), MC_CUDA_ERROR_INVALID_VALUE);
    /* A handle of a mapping cannot be taken; only the owner's allocation. */
    CUipcMemHandle again;
    RC(cu.ipc_get(&again, p), MC_CUDA_ERROR_INVALID_VALUE);
    /* Write back: the owner checks it after we exit. */
    CUdeviceptr mine = dalloc(IPC_N);
    dset(mine, IPC_N, 42);
    OK(cu.dtod(p, mine, IPC_N));
    RC(cu.free(p), MC_CUDA_ERROR_INVALID_VALUE); /* not ours to free */
    RC(cu.ipc_close(p + 1), MC_CUDA_ERROR_INVALID_VALUE);
    RC(cu.ipc_close(mine), MC_CUDA_ERROR_INVALID_VALUE);
    OK(cu.ipc_close(p));
    RC(cu.ipc_close(p), MC_CUDA_ERROR_INVALID_VALUE);
    mem_type(p, MC_CUDA_ERROR_INVALID_VALUE);
    RC(cu.dtoh(buf, p, 16), MC_CUDA_ERROR_INVALID_VALUE);
    CHECK(cpu_touch(p, 0) == SIGSEGV);
    /* Memory the owner freed, and an owner that is gone. */
    CUdeviceptr q = 0;
    RC(cu.ipc_open(&q, stale, 0), MC_CUDA_ERROR_INVALID_HANDLE);
    RC(cu.ipc_open(&q, gone, 0), MC_CUDA_ERROR_INVALID_HANDLE);
    CHECK(q == 0);
    return 0;
}

/* handle_from_gone_process returns a handle made by a process that has
 * exited since. */
static CUipcMemHandle handle_from_gone_process(void) {
    int fds[2];
    CHECK(pipe(fds) == 0);
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        CUipcMemHandle h;
        if (cu.ipc_get(&h, dalloc(4096)) != MC_CUDA_SUCCESS || write(fds[1], &h, sizeof h) != sizeof h) _exit(1);
        _exit(0);
    }
    close(fds[1]);
    CUipcMemHandle h;
    CHECK(read(fds[0], &h, sizeof h) == sizeof h);
    close(fds[0]);
    int st;
    CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    return h;
}

static void case_ipc(void) {
    start(1);
    CUdeviceptr p = dalloc(IPC_N);
    dset(p, IPC_N, 41);
    CUipcMemHandle live, stale, bad;
    RC(cu.ipc_get(&live, p + 1), MC_CUDA_ERROR_INVALID_VALUE); /* only the base */
    RC(cu.ipc_get(NULL, p), MC_CUDA_ERROR_INVALID_VALUE);
    RC(cu.ipc_get(&live, 0x1000), MC_CUDA_ERROR_INVALID_VALUE);
    OK(cu.ipc_get(&live, p));
    CUdeviceptr q = 0;
    /* The driver will not open a handle in the process that made it. */
    RC(cu.ipc_open(&q, live, MC_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), MC_CUDA_ERROR_INVALID_CONTEXT);
    RC(cu.ipc_open(&q, live, 0x40), MC_CUDA_ERROR_INVALID_VALUE); /* unknown flag */
    memset(&bad, 0x17, sizeof bad);
    RC(cu.ipc_open(&q, bad, 0), MC_CUDA_ERROR_INVALID_HANDLE);
    bad = live;
    bad.reserved[0] ^= 1; /* the magic */
    RC(cu.ipc_open(&q, bad, 0), MC_CUDA_ERROR_INVALID_HANDLE);
    CHECK(q == 0);
    /* stale: memory freed before the peer opens it; another allocation
     * may reuse its descriptor number, which the handle must catch. */
    CUdeviceptr s = dalloc(IPC_N);
    OK(cu.ipc_get(&stale, s));
    OK(cu.free(s));
    CUdeviceptr reuse = dalloc(IPC_N);
    CUipcMemHandle gone = handle_from_gone_process();

    char a[129], b[129], c[129];
    hex(&live, a);
    hex(&stale, b);
    hex(&gone, c);
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        execl("/proc/self/exe", "selftest", lib_path, "--ipc-peer", a, b, c, (char *)NULL);
        fprintf(stderr, "exec: %s\n", strerror(errno));
        _exit(127);
    }
    int st;
    CHECK(waitpid(pid, &st, 0) == pid);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) FAIL("the peer failed (status %#x)", st);
    /* The peer's write landed in our memory. */
    CHECK(dfilled(p, IPC_N, 42));
    OK(cu.free(p));
    OK(cu.free(reuse));
}

/* Copies into device memory from device or pageable host memory return
 * before they land, on the legacy stream; cuStreamSynchronize, a later
 * copy or a free lands them, in order. A pageable source is read at the
 * call; pinned sources and host destinations are synchronous. */
static void case_legacy_stream(void) {
    start(0);
    enum { N = 2 * 4096 + 7 };
    static unsigned char host[N], dst[N];
    CUdeviceptr a = dalloc(N), b = dalloc(N);
    void *pin = NULL;
    OK(cu.host_alloc(&pin, N, 0));
    fill(pin, N, 3);
    OK(cu.copy(a, (CUdeviceptr)(uintptr_t)pin, N)); /* pinned to device: done */
    CHECK(cu.pending() == 0);
    OK(cu.copy(b, a, N)); /* device to device: queued */
    CHECK(cu.pending() == 1);
    OK(cu.sync(NULL));
    CHECK(cu.pending() == 0);
    OK(cu.copy((CUdeviceptr)(uintptr_t)dst, b, N)); /* device to pageable: done */
    CHECK(cu.pending() == 0 && filled(dst, N, 3));

    fill(host, N, 4);
    OK(cu.copy(a, (CUdeviceptr)(uintptr_t)host, N)); /* pageable to device: staged, queued */
    CHECK(cu.pending() == 1);
    fill(host, N, 5); /* the source may change once the call returned */
    OK(cu.copy(b, a, N)); /* lands the first, queues itself */
    CHECK(cu.pending() == 1);
    CHECK(dfilled(b, N, 4)); /* a later copy runs after both */
    CHECK(cu.pending() == 0);

    OK(cu.copy(b, (CUdeviceptr)(uintptr_t)host, N));
    CHECK(cu.pending() == 1);
    OK(cu.free(b)); /* a free waits for the stream */
    CHECK(cu.pending() == 0);
    RC(cu.sync((CUstream)(uintptr_t)1), MC_CUDA_ERROR_INVALID_HANDLE);
    OK(cu.host_free(pin));
    OK(cu.free(a));
}

/* ---- the runner ---- */

struct tcase {
    const char *name;
    void (*run)(void);
    const char *env[3]; /* NAME=VALUE set for its process */
};

static const struct tcase cases[] = {
    {"uninitialized", case_uninitialized, {NULL}},
    {"devices", case_devices, {NULL}},
    {"devices_env", case_devices_env, {"MC_FAKECUDA_DEVICES=5", NULL}},
    {"no_device", case_no_device, {"MC_FAKECUDA_DEVICES=0", NULL}},
    {"bad_devices_env", case_bad_env, {"MC_FAKECUDA_DEVICES=two", NULL}},
    {"bad_fail_env_name", case_bad_env, {"MC_FAKECUDA_FAIL=cuMemcpy:1,cuNoSuchCall:1", NULL}},
    {"bad_fail_env_count", case_bad_env, {"MC_FAKECUDA_FAIL=cuMemcpy:0", NULL}},
    {"contexts", case_contexts, {NULL}},
    {"require_context", case_require_context, {"MC_FAKECUDA_REQUIRE_CONTEXT=1", NULL}},
    {"attributes", case_attributes, {NULL}},
    {"alloc_free", case_alloc_free, {NULL}},
    {"cpu_faults", case_cpu_faults, {NULL}},
    {"copies", case_copies, {NULL}},
    {"legacy_stream", case_legacy_stream, {NULL}},
    {"error_strings", case_error_strings, {NULL}},
    {"fail_env", case_fail_env, {"MC_FAKECUDA_FAIL=cuInit:1,cuMemAlloc_v2:2:2,cuMemcpyHtoD_v2:2,cuMemcpyDtoH_v2:1:205", NULL}},
    {"fail_hooks", case_fail_hooks, {NULL}},
    {"threads", case_threads, {NULL}},
    {"ipc", case_ipc, {NULL}},
};

enum { NCASES = sizeof cases / sizeof cases[0] };

static const struct tcase *lookup(const char *name) {
    for (int i = 0; i < NCASES; i++)
        if (strcmp(cases[i].name, name) == 0) return &cases[i];
    return NULL;
}

/* spawn runs case c in a fresh process with exactly its environment knobs
 * and reports whether it passed. */
static int spawn(const struct tcase *c) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) FAIL("fork: %s", strerror(errno));
    if (pid == 0) {
        unsetenv("MC_FAKECUDA_DEVICES");
        unsetenv("MC_FAKECUDA_FAIL");
        unsetenv("MC_FAKECUDA_REQUIRE_CONTEXT");
        for (int i = 0; c->env[i] != NULL; i++) putenv((char *)c->env[i]);
        execl("/proc/self/exe", "selftest", lib_path, "--run", c->name, (char *)NULL);
        fprintf(stderr, "exec: %s\n", strerror(errno));
        _exit(127);
    }
    int st;
    if (waitpid(pid, &st, 0) != pid) FAIL("waitpid: %s", strerror(errno));
    int ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
    if (WIFSIGNALED(st)) fprintf(stderr, "%s: killed by signal %d\n", c->name, WTERMSIG(st));
    printf("%s %s\n", ok ? "ok  " : "FAIL", c->name);
    return ok;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s LIB [-list | CASE...]\n", argv[0]);
        return 2;
    }
    lib_path = argv[1];
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc == 3 && strcmp(argv[2], "-list") == 0) {
        for (int i = 0; i < NCASES; i++) printf("%s\n", cases[i].name);
        return 0;
    }
    if (argc == 6 && strcmp(argv[2], "--ipc-peer") == 0) {
        load(lib_path);
        return ipc_peer(argv);
    }
    if (argc == 4 && strcmp(argv[2], "--run") == 0) {
        const struct tcase *c = lookup(argv[3]);
        if (c == NULL) FAIL("no case %s", argv[3]);
        case_name = c->name;
        load(lib_path);
        c->run();
        return 0;
    }
    int failed = 0;
    if (argc == 2) {
        for (int i = 0; i < NCASES; i++) failed += !spawn(&cases[i]);
    } else {
        for (int i = 2; i < argc; i++) {
            const struct tcase *c = lookup(argv[i]);
            if (c == NULL) FAIL("no case %s (see -list)", argv[i]);
            failed += !spawn(c);
        }
    }
    if (failed) printf("%d case(s) failed\n", failed);
    return failed ? 1 : 0;
}
