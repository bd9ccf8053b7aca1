package client

import (
	"testing"

	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/internal/secure"
	"github.com/mooncake-go/mooncake/store/master"
)

// BenchmarkSmallOps upserts and reads back a 4 KiB value, kept in this
// process's segment (plain copies) or in a node's over TCP (the engine):
// the per-item cost of the put and get paths, for -benchmem (allocations
// per call) more than for time.
func BenchmarkSmallOps(b *testing.B) {
	m := startMaster(b, master.ServiceConfig{})
	tcp := func(c *Config) { c.EngineConfig = engine.Config{Host: "127.0.0.1", Transport: "tcp"} }
	node := newClient(b, m.Addr(), 64<<20, tcp)
	c := newClient(b, m.Addr(), 64<<20, tcp)
	val := value(1, 4<<10)
	dst := make([]byte, len(val))
	if err := c.RegisterBuffer(dst); err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name string
		seg  string
	}{{"local", c.SegmentName()}, {"remote", node.SegmentName()}} {
		rc := &ReplicateConfig{PreferredSegments: []string{bc.seg}}
		b.Run("upsert/"+bc.name, func(b *testing.B) {
			for b.Loop() {
				if err := c.Upsert(b.Context(), bc.name, val, rc); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("get/"+bc.name, func(b *testing.B) {
			for b.Loop() {
				if _, err := c.GetInto(b.Context(), bc.name, dst); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkTLSMasterCalls: a 4 KiB upsert in this process's own segment
// (its two calls to the master are nearly all of it) and an exist (one
// call) against a master
// serving mutual TLS, the calls as frames inside TLS or over gRPC
// (Config.MasterGRPC), which is what a TLS client used before.
func BenchmarkTLSMasterCalls(b *testing.B) {
	files, err := secure.Generate(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	m, err := master.Start(master.ServerConfig{Listen: "127.0.0.1:0", TLS: files.ServerTLS()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = m.Close() })
	for _, grpcOnly := range []bool{false, true} {
		name := map[bool]string{false: "frames", true: "grpc"}[grpcOnly]
		c := newClient(b, m.Addr(), 16<<20, func(c *Config) { c.MasterTLS, c.MasterGRPC = files.ClientTLS(), grpcOnly })
		val := value(1, 4<<10)
		rc := &ReplicateConfig{PreferredSegments: []string{c.SegmentName()}}
		b.Run("upsert/"+name, func(b *testing.B) {
			for b.Loop() {
				if err := c.Upsert(b.Context(), name, val, rc); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("exist/"+name, func(b *testing.B) {
			for b.Loop() {
				if ok, err := c.Exist(b.Context(), name); err != nil || !ok {
					b.Fatal(ok, err)
				}
			}
		})
	}
}
