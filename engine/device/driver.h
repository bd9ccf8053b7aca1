/* driver.h: the CUDA driver as engine/device calls it, resolved at run
 * time (driver.c). Every call that needs a context makes its device's
 * primary context current on the calling thread first, in the same C call:
 * Go moves goroutines between threads, so no context is assumed current. */
#ifndef MC_DEVICE_DRIVER_H
#define MC_DEVICE_DRIVER_H

#include <stddef.h>
#include <stdint.h>

#include "cudaabi.h"

/* MC_DRIVER_DL: the library could not be loaded or lacks an entry point;
 * the message says which. Otherwise results are CUresult values. */
#define MC_DRIVER_DL (-1)
/* MC_DRIVER_NOT_LOADED: with noload, the process has not loaded the
 * library. */
#define MC_DRIVER_NOT_LOADED (-2)

/* mc_driver_load opens the driver at path (noload: only if the process has
 * it loaded already), resolves its entry points and initialises it. On
 * MC_DRIVER_DL, err holds the reason. */
int mc_driver_load(const char *path, int noload, char *err, size_t errlen);
int mc_driver_devices(int *count);
/* mc_loader_adds is a count that grows whenever the dynamic loader may
 * have added an object to the process (glibc: the objects it added; musl:
 * its successful dlopen calls), 0 where it does not say. */
unsigned long long mc_loader_adds(void);
const char *mc_driver_error_string(CUresult r);

/* mc_driver_locate sets *type to the memory type of ptr (0: memory the
 * driver does not know, that is pageable host memory) and *dev to its
 * device ordinal when on a device. */
CUresult mc_driver_locate(uint64_t ptr, int *type, int *dev);
CUresult mc_driver_range(int dev, uint64_t ptr, uint64_t *base, uint64_t *size);
/* mc_driver_copy copies n bytes with unified addressing (either side host
 * or device), in dev's primary context. */
CUresult mc_driver_copy(int dev, uint64_t dst, uint64_t src, size_t n);
CUresult mc_driver_alloc_host(size_t n, uint64_t *p);
CUresult mc_driver_free_host(uint64_t p);
CUresult mc_driver_ipc_handle(int dev, uint64_t ptr, void *handle64);
CUresult mc_driver_ipc_open(int dev, const void *handle64, uint64_t *ptr);
CUresult mc_driver_ipc_close(int dev, uint64_t ptr);
/* Tests only: device memory, where the driver offers cuMemAlloc. */
CUresult mc_driver_alloc_device(int dev, size_t n, uint64_t *ptr);
CUresult mc_driver_free_device(int dev, uint64_t ptr);

#endif
