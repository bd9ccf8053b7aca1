package master

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/mooncake-go/mooncake/store/storepb"
)

// The eviction order under SSD tiers (offload, spill, promotion,
// move end/fail/expiry), reserved slots and commits, reclaims, unmounts,
// client expiry and evictions, checked after every step.
func TestEvictOrderRandomTiers(t *testing.T) {
	for seed := range uint64(2) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			s, clk := newTestService(t, ServiceConfig{Shards: 4, LeaseTTL: 50*time.Millisecond + time.Nanosecond})
			ctx := t.Context()
			const size = 1024
			must := func(err error) {
				t.Helper()
				if err != nil {
					t.Fatal(err)
				}
			}
			must(s.MountSegment(ctx, "c1", seg("1", 0, 200*size)))
			disk := seg("2", 1<<30, 150*size)
			disk.Medium = storepb.Medium_MEDIUM_DISK
			must(s.MountSegment(ctx, "c1", disk))
			c2up := false
			r := rand.New(rand.NewPCG(seed, 99))
			var slots []string
			for step := range 4000 {
				clk.Advance(time.Duration(1+r.IntN(3000)) * time.Microsecond)
				s.Ping("c1")
				if c2up {
					s.Ping("c2")
				}
				key := fmt.Sprint("k", r.IntN(400))
				switch op := r.IntN(100); {
				case op < 25:
					var rc *storepb.ReplicateConfig
					switch r.IntN(10) {
					case 0:
						rc = &storepb.ReplicateConfig{WithHardPin: true}
					case 1, 2:
						rc = &storepb.ReplicateConfig{WithSoftPin: true, SoftPinTtlMs: int64(1 + r.IntN(100))}
					case 3:
						rc = &storepb.ReplicateConfig{ReplicaNum: 2}
					}
					if _, err := s.PutStart(ctx, "c1", key, size, rc); err == nil && r.IntN(8) != 0 {
						must(s.PutEnd(ctx, "c1", key, 1))
					}
				case op < 32:
					if _, err := s.UpsertStart(ctx, "c1", key, size, nil); err == nil {
						if r.IntN(2) == 0 {
							must(s.UpsertEnd(ctx, "c1", key, 2))
						} else {
							must(s.UpsertRevoke(ctx, "c1", key))
						}
					}
				case op < 50:
					_, _, _, _, _ = s.GetReplicaList(key)
				case op < 53:
					_, _ = s.ExistKey(key)
				case op < 58:
					_ = s.Remove(ctx, key, r.IntN(2) == 0)
				case op < 68:
					for _, task := range s.takeTasks(t.Context(), "c1") {
						_ = s.MoveEnd(ctx, "c1", task.Id, r.IntN(5) != 0)
					}
				case op < 72:
					if sl, err := s.PutReserve(ctx, DefaultTenant, "c1", size, 3, nil); err == nil {
						for _, p := range sl {
							slots = append(slots, p.Slot)
						}
					}
				case op < 76:
					if len(slots) > 0 {
						i := r.IntN(len(slots))
						_ = commit(s, "c1", slots[i], key, 3)
						slots = append(slots[:i], slots[i+1:]...)
					}
				case op < 78:
					if !c2up {
						must(s.MountSegment(ctx, "c2", seg("3", 1<<28, 100*size)))
						c2up = true
					} else if r.IntN(2) == 0 {
						must(s.UnmountSegment(ctx, "c2", "3"))
						c2up = false
					} else {
						// c2 goes silent: expired.
						clk.Advance(s.cfg.ClientTTL + time.Second)
						s.Ping("c1")
						s.ExpireClients()
						c2up = false
					}
				case op < 79:
					clk.Advance(moveTaskTTL)
					s.Ping("c1")
					s.expireTasks()
				case op < 80:
					s.ReclaimPuts()
				default:
					s.needEvict.Store(r.IntN(2) == 0)
					now := s.now()
					leased := map[*object]bool{}
					for i := range s.shards {
						for _, o := range s.shards[i].objects {
							if o.lease.After(now) || o.hardPin || o.pending != nil {
								leased[o] = true
							}
						}
					}
					s.Evict()
					for i := range s.shards {
						for k, o := range s.shards[i].objects {
							_ = k
							_ = o
						}
					}
				}
				checkEvictOrder(t, s)
				if t.Failed() {
					t.Fatalf("step %d", step)
				}
			}
		})
	}
}
