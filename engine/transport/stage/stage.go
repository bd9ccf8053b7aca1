// Package stage moves slices whose local bytes are in GPU memory over the
// paths that move host memory (TCP, same-host shared memory), by staging
// them through host buffers: a WRITE's bytes are copied off the device
// into a buffer that the next path sends; a READ lands in a buffer whose
// bytes are then copied onto the device. The wire never changes: the peer
// cannot tell. The CPU never touches the device bytes; the driver copies
// them (package device).
//
// The staging path is first among the engine's built-in paths and opens
// every peer that has a path after it. A slice on host memory goes straight
// to that path (inline sends included); only a slice on a device takes a
// buffer. Slices are staged as they are submitted and unstaged as their
// answers arrive, so with a request cut into many slices the copy of one
// overlaps the network transfer of others: a device-to-device transfer
// between hosts runs at about the network's rate, not the sum of both.
package stage

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
	"unsafe"

	"github.com/mooncake-go/mooncake/engine/device"
	"github.com/mooncake-go/mooncake/engine/transport"
	"github.com/mooncake-go/mooncake/internal/crc32c"
)

// ErrDevice: copying a slice's bytes to or from the GPU failed. The slice
// fails; nothing it carried is reported in place.
var ErrDevice = errors.New("stage: GPU memory copy failed")

// Config configures the staging path.
type Config struct {
	// BufferSize is the size of each staging buffer: at least the engine's
	// largest slice.
	BufferSize uint64
	// Buffers is how many slices may be staged at once; zero means 64.
	Buffers int
	Logger  *slog.Logger
}

// Transport is the staging path.
type Transport struct {
	cfg Config

	once sync.Once
	drv  *device.Driver
	free chan []byte // staging buffers not in use
	host uintptr     // their page-locked memory, 0 if they are Go memory
	err  error       // why staging is impossible (no driver)

	closeOnce sync.Once
}

var (
	_ transport.Transport = (*Transport)(nil)
	_ transport.Peer      = (*peer)(nil)
	_ transport.Inliner   = inliner{}
)

