package cudaipc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/mooncake-go/mooncake/engine/device"
	"github.com/mooncake-go/mooncake/engine/metadata"
	"github.com/mooncake-go/mooncake/engine/transport"
	"github.com/mooncake-go/mooncake/engine/transport/shm"
	"github.com/mooncake-go/mooncake/internal/crc32c"
)

// ErrCopy: the driver failed to copy a slice to or from a peer's mapped GPU
// memory, even after the peer's view was refreshed. The slice fails; it is
// not retried.
var ErrCopy = errors.New("cudaipc: GPU copy failed")

// Config configures the CUDA IPC path.
type Config struct {
	// Workers copying slices; zero means 4. A device copy keeps its
	// worker for its whole length: Submit itself never copies.
	Workers int
	Logger  *slog.Logger
}

// Transport is the CUDA IPC path.
type Transport struct {
	cfg    Config
	hostID string
	pid    int

	work chan job
	quit chan struct{}
	wg   sync.WaitGroup
	once sync.Once
	// ctx ends when Close starts: what workers hand on to the next path,
	// or view refreshes, give up then.
	ctx    context.Context
	cancel context.CancelFunc
	// mu orders Submit against Close: a slice is either queued before
	// Close drains the queue or failed by Submit.
	mu     sync.RWMutex
	closed bool

	bounce sync.Pool // *[]byte host buffers for checksummed device copies
}

var (
	_ transport.Transport = (*Transport)(nil)
	_ transport.Publisher = (*Transport)(nil)
	_ transport.Peer      = (*peer)(nil)
	_ transport.Inliner   = (*peer)(nil)
)

// job is a slice queued for a worker.
type job struct {
	p *peer
	s *transport.Slice
}

// New starts the path's copy workers. It does not load the CUDA driver.
func New(cfg Config) *Transport {
	if cfg.Workers <= 0 {
		cfg.Workers = 4
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	t := &Transport{cfg: cfg, hostID: shm.HostID(), pid: os.Getpid(),
		work: make(chan job, 1024), quit: make(chan struct{})}
	t.ctx, t.cancel = context.WithCancel(context.Background())
	for range cfg.Workers {
		t.wg.Add(1)
		go t.run()
	}
	return t
}

// Name implements transport.Transport.
func (t *Transport) Name() string { return "cudaipc" }

// Close implements transport.Transport: it stops the workers; queued slices
// fail with transport.ErrClosed, and so do later ones. Mappings are the
// peers' to close.
func (t *Transport) Close() error {
	t.once.Do(func() {
		t.cancel()
		close(t.quit)
		// Submits blocked on a full queue leave through quit; then no
		// Submit is in progress and none starts.
		t.mu.Lock()
		t.closed = true
		t.mu.Unlock()
		t.wg.Wait()
		for {
			select {
			case j := <-t.work:
				j.s.Done(j.s, transport.ErrClosed)
			default:
				return
			}
		}
	})
	return nil
}

// Publish implements transport.Publisher: the IPC handle of the allocation
// under each registered GPU region, with this process's identity. Nothing
// needs reading before the regions are listed: a handle is taken from the
// driver as the descriptor is made.
func (t *Transport) Publish(d *metadata.SegmentDesc) func([]transport.LocalRegion) {
	return func(regions []transport.LocalRegion) {
		if t.hostID == "" { // no /proc to identify this host by: no peer could tell
			return
		}
		var bufs []metadata.IPCBuffer
		var drv *device.Driver
		for _, r := range regions {
			if r.Device == 0 {
				continue
			}
			// A region on a GPU was registered through the driver.
			if drv == nil {
				if drv = device.Present(); drv == nil {
					return
				}
			}
			b, err := ipcBuffer(drv, r)
			if err != nil {
				t.cfg.Logger.Warn("GPU buffer published without an IPC handle: same-host peers reach it through staging",
					"addr", fmt.Sprintf("%#x", r.Addr), "length", r.Length, "err", err)
				continue
			}
			bufs = append(bufs, b)
		}
		if len(bufs) > 0 {
			d.CudaIPC = &metadata.CudaIPCInfo{HostID: t.hostID, PID: t.pid, Buffers: bufs}
		}
	}
}

// ipcBuffer describes region r with the handle of the allocation holding it
// (a region may be part of an allocation; handles are of bases only).
func ipcBuffer(drv *device.Driver, r transport.LocalRegion) (metadata.IPCBuffer, error) {
	dev := r.Device - 1
	base, size, err := drv.Range(dev, uintptr(r.Addr))
	if err != nil {
		return metadata.IPCBuffer{}, err
	}
	h, err := drv.IPCHandle(dev, base)
	if err != nil {
		return metadata.IPCBuffer{}, err
	}
	return metadata.IPCBuffer{Addr: r.Addr, Length: r.Length, Base: uint64(base), Size: size, Device: dev, Handle: h[:]}, nil
}

// Unregistered implements transport.Publisher. Peers learn of a removed
// region from the same-host path's control counter (see the package doc).
func (t *Transport) Unregistered() {}

// Open implements transport.Transport: a peer in another process of this
// host that publishes IPC buffers; any other is transport.ErrUnavailable.
func (t *Transport) Open(_ context.Context, info transport.PeerInfo) (transport.Peer, error) {
	c := info.Desc.CudaIPC
	switch {
	case c == nil || len(c.Buffers) == 0:
		return nil, fmt.Errorf("%w: segment %s publishes no CUDA IPC buffers", transport.ErrUnavailable, info.Name)
	case t.hostID == "" || c.HostID != t.hostID:
		return nil, fmt.Errorf("%w: segment %s is on another host", transport.ErrUnavailable, info.Name)
	case c.PID == t.pid:
		// CUDA refuses to open a process's own handles.
		return nil, fmt.Errorf("%w: segment %s is in this process", transport.ErrUnavailable, info.Name)
	}
	v, err := newView(info.Desc, c.PID, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: segment %s: %w", transport.ErrUnavailable, info.Name, err)
	}
	ctrl, err := openControl(info.Desc.Local, c.PID)
	if err != nil {
		return nil, fmt.Errorf("%w: segment %s: %w", transport.ErrUnavailable, info.Name, err)
	}
	p := &peer{t: t, name: info.Name, pid: c.PID, ctrl: ctrl, describe: info.Describe, next: info.Next,
		maps: map[device.IPCHandle]*mapping{}}
	p.inline, _ = info.Next.(transport.Inliner)
	p.view.Store(v)
	p.drv.Store(device.Present())
	return p, nil
}

// submit queues s for a worker, waiting while the queue is full until
// s.Deadline or the end of ctx.
func (t *Transport) submit(ctx context.Context, p *peer, s *transport.Slice) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.closed {
		s.Done(s, transport.ErrClosed)
		return
	}
	j := job{p, s}
	select {
	case t.work <- j:
		return
	default:
	}
	timer := time.NewTimer(time.Until(s.Deadline))
	defer timer.Stop()
	select {
	case t.work <- j:
	case <-timer.C:
		s.Done(s, fmt.Errorf("%w: CUDA IPC copy queue full", transport.ErrTimeout))
	case <-ctx.Done():
		s.Done(s, fmt.Errorf("CUDA IPC copy queue full: %w", context.Cause(ctx)))
	case <-t.quit:
		s.Done(s, transport.ErrClosed)
	}
}

// maxRun bounds the bytes of one coalesced copy.
const maxRun = 64 << 20

func (t *Transport) run() {
	defer t.wg.Done()
	for {
		select {
		case j := <-t.work:
			for next := &j; next != nil; {
				var run []job
				run, next = t.gather(*next)
				if len(run) == 1 {
					run[0].p.serve(run[0].s)
				} else {
					run[0].p.serveRun(run)
				}
			}
		case <-t.quit:
			return
		}
	}
}

