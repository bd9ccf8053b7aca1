package master

import (
	"context"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	"github.com/mooncake-go/mooncake/internal/etcdtest"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// A follower forgets a batch the new leader deleted as unacknowledged (it
// came after a gap when the old leader died): the records the new leader
// writes in its place are the ones it applies, never the deleted ones,
// even when the gap before them fills.
func TestFollowerDropsDeletedBatch(t *testing.T) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcdtest.Start(t)}, DialTimeout: 5 * time.Second})
	require.NoError(t, err)
	defer cli.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	prefix := journalPrefix("f")
	mount := func(id string) *storepb.JournalRecord {
		return &storepb.JournalRecord{Op: &storepb.JournalRecord_Mount{Mount: &storepb.JournalMount{
			ClientId: "c", Segment: seg(id, 1<<30, 1<<20)}}}
	}
	write := func(first uint64, recs ...*storepb.JournalRecord) {
		b, err := proto.Marshal(&storepb.JournalBatch{FirstSeq: first, Records: recs})
		require.NoError(t, err)
		_, err = cli.Put(ctx, logKey(prefix, first), string(b))
		require.NoError(t, err)
	}
	f := startFollower(cli, "f", ServiceConfig{}, fetchConfig{}, &tailStore{}, slog.New(slog.DiscardHandler))
	defer f.stop()
	waitFor := func(seq uint64) {
		for {
			f.mu.Lock()
			last := f.last
			f.mu.Unlock()
			if last >= seq {
				return
			}
			require.NoError(t, ctx.Err(), "the follower never applied record %d", seq)
			time.Sleep(5 * time.Millisecond)
		}
	}

	write(1, mount("1"))
	waitFor(1)
	// The old leader's batch 3 lands, its batch 2 never does; the new
	// leader deletes 3 and writes its own 2 and 3.
	write(3, mount("stale3"), mount("stale4"))
	_, err = cli.Delete(ctx, logKey(prefix, 3))
	require.NoError(t, err)
	write(2, mount("2"))
	waitFor(2)
	write(3, mount("3"))
	write(4, mount("4"))
	write(5, mount("5"))
	waitFor(5)

	f.mu.Lock()
	ids := make([]string, 0, len(f.st.segs))
	for id := range f.st.segs {
		ids = append(ids, id)
	}
	f.mu.Unlock()
	slices.Sort(ids)
	assert.Equal(t, []string{"1", "2", "3", "4", "5"}, ids, "the follower's state is the new leader's journal")
}
