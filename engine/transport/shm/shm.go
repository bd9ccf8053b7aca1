// Package shm moves slices between processes on the same host without the
// network stack: memfd-backed buffers of the peer are mapped once and copied
// with memmove; any other registered memory is reached with
// process_vm_readv/process_vm_writev, one syscall per slice.
//
// A peer publishes its pid, start time and a control page (a one-page memfd
// holding a generation counter it bumps on every unregistration). The
// initiator checks the counter before each copy: once it moves, mapped views
// may be stale and the peer is reported Stale, so the engine falls back to
// TCP, whose server validates every range itself.
package shm

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/mooncake-go/mooncake/engine/transport"
)

// ErrStale: the peer unregistered memory since it was opened; reopen it or
// use another transport.
var ErrStale = errors.New("shm: peer memory changed since open")

// ErrUnavailable: the peer cannot be reached through shared memory (other
// host, other pid namespace, no permission, exited).
var ErrUnavailable = errors.New("shm: peer not reachable through shared memory")

// HostID identifies the set of processes whose pids and /proc this process
// shares: the kernel boot id plus the pid namespace.
func HostID() string {
	boot, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	ns, _ := os.Readlink("/proc/self/ns/pid")
	if len(boot) == 0 || ns == "" {
		return ""
	}
	return strings.TrimSpace(string(boot)) + "/" + ns
}

