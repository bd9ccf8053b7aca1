package master

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/mooncake-go/mooncake/internal/etcdtest"
)

// A standby that handed its tail to a new leader acknowledges nothing more
// of the old leader's: the new leader wrote what the tail held then, and a
// put the old leader (paused past its lease, say, and not aware yet that
// it was deposed) acknowledged through the standby afterwards would be
// lost.
func TestStandbyAcksNothingAfterHandingItsTail(t *testing.T) {
	etcd := etcdtest.Start(t)
	a := startHA(t, etcd, "seal", false)
	require.Eventually(t, a.Leading, 20*time.Second, 5*time.Millisecond)
	b := startHA(t, etcd, "seal", false)
	waitDesignated(t, a)
	j := etcdJournalOf(t, a)
	j.holdEtcd.Store(true)
	putMany(t, a.Service(), 10) // acknowledged through b alone

	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd}, DialTimeout: 5 * time.Second})
	require.NoError(t, err)
	defer cli.Close()
	d, err := insync(t.Context(), cli, "seal")
	require.NoError(t, err)
	require.NotEmpty(t, d)
	// A new leader takes b's tail, as takeOver does.
	tail, err := askTail(t.Context(), b.Addr(), d, "")
	require.NoError(t, err)
	require.NotEmpty(t, tail.Records)

	// a goes on: its next put must wait for etcd, which it cannot reach.
	svc := a.Service()
	_, _, err = svc.startSeq(t.Context(), "node", "late", 64, nil, false)
	require.NoError(t, err)
	seq, err := svc.putEndSeq("node", "late", 7)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	require.ErrorIs(t, svc.durable(ctx, seq), context.DeadlineExceeded,
		"acknowledged through a standby whose tail a new leader took already")
}
