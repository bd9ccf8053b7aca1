/* cudaabi.h: the part of the CUDA driver API's binary interface that
 * mooncake-go uses, declared here so that nothing at build time needs
 * CUDA's headers or toolkit. The values are the driver's documented ones
 * (CUDA 11 and later); the driver itself is loaded at run time (device.go).
 * The test double in fakecuda/ implements the same entry points. */
#ifndef MC_CUDAABI_H
#define MC_CUDAABI_H

#include <stddef.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr; /* the _v2 API's 64-bit pointers */
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct {
    char reserved[64];
} CUipcMemHandle;

enum {
    MC_CUDA_SUCCESS = 0,
    MC_CUDA_ERROR_INVALID_VALUE = 1,
    MC_CUDA_ERROR_OUT_OF_MEMORY = 2,
    MC_CUDA_ERROR_NOT_INITIALIZED = 3,
    MC_CUDA_ERROR_NO_DEVICE = 100,
    MC_CUDA_ERROR_INVALID_DEVICE = 101,
    MC_CUDA_ERROR_INVALID_CONTEXT = 201,
    MC_CUDA_ERROR_MAP_FAILED = 205,
    MC_CUDA_ERROR_INVALID_HANDLE = 400,
    MC_CUDA_ERROR_NOT_FOUND = 500,
    MC_CUDA_ERROR_UNKNOWN = 999,
};

/* CUpointer_attribute values used. */
enum {
    MC_CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
    MC_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
};

/* CUmemorytype values. */
enum {
    MC_CU_MEMORYTYPE_HOST = 1,
    MC_CU_MEMORYTYPE_DEVICE = 2,
    MC_CU_MEMORYTYPE_UNIFIED = 4,
};

/* cuIpcOpenMemHandle flag. */
enum { MC_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 1 };

/* The entry points, by the names libcuda.so.1 exports (the _v2 ones where
 * the API has two versions). */
typedef CUresult (*mc_cuInit_t)(unsigned int flags);
typedef CUresult (*mc_cuGetErrorString_t)(CUresult err, const char **str);
typedef CUresult (*mc_cuDeviceGetCount_t)(int *count);
typedef CUresult (*mc_cuDeviceGet_t)(CUdevice *dev, int ordinal);
typedef CUresult (*mc_cuDevicePrimaryCtxRetain_t)(CUcontext *ctx, CUdevice dev);
typedef CUresult (*mc_cuCtxSetCurrent_t)(CUcontext ctx);
typedef CUresult (*mc_cuPointerGetAttribute_t)(void *data, int attribute, CUdeviceptr ptr);
typedef CUresult (*mc_cuMemGetAddressRange_t)(CUdeviceptr *base, size_t *size, CUdeviceptr ptr); /* _v2 */
typedef CUresult (*mc_cuMemcpy_t)(CUdeviceptr dst, CUdeviceptr src, size_t n);                  /* unified addressing */
typedef CUresult (*mc_cuMemcpyHtoD_t)(CUdeviceptr dst, const void *src, size_t n);              /* _v2 */
typedef CUresult (*mc_cuMemcpyDtoH_t)(void *dst, CUdeviceptr src, size_t n);                    /* _v2 */
typedef CUresult (*mc_cuMemcpyDtoD_t)(CUdeviceptr dst, CUdeviceptr src, size_t n);              /* _v2 */
typedef CUresult (*mc_cuStreamSynchronize_t)(CUstream stream);
typedef CUresult (*mc_cuMemHostAlloc_t)(void **p, size_t n, unsigned int flags);
typedef CUresult (*mc_cuMemFreeHost_t)(void *p);
typedef CUresult (*mc_cuIpcGetMemHandle_t)(CUipcMemHandle *h, CUdeviceptr ptr);
typedef CUresult (*mc_cuIpcOpenMemHandle_t)(CUdeviceptr *ptr, CUipcMemHandle h, unsigned int flags); /* _v2 */
typedef CUresult (*mc_cuIpcCloseMemHandle_t)(CUdeviceptr ptr);
/* Used by tests only, to make device memory (the double implements them). */
typedef CUresult (*mc_cuMemAlloc_t)(CUdeviceptr *ptr, size_t n); /* _v2 */
typedef CUresult (*mc_cuMemFree_t)(CUdeviceptr ptr);             /* _v2 */

#endif
