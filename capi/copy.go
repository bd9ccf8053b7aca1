package main

/*
#include "mooncake.h"
*/
import "C"

import (
	"unsafe"

	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/engine/device"
	"github.com/mooncake-go/mooncake/engine/transport"
)

//export mcgoCopy
func mcgoCopy(dst, src unsafe.Pointer, n C.uint64_t, cerr *C.mc_error_t) C.mc_status_t {
	return guard(cerr, domainEngine, func() error {
		switch {
		case n == 0:
			return nil
		case dst == nil:
			return nullArg("dst")
		case src == nil:
			return nullArg("src")
		}
		return copyMemory(uintptr(dst), uintptr(src), uint64(n))
	})
}

// copyMemory copies n bytes from src to dst, both of this process: with
// the CUDA driver when either is GPU memory (found by asking the driver,
// if the process has loaded it), else with the CPU.
func copyMemory(dst, src uintptr, n uint64) error {
	if drv := device.Present(); drv != nil {
		dDev, dOn, err := drv.Locate(dst)
		if err != nil {
			return &engine.Error{Code: engine.CodeMemory, Err: err}
		}
		sDev, sOn, err := drv.Locate(src)
		if err != nil {
			return &engine.Error{Code: engine.CodeMemory, Err: err}
		}
		if dOn || sOn {
			dev := dDev
			if !dOn {
				dev = sDev
			}
			if err := drv.Copy(dev, dst, src, n); err != nil {
				return &engine.Error{Code: engine.CodeMemory, Err: err}
			}
			return nil
		}
	}
	copy(transport.Bytes(dst, n), transport.Bytes(src, n))
	return nil
}
