package master

import (
	"fmt"
	"log/slog"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/store/storepb"
)

// Snapshots copied a shard at a time while SSD-tier work (offloads,
// spills, promotions, DRAM-only and SSD-only drops), evictions, unmounts
// and expiries run from goroutines and between the shards' copies: each,
// with the journal after it replayed, gives the final state.
func TestSnapshotShardsWithTiers(t *testing.T) {
	s, clk := newTestService(t, ServiceConfig{Shards: 8, LeaseTTL: time.Millisecond})
	dir := t.TempDir()
	j, err := openFileJournal(dir, 0, 0, 1, slog.Default())
	require.NoError(t, err)
	s.j = j
	ctx := t.Context()
	const size = 1000
	require.NoError(t, s.MountSegment(ctx, "a", seg("1", 1<<24, 300*1024)))
	disk := seg("2", 1<<30, 200*1024)
	disk.Medium = storepb.Medium_MEDIUM_DISK
	require.NoError(t, s.MountSegment(ctx, "a", disk))
	require.NoError(t, s.MountSegment(ctx, "b", seg("3", 1<<26, 100*1024)))

	var opMu sync.Mutex // the random source and b's mount
	r := rand.New(rand.NewPCG(5, 6))
	bUp := true
	step := func() {
		opMu.Lock()
		op, k := r.IntN(100), fmt.Sprint("k", r.IntN(300))
		ok := r.IntN(4) != 0
		opMu.Unlock()
		clk.Advance(time.Duration(1+op) * 37 * time.Microsecond)
		s.Ping("a")
		switch {
		case op < 30:
			if _, err := s.PutStart(ctx, "a", k, size, nil); err == nil {
				_ = s.PutEnd(ctx, "a", k, 7)
			}
		case op < 40:
			if _, err := s.UpsertStart(ctx, "a", k, size, nil); err == nil {
				_ = s.UpsertEnd(ctx, "a", k, 8)
			}
		case op < 55:
			_, _, _, _, _ = s.GetReplicaList(k)
		case op < 62:
			_ = s.Remove(ctx, k, true)
		case op < 80:
			for _, task := range s.takeTasks(t.Context(), "a") {
				_ = s.MoveEnd(ctx, "a", task.Id, ok)
			}
		case op < 88:
			s.needEvict.Store(ok && op%5 == 0)
			s.Evict()
		case op < 99:
		default:
			opMu.Lock()
			defer opMu.Unlock()
			if bUp {
				_ = s.UnmountSegment(ctx, "b", "3")
			} else {
				_ = s.MountSegment(ctx, "b", seg("3", 1<<26, 100*1024))
			}
			bUp = !bUp
		}
	}
	for range 2000 {
		step()
	}
	t.Logf("%d lines in the view after warm-up; %+v", len(view(s)), s.Stats())
	snapshotShardCopied = func(int) {
		for range 20 {
			step()
		}
	}
	defer func() { snapshotShardCopied = nil }()
	type snap struct {
		chunks []*storepb.SnapshotChunk
		seq    uint64
	}
	var snaps []snap
	take := func() {
		st, seq, err := s.snapshotShards()
		require.NoError(t, err)
		snaps = append(snaps, snap{st.chunks(50), seq})
	}
	for range 3 {
		take()
	}
	snapshotShardCopied = nil
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				step()
			}
		})
	}
	for range 10 {
		take()
	}
	close(stop)
	wg.Wait()
	// Moves still queued or orphaned hold SSD space no record names.
	for _, task := range s.takeTasks(t.Context(), "a") {
		_ = s.MoveEnd(ctx, "a", task.Id, false)
	}
	clk.Advance(moveTaskTTL)
	s.expireTasks()
	require.NoError(t, j.wait(ctx, j.last()))
	want := view(s)
	t.Logf("%d lines in the final view", len(want))
	j.close()
	for _, sn := range snaps {
		st := loadChunks(t, sn.chunks)
		_, err := replayFile(filepath.Join(dir, journalName(1)), st, sn.seq, false, slog.Default())
		require.NoError(t, err, "replay after snapshot %d", sn.seq)
		s2, _ := newTestService(t, ServiceConfig{Shards: 8})
		require.NoError(t, s2.restore(st))
		require.Equal(t, want, view(s2), "snapshot %d and the records after it", sn.seq)
	}
}
