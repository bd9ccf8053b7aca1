package master

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/store/storepb"
)

// A snapshot holds one shard at a time: a request on another shard is
// answered while the snapshot waits for a shard someone else holds (it
// used to hold every shard for the whole copy, stalling every request for
// tens of milliseconds per 100000 objects).
func TestSnapshotDoesNotStallOtherShards(t *testing.T) {
	s, _ := newTestService(t, ServiceConfig{Shards: 8})
	j, err := openFileJournal(t.TempDir(), 0, 0, 1, slog.Default())
	require.NoError(t, err)
	defer j.close()
	s.j = j
	require.NoError(t, s.MountSegment(t.Context(), "a", seg("1", 1<<20, 1<<20)))
	key := keyInShard(s, 0, "k")
	put(t, s, "a", key, 100, nil)

	held := &s.shards[len(s.shards)-1]
	held.mu.Lock()
	locked := true
	defer func() {
		if locked {
			held.mu.Unlock()
		}
	}()
	snapped := make(chan struct{})
	go func() {
		defer close(snapped)
		s.snapshot(snapChunkObjs)
	}()
	// The snapshot has begun once it took shard 0 (the old one, holding
	// it to the end) or started taking the journal's records (the new).
	first := &s.shards[0]
	require.Eventually(t, func() bool {
		j.mu.Lock()
		tapping := j.tapping
		j.mu.Unlock()
		if tapping {
			return true
		}
		if first.mu.TryLock() {
			first.mu.Unlock()
			return false
		}
		return true
	}, 10*time.Second, time.Millisecond)

	answered := make(chan error, 1)
	go func() { answered <- s.Remove(context.Background(), key, true) }()
	select {
	case err := <-answered:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		held.mu.Unlock()
		locked = false
		<-answered
		t.Fatal("a remove on shard 0 waited for a snapshot blocked on another shard")
	}
	held.mu.Unlock()
	locked = false
	<-snapped
}

// keyInShard is a key, prefix and a number, of shard i.
func keyInShard(s *Service, i int, prefix string) string {
	for n := 0; ; n++ {
		if k := fmt.Sprintf("%s%d", prefix, n); s.shardIndex(k) == uint64(i) {
			return k
		}
	}
}

// A snapshot copied a shard at a time is the state as of its sequence
// number: loaded, with the journal's records after it replayed, it gives
// the state the service ended with. Changes land between the shards'
// copies (puts, removes, upserts, an unmount and a mount again of the
// same segment id, commits of reserved slots whose slot and key the copy
// takes on either side of the commit) and from goroutines meanwhile.
func TestSnapshotShardsEqualsStateAtSeq(t *testing.T) {
	s, _ := newTestService(t, ServiceConfig{Shards: 8})
	dir := t.TempDir()
	j, err := openFileJournal(dir, 0, 0, 1, slog.Default())
	require.NoError(t, err)
	s.j = j
	ctx := t.Context()
	require.NoError(t, s.MountSegment(ctx, "a", seg("1", 1<<24, 8<<20)))
	require.NoError(t, s.MountSegment(ctx, "a", seg("2", 1<<25, 8<<20)))
	require.NoError(t, s.MountSegment(ctx, "b", seg("3", 1<<26, 8<<20)))
	// b's segment leaves during a snapshot: what the test changes later
	// stays on a's.
	onA := &storepb.ReplicateConfig{ReplicaNum: 1, PreferredSegments: []string{"node-1"}}
	onA2 := &storepb.ReplicateConfig{ReplicaNum: 2, PreferredSegments: []string{"node-1", "node-2"}}
	onB := &storepb.ReplicateConfig{ReplicaNum: 1, PreferredSegments: []string{"node-3"}}
	putE := func(client, key string, cfg *storepb.ReplicateConfig) error {
		if _, err := s.PutStart(ctx, client, key, 1000, cfg); err != nil {
			return err
		}
		return s.PutEnd(ctx, client, key, 7)
	}
	for i := range 64 {
		cfg := onA
		if i%2 == 1 {
			cfg = onA2
		}
		require.NoError(t, putE("a", fmt.Sprintf("base%d", i), cfg))
		require.NoError(t, putE("b", fmt.Sprintf("onb%d", i), onB))
	}
	slots, err := s.PutReserve(ctx, DefaultTenant, "a", 1000, 64, onA)
	require.NoError(t, err)

	// Between the shards' copies: changes on both sides of the copy.
	var (
		hookMu sync.Mutex
		round  int
		nslot  int
		splits int // commits whose slot the copy takes after them, key before
	)
	snapshotShardCopied = func(i int) {
		hookMu.Lock()
		defer hookMu.Unlock()
		n := len(s.shards)
		before, after := keyInShard(s, i, fmt.Sprintf("h%d-%d-", round, i)), keyInShard(s, (i+1)%n, fmt.Sprintf("h%d-%d-", round, i))
		assert.NoError(t, putE("a", before, nil))
		assert.NoError(t, putE("a", after, nil))
		assert.NoError(t, s.Remove(ctx, fmt.Sprintf("base%d", round*8+i), true))
		if _, err := s.UpsertStart(ctx, "a", fmt.Sprintf("base%d", (round*8+i+32)%64), 2000, onA); assert.NoError(t, err) {
			assert.NoError(t, s.PutEnd(ctx, "a", fmt.Sprintf("base%d", (round*8+i+32)%64), 9))
		}
		if nslot < len(slots) {
			sl := slots[nslot].Slot
			nslot++
			si := int(s.shardIndex(sl))
			var key string
			switch {
			case si > i:
				key = keyInShard(s, i, fmt.Sprintf("c%d-%d-", round, i)) // copied before the commit, slot after
				splits++
			case i+1 < n:
				key = keyInShard(s, i+1, fmt.Sprintf("c%d-%d-", round, i)) // slot before, key after
			}
			if key != "" {
				assert.NoError(t, commit(s, "a", sl, key, 5))
			}
		}
		if i == 2 {
			// b's segment leaves and comes back with the same id; values
			// put on it after belong to the new one.
			assert.NoError(t, s.UnmountSegment(ctx, "b", "3"))
			assert.NoError(t, s.MountSegment(ctx, "b", seg("3", 1<<26, 8<<20)))
			for k := range 4 {
				assert.NoError(t, putE("b", keyInShard(s, n-1-k%2, fmt.Sprintf("newb%d-%d-", round, k)), onB))
			}
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
		require.NoError(t, err, "the snapshot fell back to holding every shard")
		snaps = append(snaps, snap{st.chunks(50), seq})
	}
	take()
	round++
	take()
	round++
	require.Positive(t, splits, "some commit was split across the copy")

	// And with changes from other goroutines meanwhile.
	snapshotShardCopied = nil
	nextSlot := func() (string, bool) {
		hookMu.Lock()
		defer hookMu.Unlock()
		if nslot == len(slots) {
			return "", false
		}
		nslot++
		return slots[nslot-1].Slot, true
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 3 {
		wg.Go(func() {
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("w%d-%d", w, n)
				assert.NoError(t, putE("a", key, onA))
				if n%3 == 2 {
					assert.NoError(t, s.Remove(ctx, fmt.Sprintf("w%d-%d", w, n-1), true))
				}
				if n%5 == 4 {
					if sl, ok := nextSlot(); ok {
						assert.NoError(t, commit(s, "a", sl, fmt.Sprintf("wc%d-%d", w, n), 3))
					}
				}
			}
		})
	}
	for range 10 {
		take()
	}
	close(stop)
	wg.Wait()
	require.NoError(t, j.wait(ctx, j.last()))
	want := view(s)
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