// gather returns j and the slices queued behind it that continue it (same
// peer and direction, adjacent on both sides, no checksum), up to maxRun
// bytes, and the first queued slice that does not, if any. A request is
// cut into slices of the engine's size (128 KiB), but one driver copy of
// a GPU range costs microseconds whatever its length: copied one by one,
// the slices of a large request would move a few percent of what the GPU
// can.
func (t *Transport) gather(j job) (run []job, next *job) {
	run = []job{j}
	if j.s.Checksum && j.s.LocalDevice > 0 {
		return run, nil
	}
	end := j.s
	total := end.Length
	for total < maxRun {
		select {
		case k := <-t.work:
			s := k.s
			if k.p != j.p || s.Op != end.Op || (s.Checksum && s.LocalDevice > 0) || s.Local != end.Local+uintptr(end.Length) ||
				s.Remote != end.Remote+end.Length || total+s.Length > maxRun {
				return run, &k
			}
			run = append(run, k)
			end, total = s, total+s.Length
		default:
			return run, nil
		}
	}
	return run, nil
}

// getBounce returns a host buffer of n bytes.
func (t *Transport) getBounce(n uint64) *[]byte {
	if b, ok := t.bounce.Get().(*[]byte); ok && uint64(cap(*b)) >= n {
		*b = (*b)[:n]
		return b
	}
	b := make([]byte, n)
	return &b
}

// openControl maps, read-only, the control page that the peer's same-host
// path publishes (package shm): a counter that moves whenever the peer
// unregisters memory. Without it a mapping of memory the peer freed could
// not be told from a live one, so the path does not open such a peer.
func openControl(l *metadata.LocalInfo, pid int) ([]byte, error) {
	if l == nil || l.Generation == nil || l.PID != pid {
		return nil, errors.New("cudaipc: the peer publishes no control counter of its memory")
	}
	// The start time proves the pid was not reused.
	if st, err := shm.StartTime(pid); err != nil || st != l.StartTime {
		return nil, fmt.Errorf("cudaipc: pid %d is not the published process", pid)
	}
	path := fmt.Sprintf("/proc/%d/fd/%d", pid, l.ControlFD)
	if target, err := os.Readlink(path); err != nil || !strings.HasPrefix(target, "/memfd:mooncake-control") {
		return nil, fmt.Errorf("cudaipc: %s is not the peer's control page (%q, %v)", path, target, err)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("cudaipc: control page: %w", err)
	}
	defer f.Close()
	mem, err := unix.Mmap(int(f.Fd()), 0, os.Getpagesize(), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("cudaipc: map %s: %w", path, err)
	}
	return mem, nil
}

// counter reads the control page's counter.
func counter(ctrl []byte) uint64 { return (*atomic.Uint64)(unsafe.Pointer(&ctrl[0])).Load() }

// view is a peer's GPU buffers as one descriptor published them.
type view struct {
	gen  uint64 // counts refreshes: a slice that failed on gen asks for gen+1
	ipc  []ipcBuf
	bufs []metadata.Buffer // every buffer the peer listed, host or GPU
	// ctrl is the peer's control counter as it read it before listing its
	// buffers: the view is current while the counter still holds it.
	ctrl uint64
}

// ipcBuf is an IPC buffer of the peer, decoded.
type ipcBuf struct {
	addr, length uint64
	base, size   uint64
	dev          int
	handle       device.IPCHandle
}

// errStale: the peer unregistered memory since the view was taken.
var errStale = errors.New("cudaipc: view of the peer is stale")

// errBadBuffer: a descriptor's IPC buffer that makes no sense.
var errBadBuffer = errors.New("cudaipc: bad IPC buffer")

