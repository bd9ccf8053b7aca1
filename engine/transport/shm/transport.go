package shm

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mooncake-go/mooncake/engine/device"
	"github.com/mooncake-go/mooncake/engine/metadata"
	"github.com/mooncake-go/mooncake/engine/transport"
)

// Config configures the same-host path.
type Config struct {
	// Workers copying slices; zero means GOMAXPROCS.
	Workers int
	// Timeout bounds a view refresh when no waiting slice has a nearer
	// deadline. Zero means 30 s.
	Timeout time.Duration
	// Refreshed is called each time a peer's view is refreshed (metrics).
	Refreshed func()
	Logger    *slog.Logger
}

// Transport is the same-host path as the engine drives it: it publishes
// this process's identity and memfds with the engine's descriptor, opens
// peers that run on this host, and keeps each peer's view of memory up to
// date (refresh.go).
type Transport struct {
	cfg    Config
	pool   *Pool
	ctrl   *Control
	hostID string
	start  uint64

	// ctx ends when Close starts: view refreshes in progress give up.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // refreshers and hand-offs to the next path
	once   sync.Once

	// ctrlMu guards the control page against Close: the engine may still
	// publish (a peer asking for the descriptor) while it closes.
	ctrlMu sync.RWMutex
	closed bool
}

var (
	_ transport.Transport = (*Transport)(nil)
	_ transport.Publisher = (*Transport)(nil)
	_ transport.Peer      = (*peer)(nil)
)

// New starts the path: its control page and copy workers.
func New(cfg Config) (*Transport, error) {
	if cfg.Timeout <= 0 {
		cfg.Timeout = 30 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Refreshed == nil {
		cfg.Refreshed = func() {}
	}
	t := &Transport{cfg: cfg, hostID: HostID()}
	var err error
	if t.start, err = StartTime(os.Getpid()); err != nil {
		return nil, fmt.Errorf("shm: own start time: %w", err)
	}
	if t.ctrl, err = NewControl(); err != nil {
		return nil, fmt.Errorf("shm: control page: %w", err)
	}
	t.ctx, t.cancel = context.WithCancel(context.Background())
	t.pool = NewPool(cfg.Workers)
	return t, nil
}

// Name implements transport.Transport.
func (t *Transport) Name() string { return "shm" }

// Close stops the copy workers (queued slices fail with ErrClosed), ends
// view refreshes and waits for them, and releases the control page. Later
// calls do nothing; a descriptor published after it has no same-host part.
func (t *Transport) Close() error {
	t.once.Do(func() {
		t.cancel()
		t.pool.Close()
		t.wg.Wait()
		t.ctrlMu.Lock()
		t.closed = true
		t.ctrl.Close()
		t.ctrlMu.Unlock()
	})
	return nil
}

// Publish implements transport.Publisher. The control counter is read
// before the regions are listed, and Unregistered moves it after a region
// is removed: a peer holding a view of this descriptor sees it stale once
// a listed region is gone.
func (t *Transport) Publish(d *metadata.SegmentDesc) func([]transport.LocalRegion) {
	t.ctrlMu.RLock()
	defer t.ctrlMu.RUnlock()
	if t.closed || t.hostID == "" { // no /proc to identify this host by: peers cannot use it
		return func([]transport.LocalRegion) {}
	}
	gen, fd := t.ctrl.Generation(), t.ctrl.FD()
	return func(regions []transport.LocalRegion) {
		var shared []metadata.SharedBuffer
		for _, r := range regions {
			if r.FD >= 0 {
				shared = append(shared, metadata.SharedBuffer{Addr: r.Addr, Length: r.Length, FD: r.FD})
			}
		}
		d.Local = &metadata.LocalInfo{HostID: t.hostID, PID: os.Getpid(), StartTime: t.start,
			ControlFD: fd, Generation: &gen, Shared: shared}
	}
}

// Unregistered implements transport.Publisher.
func (t *Transport) Unregistered() {
	t.ctrlMu.RLock()
	defer t.ctrlMu.RUnlock()
	if !t.closed {
		t.ctrl.Bump()
	}
}

// info returns what the same-host path needs of a descriptor, if the peer
// is on this host.
func (t *Transport) info(desc *metadata.SegmentDesc) (PeerInfo, bool) {
	l := desc.Local
	if l == nil || t.hostID == "" || l.HostID != t.hostID {
		return PeerInfo{}, false
	}
	info := PeerInfo{PID: l.PID, StartTime: l.StartTime, ControlFD: l.ControlFD, Generation: l.Generation}
	for _, b := range l.Shared {
		info.Shared = append(info.Shared, Shared{Addr: b.Addr, Length: b.Length, FD: b.FD})
	}
	for _, b := range desc.Buffers {
		if b.Location != "" {
			loc, err := device.ParseLocation(b.Location)
			if err != nil || !loc.Cuda {
				continue // neither host memory nor a GPU this path knows: never touched
			}
			info.Device = append(info.Device, Region{Addr: b.Addr, Length: b.Length, Dev: loc.Device})
		} else {
			info.Regions = append(info.Regions, Region{Addr: b.Addr, Length: b.Length})
		}
	}
	return info, true
}

// Open implements transport.Transport: a peer on this host whose process
// this one can map is opened; any other is ErrUnavailable.
func (t *Transport) Open(_ context.Context, pi transport.PeerInfo) (transport.Peer, error) {
	info, ok := t.info(pi.Desc)
	if !ok {
		return nil, fmt.Errorf("%w: segment %s is on another host", ErrUnavailable, pi.Name)
	}
	p, err := Open(info)
	if err != nil {
		t.cfg.Logger.Info("same-host path unavailable", "segment", pi.Name, "err", err)
		return nil, err
	}
	return &peer{t: t, p: p, name: pi.Name, describe: pi.Describe, next: pi.Next}, nil
}

// peer is an opened same-host peer as the engine sees it.
type peer struct {
	t        *Transport
	p        *Peer
	name     string
	describe func(context.Context) (*metadata.SegmentDesc, error)
	next     transport.Peer // nil: no other path

	stale   atomic.Bool // this path gave up on the peer: next from now on
	refresh viewRefresh
}

// Submit implements transport.Peer.
func (p *peer) Submit(ctx context.Context, s *transport.Slice) {
	if p.next != nil && p.stale.Load() {
		p.next.Submit(ctx, s)
		return
	}
	p.t.pool.Submit(ctx, p.p, s, p.missed)
}

// Path implements transport.Peer.
func (p *peer) Path() string {
	if p.next != nil && p.stale.Load() {
		return p.next.Path()
	}
	return "shm"
}

// Close implements transport.Peer: it unmaps the peer's memory once no copy
// uses it.
func (p *peer) Close() { p.p.Close() }
