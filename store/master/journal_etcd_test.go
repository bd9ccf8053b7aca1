package master

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/mooncake-go/mooncake/internal/embedetcd"
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

	j := newEtcdJournal(cli, "j", l.Term(), 0, 0, false)
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
	require.NoError(t, j.wait(ctx, last))
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
	old := newEtcdJournal(cli, "j", l.Term(), n, 0, false)
	seq := old.append(mount, nil)
	assert.ErrorIs(t, old.wait(ctx, seq), ErrNotLeader)
	old.close()
	_, _, err = loadJournal(ctx, cli, "j", l2.Term())
	require.NoError(t, err)
	_ = st
}

// A durability wait ends with its caller's context: an RPC cancelled or
// past its deadline answers at once, its error's cause the context's,
// where the journal, its etcd gone, would hold it for etcdOpTimeout.
func TestDurableWaitEndsWithContext(t *testing.T) {
	e, err := embedetcd.Start(t.TempDir(), "127.0.0.1:0")
	require.NoError(t, err)
	var stop sync.Once // the test stops etcd halfway
	defer stop.Do(e.Close)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Addr()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The election on a client of its own, closed before etcd stops: its
	// lease keep-alive stream would hold etcd's graceful stop for seconds.
	ecli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Addr()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	require.NoError(t, err)
	defer ecli.Close()
	l, err := ha.Campaign(ctx, ecli, "d", "me:1", 0)
	require.NoError(t, err)
	svc, err := NewService(ServiceConfig{})
	require.NoError(t, err)
	j := newEtcdJournal(cli, "d", l.Term(), 0, 0, false)
	svc.j = j
	// Closing the client first fails the writes stuck on the dead etcd, so
	// that the journal closes without waiting them out.
	defer j.close()
	defer cli.Close()

	// While etcd runs, changes are durable and answered. Each case below
	// runs once per cause, on keys of its own (i).
	require.NoError(t, svc.MountSegment(ctx, "c1", seg("1", 1<<20, 1<<20)))
	for i := range 2 {
		for _, k := range []string{"pending", "done", "grpc"} {
			_, err := svc.PutStart(ctx, "c1", fmt.Sprint(k, i), 64, nil)
			require.NoError(t, err)
		}
		require.NoError(t, svc.PutEnd(ctx, "c1", fmt.Sprint("done", i), 0))
		require.NoError(t, svc.PutEnd(ctx, "c1", fmt.Sprint("grpc", i), 0))
	}
	// etcd gone: no record lands from here on (its client waits for it to
	// come back, up to etcdOpTimeout).
	require.NoError(t, ecli.Close())
	stop.Do(e.Close)

	etcdFailed := &storepb.Error{Code: storepb.EtcdOperationError}
	g := NewGRPCServer(svc)
	cases := []struct {
		name string
		call func(ctx context.Context, i int) error
	}{
		// Each kind of wait: a put's start, its end, a removal, a mount.
		{"PutStart", func(ctx context.Context, i int) error {
			_, err := svc.PutStart(ctx, "c1", fmt.Sprint("new", i), 64, nil)
			return err
		}},
		{"PutEnd", func(ctx context.Context, i int) error { return svc.PutEnd(ctx, "c1", fmt.Sprint("pending", i), 0) }},
		{"Remove", func(ctx context.Context, i int) error { return svc.Remove(ctx, fmt.Sprint("done", i), true) }},
		{"MountSegment", func(ctx context.Context, i int) error {
			return svc.MountSegment(ctx, "c1", seg(fmt.Sprint(2+i), uint64(4+i)<<20, 1<<20))
		}},
		// The gRPC front passes the RPC's context down; the cause does not
		// cross the wire, the code does.
		{"gRPC BatchRemove", func(ctx context.Context, i int) error {
			r, err := g.BatchRemove(ctx, &storepb.BatchRemoveRequest{Keys: []string{fmt.Sprint("grpc", i)}, Force: true})
			require.NoError(t, err)
			return r.Results[0].AsError()
		}},
	}
	for _, c := range cases {
		for i, cause := range []error{context.DeadlineExceeded, context.Canceled} {
			t.Run(fmt.Sprintf("%s/%v", c.name, cause), func(t *testing.T) {
				cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
				defer cancel()
				if cause == context.Canceled {
					// Cancelled while it waits, well before its deadline.
					cctx, cancel = context.WithCancel(ctx)
					defer cancel()
					time.AfterFunc(100*time.Millisecond, cancel)
				}
				start := time.Now()
				err := c.call(cctx, i)
				assert.Less(t, time.Since(start), etcdOpTimeout/2, "the wait outlived its context")
				require.ErrorIs(t, err, etcdFailed)
				if !strings.HasPrefix(c.name, "gRPC") {
					require.ErrorIs(t, err, cause)
				}
			})
		}
	}
}