// newView decodes d's IPC buffers. Descriptors from the network were
// checked by metadata.ParseSegmentDesc; this checks again what a copy
// relies on, for descriptors made otherwise. A descriptor of another
// process than pid (the peer restarted), or without its control counter,
// gives a view with no IPC buffer: every slice passes on.
func newView(d *metadata.SegmentDesc, pid int, gen uint64) (*view, error) {
	v := &view{gen: gen, bufs: d.Buffers}
	if d.CudaIPC == nil {
		return v, nil
	}
	for _, b := range d.CudaIPC.Buffers {
		if len(b.Handle) != len(device.IPCHandle{}) || b.Length == 0 || b.Addr+b.Length < b.Addr ||
			b.Addr < b.Base || b.Addr+b.Length > b.Base+b.Size || b.Base+b.Size < b.Base || b.Device < 0 {
			return nil, fmt.Errorf("%w: %#x+%d in allocation %#x+%d on cuda:%d, handle of %d bytes",
				errBadBuffer, b.Addr, b.Length, b.Base, b.Size, b.Device, len(b.Handle))
		}
		ib := ipcBuf{addr: b.Addr, length: b.Length, base: b.Base, size: b.Size, dev: b.Device}
		copy(ib.handle[:], b.Handle)
		v.ipc = append(v.ipc, ib)
	}
	if d.CudaIPC.PID != pid || d.Local == nil || d.Local.PID != pid || d.Local.Generation == nil {
		v.ipc = nil
		return v, nil
	}
	v.ctrl = *d.Local.Generation
	return v, nil
}

// find returns the IPC buffer holding [addr, addr+n), or nil.
func (v *view) find(addr, n uint64) *ipcBuf {
	for i := range v.ipc {
		b := &v.ipc[i]
		if addr >= b.addr && addr+n >= addr && addr+n <= b.addr+b.length {
			return b
		}
	}
	return nil
}

// known reports whether [addr, addr+n) lies in a buffer the peer listed.
func (v *view) known(addr, n uint64) bool {
	for _, b := range v.bufs {
		if addr >= b.Addr && addr+n >= addr && addr+n <= b.Addr+b.Length {
			return true
		}
	}
	return false
}

// mapping is a peer's device allocation mapped into this process.
type mapping struct {
	dev int
	ptr uintptr
	// err: the allocation could not be mapped; its slices go to the next
	// path from now on.
	err error
}

// peer is an opened peer on the CUDA IPC path.
type peer struct {
	t        *Transport
	name     string
	pid      int
	ctrl     []byte // the peer's control page; unmapped by Close
	describe func(context.Context) (*metadata.SegmentDesc, error)
	next     transport.Peer    // nil: no other path
	inline   transport.Inliner // next, if it sends inline

	view atomic.Pointer[view]
	// drv is the driver if this process had loaded it when a slice asked;
	// nil: slices go to the next path (the path never loads CUDA itself).
	drv atomic.Pointer[device.Driver]

	// mu is held for reading by each copy and for writing while mappings
	// are closed (a refresh dropping some, Close dropping all).
	mu     sync.RWMutex
	closed bool
	mapMu  sync.Mutex // guards maps against concurrent opens
	maps   map[device.IPCHandle]*mapping

	refreshMu sync.Mutex // one refresh at a time
}

// driver returns the driver to copy s with, nil if there is none.
func (p *peer) driver(s *transport.Slice) *device.Driver {
	drv := p.drv.Load()
	if drv == nil && s.LocalDevice > 0 {
		// Device memory was registered through the driver: it is loaded.
		drv = device.Present()
		p.drv.Store(drv)
	}
	return drv
}

// direct reports whether s goes straight to the next path: no driver, or
// the range lies in the peer's host memory.
func (p *peer) direct(s *transport.Slice) bool {
	if p.driver(s) == nil {
		return true
	}
	v := p.view.Load()
	return v.find(s.Remote, s.Length) == nil && v.known(s.Remote, s.Length)
}

// Submit implements transport.Peer.
func (p *peer) Submit(ctx context.Context, s *transport.Slice) {
	if p.direct(s) {
		p.pass(ctx, s)
		return
	}
	p.t.submit(ctx, p, s)
}

// SubmitInline implements transport.Inliner: slices the next path takes
// anyway keep its inline sends; any for this path are queued one by one.
func (p *peer) SubmitInline(ctx context.Context, sl []*transport.Slice) transport.Inline {
	all := p.inline != nil
	for _, s := range sl {
		all = all && p.direct(s)
	}
	if all {
		return p.inline.SubmitInline(ctx, sl)
	}
	for _, s := range sl {
		p.Submit(ctx, s)
	}
	return nil
}

