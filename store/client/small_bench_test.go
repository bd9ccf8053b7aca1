package client

import (
	"testing"

	"github.com/mooncake-go/mooncake/engine"
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
