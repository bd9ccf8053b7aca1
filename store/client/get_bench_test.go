package client

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/store/master"
)

// The remote get benchmarks read values of benchValue bytes, benchKeys of
// them, from a node's segment in this process over TCP. They are for
// profiles and traces of one get (-cpuprofile, -trace, strace -c), not for
// figures: bench/README.md has those, from `mooncake bench store`.
const benchValue, benchKeys = 1 << 20, 64

// remoteGetter is a client reading from a node client over TCP into a
// registered buffer, as `bench store --topology remote` does.
type remoteGetter struct {
	c   *Client
	dst []byte
}

// newRemoteGetters starts a master, a node holding benchKeys values, and
// one reading client per configuration.
func newRemoteGetters(b *testing.B, cfgs ...func(*Config)) []remoteGetter {
	m := startMaster(b, master.ServiceConfig{})
	tcp := func(c *Config) { c.EngineConfig = engine.Config{Host: "127.0.0.1", Transport: "tcp"} }
	node := newClient(b, m.Addr(), 256<<20, tcp)
	ctx := ctxT(b)
	val := value(1, benchValue)
	var gs []remoteGetter
	for j, cfg := range cfgs {
		c := newClient(b, m.Addr(), NoSegment, tcp, cfg)
		if j == 0 {
			for i := range benchKeys {
				if err := c.Put(ctx, fmt.Sprint("k", i), val, &ReplicateConfig{PreferredSegments: []string{node.SegmentName()}}); err != nil {
					b.Fatal(err)
				}
			}
		}
		dst := make([]byte, benchValue)
		if err := c.RegisterBuffer(dst); err != nil {
			b.Fatal(err)
		}
		gs = append(gs, remoteGetter{c: c, dst: dst})
	}
	return gs
}

func (g remoteGetter) get(b *testing.B, k int) {
	if _, err := g.c.GetInto(b.Context(), fmt.Sprint("k", k), g.dst); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkRemoteGet is one client's gets, checksummed (as by default) or
// not.
func BenchmarkRemoteGet(b *testing.B) {
	for _, bc := range []struct {
		name string
		cfg  func(*Config)
	}{
		{"checksummed", func(*Config) {}},
		{"unchecked", func(c *Config) { c.NoChecksum = true }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			g := newRemoteGetters(b, bc.cfg)[0]
			b.SetBytes(benchValue)
			for i := 0; b.Loop(); i++ {
				g.get(b, i%benchKeys)
			}
		})
	}
}

// BenchmarkRemoteGetFloor is the same reads over newFloor's bare socket.
func BenchmarkRemoteGetFloor(b *testing.B) {
	f := newFloor(b)
	b.SetBytes(benchValue)
	for i := 0; b.Loop(); i++ {
		f.get(b, i%benchKeys)
	}
}

// BenchmarkRemoteGetVsFloor alternates, call by call, a checksummed get,
// an unchecked one and a bare socket's read of as many bytes, so that the
// load of a shared machine drifts alike for all three, and reports each
// one's median call.
func BenchmarkRemoteGetVsFloor(b *testing.B) {
	gs := newRemoteGetters(b, func(*Config) {}, func(c *Config) { c.NoChecksum = true })
	names := []string{"checksummed", "unchecked", "floor"}
	floor := newFloor(b)
	took := make([][]time.Duration, len(names))
	for i := 0; b.Loop(); i++ {
		for r := range names {
			// Each its own keys (cold in the node's memory), each first
			// in turn.
			j := (i + r) % len(names)
			k := (i*len(names) + j) % benchKeys
			t0 := time.Now()
			if j < len(gs) {
				gs[j].get(b, k)
			} else {
				floor.get(b, k)
			}
			took[j] = append(took[j], time.Since(t0))
		}
	}
	for j, name := range names {
		slices.Sort(took[j])
		b.ReportMetric(float64(took[j][len(took[j])/2].Microseconds()), name+"-p50-µs")
	}
}

// floorConn is a connection to newFloor's server.
type floorConn struct {
	c       net.Conn
	dst     []byte
	req, st [8]byte
}

func (f *floorConn) get(b *testing.B, k int) {
	binary.LittleEndian.PutUint64(f.req[:], uint64(k))
	if _, err := f.c.Write(f.req[:]); err != nil {
		b.Fatal(err)
	}
	if _, err := io.ReadFull(f.c, f.st[:]); err != nil {
		b.Fatal(err)
	}
	if _, err := io.ReadFull(f.c, f.dst); err != nil {
		b.Fatal(err)
	}
}

// newFloor starts a bare TCP server of benchKeys values: an 8-byte request
// naming one is answered with one writev of a status word and the value.
func newFloor(b *testing.B) *floorConn {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	mem := value(1, benchValue*benchKeys)
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		var req, st [8]byte
		for {
			if _, err := io.ReadFull(c, req[:]); err != nil {
				return
			}
			i := binary.LittleEndian.Uint64(req[:]) % benchKeys
			out := net.Buffers{st[:], mem[i*benchValue : (i+1)*benchValue]}
			if _, err := out.WriteTo(c); err != nil {
				return
			}
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close(); ln.Close(); <-done })
	return &floorConn{c: c, dst: make([]byte, benchValue)}
}