// StartTime returns the start time of process pid (field 22 of its stat).
func StartTime(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name may hold spaces and parentheses: fields start after
	// the last ')'.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, fmt.Errorf("shm: unreadable /proc/%d/stat", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0, fmt.Errorf("shm: short /proc/%d/stat", pid)
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// Control is this process's control page: peers map it to learn when its
// registered memory changes.
type Control struct {
	fd  int
	mem []byte
}

// NewControl creates the control page.
func NewControl() (*Control, error) {
	fd, err := unix.MemfdCreate("mooncake-control", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, err
	}
	ps := os.Getpagesize()
	if err := unix.Ftruncate(fd, int64(ps)); err != nil {
		unix.Close(fd)
		return nil, err
	}
	mem, err := unix.Mmap(fd, 0, ps, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	return &Control{fd: fd, mem: mem}, nil
}

// FD is the memfd of the page, published to peers.
func (c *Control) FD() int { return c.fd }

func genPtr(mem []byte) *atomic.Uint64 { return (*atomic.Uint64)(unsafe.Pointer(&mem[0])) }

// Bump tells peers that registered memory changed.
func (c *Control) Bump() { genPtr(c.mem).Add(1) }

// Close releases the page.
func (c *Control) Close() {
	unix.Munmap(c.mem)
	unix.Close(c.fd)
}

// Shared is a memfd-backed buffer of the peer.
type Shared struct {
	Addr, Length uint64
	FD           int
}

// Region is a registered, remote-accessible range of the peer.
type Region struct{ Addr, Length uint64 }

// PeerInfo is what a peer published about itself.
type PeerInfo struct {
	PID       int
	StartTime uint64
	ControlFD int
	Shared    []Shared
	// Regions are all the ranges the peer lets others touch; a slice
	// outside them is rejected without a syscall.
	Regions []Region
}

type view struct {
	addr uint64
	mem  []byte
}

// Peer is an opened same-host peer.
type Peer struct {
	pid     int
	pidfd   int
	ctrl    []byte
	gen     uint64
	views   []view // sorted by addr
	regions []Region
	self    bool
	closeMu sync.RWMutex
	closed  bool
}

// Open checks that the peer is this host's process it claims to be and maps
// its control page and shared buffers. A peer that is this very process is
// reached with plain copies.
func Open(info PeerInfo) (*Peer, error) {
	p := &Peer{pid: info.PID, pidfd: -1, regions: slices.Clone(info.Regions), self: info.PID == os.Getpid()}
	fail := func(err error) (*Peer, error) {
		p.release()
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	var err error
	if !p.self {
		if p.pidfd, err = unix.PidfdOpen(info.PID, 0); err != nil {
			return fail(fmt.Errorf("pidfd_open %d: %v", info.PID, err))
		}
	}
	// Holding the pidfd, a matching start time proves the pid was not reused.
	if st, err := StartTime(info.PID); err != nil || st != info.StartTime {
		return fail(fmt.Errorf("pid %d is not the published process", info.PID))
	}
	if p.ctrl, err = mapFD(info.PID, info.ControlFD, uint64(os.Getpagesize()), "mooncake-control"); err != nil {
		return fail(err)
	}
	p.gen = genPtr(p.ctrl).Load()
	for _, s := range info.Shared {
		mem, err := mapFD(info.PID, s.FD, s.Length, "mooncake-buffer")
		if err != nil {
			return fail(err)
		}
		p.views = append(p.views, view{addr: s.Addr, mem: mem})
	}
	slices.SortFunc(p.views, func(a, b view) int {
		if a.addr < b.addr {
			return -1
		}
		return 1
	})
	if err := p.alive(); err != nil {
		return fail(err)
	}
	return p, nil
}

// mapFD maps another process's memfd through /proc, after checking that
// the descriptor still names the memfd we expect and is large enough.
func mapFD(pid, fd int, length uint64, name string) ([]byte, error) {
	path := fmt.Sprintf("/proc/%d/fd/%d", pid, fd)
	target, err := os.Readlink(path)
	if err != nil {
		return nil, err
	}
	if !strings.HasPrefix(target, "/memfd:"+name) {
		return nil, fmt.Errorf("%s is %q, not a %s memfd", path, target, name)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, err
	}
	if uint64(st.Size) < length {
		return nil, fmt.Errorf("%s holds %d bytes, want %d", path, st.Size, length)
	}
	return unix.Mmap(int(f.Fd()), 0, int(length), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
}

func (p *Peer) alive() error {
	if genPtr(p.ctrl).Load() != p.gen {
		return ErrStale
	}
	if p.self {
		return nil
	}
	// A pidfd turns readable once its process exits, zombie or not.
	fds := []unix.PollFd{{Fd: int32(p.pidfd), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, 0)
	for err == unix.EINTR { // a signal (Go's preemption) is no news about the peer
		n, err = unix.Poll(fds, 0)
	}
	switch {
	case err != nil:
		return fmt.Errorf("%w: poll pidfd of %d: %v", transport.ErrPeer, p.pid, err)
	case n > 0:
		return fmt.Errorf("%w: process %d has exited", transport.ErrPeer, p.pid)
	}
	return nil
}

// Copy performs s synchronously. It does not call s.Done.
func (p *Peer) Copy(s *transport.Slice) error {
	p.closeMu.RLock()
	defer p.closeMu.RUnlock()
	if p.closed {
		return transport.ErrClosed
	}
	if err := p.alive(); err != nil {
		return err
	}
	local := transport.Bytes(s.Local, s.Length)
	if v := p.find(s.Remote, s.Length); v != nil {
		off := s.Remote - v.addr
		copyDir(s.Op, local, v.mem[off:off+s.Length])
		return nil
	}
	if !p.allowed(s.Remote, s.Length) {
		return fmt.Errorf("%w: %#x+%d is not inside the peer's registered memory", transport.ErrRejected, s.Remote, s.Length)
	}
	if p.self {
		copyDir(s.Op, local, transport.Bytes(uintptr(s.Remote), s.Length))
		return nil
	}
	return p.vm(s, local)
}

// allowed reports whether [addr, addr+n) lies inside one published region.
func (p *Peer) allowed(addr, n uint64) bool {
	for _, r := range p.regions {
		if addr >= r.Addr && addr+n >= addr && addr+n <= r.Addr+r.Length {
			return true
		}
	}
	return false
}

func copyDir(op transport.Op, local, remote []byte) {
	if op == transport.Write {
		copy(remote, local)
	} else {
		copy(local, remote)
	}
}

func (p *Peer) find(addr, n uint64) *view {
	i, found := slices.BinarySearchFunc(p.views, addr, func(v view, a uint64) int {
		switch {
		case v.addr+uint64(len(v.mem)) <= a:
			return -1
		case v.addr > a:
			return 1
		}
		return 0
	})
	if !found || i >= len(p.views) {
		return nil
	}
	v := &p.views[i]
	if addr+n > v.addr+uint64(len(v.mem)) {
		return nil
	}
	return v
}

// vm moves the slice with process_vm_readv/writev, resuming after partial
// transfers (the kernel stops at page-fault boundaries).
func (p *Peer) vm(s *transport.Slice, local []byte) error {
	done := uint64(0)
	for done < s.Length {
		l := []unix.Iovec{{Base: &local[done]}}
		l[0].SetLen(int(s.Length - done))
		r := []unix.RemoteIovec{{Base: uintptr(s.Remote + done), Len: int(s.Length - done)}}
		var n int
		var err error
		if s.Op == transport.Write {
			n, err = unix.ProcessVMWritev(p.pid, l, r, 0)
		} else {
			n, err = unix.ProcessVMReadv(p.pid, l, r, 0)
		}
		if err != nil {
			if errors.Is(err, unix.EPERM) || errors.Is(err, unix.ENOSYS) {
				return fmt.Errorf("%w: process_vm: %v", ErrUnavailable, err)
			}
			return fmt.Errorf("%w: process_vm %s %#x+%d: %v", transport.ErrPeer, s.Op, s.Remote, s.Length, err)
		}
		if n <= 0 {
			return fmt.Errorf("%w: process_vm made no progress", transport.ErrPeer)
		}
		done += uint64(n)
	}
	return nil
}

// Close unmaps the peer's memory, waiting for copies in progress.
func (p *Peer) Close() {
	p.closeMu.Lock()
	defer p.closeMu.Unlock()
	if p.closed {
		return
	}
	p.closed = true
	p.release()
}

func (p *Peer) release() {
	for _, v := range p.views {
		unix.Munmap(v.mem)
	}
	p.views = nil
	if p.ctrl != nil {
		unix.Munmap(p.ctrl)
		p.ctrl = nil
	}
	if p.pidfd >= 0 {
		unix.Close(p.pidfd)
		p.pidfd = -1
	}
}

// Pool runs copies on a fixed set of workers so Submit returns at once and
// copies use every core, with a bounded queue.
type Pool struct {
	work chan job
	wg   sync.WaitGroup
	once sync.Once
	quit chan struct{}
}

type job struct {
	p *Peer
	s *transport.Slice
	// fallback gets the slice when the shared path cannot serve it.
	fallback func(*transport.Slice)
}

// NewPool starts workers (0 means GOMAXPROCS).
func NewPool(workers int) *Pool {
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	pl := &Pool{work: make(chan job, 1024), quit: make(chan struct{})}
	for range workers {
		pl.wg.Add(1)
		go pl.run()
	}
	return pl
}

// Name implements transport.Transport.
func (pl *Pool) Name() string { return "shm" }

// Submit queues s for copying to or from p. When the peer turns out stale
// or unreachable, fallback receives s instead (with s.Done not yet called).
func (pl *Pool) Submit(p *Peer, s *transport.Slice, fallback func(*transport.Slice)) {
	select {
	case pl.work <- job{p, s, fallback}:
	case <-pl.quit:
		s.Done(s, transport.ErrClosed)
	}
}

func (pl *Pool) run() {
	defer pl.wg.Done()
	for {
		select {
		case j := <-pl.work:
			err := j.p.Copy(j.s)
			if (errors.Is(err, ErrStale) || errors.Is(err, ErrUnavailable)) && j.fallback != nil {
				j.fallback(j.s)
				continue
			}
			j.s.Done(j.s, err)
		case <-pl.quit:
			return
		}
	}
}

// Close stops the workers; queued copies fail with transport.ErrClosed.
func (pl *Pool) Close() error {
	pl.once.Do(func() { close(pl.quit) })
	pl.wg.Wait()
	for {
		select {
		case j := <-pl.work:
			j.s.Done(j.s, transport.ErrClosed)
		default:
			return nil
		}
	}
}
