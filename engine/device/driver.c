#define _GNU_SOURCE /* dl_iterate_phdr and struct dl_phdr_info */
#include "driver.h"

#include <dlfcn.h>
#include <link.h>
#include <stddef.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

/* The driver's entry points; resolved once by mc_driver_load, read-only
 * afterwards. */
static struct {
    void *lib;
    mc_cuInit_t init;
    mc_cuGetErrorString_t error_string;
    mc_cuDeviceGetCount_t device_count;
    mc_cuDeviceGet_t device_get;
    mc_cuDevicePrimaryCtxRetain_t ctx_retain;
    mc_cuCtxSetCurrent_t ctx_set;
    mc_cuPointerGetAttribute_t pointer_attr;
    mc_cuMemGetAddressRange_t address_range;
    mc_cuMemcpy_t copy;
    mc_cuStreamSynchronize_t stream_sync;
    mc_cuMemHostAlloc_t host_alloc;
    mc_cuMemFreeHost_t host_free;
    mc_cuIpcGetMemHandle_t ipc_get;
    mc_cuIpcOpenMemHandle_t ipc_open;
    mc_cuIpcCloseMemHandle_t ipc_close;
    mc_cuMemAlloc_t mem_alloc; /* optional */
    mc_cuMemFree_t mem_free;   /* optional */
    int devices;
} drv;

/* Primary contexts, retained on first use per device. */
#define MC_MAX_DEVICES 64
static CUcontext ctxs[MC_MAX_DEVICES];
static pthread_mutex_t ctx_mu = PTHREAD_MUTEX_INITIALIZER;

/* sym resolves the exported name, else the fallback (an older name of the
 * same entry point), if any. */
static void *sym(const char *name, const char *fallback) {
    void *p = dlsym(drv.lib, name);
    if (p == NULL && fallback != NULL) p = dlsym(drv.lib, fallback);
    return p;
}

int mc_driver_load(const char *path, int noload, char *err, size_t errlen) {
    drv.lib = dlopen(path, RTLD_NOW | RTLD_LOCAL | (noload ? RTLD_NOLOAD : 0));
    if (drv.lib == NULL) {
        const char *e = dlerror();
        snprintf(err, errlen, "%s", noload ? "not loaded in this process" : (e ? e : "dlopen failed"));
        return noload ? MC_DRIVER_NOT_LOADED : MC_DRIVER_DL;
    }
    struct {
        void **slot;
        const char *name, *fallback;
        int optional;
    } want[] = {
        {(void **)&drv.init, "cuInit", NULL, 0},
        {(void **)&drv.error_string, "cuGetErrorString", NULL, 0},
        {(void **)&drv.device_count, "cuDeviceGetCount", NULL, 0},
        {(void **)&drv.device_get, "cuDeviceGet", NULL, 0},
        {(void **)&drv.ctx_retain, "cuDevicePrimaryCtxRetain", NULL, 0},
        {(void **)&drv.ctx_set, "cuCtxSetCurrent", NULL, 0},
        {(void **)&drv.pointer_attr, "cuPointerGetAttribute", NULL, 0},
        {(void **)&drv.address_range, "cuMemGetAddressRange_v2", NULL, 0},
        {(void **)&drv.copy, "cuMemcpy", NULL, 0},
        {(void **)&drv.stream_sync, "cuStreamSynchronize", NULL, 0},
        {(void **)&drv.host_alloc, "cuMemHostAlloc", NULL, 0},
        {(void **)&drv.host_free, "cuMemFreeHost", NULL, 0},
        {(void **)&drv.ipc_get, "cuIpcGetMemHandle", NULL, 0},
        {(void **)&drv.ipc_open, "cuIpcOpenMemHandle_v2", "cuIpcOpenMemHandle", 0},
        {(void **)&drv.ipc_close, "cuIpcCloseMemHandle", NULL, 0},
        {(void **)&drv.mem_alloc, "cuMemAlloc_v2", NULL, 1},
        {(void **)&drv.mem_free, "cuMemFree_v2", NULL, 1},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        *want[i].slot = sym(want[i].name, want[i].fallback);
        if (*want[i].slot == NULL && !want[i].optional) {
            snprintf(err, errlen, "%s: no entry point %s", path, want[i].name);
            return MC_DRIVER_DL;
        }
    }
    CUresult r = drv.init(0);
    if (r != MC_CUDA_SUCCESS) return r;
    int n = 0;
    if ((r = drv.device_count(&n)) != MC_CUDA_SUCCESS) return r;
    drv.devices = n > MC_MAX_DEVICES ? MC_MAX_DEVICES : n;
    return MC_CUDA_SUCCESS;
}

int mc_driver_devices(int *count) {
    *count = drv.devices;
    return MC_CUDA_SUCCESS;
}

const char *mc_driver_error_string(CUresult r) {
    const char *s = NULL;
    if (drv.error_string == NULL || drv.error_string(r, &s) != MC_CUDA_SUCCESS || s == NULL) return "unknown CUDA error";
    return s;
}

