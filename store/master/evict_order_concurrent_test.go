package master

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/mooncake-go/mooncake/store/storepb"
)

// The eviction order stays exact under concurrent puts, upserts,
// reads, removals, moves, tenant-free evictions and forced evictions.
func TestEvictOrderConcurrent(t *testing.T) {
	s, clk := newTestService(t, ServiceConfig{Shards: 4, LeaseTTL: time.Millisecond})
	ctx := t.Context()
	const size = 1024
	if err := s.MountSegment(ctx, "c1", seg("1", 0, 300*size)); err != nil {
		t.Fatal(err)
	}
	disk := seg("2", 1<<30, 200*size)
	disk.Medium = storepb.Medium_MEDIUM_DISK
	if err := s.MountSegment(ctx, "c1", disk); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 3))
			for range 3000 {
				clk.Advance(time.Duration(r.IntN(100)) * time.Microsecond)
				key := fmt.Sprint("k", r.IntN(400))
				switch op := r.IntN(100); {
				case op < 30:
					var rc *storepb.ReplicateConfig
					if r.IntN(4) == 0 {
						rc = &storepb.ReplicateConfig{WithSoftPin: true, SoftPinTtlMs: int64(1 + r.IntN(5))}
					}
					if _, err := s.PutStart(ctx, "c1", key, size, rc); err == nil {
						_ = s.PutEnd(ctx, "c1", key, 1)
					}
				case op < 40:
					if _, err := s.UpsertStart(ctx, "c1", key, size, nil); err == nil {
						if r.IntN(2) == 0 {
							_ = s.UpsertEnd(ctx, "c1", key, 2)
						} else {
							_ = s.UpsertRevoke(ctx, "c1", key)
						}
					}
				case op < 60:
					_, _, _, _, _ = s.GetReplicaList(key)
				case op < 65:
					_ = s.Remove(ctx, key, true)
				case op < 80:
					for _, task := range s.takeTasks(t.Context(), "c1") {
						_ = s.MoveEnd(ctx, "c1", task.Id, r.IntN(4) != 0)
					}
				default:
					s.needEvict.Store(r.IntN(2) == 0)
					s.Evict()
				}
			}
		})
	}
	wg.Wait()
	checkEvictOrder(t, s)
}