// New returns the staging path. It allocates nothing until a slice on a
// device arrives.
func New(cfg Config) *Transport {
	if cfg.Buffers <= 0 {
		cfg.Buffers = 64
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Transport{cfg: cfg}
}

// Name implements transport.Transport.
func (t *Transport) Name() string { return "stage" }

// Open implements transport.Transport: every peer with a path after this
// one.
func (t *Transport) Open(_ context.Context, info transport.PeerInfo) (transport.Peer, error) {
	if info.Next == nil {
		return nil, fmt.Errorf("%w: no path to stage onto for %s", transport.ErrUnavailable, info.Name)
	}
	p := &peer{t: t, next: info.Next}
	// Inline sends only where the next path has them: a peer that offers
	// them sets the engine holding a Submit's slices back for them.
	if in, ok := info.Next.(transport.Inliner); ok {
		return inliner{p, in}, nil
	}
	return p, nil
}

// Close releases the staging buffers, once none is in use (the paths
// after this one, closed before it, have failed what they held).
func (t *Transport) Close() error {
	t.closeOnce.Do(func() {
		if t.free == nil {
			return
		}
		for range t.cfg.Buffers {
			select {
			case <-t.free:
			default:
				t.cfg.Logger.Warn("staging buffers still in use at close: left allocated")
				return
			}
		}
		if t.host != 0 {
			t.drv.FreeHost(t.host)
		}
	})
	return nil
}

// setup allocates the buffers on first use: page-locked memory from the
// driver, which the GPU reads and writes at full speed, or Go memory if
// the driver has none to give.
func (t *Transport) setup() error {
	t.once.Do(func() {
		if t.drv = device.Present(); t.drv == nil {
			t.err = fmt.Errorf("%w: no CUDA driver in this process", ErrDevice)
			return
		}
		n, size := t.cfg.Buffers, t.cfg.BufferSize
		t.free = make(chan []byte, n)
		host, err := t.drv.AllocHost(uint64(n) * size)
		if err != nil {
			t.cfg.Logger.Warn("no page-locked staging memory: using pageable memory", "err", err)
			for range n {
				t.free <- make([]byte, size)
			}
			return
		}
		t.host = host
		for i := range n {
			t.free <- transport.Bytes(host+uintptr(uint64(i)*size), size)
		}
	})
	return t.err
}

// get takes a staging buffer, waiting until one is free, s's deadline or
// the end of ctx.
func (t *Transport) get(ctx context.Context, s *transport.Slice) ([]byte, error) {
	if err := t.setup(); err != nil {
		return nil, err
	}
	if s.Length > t.cfg.BufferSize {
		return nil, fmt.Errorf("%w: slice of %d bytes, staging buffers of %d", ErrDevice, s.Length, t.cfg.BufferSize)
	}
	select {
	case b := <-t.free:
		return b, nil
	default:
	}
	timer := time.NewTimer(time.Until(s.Deadline))
	defer timer.Stop()
	select {
	case b := <-t.free:
		return b, nil
	case <-timer.C:
		return nil, fmt.Errorf("%w: no staging buffer free", transport.ErrTimeout)
	case <-ctx.Done():
		return nil, fmt.Errorf("no staging buffer free: %w", context.Cause(ctx))
	}
}

func (t *Transport) put(b []byte) { t.free <- b }

// peer stages one peer's device slices onto the path after this one.
type peer struct {
	t    *Transport
	next transport.Peer
}

// inliner is a peer whose next path sends inline.
type inliner struct {
	*peer
	next transport.Inliner
}

// Path implements transport.Peer: the path the bytes take on the wire.
func (p *peer) Path() string { return p.next.Path() }

// Close implements transport.Peer. The next path is the engine's to close.
func (p *peer) Close() {}

// Submit implements transport.Peer.
func (p *peer) Submit(ctx context.Context, s *transport.Slice) {
	dev, ok := s.OnDevice()
	if !ok {
		p.next.Submit(ctx, s)
		return
	}
	buf, err := p.t.get(ctx, s)
	if err != nil {
		s.Done(s, err)
		return
	}
	buf = buf[:s.Length]
	h := &transport.Slice{Op: s.Op, Local: addr(buf), Remote: s.Remote, Length: s.Length,
		Deadline: s.Deadline, Retries: s.Retries}
	if s.Op == transport.Write {
		if err := p.t.drv.Copy(dev, h.Local, s.Local, s.Length); err != nil {
			p.t.put(buf[:cap(buf)])
			s.Done(s, fmt.Errorf("%w: off cuda:%d: %w", ErrDevice, dev, err))
			return
		}
		sum(s, buf)
		h.Done = func(h *transport.Slice, err error) {
			p.t.put(buf[:cap(buf)])
			s.Retries = h.Retries
			s.Done(s, err)
		}
	} else {
		h.Done = func(h *transport.Slice, err error) {
			if err == nil {
				if cerr := p.t.drv.Copy(dev, s.Local, h.Local, s.Length); cerr != nil {
					err = fmt.Errorf("%w: onto cuda:%d: %w", ErrDevice, dev, cerr)
				} else {
					sum(s, buf)
				}
			}
			p.t.put(buf[:cap(buf)])
			s.Retries = h.Retries
			s.Done(s, err)
		}
	}
	p.next.Submit(ctx, h)
}

// SubmitInline implements transport.Inliner: slices on host memory keep
// the next path's inline sends; any on a device are submitted one by one.
func (p inliner) SubmitInline(ctx context.Context, sl []*transport.Slice) transport.Inline {
	host := true
	for _, s := range sl {
		host = host && s.LocalDevice == 0
	}
	if host {
		return p.next.SubmitInline(ctx, sl)
	}
	for _, s := range sl {
		p.Submit(ctx, s)
	}
	return nil
}

// sum takes the checksum the engine asked for from the staged bytes.
func sum(s *transport.Slice, b []byte) {
	if s.Checksum {
		s.CRC, s.Summed = crc32c.Checksum(b), true
	}
}

func addr(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }
