package te

import (
	"context"
	"fmt"

	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/engine/device"
)

// buffer is the memory one side of the benchmark moves bytes from and to:
// an engine buffer in host memory, or GPU memory (Options.UseVRAM).
type buffer interface {
	Addr() uintptr
	Len() int
	Free() error
}

// gpuBuffer is GPU memory allocated through the CUDA driver and registered
// with the engine at "cuda:N".
type gpuBuffer struct {
	e   *engine.Engine
	drv *device.Driver
	dev int
	p   uintptr
	n   int
}

func (b *gpuBuffer) Addr() uintptr { return b.p }
func (b *gpuBuffer) Len() int      { return b.n }

func (b *gpuBuffer) Free() error {
	if b.p == 0 {
		return nil
	}
	err := b.e.UnregisterMemory(context.Background(), b.p)
	if ferr := b.drv.FreeDevice(b.dev, b.p); err == nil {
		err = ferr
	}
	b.p = 0
	return err
}

// allocate returns n bytes of host memory (gpu < 0), touched so that page
// faults stay out of the figures, or of GPU gpu's memory, registered with
// e (remote-accessible).
func allocate(ctx context.Context, e *engine.Engine, n, gpu int) (buffer, error) {
	if gpu < 0 {
		b, err := e.AllocateBuffer(ctx, n, "cpu:0")
		if err != nil {
			return nil, err
		}
		touch(b.Bytes())
		return b, nil
	}
	drv, err := device.Load()
	if err != nil {
		return nil, err
	}
	p, err := drv.AllocDevice(gpu, uint64(n))
	if err != nil {
		return nil, err
	}
	if err := e.RegisterMemory(ctx, p, uint64(n), fmt.Sprintf("cuda:%d", gpu), true); err != nil {
		drv.FreeDevice(gpu, p)
		return nil, err
	}
	return &gpuBuffer{e: e, drv: drv, dev: gpu, p: p, n: n}, nil
}
