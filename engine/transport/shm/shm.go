// Package shm moves slices between processes on the same host without the
// network stack: memfd-backed buffers of the peer are mapped once and copied
// with memmove; any other registered memory is reached with
// process_vm_readv/process_vm_writev, one syscall per slice.
//
// A peer publishes its pid, start time, a control page (a one-page memfd
// holding a generation counter it bumps on every unregistration) and the
// generation its descriptor was taken at. The initiator checks the counter
// before each copy: once it has moved past the view's generation, mapped
// views may be stale and Copy reports ErrStale; a range outside the view is
// ErrOutside. Either way the engine re-reads the peer's descriptor and
// hands it to Update, which swaps the view once no copy uses the old one
// and only then unmaps what the peer no longer publishes.
package shm

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/mooncake-go/mooncake/engine/device"
	"github.com/mooncake-go/mooncake/engine/transport"
	"github.com/mooncake-go/mooncake/internal/crc32c"
)

// ErrStale: the peer unregistered memory since it was opened; reopen it or
// use another transport.
var ErrStale = errors.New("shm: peer memory changed since open")

// ErrOutside: the range is not inside the memory the view knows of. It
// wraps transport.ErrRejected; the peer may have registered the range
// since the view was taken, so the engine refreshes the view and retries.
var ErrOutside = fmt.Errorf("%w: outside the peer's published memory", transport.ErrRejected)

// ErrUnavailable: the peer cannot be reached through shared memory (other
// host, other pid namespace, no permission, exited). It wraps
// transport.ErrUnavailable: the next path may reach it.
var ErrUnavailable = fmt.Errorf("%w: shared memory", transport.ErrUnavailable)

// ErrOnDevice: one side of the slice is GPU memory, which this path does
// not move (host copies would touch it with the CPU); the next path does.
var ErrOnDevice = errors.New("shm: GPU memory is not moved by shared memory")

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

// Generation is the current counter. A descriptor reads it before listing
// the regions, so a view built from the descriptor is stale exactly when
// the counter has moved on since.
func (c *Control) Generation() uint64 { return genPtr(c.mem).Load() }

// Close releases the page; a second Close does nothing (the descriptor
// number may name another file by then).
func (c *Control) Close() {
	if c.mem == nil {
		return
	}
	unix.Munmap(c.mem)
	unix.Close(c.fd)
	c.mem, c.fd = nil, -1
}

// Shared is a memfd-backed buffer of the peer.
type Shared struct {
	Addr, Length uint64
	FD           int
}

// Region is a registered, remote-accessible range of the peer.
type Region struct {
	Addr, Length uint64
	Dev          int // the GPU of a Device region
}

// PeerInfo is what a peer published about itself.
type PeerInfo struct {
	PID       int
	StartTime uint64
	ControlFD int
	// Generation is the control counter the peer read before listing its
	// memory; nil (a peer that does not publish it) means the counter as
	// Open or Update finds it.
	Generation *uint64
	Shared     []Shared
	// Regions are all the ranges of host memory the peer lets others
	// touch; a slice outside them is refused without a syscall.
	Regions []Region
	// Device are the peer's remote-accessible ranges of GPU memory: a slice
	// into them is ErrOnDevice.
	Device []Region
}

// view is one mapped memfd buffer of the peer; dev and ino identify the
// file, so a new buffer behind a reused descriptor number (and perhaps the
// same address) is never taken for the old one.
type view struct {
	addr     uint64
	mem      []byte
	dev, ino uint64
}

// Peer is an opened same-host peer. Copies hold mu for reading while they
// use the views; Update and Close take it for writing, so a mapping is
// never unmapped under a copy.
type Peer struct {
	pid   int
	start uint64
	pidfd int
	ctrl  []byte
	self  bool

	mu      sync.RWMutex
	gen     uint64
	views   []view // sorted by addr
	regions []Region
	device  []Region
	closed  bool
}

// Open checks that the peer is this host's process it claims to be and maps
// its control page and shared buffers. A peer that is this very process is
// reached with plain copies.
func Open(info PeerInfo) (*Peer, error) {
	p := &Peer{pid: info.PID, start: info.StartTime, pidfd: -1, self: info.PID == os.Getpid()}
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
	if p.ctrl, _, err = mapFD(info.PID, info.ControlFD, uint64(os.Getpagesize()), "mooncake-control"); err != nil {
		return fail(err)
	}
	if p.views, err = p.mapViews(info.Shared, nil); err != nil {
		return fail(err)
	}
	p.gen, p.regions, p.device = p.generation(info), slices.Clone(info.Regions), slices.Clone(info.Device)
	if err := p.running(); err != nil {
		return fail(err)
	}
	return p, nil
}

func (p *Peer) generation(info PeerInfo) uint64 {
	if info.Generation != nil {
		return *info.Generation
	}
	return genPtr(p.ctrl).Load()
}

