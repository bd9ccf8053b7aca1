//go:build ignore

/* fakecuda.c: a test double of the CUDA driver entry points that
 * mooncake-go calls (../cudaabi.h), implemented over host memory so that
 * the device path of the engine runs on machines without a GPU.
 *
 * Device memory is a memfd mapped twice: PROT_NONE at the address handed
 * out as the CUdeviceptr (so any CPU load or store through it faults, as it
 * would on a real GPU), and read-write at a private alias that only the
 * double's copies use. IPC handles name the owner's memfd through
 * /proc/<pid>/fd/<fd>. Behaviour follows the driver's documentation;
 * README.md lists what is implemented, the environment knobs and the
 * fakecuda_* test hooks.
 *
 * The "go:build ignore" line above keeps the Go tool from treating this
 * file as part of the (test-only, cgo-free) Go package in this directory. */

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../cudaabi.h"

#define EXPORT __attribute__((visibility("default")))

/* ---- entry points: names, call counts and injected failures ---- */

enum {
    F_cuInit,
    F_cuGetErrorString,
    F_cuDeviceGetCount,
    F_cuDeviceGet,
    F_cuDevicePrimaryCtxRetain,
    F_cuCtxSetCurrent,
    F_cuPointerGetAttribute,
    F_cuMemGetAddressRange_v2,
    F_cuMemcpy,
    F_cuMemcpyHtoD_v2,
    F_cuMemcpyDtoH_v2,
    F_cuMemcpyDtoD_v2,
    F_cuMemHostAlloc,
    F_cuMemFreeHost,
    F_cuIpcGetMemHandle,
    F_cuIpcOpenMemHandle_v2,
    F_cuIpcCloseMemHandle,
    F_cuMemAlloc_v2,
    F_cuMemFree_v2,
    F_cuStreamSynchronize,
    F_COUNT
};

static const char *const fn_names[F_COUNT] = {
    "cuInit",
    "cuGetErrorString",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDevicePrimaryCtxRetain",
    "cuCtxSetCurrent",
    "cuPointerGetAttribute",
    "cuMemGetAddressRange_v2",
    "cuMemcpy",
    "cuMemcpyHtoD_v2",
    "cuMemcpyDtoH_v2",
    "cuMemcpyDtoD_v2",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuIpcGetMemHandle",
    "cuIpcOpenMemHandle_v2",
    "cuIpcCloseMemHandle",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuStreamSynchronize",
};

/* An armed failure: call number `at` of entry point `fn` returns `code`. */
struct armed {
    int fn;
    long at;
    int code;
};

#define MAX_ARMED 256

static pthread_mutex_t rec_mu = PTHREAD_MUTEX_INITIALIZER;
static long calls[F_COUNT];
static long calls_no_ctx[F_COUNT];
static struct armed armed[MAX_ARMED];
static int narmed;
static pthread_once_t env_once = PTHREAD_ONCE_INIT;
static int config_error; /* a knob could not be parsed: cuInit refuses */

static int fn_index(const char *name) {
    if (name == NULL) return -1;
    for (int i = 0; i < F_COUNT; i++)
        if (strcmp(fn_names[i], name) == 0) return i;
    return -1;
}

/* arm_locked records a failure; rec_mu is held. It returns -1 when the
 * table is full, so that a test asking for too much hears about it. */
static int arm_locked(int fn, long at, int code) {
    if (narmed == MAX_ARMED) return -1;
    armed[narmed++] = (struct armed){fn, at, code == 0 ? MC_CUDA_ERROR_UNKNOWN : code};
    return 0;
}

