package engine

import (
	"context"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Buffer is memory the engine allocated and registered: an mmap of a memfd,
// so a peer on the same host can map the same pages and copy with a single
// memcpy. It never lives on the Go heap and never moves.
type Buffer struct {
	e   *Engine
	mem []byte
	fd  int
}

// Addr is the buffer's address, usable in Requests and by peers.
func (b *Buffer) Addr() uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b.mem))) }

// Bytes is the buffer's memory. It stays valid until Free.
func (b *Buffer) Bytes() []byte { return b.mem }

// Len is the buffer's size in bytes.
func (b *Buffer) Len() int { return len(b.mem) }

// Free unregisters the buffer (waiting for transfers that serve it) and
// releases its memory. Free is idempotent.
func (b *Buffer) Free() error {
	if b.mem == nil {
		return nil
	}
	err := b.e.UnregisterMemory(context.Background(), b.Addr())
	unix.Munmap(b.mem)
	unix.Close(b.fd)
	b.mem = nil
	return err
}

// AllocateBuffer maps size bytes of memfd-backed shared memory and registers
// it (remote-accessible) at location ("" means "cpu:0"); ctx bounds
// publishing the new descriptor.
func (e *Engine) AllocateBuffer(ctx context.Context, size int, location string) (*Buffer, error) {
	if size <= 0 {
		return nil, errorf(CodeInvalidArgument, "allocate buffer: size %d", size)
	}
	fd, err := unix.MemfdCreate("mooncake-buffer", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, wrapf(CodeMemory, err, "allocate buffer: memfd_create")
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		unix.Close(fd)
		return nil, wrapf(CodeMemory, err, "allocate buffer of %d bytes", size)
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, wrapf(CodeMemory, err, "allocate buffer of %d bytes: mmap", size)
	}
	b := &Buffer{e: e, mem: mem, fd: fd}
	if err := e.register(ctx, uint64(b.Addr()), uint64(size), location, true, fd); err != nil {
		unix.Munmap(mem)
		unix.Close(fd)
		return nil, fmt.Errorf("allocate buffer: %w", err)
	}
	return b, nil
}

// AddrOf returns the address of b's first byte. b must not be Go heap
// memory that the engine keeps using after the call returns: pass memory
// from mmap, C, or AllocateBuffer.
func AddrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }
