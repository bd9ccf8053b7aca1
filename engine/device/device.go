// Package device reaches GPU memory through the CUDA driver, which it loads
// at run time: nothing at build time needs CUDA's headers or toolkit, and a
// host without a GPU never loads it.
//
// The driver is libcuda.so.1, or the library named by MC_CUDA_DRIVER (the
// test double in fakecuda/ for tests; "none" disables the driver). Load
// opens it when a caller names device memory (a "cuda:N" location).
// Present only finds a driver the process has loaded already: a pointer
// can be device memory only in a process that loaded the driver, so asking
// whether a "*" or "cpu" registration is on a GPU never loads CUDA into a
// process that does not use it (loading it, and initialising it, would
// break a later fork that uses CUDA in the child).
//
// Every call makes its device's primary context current on the calling
// thread first, within the same C call, since Go moves goroutines between
// threads. Copies use unified addressing (cuMemcpy): either side may be
// host or device memory.
package device

// #cgo LDFLAGS: -ldl
// #include <stdlib.h>
// #include "driver.h"
import "C"

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"unsafe"
)

func check(call string, r C.CUresult) error {
	if r == 0 {
		return nil
	}
	return &Error{Call: call, Code: int(r), Msg: C.GoString(C.mc_driver_error_string(r))}
}

// Driver is the loaded CUDA driver. Its methods are safe for concurrent
// use.
type Driver struct {
	path    string
	devices int
}

var (
	mu      sync.Mutex
	loaded  *Driver
	loadErr error // of a full Load; sticky
	// The process had not loaded the driver at absentPath when the
	// dynamic loader's count of objects added (mc_loader_adds) was
	// absentAdds: Present looks again only once the count has grown. The
	// look, a dlopen that finds nothing, cost every put and get of
	// unregistered memory ~4 us.
	absentPath string
	absentAdds uint64
	// probes counts Present's looks (tests).
	probes int
)

// path is the library to load.
func path() string {
	if p := os.Getenv("MC_CUDA_DRIVER"); p != "" {
		return p
	}
	return "libcuda.so.1"
}

// Load returns the driver, loading and initialising it on first use. A
// failure is remembered: the process will not have a driver later either.
func Load() (*Driver, error) {
	mu.Lock()
	defer mu.Unlock()
	if loaded != nil || loadErr != nil {
		return loaded, loadErr
	}
	d, err := open(path(), false)
	if err != nil {
		loadErr = err
		return nil, err
	}
	loaded = d
	return d, nil
}

// Present returns the driver if the process has loaded it already (by
// Load, or by a framework that uses CUDA), nil otherwise. It never loads
// the driver itself.
func Present() *Driver {
	mu.Lock()
	defer mu.Unlock()
	if loaded != nil {
		return loaded
	}
	if loadErr != nil {
		return nil
	}
	// The count is read before the look: a load that ends after the read
	// has grown it, and the next call looks again.
	p, adds := path(), uint64(C.mc_loader_adds())
	if adds != 0 && adds == absentAdds && p == absentPath {
		return nil
	}
	probes++
	d, err := open(p, true)
	switch {
	case err == nil:
		loaded = d
	case errors.Is(err, errNotLoaded):
		absentPath, absentAdds = p, adds
	}
	return loaded
}

// errNotLoaded: the process has not loaded the driver (open with noload).
var errNotLoaded = errors.New("not loaded in this process")

func open(p string, noload bool) (*Driver, error) {
	if p == "none" {
		return nil, fmt.Errorf("%w: MC_CUDA_DRIVER=none", ErrNoDriver)
	}
	cp := C.CString(p)
	defer C.free(unsafe.Pointer(cp))
	var msg [256]C.char
	nl := C.int(0)
	if noload {
		nl = 1
	}
	r := C.mc_driver_load(cp, nl, &msg[0], C.size_t(len(msg)))
	switch {
	case r == C.MC_DRIVER_NOT_LOADED:
		return nil, fmt.Errorf("%w: %s: %w", ErrNoDriver, p, errNotLoaded)
	case r == C.MC_DRIVER_DL:
		return nil, fmt.Errorf("%w: %s", ErrNoDriver, C.GoString(&msg[0]))
	case r != 0:
		return nil, fmt.Errorf("%w: %s: %w", ErrNoDriver, p, check("cuInit", C.CUresult(r)))
	}
	var n C.int
	C.mc_driver_devices(&n)
	return &Driver{path: p, devices: int(n)}, nil
}

// Devices is the number of GPUs the driver reports.
func (d *Driver) Devices() int { return d.devices }

