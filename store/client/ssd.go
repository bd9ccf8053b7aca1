package client

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/google/uuid"
	"golang.org/x/sys/unix"

	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/engine/transport"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// ssdTier is the client's SSD tier: a preallocated file in Config.SSDDir,
// mapped shared and registered with the engine, mounted as a segment of
// medium DISK. The master spills evicted objects into it and promotes
// them back on a hit (see store/master's tier story); the client does the
// copies it is given in ping answers. The file is a cache: it is removed
// on Close and not reloaded by a restart.
type ssdTier struct {
	f   *os.File
	mem []byte
	seg *storepb.Segment
}

// openSSD creates and maps the tier. The file is fallocated in full, so a
// disk that fills up later cannot fault a write into the mapping; where
// that fails the client runs without a tier.
func openSSD(ctx context.Context, e *engine.Engine, dir string, size int64, name, host string) (*ssdTier, error) {
	f, err := os.CreateTemp(dir, "mooncake-ssd-*.seg")
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*ssdTier, error) {
		_ = f.Close()
		_ = os.Remove(f.Name())
		return nil, err
	}
	if err := unix.Fallocate(int(f.Fd()), 0, 0, size); err != nil {
		return fail(fmt.Errorf("fallocate %d bytes in %s: %w", size, dir, err))
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fail(fmt.Errorf("mmap %s: %w", f.Name(), err))
	}
	addr := engine.AddrOf(mem)
	if err := e.RegisterMemory(ctx, addr, uint64(size), "", true); err != nil {
		_ = unix.Munmap(mem)
		return fail(err)
	}
	return &ssdTier{f: f, mem: mem, seg: &storepb.Segment{
		Id: uuid.NewString(), Name: name, Base: uint64(addr), Size: uint64(size),
		TransportEndpoint: name, Protocol: "tcp", HostId: host, Medium: storepb.Medium_MEDIUM_DISK,
	}}, nil
}

func (t *ssdTier) close(e *engine.Engine) error {
	err := e.UnregisterMemory(context.Background(), engine.AddrOf(t.mem))
	_ = unix.Munmap(t.mem)
	_ = t.f.Close()
	if rerr := os.Remove(t.f.Name()); err == nil {
		err = rerr
	}
	return err
}

// Path is the tier's file ("" without a tier), for operators and tests.
func (c *Client) SSDPath() string {
	if c.ssd == nil {
		return ""
	}
	return c.ssd.f.Name()
}

// runMoves does the copies the master asked for and reports each. The
// source is in one of this client's segments; the target anywhere.
func (c *Client) runMoves(ctx context.Context, tasks []*storepb.MoveTask) {
	xs := make([]*xfer, len(tasks))
	for i, t := range tasks {
		src, dst := t.GetSource(), t.GetTarget()
		x := &xfer{op: engine.Write}
		xs[i] = x
		switch {
		case src == nil || dst == nil || src.Size == 0 || src.Size != dst.Size:
			x.err = fmt.Errorf("malformed move %d", t.Id)
			continue
		case src.SegmentName != c.name:
			x.err = fmt.Errorf("move %d: source on %s, not here", t.Id, src.SegmentName)
			continue
		}
		x.local = transport.Bytes(uintptr(src.BufferAddress), src.Size)
		if !c.registered(x.local) {
			x.err = fmt.Errorf("move %d: source %#x+%d outside this client's segments", t.Id, src.BufferAddress, src.Size)
			continue
		}
		x.seg, x.remote = dst.SegmentName, dst.BufferAddress
	}
	var run []*xfer
	for _, x := range xs {
		if x.err == nil {
			run = append(run, x)
		}
	}
	c.run(ctx, run, time.Time{})
	for i, t := range tasks {
		ok := xs[i].err == nil
		if !ok {
			c.log.Warn("store: move failed", "key", t.Key, "err", xs[i].err)
		}
		err := c.master.call(ctx, func(ctx context.Context, rpc storepb.MasterClient) error {
			r, err := rpc.MoveEnd(ctx, &storepb.MoveEndRequest{ClientId: c.id, TaskId: t.Id, Ok: ok})
			if err != nil {
				return err
			}
			return r.AsError()
		})
		if err != nil && ctx.Err() == nil {
			c.log.Debug("store: move not taken", "key", t.Key, "err", err)
		}
	}
}