// mapViews maps the shared buffers of info, sorted by address, reusing
// the mappings of old that show the same file at the same place.
func (p *Peer) mapViews(shared []Shared, old []view) (vs []view, err error) {
	defer func() {
		if err != nil {
			unmapNew(vs, old)
			vs = nil
		}
	}()
	for _, s := range shared {
		path := fmt.Sprintf("/proc/%d/fd/%d", p.pid, s.FD)
		var st unix.Stat_t
		if i := slices.IndexFunc(old, func(v view) bool {
			return v.addr == s.Addr && uint64(len(v.mem)) == s.Length
		}); i >= 0 && unix.Stat(path, &st) == nil && st.Dev == old[i].dev && st.Ino == old[i].ino {
			vs = append(vs, old[i])
			continue
		}
		mem, st, err := mapFD(p.pid, s.FD, s.Length, "mooncake-buffer")
		if err != nil {
			return vs, err
		}
		vs = append(vs, view{addr: s.Addr, mem: mem, dev: st.Dev, ino: st.Ino})
	}
	slices.SortFunc(vs, func(a, b view) int { return cmp.Compare(a.addr, b.addr) })
	return vs, nil
}

// unmapNew unmaps the views of vs that are not in keep.
func unmapNew(vs, keep []view) {
	for _, v := range vs {
		if !slices.ContainsFunc(keep, func(k view) bool { return unsafe.SliceData(k.mem) == unsafe.SliceData(v.mem) }) {
			unix.Munmap(v.mem)
		}
	}
}

// Update replaces the view with what the peer published in info (its
// descriptor re-read after a miss or a move of the control counter). New
// buffers are mapped before the swap; buffers the peer no longer publishes
// are unmapped after it, once no copy uses them. The peer must be the
// process that was opened: a restarted peer is ErrUnavailable.
func (p *Peer) Update(info PeerInfo) error {
	if info.PID != p.pid || info.StartTime != p.start {
		return fmt.Errorf("%w: segment is now served by pid %d, not %d", ErrUnavailable, info.PID, p.pid)
	}
	p.mu.RLock()
	old, closed := p.views, p.closed
	p.mu.RUnlock()
	if closed {
		return transport.ErrClosed
	}
	// Only Update replaces views and the engine runs one Update per peer
	// at a time, so old stays the current set until the swap below.
	vs, err := p.mapViews(info.Shared, old)
	if err != nil {
		// Close may have run since the check above: it unmaps the control
		// page, which only mu keeps mapped.
		p.mu.RLock()
		defer p.mu.RUnlock()
		if p.closed {
			return transport.ErrClosed
		}
		if genPtr(p.ctrl).Load() != p.generation(info) {
			// The peer freed a buffer since it described it: look again.
			return fmt.Errorf("%w: %v", ErrStale, err)
		}
		return fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		unmapNew(vs, old)
		return transport.ErrClosed
	}
	p.views, p.regions, p.device, p.gen = vs, slices.Clone(info.Regions), slices.Clone(info.Device), p.generation(info)
	p.mu.Unlock()
	unmapNew(old, vs)
	return nil
}

// Covers reports whether the current view holds [addr, addr+n).
func (p *Peer) Covers(addr, n uint64) bool {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.find(addr, n) != nil || p.allowed(addr, n)
}

// mapFD maps another process's memfd through /proc, after checking that
// the descriptor still names the memfd we expect and is large enough. It
// returns the mapping and the file's stat.
func mapFD(pid, fd int, length uint64, name string) (mem []byte, st unix.Stat_t, err error) {
	path := fmt.Sprintf("/proc/%d/fd/%d", pid, fd)
	target, err := os.Readlink(path)
	if err != nil {
		return nil, st, err
	}
	if !strings.HasPrefix(target, "/memfd:"+name) {
		return nil, st, fmt.Errorf("%s is %q, not a %s memfd", path, target, name)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, st, err
	}
	defer f.Close()
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, st, err
	}
	if uint64(st.Size) < length {
		return nil, st, fmt.Errorf("%s holds %d bytes, want %d", path, st.Size, length)
	}
	mem, err = unix.Mmap(int(f.Fd()), 0, int(length), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	return mem, st, err
}

// alive checks that the view is current and the peer still runs.
func (p *Peer) alive() error {
	if genPtr(p.ctrl).Load() != p.gen {
		return ErrStale
	}
	return p.running()
}

func (p *Peer) running() error {
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
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return transport.ErrClosed
	}
	if err := p.alive(); err != nil {
		return err
	}
	if s.LocalDevice > 0 || p.onDevice(s.Remote, s.Length) {
		if p.self {
			return p.deviceCopy(s)
		}
		return ErrOnDevice
	}
	local := transport.Bytes(s.Local, s.Length)
	if v := p.find(s.Remote, s.Length); v != nil {
		off := s.Remote - v.addr
		copyDir(s.Op, local, v.mem[off:off+s.Length])
		return nil
	}
	if !p.allowed(s.Remote, s.Length) {
		return fmt.Errorf("%w: %#x+%d", ErrOutside, s.Remote, s.Length)
	}
	if p.self {
		copyDir(s.Op, local, transport.Bytes(uintptr(s.Remote), s.Length))
		return nil
	}
	return p.vm(s, local)
}

// allowed reports whether [addr, addr+n) lies inside one published region.
// onDevice reports whether [addr, addr+n) meets the peer's GPU memory.
func (p *Peer) onDevice(addr, n uint64) bool {
	_, ok := p.deviceRegion(addr, n, false)
	return ok
}

// deviceRegion returns the peer's GPU region that holds [addr, addr+n)
// (whole: only one that does), or that meets it (whole false).
func (p *Peer) deviceRegion(addr, n uint64, whole bool) (Region, bool) {
	for _, r := range p.device {
		if whole && addr >= r.Addr && addr+n >= addr && addr+n <= r.Addr+r.Length {
			return r, true
		}
		if !whole && addr < r.Addr+r.Length && r.Addr < addr+n {
			return r, true
		}
	}
	return Region{}, false
}

// deviceCopy moves a slice with GPU memory on a side when the peer is this
// very process: both addresses are this process's, so the driver copies
// between them directly (no IPC, which a driver refuses within a process).
// A checksum is taken from a host copy the driver makes.
func (p *Peer) deviceCopy(s *transport.Slice) error {
	drv := device.Present()
	if drv == nil {
		return ErrOnDevice
	}
	dev := s.LocalDevice - 1
	if r, ok := p.deviceRegion(s.Remote, s.Length, true); ok {
		if dev < 0 {
			dev = r.Dev
		}
	} else if !p.allowed(s.Remote, s.Length) {
		return fmt.Errorf("%w: %#x+%d", ErrOutside, s.Remote, s.Length)
	}
	dst, src := uintptr(s.Remote), s.Local
	if s.Op == transport.Read {
		dst, src = src, dst
	}
	if !s.Checksum || s.LocalDevice == 0 {
		// Host bytes here: the engine sums them once copied.
		return drv.Copy(dev, dst, src, s.Length)
	}
	tmp := make([]byte, s.Length)
	at := uintptr(unsafe.Pointer(unsafe.SliceData(tmp)))
	if err := drv.Copy(dev, at, src, s.Length); err != nil {
		return err
	}
	s.CRC, s.Summed = crc32c.Checksum(tmp), true
	return drv.Copy(dev, dst, at, s.Length)
}

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
	p.mu.Lock()
	defer p.mu.Unlock()
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
	// mu orders Submit against Close: a slice is either queued before Close
	// drains the queue or failed by Submit, never left in the queue.
	mu     sync.RWMutex
	closed bool
}

type job struct {
	p *Peer
	s *transport.Slice
	// miss gets the slice, with the reason, when the view cannot serve it.
	miss func(*transport.Slice, error)
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

// Submit queues s for copying to or from p. When the view turns out stale
// (ErrStale), does not cover the range (ErrOutside) or the peer cannot be
// reached this way (ErrUnavailable), miss receives s and the error instead,
// with s.Done not yet called; miss must not block. Submit waits while the
// queue is full, until s.Deadline or the end of ctx.
func (pl *Pool) Submit(ctx context.Context, p *Peer, s *transport.Slice, miss func(*transport.Slice, error)) {
	pl.mu.RLock()
	defer pl.mu.RUnlock()
	if pl.closed {
		s.Done(s, transport.ErrClosed)
		return
	}
	j := job{p, s, miss}
	select {
	case pl.work <- j:
		return
	default:
	}
	t := time.NewTimer(time.Until(s.Deadline))
	defer t.Stop()
	select {
	case pl.work <- j:
	case <-t.C:
		s.Done(s, fmt.Errorf("%w: copy queue full", transport.ErrTimeout))
	case <-ctx.Done():
		s.Done(s, fmt.Errorf("copy queue full: %w", context.Cause(ctx)))
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
			if j.miss != nil && (errors.Is(err, ErrStale) || errors.Is(err, ErrOutside) || errors.Is(err, ErrUnavailable) ||
				errors.Is(err, ErrOnDevice)) {
				j.miss(j.s, err)
				continue
			}
			j.s.Done(j.s, err)
		case <-pl.quit:
			return
		}
	}
}

// Close stops the workers; queued copies fail with transport.ErrClosed, and
// so do later Submits.
func (pl *Pool) Close() error {
	pl.once.Do(func() { close(pl.quit) })
	// Submits blocked on a full queue leave through quit; then no Submit is
	// in progress and none starts.
	pl.mu.Lock()
	pl.closed = true
	pl.mu.Unlock()
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
