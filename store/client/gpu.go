package client

import (
	"fmt"

	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/engine/device"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// GPU memory. A caller's buffer may be device memory (a CUDA tensor's
// data_ptr(), registered with RegisterBuffer or not, as vLLM's store
// connector passes on a GPU host). The CPU never reads or writes it: its
// bytes move only through the engine, whose transfers copy device memory
// with the driver (a replica in this process included: the engine's
// local-segment copy), or through the driver's copies into and out of the
// staging buffer. Their checksum comes from those transfers (the engine
// sums the host copy it moves), never from a pass of the CPU over the
// caller's memory. A storage segment is always host memory.

// place is where a caller's buffer lives: on GPU dev, copied by drv, or
// in host memory (dev -1).
type place struct {
	dev int
	drv *device.Driver
}

var host = place{dev: -1}

func (p place) onGPU() bool { return p.dev >= 0 }

// placeOf says where b lives: memory registered with the engine as the
// engine found it at registration; other memory as the CUDA driver says
// when the process has loaded it (device memory exists only then, and a
// process without it is never made to load it).
func (c *Client) placeOf(b []byte) (place, error) {
	if len(b) == 0 {
		return host, nil
	}
	a := engine.AddrOf(b)
	dev, on, ok := c.eng.MemoryLocation(a, uint64(len(b)))
	if ok && !on {
		return host, nil
	}
	drv := device.Present()
	if drv == nil {
		return host, nil
	}
	if !ok {
		var err error
		if dev, on, err = drv.Locate(a); err != nil {
			return host, &storepb.Error{Code: storepb.InvalidParams,
				Msg: fmt.Sprintf("where is buffer %#x+%d", a, len(b)), Err: err}
		}
		if !on {
			return host, nil
		}
	}
	return place{dev: dev, drv: drv}, nil
}

// copyTo copies src to dst, one of which is the caller's memory at p:
// with the driver when that is on a GPU.
func (p place) copyTo(dst, src []byte) error {
	if !p.onGPU() {
		copy(dst, src)
		return nil
	}
	n := min(len(dst), len(src))
	if n == 0 {
		return nil
	}
	if err := p.drv.Copy(p.dev, engine.AddrOf(dst), engine.AddrOf(src), uint64(n)); err != nil {
		return transferErr(err, "copy %d bytes between cuda:%d and the staging buffer", n, p.dev)
	}
	return nil
}