// Path implements transport.Peer: "cudaipc" while this process can copy
// GPU memory (a task to the peer's host memory is counted here too, though
// the next path carries it), the next path's name otherwise.
func (p *peer) Path() string {
	if p.drv.Load() == nil && p.next != nil {
		return p.next.Path()
	}
	return "cudaipc"
}

// Close implements transport.Peer: it waits for copies in progress, then
// unmaps the peer's allocations. Slices still queued fail with
// transport.ErrClosed.
func (p *peer) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.closed = true
	p.unmap(func(device.IPCHandle) bool { return true })
	unix.Munmap(p.ctrl)
}

// unmap closes the mappings whose handle drop says, with p.mu held for
// writing.
func (p *peer) unmap(drop func(device.IPCHandle) bool) {
	for h, m := range p.maps {
		if !drop(h) {
			continue
		}
		delete(p.maps, h)
		if m.err != nil {
			continue
		}
		if err := p.drv.Load().CloseIPC(m.dev, m.ptr); err != nil {
			p.t.cfg.Logger.Warn("closing a peer's GPU mapping failed", "segment", p.name, "err", err)
		}
	}
}

// pass hands s to the next path.
func (p *peer) pass(ctx context.Context, s *transport.Slice) {
	if p.next == nil {
		s.Done(s, fmt.Errorf("%w: %#x+%d of %s: not through CUDA IPC, and no other path", transport.ErrUnavailable, s.Remote, s.Length, p.name))
		return
	}
	p.next.Submit(ctx, s)
}

// serve runs s on a worker: through the peer's mapped GPU memory if it can,
// refreshing a view that does not know the range or whose copy failed,
// else on the next path.
func (p *peer) serve(s *transport.Slice) {
	if time.Now().After(s.Deadline) {
		s.Done(s, fmt.Errorf("%w: waiting for a CUDA IPC copy", transport.ErrTimeout))
		return
	}
	refreshed := false
	for {
		v := p.view.Load()
		b := v.find(s.Remote, s.Length)
		if b == nil {
			if refreshed || v.known(s.Remote, s.Length) || p.refresh(s, v.gen) != nil {
				p.pass(p.t.ctx, s)
				return
			}
			// The peer may have registered the range since it was opened.
			refreshed = true
			continue
		}
		mapped, err := p.copy(v, b, s)
		switch {
		case errors.Is(err, errStale):
			if refreshed || p.refresh(s, v.gen) != nil {
				p.pass(p.t.ctx, s)
				return
			}
			refreshed = true
			continue
		case !mapped:
			p.pass(p.t.ctx, s)
			return
		case err == nil || errors.Is(err, transport.ErrClosed) || refreshed || p.refresh(s, v.gen) != nil:
			s.Done(s, err)
			return
		}
		// The copy failed: tried again only if the peer now publishes
		// another allocation there (it re-registered).
		refreshed = true
		if nb := p.view.Load().find(s.Remote, s.Length); nb != nil && nb.handle == b.handle {
			s.Done(s, err)
			return
		}
	}
}

// serveRun copies adjacent slices (gather) with one driver copy when the
// peer's mapped allocation holds all of them, and completes each; anything
// else (no mapping, a stale view, a failed copy, a deadline passed) serves
// them one by one, which refreshes, retries or passes each on as serve
// does. A failed run copy is redone slice by slice: copies are idempotent.
func (p *peer) serveRun(run []job) {
	first, last := run[0].s, run[len(run)-1].s
	whole := &transport.Slice{Op: first.Op, Local: first.Local, Remote: first.Remote,
		Length: uint64(last.Local-first.Local) + last.Length, Deadline: first.Deadline, LocalDevice: first.LocalDevice}
	for _, j := range run {
		if j.s.Deadline.Before(whole.Deadline) {
			whole.Deadline = j.s.Deadline
		}
	}
	if time.Now().Before(whole.Deadline) {
		v := p.view.Load()
		if b := v.find(whole.Remote, whole.Length); b != nil {
			if mapped, err := p.copy(v, b, whole); mapped && err == nil {
				for _, j := range run {
					j.s.Done(j.s, nil)
				}
				return
			}
		}
	}
	for _, j := range run {
		p.serve(j.s)
	}
}

