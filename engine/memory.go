package engine

import (
	"cmp"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/mooncake-go/mooncake/engine/device"
	"github.com/mooncake-go/mooncake/engine/transport"
)

// region is one registered memory range. Serving a remote request holds pin
// for reading; unregistering takes it for writing, so UnregisterMemory
// returns only once no transport touches the range any more.
type region struct {
	addr     uint64
	length   uint64
	location string
	remote   bool   // remote-accessible
	fd       int    // memfd backing it, or -1
	seq      uint64 // registration order: descriptors list buffers in it
	// dev is the GPU holding the region, or -1 for host memory; drv moves
	// its bytes (the CPU never touches device memory).
	dev int
	drv *device.Driver

	pin  sync.RWMutex
	gone bool // set under pin once unregistered
}

func (r *region) end() uint64 { return r.addr + r.length }

// onDevice reports whether the region is GPU memory.
func (r *region) onDevice() bool { return r.dev >= 0 }

// deviceRegion is a pinned region in GPU memory, as the serving side of a
// transport sees it (transport.DeviceMemory).
type deviceRegion struct{ *region }

func (r deviceRegion) CopyOut(dst []byte, addr uint64) error {
	if len(dst) == 0 {
		return nil
	}
	return r.drv.Copy(r.dev, uintptr(unsafe.Pointer(&dst[0])), uintptr(addr), uint64(len(dst)))
}

func (r deviceRegion) CopyIn(addr uint64, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	return r.drv.Copy(r.dev, uintptr(addr), uintptr(unsafe.Pointer(&src[0])), uint64(len(src)))
}

func (r *region) Release() { r.pin.RUnlock() }

// placeRegion finds where a region to register lives. A "cuda:N"
// location must be memory of GPU N, which needs the CUDA driver (loaded
// here if need be); other locations ("*", "cpu:N", "") are host memory
// unless the driver, when the process has loaded it, says the address is
// a GPU's, as Mooncake detects device pointers. Host memory registered as
// "*" or "" is "cpu:0".
func placeRegion(r *region) error {
	where := fmt.Sprintf("register memory %#x+%d at %q", r.addr, r.length, r.location)
	loc, err := device.ParseLocation(r.location)
	if err != nil {
		return wrapf(CodeInvalidArgument, err, "%s", where)
	}
	if loc.Cuda {
		if r.drv, err = device.Load(); err != nil {
			return wrapf(CodeDeviceNotFound, err, "%s", where)
		}
		if err := r.drv.CheckDevice(loc.Device); err != nil {
			return wrapf(CodeDeviceNotFound, err, "%s", where)
		}
	} else if r.drv = device.Present(); r.drv == nil {
		if r.location == "" || r.location == "*" {
			r.location = "cpu:0"
		}
		return nil
	}
	dev, on, err := r.drv.Locate(uintptr(r.addr))
	switch {
	case err != nil:
		return wrapf(CodeInvalidArgument, err, "%s", where)
	case !on && loc.Cuda:
		return errorf(CodeInvalidArgument, "%s: not GPU memory", where)
	case !on:
		r.drv = nil
		if r.location == "" || r.location == "*" {
			r.location = "cpu:0"
		}
		return nil
	case loc.Cuda && dev != loc.Device:
		return errorf(CodeInvalidArgument, "%s: the memory is on cuda:%d", where, dev)
	}
	base, size, err := r.drv.Range(dev, uintptr(r.addr))
	if err != nil {
		return wrapf(CodeInvalidArgument, err, "%s", where)
	}
	if r.addr+r.length > uint64(base)+size {
		return errorf(CodeInvalidArgument, "%s: runs past its device allocation %#x+%d", where, base, size)
	}
	r.dev, r.location = dev, fmt.Sprintf("cuda:%d", dev)
	return nil
}

// registry holds the registered regions as an immutable sorted snapshot so
// that lookups on the data path take no lock.
type registry struct {
	mu   sync.Mutex // serialises writers
	seq  uint64
	snap atomic.Pointer[[]*region]
}

func newRegistry() *registry {
	r := &registry{}
	r.snap.Store(&[]*region{})
	return r
}

func (g *registry) list() []*region { return *g.snap.Load() }

// inOrder lists the regions in registration order, as Mooncake's
// descriptors do (peers read "the first buffer" of a segment).
func (g *registry) inOrder() []*region {
	rs := slices.Clone(g.list())
	slices.SortFunc(rs, func(a, b *region) int { return cmp.Compare(a.seq, b.seq) })
	return rs
}

// find returns the region containing [addr, addr+n), or nil.
func (g *registry) find(addr, n uint64) *region {
	rs := g.list()
	i, _ := slices.BinarySearchFunc(rs, addr, func(r *region, a uint64) int {
		switch {
		case r.end() <= a:
			return -1
		case r.addr > a:
			return 1
		}
		return 0
	})
	if i == len(rs) {
		return nil
	}
	r := rs[i]
	if addr < r.addr || addr+n < addr || addr+n > r.end() {
		return nil
	}
	return r
}

func (g *registry) add(nr *region) error {
	if nr.length == 0 {
		return errorf(CodeInvalidArgument, "register memory %#x: zero length", nr.addr)
	}
	if nr.addr == 0 || nr.addr+nr.length < nr.addr {
		return errorf(CodeInvalidArgument, "register memory %#x+%d: bad range", nr.addr, nr.length)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	old := g.list()
	for _, r := range old {
		if nr.addr < r.end() && r.addr < nr.end() {
			return errorf(CodeAddressOverlapped, "register memory %#x+%d overlaps %#x+%d",
				nr.addr, nr.length, r.addr, r.length)
		}
	}
	g.seq++
	nr.seq = g.seq
	next := append(slices.Clone(old), nr)
	slices.SortFunc(next, func(a, b *region) int {
		if a.addr < b.addr {
			return -1
		}
		return 1
	})
	g.snap.Store(&next)
	return nil
}

// remove drops the region starting at addr and waits until no transfer
// holds it.
func (g *registry) remove(addr uint64) (*region, error) {
	g.mu.Lock()
	old := g.list()
	i := slices.IndexFunc(old, func(r *region) bool { return r.addr == addr })
	if i < 0 {
		g.mu.Unlock()
		return nil, errorf(CodeAddressNotRegistered, "unregister memory %#x: not registered", addr)
	}
	r := old[i]
	next := slices.Delete(slices.Clone(old), i, i+1)
	g.snap.Store(&next)
	g.mu.Unlock()
	r.pin.Lock()
	r.gone = true
	r.pin.Unlock()
	return r, nil
}

// Acquire implements transport.Memory for the serving side.
func (g *registry) Acquire(addr, n uint64) (transport.Pinned, error) {
	r := g.find(addr, n)
	if r == nil {
		return nil, fmt.Errorf("%w: %#x+%d is not inside registered memory", transport.ErrRejected, addr, n)
	}
	if !r.remote {
		return nil, fmt.Errorf("%w: %#x+%d is not remote-accessible", transport.ErrRejected, addr, n)
	}
	r.pin.RLock()
	if r.gone {
		r.pin.RUnlock()
		return nil, fmt.Errorf("%w: %#x+%d was unregistered", transport.ErrRejected, addr, n)
	}
	if r.onDevice() {
		return deviceRegion{r}, nil
	}
	return r, nil
}