// Path is the library the driver was loaded from.
func (d *Driver) Path() string { return d.path }

// CheckDevice returns ErrNoDevice unless dev is a GPU of this host.
func (d *Driver) CheckDevice(dev int) error {
	if dev < 0 || dev >= d.devices {
		return fmt.Errorf("%w: cuda:%d (this host has %d)", ErrNoDevice, dev, d.devices)
	}
	return nil
}

// Locate says whether ptr is GPU memory, and on which device. Memory the
// driver does not know (pageable host memory) is not.
func (d *Driver) Locate(ptr uintptr) (dev int, onDevice bool, err error) {
	var typ, ordinal C.int
	if err := check("cuPointerGetAttribute", C.mc_driver_locate(C.uint64_t(ptr), &typ, &ordinal)); err != nil {
		return -1, false, err
	}
	if ordinal < 0 {
		return -1, false, nil
	}
	return int(ordinal), true, nil
}

// Range returns the allocation on dev that holds ptr.
func (d *Driver) Range(dev int, ptr uintptr) (base uintptr, size uint64, err error) {
	if err := d.CheckDevice(dev); err != nil {
		return 0, 0, err
	}
	var b, n C.uint64_t
	if err := check("cuMemGetAddressRange", C.mc_driver_range(C.int(dev), C.uint64_t(ptr), &b, &n)); err != nil {
		return 0, 0, err
	}
	return uintptr(b), uint64(n), nil
}

// Copy copies n bytes from src to dst in dev's context; each side may be
// host or device memory. The CPU never touches the device side.
func (d *Driver) Copy(dev int, dst, src uintptr, n uint64) error {
	if err := d.CheckDevice(dev); err != nil {
		return err
	}
	return check("cuMemcpy", C.mc_driver_copy(C.int(dev), C.uint64_t(dst), C.uint64_t(src), C.size_t(n)))
}

// AllocHost allocates n bytes of page-locked host memory, which the GPU
// reads and writes at full speed: staging buffers.
func (d *Driver) AllocHost(n uint64) (uintptr, error) {
	var p C.uint64_t
	if err := check("cuMemHostAlloc", C.mc_driver_alloc_host(C.size_t(n), &p)); err != nil {
		return 0, err
	}
	return uintptr(p), nil
}

// FreeHost frees memory from AllocHost.
func (d *Driver) FreeHost(p uintptr) error {
	return check("cuMemFreeHost", C.mc_driver_free_host(C.uint64_t(p)))
}

// IPCHandle returns the handle of the device allocation whose base is ptr.
func (d *Driver) IPCHandle(dev int, ptr uintptr) (IPCHandle, error) {
	var h IPCHandle
	if err := d.CheckDevice(dev); err != nil {
		return h, err
	}
	err := check("cuIpcGetMemHandle", C.mc_driver_ipc_handle(C.int(dev), C.uint64_t(ptr), unsafe.Pointer(&h[0])))
	return h, err
}

// OpenIPC maps another process's device allocation into this one, on dev.
func (d *Driver) OpenIPC(dev int, h IPCHandle) (uintptr, error) {
	if err := d.CheckDevice(dev); err != nil {
		return 0, err
	}
	var p C.uint64_t
	if err := check("cuIpcOpenMemHandle", C.mc_driver_ipc_open(C.int(dev), unsafe.Pointer(&h[0]), &p)); err != nil {
		return 0, err
	}
	return uintptr(p), nil
}

// CloseIPC unmaps what OpenIPC mapped.
func (d *Driver) CloseIPC(dev int, p uintptr) error {
	if err := d.CheckDevice(dev); err != nil {
		return err
	}
	return check("cuIpcCloseMemHandle", C.mc_driver_ipc_close(C.int(dev), C.uint64_t(p)))
}

// AllocDevice allocates n bytes on dev. The engine never allocates device
// memory (frameworks own it); tests and benchmarks do.
func (d *Driver) AllocDevice(dev int, n uint64) (uintptr, error) {
	if err := d.CheckDevice(dev); err != nil {
		return 0, err
	}
	var p C.uint64_t
	if err := check("cuMemAlloc", C.mc_driver_alloc_device(C.int(dev), C.size_t(n), &p)); err != nil {
		return 0, err
	}
	return uintptr(p), nil
}

// FreeDevice frees memory from AllocDevice.
func (d *Driver) FreeDevice(dev int, p uintptr) error {
	if err := d.CheckDevice(dev); err != nil {
		return err
	}
	return check("cuMemFree", C.mc_driver_free_device(C.int(dev), C.uint64_t(p)))
}