// refresh replaces the view seen (of generation gen) with the peer's
// current descriptor, unless another slice did so meanwhile, and closes
// the mappings of allocations the peer no longer publishes.
func (p *peer) refresh(s *transport.Slice, gen uint64) error {
	p.refreshMu.Lock()
	defer p.refreshMu.Unlock()
	if p.view.Load().gen != gen {
		return nil
	}
	if p.describe == nil {
		return fmt.Errorf("cudaipc: %s: no way to refresh the view", p.name)
	}
	ctx, cancel := context.WithDeadline(p.t.ctx, s.Deadline)
	defer cancel()
	d, err := p.describe(ctx)
	if err != nil {
		p.t.cfg.Logger.Debug("CUDA IPC view refresh failed", "segment", p.name, "err", err)
		return err
	}
	v, err := newView(d, p.pid, gen+1)
	if err != nil {
		return err
	}
	live := map[device.IPCHandle]bool{}
	for _, b := range v.ipc {
		live[b.handle] = true
	}
	p.mu.Lock()
	p.view.Store(v)
	if !p.closed {
		p.unmap(func(h device.IPCHandle) bool { return !live[h] })
	}
	p.mu.Unlock()
	return nil
}

// mapping returns b's allocation mapped, opening it on first use. With
// p.mu held for reading.
func (p *peer) mapping(drv *device.Driver, b *ipcBuf) *mapping {
	p.mapMu.Lock()
	defer p.mapMu.Unlock()
	if m := p.maps[b.handle]; m != nil {
		return m
	}
	m := &mapping{dev: b.dev}
	if m.err = drv.CheckDevice(b.dev); m.err == nil {
		m.ptr, m.err = drv.OpenIPC(b.dev, b.handle)
	}
	if m.err != nil {
		p.t.cfg.Logger.Warn("cannot map a peer's GPU allocation: its slices take the next path",
			"segment", p.name, "allocation", fmt.Sprintf("%#x+%d", b.base, b.size), "device", b.dev, "err", m.err)
	}
	p.maps[b.handle] = m
	return m
}

// copy moves s through b's mapped allocation. mapped is false when the
// allocation cannot be mapped (s is then untouched).
func (p *peer) copy(v *view, b *ipcBuf, s *transport.Slice) (mapped bool, err error) {
	drv := p.driver(s)
	if drv == nil {
		return false, nil
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return true, transport.ErrClosed
	}
	if counter(p.ctrl) != v.ctrl {
		return false, errStale
	}
	m := p.mapping(drv, b)
	if m.err != nil {
		return false, nil
	}
	remote := m.ptr + uintptr(s.Remote-b.base)
	dst, src := remote, s.Local
	if s.Op == transport.Read {
		dst, src = s.Local, remote
	}
	switch {
	case !s.Checksum:
		err = drv.Copy(b.dev, dst, src, s.Length)
	case s.LocalDevice == 0:
		// The local side is host memory: sum it there.
		if err = drv.Copy(b.dev, dst, src, s.Length); err == nil {
			s.CRC, s.Summed = crc32c.Checksum(transport.Bytes(s.Local, s.Length)), true
		}
	default:
		err = p.bounced(drv, b.dev, dst, src, s)
	}
	if err != nil {
		return true, fmt.Errorf("%w: %s %#x+%d of %s on cuda:%d: %w", ErrCopy, s.Op, s.Remote, s.Length, p.name, b.dev, err)
	}
	return true, nil
}

// bounced copies s's bytes from src to dst, both on GPUs, through a host
// buffer, and sums them there: the CPU never reads device memory.
func (p *peer) bounced(drv *device.Driver, dev int, dst, src uintptr, s *transport.Slice) error {
	bp := p.t.getBounce(s.Length)
	defer p.t.bounce.Put(bp)
	buf := *bp
	host := uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
	err := drv.Copy(dev, host, src, s.Length)
	if err == nil {
		s.CRC, s.Summed = crc32c.Checksum(buf), true
		err = drv.Copy(dev, dst, host, s.Length)
	}
	// The driver kept no reference to buf past its calls.
	runtime.KeepAlive(buf)
	return err
}