/* parse_int reads a whole decimal int in [lo, hi] from s..end. */
static int parse_int(const char *s, const char *end, long lo, long hi, long *out) {
    if (s == end) return -1;
    char buf[32];
    size_t n = (size_t)(end - s);
    if (n >= sizeof buf) return -1;
    memcpy(buf, s, n);
    buf[n] = 0;
    char *e = NULL;
    errno = 0;
    long v = strtol(buf, &e, 10);
    if (errno != 0 || *e != 0 || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

/* parse_fail_env arms the failures named by MC_FAKECUDA_FAIL,
 * "name:N[:code][,name:N[:code]]..."; N counts from the first call. */
static void parse_fail_env(void) {
    const char *spec = getenv("MC_FAKECUDA_FAIL");
    if (spec == NULL || *spec == 0) return;
    pthread_mutex_lock(&rec_mu);
    const char *p = spec;
    while (*p != 0) {
        const char *end = strchr(p, ',');
        if (end == NULL) end = p + strlen(p);
        const char *c1 = memchr(p, ':', (size_t)(end - p));
        const char *c2 = c1 == NULL ? NULL : memchr(c1 + 1, ':', (size_t)(end - c1 - 1));
        long nth = 0, code = MC_CUDA_ERROR_UNKNOWN;
        char name[64];
        int fn = -1;
        if (c1 != NULL && (size_t)(c1 - p) < sizeof name) {
            memcpy(name, p, (size_t)(c1 - p));
            name[c1 - p] = 0;
            fn = fn_index(name);
        }
        if (fn < 0 || parse_int(c1 + 1, c2 ? c2 : end, 1, LONG_MAX, &nth) != 0 ||
            (c2 != NULL && parse_int(c2 + 1, end, INT_MIN, INT_MAX, &code) != 0) ||
            arm_locked(fn, nth, (int)code) != 0) {
            fprintf(stderr, "fakecuda: MC_FAKECUDA_FAIL=%s: bad entry \"%.*s\" (want name:N[:code], name an entry point, N >= 1)\n",
                    spec, (int)(end - p), p);
            config_error = 1;
            break;
        }
        p = *end == ',' ? end + 1 : end;
    }
    pthread_mutex_unlock(&rec_mu);
}

static void load_env(void) { parse_fail_env(); }

static void land_locked(void); /* the legacy stream, below */

/* ---- devices and contexts ---- */

#define MAX_DEVICES 64

struct CUctx_st {
    int device;
};

static pthread_mutex_t init_mu = PTHREAD_MUTEX_INITIALIZER;
static int initialized; /* read with __atomic: set once, never cleared */
static int ndevices;
static int require_context; /* MC_FAKECUDA_REQUIRE_CONTEXT=1 */
static struct CUctx_st contexts[MAX_DEVICES];
static __thread CUcontext current;

/* enter counts a call of fn, notes whether the thread had a context, and
 * returns the injected failure for this call, or success. */
static CUresult enter(int fn) {
    pthread_once(&env_once, load_env);
    pthread_mutex_lock(&rec_mu);
    long n = ++calls[fn];
    if (current == NULL) calls_no_ctx[fn]++;
    CUresult r = MC_CUDA_SUCCESS;
    for (int i = 0; i < narmed; i++) {
        if (armed[i].fn == fn && armed[i].at == n) {
            r = armed[i].code;
            armed[i] = armed[--narmed];
            break;
        }
    }
    pthread_mutex_unlock(&rec_mu);
    return r;
}

static int is_initialized(void) { return __atomic_load_n(&initialized, __ATOMIC_ACQUIRE); }

/* ENTER opens every entry point but cuInit and cuGetErrorString: count,
 * injected failure, then the driver's refusal before cuInit. */
#define ENTER(fn)                                           \
    do {                                                    \
        CUresult r_ = enter(F_##fn);                        \
        if (r_ != MC_CUDA_SUCCESS) return r_;               \
        if (!is_initialized()) return MC_CUDA_ERROR_NOT_INITIALIZED; \
    } while (0)

/* NEED_CONTEXT: the real driver works in the calling thread's current
 * context; the double insists only where asked to (README). */
#define NEED_CONTEXT()                                                       \
    do {                                                                     \
        if (require_context && current == NULL) return MC_CUDA_ERROR_INVALID_CONTEXT; \
    } while (0)

EXPORT CUresult cuInit(unsigned int flags) {
    CUresult r = enter(F_cuInit);
    if (r != MC_CUDA_SUCCESS) return r;
    if (flags != 0) return MC_CUDA_ERROR_INVALID_VALUE; /* documented: must be 0 */
    pthread_mutex_lock(&init_mu);
    if (initialized) goto out;
    if (config_error) {
        r = MC_CUDA_ERROR_INVALID_VALUE;
        goto out;
    }
    long n = 2;
    const char *s = getenv("MC_FAKECUDA_DEVICES");
    if (s != NULL && *s != 0 && parse_int(s, s + strlen(s), 0, MAX_DEVICES, &n) != 0) {
        fprintf(stderr, "fakecuda: MC_FAKECUDA_DEVICES=%s: want a count from 0 to %d\n", s, MAX_DEVICES);
        r = MC_CUDA_ERROR_INVALID_VALUE;
        goto out;
    }
    if (n == 0) {
        /* What the driver answers on a host without a GPU; it stays
         * uninitialised, so later calls say NOT_INITIALIZED. */
        r = MC_CUDA_ERROR_NO_DEVICE;
        goto out;
    }
    s = getenv("MC_FAKECUDA_REQUIRE_CONTEXT");
    require_context = s != NULL && strcmp(s, "1") == 0;
    ndevices = (int)n;
    for (int i = 0; i < ndevices; i++) contexts[i].device = i;
    __atomic_store_n(&initialized, 1, __ATOMIC_RELEASE);
out:
    pthread_mutex_unlock(&init_mu);
    return r;
}

EXPORT CUresult cuGetErrorString(CUresult err, const char **str) {
    CUresult r = enter(F_cuGetErrorString);
    if (r != MC_CUDA_SUCCESS) return r;
    if (str == NULL) return MC_CUDA_ERROR_INVALID_VALUE;
    const char *s = NULL;
    switch (err) {
    case MC_CUDA_SUCCESS: s = "no error"; break;
    case MC_CUDA_ERROR_INVALID_VALUE: s = "invalid argument"; break;
    case MC_CUDA_ERROR_OUT_OF_MEMORY: s = "out of memory"; break;
    case MC_CUDA_ERROR_NOT_INITIALIZED: s = "initialization error"; break;
    case MC_CUDA_ERROR_NO_DEVICE: s = "no CUDA-capable device is detected"; break;
    case MC_CUDA_ERROR_INVALID_DEVICE: s = "invalid device ordinal"; break;
    case MC_CUDA_ERROR_INVALID_CONTEXT: s = "invalid device context"; break;
    case MC_CUDA_ERROR_MAP_FAILED: s = "mapping of buffer object failed"; break;
    case MC_CUDA_ERROR_INVALID_HANDLE: s = "invalid resource handle"; break;
    case MC_CUDA_ERROR_NOT_FOUND: s = "named symbol not found"; break;
    case MC_CUDA_ERROR_UNKNOWN: s = "unknown error"; break;
    }
    *str = s;
    return s == NULL ? MC_CUDA_ERROR_INVALID_VALUE : MC_CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetCount(int *count) {
    ENTER(cuDeviceGetCount);
    if (count == NULL) return MC_CUDA_ERROR_INVALID_VALUE;
    *count = ndevices;
    return MC_CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice *dev, int ordinal) {
    ENTER(cuDeviceGet);
    if (dev == NULL) return MC_CUDA_ERROR_INVALID_VALUE;
    if (ordinal < 0 || ordinal >= ndevices) return MC_CUDA_ERROR_INVALID_DEVICE;
    *dev = ordinal;
    return MC_CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev) {
    ENTER(cuDevicePrimaryCtxRetain);
    if (ctx == NULL) return MC_CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= ndevices) return MC_CUDA_ERROR_INVALID_DEVICE;
    *ctx = &contexts[dev];
    return MC_CUDA_SUCCESS;
}

static int is_context(CUcontext c) {
    for (int i = 0; i < ndevices; i++)
        if (c == &contexts[i]) return 1;
    return 0;
}

EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
    ENTER(cuCtxSetCurrent);
    /* NULL unbinds; anything else must be one of ours. */
    if (ctx != NULL && !is_context(ctx)) return MC_CUDA_ERROR_INVALID_CONTEXT;
    current = ctx;
    return MC_CUDA_SUCCESS;
}

/* ---- the memory table ---- */

enum kind {
    K_DEVICE, /* cuMemAlloc_v2: PROT_NONE at base, alias, memfd held */
    K_IPC,    /* cuIpcOpenMemHandle_v2: PROT_NONE at base, alias */
    K_HOST,   /* cuMemHostAlloc: plain read-write memory */
    K_FREED,  /* freed device memory or a closed IPC mapping: the address
               * range stays reserved PROT_NONE, so a stale pointer keeps
               * faulting on the CPU and is never mistaken for host memory */
};

struct region {
    uintptr_t base;
    size_t size;   /* as asked for: the bound every copy is checked against */
    size_t mapped; /* size rounded up to pages */
    char *alias;
    enum kind kind;
    int device;
    int fd;
};

/* regions is sorted by base; ranges never overlap (addresses of freed
 * device memory stay reserved). Copies hold mem_mu shared, so they run in
 * parallel while no allocation or free can pull memory from under them. */
static pthread_rwlock_t mem_mu = PTHREAD_RWLOCK_INITIALIZER;
static struct region *regions;
static size_t nregions, capregions;

/* last_at_or_below returns the index of the last region with base <= p,
 * or -1. */
static long last_at_or_below(uintptr_t p) {
    long lo = 0, hi = (long)nregions - 1, found = -1;
    while (lo <= hi) {
        long mid = lo + (hi - lo) / 2;
        if (regions[mid].base <= p) {
            found = mid;
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    return found;
}

/* find returns the region containing p, or NULL. */
static struct region *find(uintptr_t p) {
    long i = last_at_or_below(p);
    if (i < 0 || p - regions[i].base >= regions[i].size) return NULL;
    return &regions[i];
}

static int is_device_kind(enum kind k) { return k == K_DEVICE || k == K_IPC || k == K_FREED; }

/* touches_device reports whether [p, p+n) overlaps any device range, live
 * or freed. Ranges are disjoint and sorted, so only the region at or below
 * p and the one after it can. */
static int touches_device(uintptr_t p, size_t n) {
    long i = last_at_or_below(p);
    if (i >= 0 && is_device_kind(regions[i].kind) && p - regions[i].base < regions[i].size) return 1;
    size_t j = (size_t)(i + 1);
    return j < nregions && is_device_kind(regions[j].kind) && regions[j].base - p < n;
}

static int insert_region(struct region r) {
    if (nregions == capregions) {
        size_t cap = capregions == 0 ? 16 : capregions * 2;
        struct region *nr = realloc(regions, cap * sizeof *nr);
        if (nr == NULL) return -1;
        regions = nr;
        capregions = cap;
    }
    size_t i = (size_t)(last_at_or_below(r.base) + 1);
    memmove(&regions[i + 1], &regions[i], (nregions - i) * sizeof *regions);
    regions[i] = r;
    nregions++;
    return 0;
}

static void remove_region(struct region *r) {
    size_t i = (size_t)(r - regions);
    memmove(&regions[i], &regions[i + 1], (nregions - i - 1) * sizeof *regions);
    nregions--;
}

static size_t page_round(size_t n) {
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    return (n + pg - 1) / pg * pg;
}

/* map_device maps fd at a fresh PROT_NONE address and at a read-write
 * alias. */
static int map_device(int fd, size_t mapped, void **base, void **alias) {
    *base = mmap(NULL, mapped, PROT_NONE, MAP_SHARED, fd, 0);
    if (*base == MAP_FAILED) return -1;
    *alias = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (*alias == MAP_FAILED) {
        munmap(*base, mapped);
        return -1;
    }
    return 0;
}

/* retire turns a live device region into a reserved, inaccessible range:
 * its pages go back to the system but its addresses are never reused. */
static void retire(struct region *r) {
    munmap(r->alias, r->mapped);
    if (r->fd >= 0) close(r->fd);
    void *p = mmap((void *)r->base, r->mapped, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    if (p == MAP_FAILED) {
        munmap((void *)r->base, r->mapped);
        remove_region(r);
        return;
    }
    r->alias = NULL;
    r->fd = -1;
    r->kind = K_FREED;
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *ptr, size_t n) {
    ENTER(cuMemAlloc_v2);
    if (current == NULL) return MC_CUDA_ERROR_INVALID_CONTEXT;
    if (ptr == NULL || n == 0) return MC_CUDA_ERROR_INVALID_VALUE;
    size_t mapped = page_round(n);
    if (mapped < n) return MC_CUDA_ERROR_OUT_OF_MEMORY;
    int fd = memfd_create("fakecuda", MFD_CLOEXEC);
    if (fd < 0) return MC_CUDA_ERROR_OUT_OF_MEMORY;
    void *base, *alias;
    if (ftruncate(fd, (off_t)mapped) != 0 || map_device(fd, mapped, &base, &alias) != 0) {
        close(fd);
        return MC_CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_rwlock_wrlock(&mem_mu);
    int err = insert_region((struct region){(uintptr_t)base, n, mapped, alias, K_DEVICE, current->device, fd});
    pthread_rwlock_unlock(&mem_mu);
    if (err != 0) {
        munmap(base, mapped);
        munmap(alias, mapped);
        close(fd);
        return MC_CUDA_ERROR_OUT_OF_MEMORY;
    }
    *ptr = (CUdeviceptr)(uintptr_t)base;
    return MC_CUDA_SUCCESS;
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr ptr) {
    ENTER(cuMemFree_v2);
    NEED_CONTEXT();
    CUresult r = MC_CUDA_ERROR_INVALID_VALUE;
    pthread_rwlock_wrlock(&mem_mu);
    land_locked(); /* a free waits for the stream */
    struct region *g = find((uintptr_t)ptr);
    if (g != NULL && g->kind == K_DEVICE && g->base == (uintptr_t)ptr) {
        retire(g);
        r = MC_CUDA_SUCCESS;
    }
    pthread_rwlock_unlock(&mem_mu);
    return r;
}

/* Flags cuMemHostAlloc documents: PORTABLE, DEVICEMAP, WRITECOMBINED. */
#define HOST_ALLOC_FLAGS 0x7u

EXPORT CUresult cuMemHostAlloc(void **p, size_t n, unsigned int flags) {
    ENTER(cuMemHostAlloc);
    NEED_CONTEXT();
    if (p == NULL || n == 0 || (flags & ~HOST_ALLOC_FLAGS) != 0) return MC_CUDA_ERROR_INVALID_VALUE;
    size_t mapped = page_round(n);
    if (mapped < n) return MC_CUDA_ERROR_OUT_OF_MEMORY;
    void *q = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (q == MAP_FAILED) return MC_CUDA_ERROR_OUT_OF_MEMORY;
    pthread_rwlock_wrlock(&mem_mu);
    int err = insert_region((struct region){(uintptr_t)q, n, mapped, NULL, K_HOST, -1, -1});
    pthread_rwlock_unlock(&mem_mu);
    if (err != 0) {
        munmap(q, mapped);
        return MC_CUDA_ERROR_OUT_OF_MEMORY;
    }
    *p = q;
    return MC_CUDA_SUCCESS;
}

EXPORT CUresult cuMemFreeHost(void *p) {
    ENTER(cuMemFreeHost);
    NEED_CONTEXT();
    CUresult r = MC_CUDA_ERROR_INVALID_VALUE;
    pthread_rwlock_wrlock(&mem_mu);
    land_locked(); /* a free waits for the stream */
    struct region *g = find((uintptr_t)p);
    if (g != NULL && g->kind == K_HOST && g->base == (uintptr_t)p) {
        munmap(p, g->mapped);
        remove_region(g);
        r = MC_CUDA_SUCCESS;
    }
    pthread_rwlock_unlock(&mem_mu);
    return r;
}

EXPORT CUresult cuPointerGetAttribute(void *data, int attribute, CUdeviceptr ptr) {
    ENTER(cuPointerGetAttribute);
    if (data == NULL) return MC_CUDA_ERROR_INVALID_VALUE;
    CUresult r = MC_CUDA_ERROR_INVALID_VALUE;
    pthread_rwlock_rdlock(&mem_mu);
    struct region *g = find((uintptr_t)ptr);
    if (g != NULL && g->kind != K_FREED) {
        int device = g->kind != K_HOST;
        if (attribute == MC_CU_POINTER_ATTRIBUTE_MEMORY_TYPE) {
            *(unsigned int *)data = device ? MC_CU_MEMORYTYPE_DEVICE : MC_CU_MEMORYTYPE_HOST;
            r = MC_CUDA_SUCCESS;
        } else if (attribute == MC_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL && device) {
            *(int *)data = g->device;
            r = MC_CUDA_SUCCESS;
        }
    }
    pthread_rwlock_unlock(&mem_mu);
    return r;
}

EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr ptr) {
    ENTER(cuMemGetAddressRange_v2);
    NEED_CONTEXT();
    CUresult r = MC_CUDA_ERROR_NOT_FOUND;
    pthread_rwlock_rdlock(&mem_mu);
    struct region *g = find((uintptr_t)ptr);
    if (g != NULL && (g->kind == K_DEVICE || g->kind == K_IPC)) {
        /* Either output may be NULL, as the driver allows. */
        if (base != NULL) *base = (CUdeviceptr)g->base;
        if (size != NULL) *size = g->size;
        r = MC_CUDA_SUCCESS;
    }
    pthread_rwlock_unlock(&mem_mu);
    return r;
}

/* ---- copies ---- */

enum side { S_HOST = 1, S_DEVICE = 2, S_ANY = S_HOST | S_DEVICE };

/* resolve turns [p, p+n) of an allowed side into the address the CPU may
 * use: the alias for device memory, p itself for host memory. NULL when
 * the range is not allowed: a device range must lie inside one live
 * allocation; a host range must not touch device memory. mem_mu is held. */
static char *resolve(uintptr_t p, size_t n, int allowed) {
    if (p == 0 || p + n < p) return NULL;
    struct region *g = find(p);
    if (g != NULL && is_device_kind(g->kind)) {
        if (!(allowed & S_DEVICE) || g->kind == K_FREED || n > g->size - (p - g->base)) return NULL;
        return g->alias + (p - g->base);
    }
    if (!(allowed & S_HOST) || touches_device(p, n)) return NULL;
    return (char *)p;
}

/* ---- the legacy stream ----
 *
 * cuMemcpy runs on the legacy default stream, and a copy into device
 * memory from device memory, or from pageable host memory, returns before
 * its bytes land (CUDA's synchronisation rules for synchronous copies;
 * from pinned memory, and into host memory, the copy is complete on
 * return). The double queues such copies and lands them in order at the
 * next call of this process that the stream orders after them: another
 * copy, cuStreamSynchronize of the legacy stream, or a free. Until then
 * the destination holds its old bytes, for this process's CPU-side peers
 * and for any other process reading it through an IPC mapping; a library
 * that reports a device copy complete without synchronising the stream is
 * caught by whoever reads the bytes from another process. A pageable
 * source is read at once, as the driver stages it before returning. */
struct pending {
    char *dst;
    const char *src;
    size_t n;
    char *staged; /* owned copy of a pageable source, or NULL */
};

static pthread_mutex_t pend_mu = PTHREAD_MUTEX_INITIALIZER;
static struct pending *pend;
static size_t npend, cap_pend;

/* grow_pending doubles the queue; pend_mu is held. */
static int grow_pending(void) {
    size_t cap = cap_pend ? 2 * cap_pend : 64;
    struct pending *p = realloc(pend, cap * sizeof *p);
    if (p == NULL) return 0;
    pend = p;
    cap_pend = cap;
    return 1;
}

/* land_locked runs the queued copies in order; mem_mu is held (read or
 * write), so no queued range is unmapped meanwhile. */
static void land_locked(void) {
    pthread_mutex_lock(&pend_mu);
    for (size_t i = 0; i < npend; i++) {
        memmove(pend[i].dst, pend[i].staged ? pend[i].staged : pend[i].src, pend[i].n);
        free(pend[i].staged);
    }
    npend = 0;
    pthread_mutex_unlock(&pend_mu);
}

/* queue_locked defers a copy; mem_mu is held. It lands at once when the
 * staging copy or the queue cannot grow (still correct, only synchronous). */
static void queue_locked(char *d, const char *s, size_t n, int stage) {
    char *staged = NULL;
    if (stage && (staged = malloc(n)) != NULL) memcpy(staged, s, n);
    pthread_mutex_lock(&pend_mu);
    if ((stage && staged == NULL) || (npend == cap_pend && !grow_pending())) {
        pthread_mutex_unlock(&pend_mu);
        free(staged);
        memmove(d, s, n);
        return;
    }
    pend[npend++] = (struct pending){d, s, n, staged};
    pthread_mutex_unlock(&pend_mu);
}

static CUresult copy(uintptr_t dst, int dst_side, uintptr_t src, int src_side, size_t n) {
    NEED_CONTEXT();
    if (n == 0) return MC_CUDA_SUCCESS;
    CUresult r = MC_CUDA_ERROR_INVALID_VALUE;
    pthread_rwlock_rdlock(&mem_mu);
    land_locked(); /* the stream runs the earlier copies first */
    char *d = resolve(dst, n, dst_side), *s = resolve(src, n, src_side);
    if (d != NULL && s != NULL) {
        struct region *gd = find(dst), *gs = find(src);
        int to_device = gd != NULL && is_device_kind(gd->kind);
        int from_device = gs != NULL && is_device_kind(gs->kind);
        int from_pinned = gs != NULL && gs->kind == K_HOST;
        if (to_device && !from_pinned)
            queue_locked(d, s, n, !from_device);
        else
            memmove(d, s, n);
        r = MC_CUDA_SUCCESS;
    }
    pthread_rwlock_unlock(&mem_mu);
    return r;
}

EXPORT CUresult cuStreamSynchronize(CUstream stream) {
    ENTER(cuStreamSynchronize);
    NEED_CONTEXT();
    if (stream != NULL) return MC_CUDA_ERROR_INVALID_HANDLE; /* the double has the legacy stream only */
    pthread_rwlock_rdlock(&mem_mu);
    land_locked();
    pthread_rwlock_unlock(&mem_mu);
    return MC_CUDA_SUCCESS;
}

EXPORT CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) {
    ENTER(cuMemcpy);
    return copy((uintptr_t)dst, S_ANY, (uintptr_t)src, S_ANY, n);
}

EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
    ENTER(cuMemcpyHtoD_v2);
    return copy((uintptr_t)dst, S_DEVICE, (uintptr_t)src, S_HOST, n);
}

EXPORT CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
    ENTER(cuMemcpyDtoH_v2);
    return copy((uintptr_t)dst, S_HOST, (uintptr_t)src, S_DEVICE, n);
}

EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
    ENTER(cuMemcpyDtoD_v2);
    return copy((uintptr_t)dst, S_DEVICE, (uintptr_t)src, S_DEVICE, n);
}

/* ---- IPC ---- */

/* The 64 bytes of a CUipcMemHandle, as the double fills them: what another
 * process needs to find and check the owner's memfd. */
struct ipc_wire {
    uint64_t magic;
    uint64_t size;
    uint64_t ino; /* of the memfd: a reused fd number is caught */
    uint64_t dev;
    int32_t pid;
    int32_t fd;
    int32_t device;
    int32_t reserved;
};
_Static_assert(sizeof(struct ipc_wire) <= sizeof(CUipcMemHandle), "IPC handle fits in 64 bytes");

#define IPC_MAGIC 0x31414455434b4146ull /* "FAKCUDA1" read little-endian */

EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr ptr) {
    ENTER(cuIpcGetMemHandle);
    NEED_CONTEXT();
    if (h == NULL) return MC_CUDA_ERROR_INVALID_VALUE;
    CUresult r = MC_CUDA_ERROR_INVALID_VALUE;
    struct ipc_wire w = {0};
    pthread_rwlock_rdlock(&mem_mu);
    struct region *g = find((uintptr_t)ptr);
    struct stat st;
    if (g != NULL && g->kind == K_DEVICE && g->base == (uintptr_t)ptr && fstat(g->fd, &st) == 0) {
        w = (struct ipc_wire){IPC_MAGIC, g->size, st.st_ino, st.st_dev, getpid(), g->fd, g->device, 0};
        r = MC_CUDA_SUCCESS;
    }
    pthread_rwlock_unlock(&mem_mu);
    if (r == MC_CUDA_SUCCESS) {
        memset(h, 0, sizeof *h);
        memcpy(h->reserved, &w, sizeof w);
    }
    return r;
}

EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *ptr, CUipcMemHandle h, unsigned int flags) {
    ENTER(cuIpcOpenMemHandle_v2);
    NEED_CONTEXT();
    if (ptr == NULL || (flags & ~(unsigned int)MC_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) != 0) return MC_CUDA_ERROR_INVALID_VALUE;
    struct ipc_wire w;
    memcpy(&w, h.reserved, sizeof w);
    if (w.magic != IPC_MAGIC || w.size == 0) return MC_CUDA_ERROR_INVALID_HANDLE;
    /* The driver refuses to open a handle in the process that made it. */
    if (w.pid == getpid()) return MC_CUDA_ERROR_INVALID_CONTEXT;
    if (w.device < 0 || w.device >= ndevices) return MC_CUDA_ERROR_INVALID_DEVICE;
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)w.pid, (int)w.fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return MC_CUDA_ERROR_INVALID_HANDLE; /* owner gone, or the fd closed */
    struct stat st;
    size_t mapped = page_round((size_t)w.size);
    if (fstat(fd, &st) != 0 || (uint64_t)st.st_ino != w.ino || (uint64_t)st.st_dev != w.dev ||
        (uint64_t)st.st_size < mapped) {
        close(fd);
        return MC_CUDA_ERROR_INVALID_HANDLE; /* the fd number now names something else */
    }
    void *base, *alias;
    int err = map_device(fd, mapped, &base, &alias);
    close(fd); /* the mappings keep the memory */
    if (err != 0) return MC_CUDA_ERROR_MAP_FAILED;
    pthread_rwlock_wrlock(&mem_mu);
    err = insert_region((struct region){(uintptr_t)base, (size_t)w.size, mapped, alias, K_IPC, w.device, -1});
    pthread_rwlock_unlock(&mem_mu);
    if (err != 0) {
        munmap(base, mapped);
        munmap(alias, mapped);
        return MC_CUDA_ERROR_OUT_OF_MEMORY;
    }
    *ptr = (CUdeviceptr)(uintptr_t)base;
    return MC_CUDA_SUCCESS;
}

EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr ptr) {
    ENTER(cuIpcCloseMemHandle);
    NEED_CONTEXT();
    CUresult r = MC_CUDA_ERROR_INVALID_VALUE;
    pthread_rwlock_wrlock(&mem_mu);
    land_locked(); /* a free waits for the stream */
    struct region *g = find((uintptr_t)ptr);
    if (g != NULL && g->kind == K_IPC && g->base == (uintptr_t)ptr) {
        retire(g);
        r = MC_CUDA_SUCCESS;
    }
    pthread_rwlock_unlock(&mem_mu);
    return r;
}

/* ---- test hooks (not in the driver's API) ---- */

/* fakecuda_calls returns how many times entry point name was called, or
 * -1 for a name the double does not implement. */
EXPORT int fakecuda_calls(const char *name) {
    pthread_once(&env_once, load_env);
    int fn = fn_index(name);
    if (fn < 0) return -1;
    pthread_mutex_lock(&rec_mu);
    long n = calls[fn];
    pthread_mutex_unlock(&rec_mu);
    return n > INT_MAX ? INT_MAX : (int)n;
}

/* fakecuda_calls_without_context returns how many of those calls came from
 * a thread with no current context (which the real driver may refuse), or
 * -1 for an unknown name. */
EXPORT int fakecuda_calls_without_context(const char *name) {
    pthread_once(&env_once, load_env);
    int fn = fn_index(name);
    if (fn < 0) return -1;
    pthread_mutex_lock(&rec_mu);
    long n = calls_no_ctx[fn];
    pthread_mutex_unlock(&rec_mu);
    return n > INT_MAX ? INT_MAX : (int)n;
}

/* fakecuda_fail makes the nth call of name from now (1: the next) return
 * code (0: CUDA_ERROR_UNKNOWN). A name it does not know, nth < 1 or a full
 * table is a bug in the test: it says so and aborts. */
EXPORT void fakecuda_fail(const char *name, int nth, int code) {
    pthread_once(&env_once, load_env);
    int fn = fn_index(name);
    if (fn < 0 || nth < 1) {
        fprintf(stderr, "fakecuda_fail(%s, %d): want an entry point's name and nth >= 1\n", name ? name : "NULL", nth);
        abort();
    }
    pthread_mutex_lock(&rec_mu);
    int err = arm_locked(fn, calls[fn] + nth, code);
    pthread_mutex_unlock(&rec_mu);
    if (err != 0) {
        fprintf(stderr, "fakecuda_fail(%s, %d): more than %d failures armed\n", name, nth, MAX_ARMED);
        abort();
    }
}

/* fakecuda_pending returns how many copies wait on the legacy stream. */
EXPORT int fakecuda_pending(void) {
    pthread_mutex_lock(&pend_mu);
    size_t n = npend;
    pthread_mutex_unlock(&pend_mu);
    return n > INT_MAX ? INT_MAX : (int)n;
}

/* fakecuda_reset zeroes the counts and disarms every failure, those from
 * MC_FAKECUDA_FAIL included. Memory and contexts are left as they are. */
EXPORT void fakecuda_reset(void) {
    pthread_once(&env_once, load_env);
    pthread_mutex_lock(&rec_mu);
    memset(calls, 0, sizeof calls);
    memset(calls_no_ctx, 0, sizeof calls_no_ctx);
    narmed = 0;
    pthread_mutex_unlock(&rec_mu);
}
