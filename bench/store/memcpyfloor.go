package store

import (
	"context"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// MemcpyStore is the memcpy floor: the working set in a shared memory
// mapping (a memfd, as our storage nodes' segments are, mapped and faulted
// in before any client calls), and an index of where each object is. Its
// workers copy values between their own memory and the mapping, one batch
// per call, with no server in between: what a same-host read or write
// costs at best.
type MemcpyStore struct {
	fd    int
	mem   []byte
	size  int
	slots *slots
}

// NewMemcpyStore maps a working set of o (after WithDefaults): Keys values.
func NewMemcpyStore(o Options) (*MemcpyStore, error) {
	o = o.WithDefaults()
	n := o.Keys * o.ValueSize
	fd, err := unix.MemfdCreate("mcbench-memcpy", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("store: memcpy: memfd: %w", err)
	}
	if err := unix.Ftruncate(fd, int64(n)); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("store: memcpy: size the memfd to %d bytes: %w", n, err)
	}
	mem, err := unix.Mmap(fd, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("store: memcpy: map %d bytes: %w", n, err)
	}
	return &MemcpyStore{fd: fd, mem: mem, size: o.ValueSize, slots: newSlots(o.Keys)}, nil
}

// Close unmaps the working set. Its workers must be closed first.
func (s *MemcpyStore) Close() error {
	return errors.Join(unix.Munmap(s.mem), unix.Close(s.fd))
}

// value is slot i of the mapping.
func (s *MemcpyStore) value(i int) []byte { return s.mem[i*s.size : (i+1)*s.size] }

// NewWorker makes a client of o (after WithDefaults) with one batch of
// memory of its own, which puts copy from and gets into.
func (s *MemcpyStore) NewWorker(o Options) (Worker, error) {
	o = o.WithDefaults()
	if o.ValueSize != s.size {
		return nil, fmt.Errorf("store: memcpy: value size %d, the store holds %d-byte values", o.ValueSize, s.size)
	}
	mem := make([]byte, o.BatchSize*o.ValueSize)
	for i := range mem {
		mem[i] = byte(i) // a pattern, not zeros
	}
	return &memcpyWorker{s: s, mem: mem}, nil
}

// memcpyWorker is a Worker of a MemcpyStore.
type memcpyWorker struct {
	s   *MemcpyStore
	mem []byte
	at  []int
}

var _ Worker = (*memcpyWorker)(nil)

// Put implements Worker.
func (w *memcpyWorker) Put(_ context.Context, keys []string) error {
	var err error
	if w.at, err = w.s.slots.reserve(keys, w.at[:0]); err != nil {
		return fmt.Errorf("store: memcpy: put: %w", err)
	}
	for j, i := range w.at {
		copy(w.s.value(i), w.mem[j*w.s.size:])
	}
	w.s.slots.publish(keys, w.at)
	return nil
}

// Get implements Worker.
func (w *memcpyWorker) Get(_ context.Context, keys []string) error {
	var err error
	if w.at, err = w.s.slots.find(keys, w.at[:0]); err != nil {
		return fmt.Errorf("store: memcpy: get: %w", err)
	}
	for j, i := range w.at {
		copy(w.mem[j*w.s.size:], w.s.value(i))
	}
	return nil
}

// Close implements Worker.
func (w *memcpyWorker) Close() error { return nil }

// RunMemcpy measures one run of o against a fresh MemcpyStore holding the
// working set, each client on its own goroutine, and unmaps it.
func RunMemcpy(ctx context.Context, o Options) (res Result, err error) {
	if err := o.Validate(); err != nil {
		return Result{}, err
	}
	o = o.WithDefaults()
	s, err := NewMemcpyStore(o)
	if err != nil {
		return Result{}, err
	}
	defer func() { err = errors.Join(err, s.Close()) }()
	res, err = Drive(ctx, o, func(int) (Worker, error) { return s.NewWorker(o) })
	res.Name, res.Topology = Memcpy, SameHost
	return res, err
}