/* use makes dev's primary context current on this thread. */
static CUresult use(int dev) {
    if (dev < 0 || dev >= drv.devices) return MC_CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&ctx_mu);
    CUresult r = MC_CUDA_SUCCESS;
    if (ctxs[dev] == NULL) {
        CUdevice d;
        r = drv.device_get(&d, dev);
        if (r == MC_CUDA_SUCCESS) r = drv.ctx_retain(&ctxs[dev], d);
    }
    CUcontext c = ctxs[dev];
    pthread_mutex_unlock(&ctx_mu);
    if (r != MC_CUDA_SUCCESS) return r;
    return drv.ctx_set(c);
}

CUresult mc_driver_locate(uint64_t ptr, int *type, int *dev) {
    unsigned int t = 0;
    *type = 0;
    *dev = -1;
    CUresult r = drv.pointer_attr(&t, MC_CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)ptr);
    if (r == MC_CUDA_ERROR_INVALID_VALUE) return MC_CUDA_SUCCESS; /* pageable host memory */
    if (r != MC_CUDA_SUCCESS) return r;
    *type = (int)t;
    if (t == MC_CU_MEMORYTYPE_DEVICE || t == MC_CU_MEMORYTYPE_UNIFIED) {
        int d = -1;
        r = drv.pointer_attr(&d, MC_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, (CUdeviceptr)ptr);
        if (r != MC_CUDA_SUCCESS) return r;
        *dev = d;
    }
    return MC_CUDA_SUCCESS;
}

CUresult mc_driver_range(int dev, uint64_t ptr, uint64_t *base, uint64_t *size) {
    CUdeviceptr b = 0;
    size_t n = 0;
    CUresult r = use(dev);
    if (r != MC_CUDA_SUCCESS) return r;
    r = drv.address_range(&b, &n, (CUdeviceptr)ptr);
    *base = b;
    *size = n;
    return r;
}

/* mc_driver_copy returns once the bytes have landed. cuMemcpy alone does
 * not promise that: into device memory from device memory (a peer's, over
 * CUDA IPC, or our own) or from pageable host memory it returns while the
 * copy still runs on the legacy stream, and a peer told the transfer is
 * complete could read the old bytes. Synchronising that stream waits for
 * the copy (and for work queued on it before, which cuMemcpy waited for
 * anyway). */
CUresult mc_driver_copy(int dev, uint64_t dst, uint64_t src, size_t n) {
    CUresult r = use(dev);
    if (r != MC_CUDA_SUCCESS) return r;
    r = drv.copy((CUdeviceptr)dst, (CUdeviceptr)src, n);
    if (r != MC_CUDA_SUCCESS) return r;
    return drv.stream_sync(NULL);
}

CUresult mc_driver_alloc_host(size_t n, uint64_t *p) {
    CUresult r = use(0);
    if (r != MC_CUDA_SUCCESS) return r;
    void *q = NULL;
    r = drv.host_alloc(&q, n, 0);
    *p = (uint64_t)(uintptr_t)q;
    return r;
}

CUresult mc_driver_free_host(uint64_t p) {
    CUresult r = use(0);
    if (r != MC_CUDA_SUCCESS) return r;
    return drv.host_free((void *)(uintptr_t)p);
}

CUresult mc_driver_ipc_handle(int dev, uint64_t ptr, void *handle64) {
    CUresult r = use(dev);
    if (r != MC_CUDA_SUCCESS) return r;
    CUipcMemHandle h;
    r = drv.ipc_get(&h, (CUdeviceptr)ptr);
    if (r == MC_CUDA_SUCCESS) memcpy(handle64, h.reserved, sizeof h.reserved);
    return r;
}

CUresult mc_driver_ipc_open(int dev, const void *handle64, uint64_t *ptr) {
    CUresult r = use(dev);
    if (r != MC_CUDA_SUCCESS) return r;
    CUipcMemHandle h;
    memcpy(h.reserved, handle64, sizeof h.reserved);
    CUdeviceptr p = 0;
    r = drv.ipc_open(&p, h, MC_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    *ptr = p;
    return r;
}

CUresult mc_driver_ipc_close(int dev, uint64_t ptr) {
    CUresult r = use(dev);
    if (r != MC_CUDA_SUCCESS) return r;
    return drv.ipc_close((CUdeviceptr)ptr);
}

CUresult mc_driver_alloc_device(int dev, size_t n, uint64_t *ptr) {
    if (drv.mem_alloc == NULL) return MC_CUDA_ERROR_NOT_FOUND;
    CUresult r = use(dev);
    if (r != MC_CUDA_SUCCESS) return r;
    CUdeviceptr p = 0;
    r = drv.mem_alloc(&p, n);
    *ptr = p;
    return r;
}

CUresult mc_driver_free_device(int dev, uint64_t ptr) {
    if (drv.mem_free == NULL) return MC_CUDA_ERROR_NOT_FOUND;
    CUresult r = use(dev);
    if (r != MC_CUDA_SUCCESS) return r;
    return drv.mem_free((CUdeviceptr)ptr);
}

/* first_adds keeps the loader's count of objects added, from the first
 * object it reports, and stops there. */
static int first_adds(struct dl_phdr_info *info, size_t size, void *data) {
    if (size >= offsetof(struct dl_phdr_info, dlpi_adds) + sizeof(info->dlpi_adds)) {
        *(unsigned long long *)data = info->dlpi_adds;
    }
    return 1;
}

unsigned long long mc_loader_adds(void) {
    unsigned long long adds = 0;
    dl_iterate_phdr(first_adds, &adds);
    return adds;
}
