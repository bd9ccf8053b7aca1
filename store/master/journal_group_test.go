package master

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/mooncake-go/mooncake/internal/embedetcd"
	"github.com/mooncake-go/mooncake/internal/nettest"
	"github.com/mooncake-go/mooncake/store/ha"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// While a journal transaction is in flight, small batches wait for it and
// go together in the next one, instead of one transaction each: etcd
// spends ~100-150 µs of CPU on a transaction however few records it holds.
// Appends then do not wake the writer (writerDue), the landing does; once
// nothing is in flight, an append wakes it again. The writer's periodic
// check, which would cover a missed wakeup, is an hour away.
func TestEtcdJournalSmallBatchesWaitTheOneInFlight(t *testing.T) {
	defer func(d time.Duration) { standbyCheck = d }(standbyCheck)
	standbyCheck = time.Hour
	e, err := embedetcd.Start(t.TempDir(), "127.0.0.1:0", embedetcd.NoFsync())
	require.NoError(t, err)
	defer e.Close()
	direct := e.Client()
	defer direct.Close()
	p := nettest.NewProxy(t, e.Addr())
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{p.Addr()}, DialTimeout: 5 * time.Second})
	require.NoError(t, err)
	defer cli.Close()
	l, err := ha.Campaign(t.Context(), direct, "g", "me:1", 0)
	require.NoError(t, err)
	j := newEtcdJournal(cli, "g", l.Term(), 0, 0, false)
	defer j.close()
	// The connection is up before the gate closes.
	rec := &storepb.JournalRecord{Op: &storepb.JournalRecord_Drop{Drop: &storepb.JournalDrop{Key: "k"}}}
	require.NoError(t, j.wait(t.Context(), j.append(rec, nil)))
	rev := func() int64 {
		r, err := direct.Get(context.Background(), "rev")
		require.NoError(t, err)
		return r.Header.Revision
	}
	before := rev()

	release := p.HoldRequests()
	j.append(rec, nil) // in flight, held in the proxy
	var last uint64
	for range 8 {
		// Time for the writer to send each as it comes, as the old
		// one did; the new one must hold them whatever the timing.
		time.Sleep(5 * time.Millisecond)
		last = j.append(rec, nil)
	}
	release()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	require.NoError(t, j.wait(ctx, last), "the records appended while one was in flight")
	require.EqualValues(t, 2, rev()-before, "transactions for one record, then 8 appended while it was in flight")
	require.NoError(t, j.wait(ctx, j.append(rec, nil)), "a record appended with nothing in flight")
}
