package master

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	"github.com/mooncake-go/mooncake/internal/etcdtest"
	"github.com/mooncake-go/mooncake/store/ha"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// The etcd journal against a real etcd: records committed with several
// transactions in flight load back in order; a gap (a batch lost while
// later ones landed) ends the log there and the records after it, never
// acknowledged, are deleted; a deposed leader's writes are refused.
func TestEtcdJournal(t *testing.T) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcdtest.Start(t)}, DialTimeout: 5 * time.Second})
	require.NoError(t, err)
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := ha.Campaign(ctx, cli, "j", "me:1", 0)
	require.NoError(t, err)

	j := newEtcdJournal(cli, "j", l.Term(), 0)
	mount := &storepb.JournalRecord{Op: &storepb.JournalRecord_Mount{Mount: &storepb.JournalMount{ClientId: "a", Segment: seg("1", 1<<20, 1<<20)}}}
	j.append(mount, nil)
	done := make(chan int, 1000)
	var last uint64
	for i := range 500 {
		key := fmt.Sprintf("k%d", i)
		j.append(&storepb.JournalRecord{Op: &storepb.JournalRecord_Start{Start: &storepb.JournalStart{ClientId: "a", Key: key, Size: 64,
			Replicas: []*storepb.ReplicaLocation{{SegmentId: "1", Offset: uint64(i) * 64, Size: 64}}}}}, nil)
		last = j.append(&storepb.JournalRecord{Op: &storepb.JournalRecord_End{End: &storepb.JournalEnd{ClientId: "a", Key: key}}},
			func() { done <- i })
	}
	require.NoError(t, j.wait(last))
	close(done)
	prev := -1
	for i := range done {
		require.Equal(t, prev+1, i, "callbacks run in record order")
		prev = i
	}
	j.close()
	st, n, err := loadJournal(ctx, cli, "j", l.Term())
	require.NoError(t, err)
	assert.Equal(t, last, n)
	assert.Len(t, st.objects, 500)

	// A hole: a batch far past the end, as if the one before it was lost.
	b, _ := proto.Marshal(&storepb.JournalBatch{FirstSeq: last + 10, Records: []*storepb.JournalRecord{mount}})
	_, err = cli.Put(ctx, logKey(journalPrefix("j"), last+10), string(b))
	require.NoError(t, err)
	st, n, err = loadJournal(ctx, cli, "j", l.Term())
	require.NoError(t, err)
	assert.Equal(t, last, n, "the log ends at the gap")
	resp, err := cli.Get(ctx, logKey(journalPrefix("j"), last+10))
	require.NoError(t, err)
	assert.Empty(t, resp.Kvs, "records past the gap are deleted")

	// Deposed: the next leader's term differs, and writes fail.
	require.NoError(t, l.Resign(ctx))
	l2, err := ha.Campaign(ctx, cli, "j", "other:1", 0)
	require.NoError(t, err)
	defer l2.Resign(ctx)
	old := newEtcdJournal(cli, "j", l.Term(), n)
	seq := old.append(mount, nil)
	assert.Error(t, old.wait(seq))
	old.close()
	_, _, err = loadJournal(ctx, cli, "j", l2.Term())
	require.NoError(t, err)
	_ = st
}
