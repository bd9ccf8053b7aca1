package client

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/store/master"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// TestContextErrorsSurvive: a call whose context has ended fails with the
// store's RPC code and, in the same chain, the context's error, against a
// real master.
func TestContextErrorsSurvive(t *testing.T) {
	m := startMaster(t, master.ServiceConfig{})
	c := newClient(t, m.Addr(), 4<<20)
	require.NoError(t, c.Put(ctxT(t), "k", []byte("v"), nil))

	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := c.Exist(cancelled, "k")
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, err, storepb.ErrRPCFail)
	_, err = c.Get(cancelled, "k")
	require.ErrorIs(t, err, context.Canceled)
	err = c.Put(cancelled, "k2", []byte("v"), nil)
	require.ErrorIs(t, err, context.Canceled)

	expired, stop := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer stop()
	_, err = c.Exist(expired, "k")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorIs(t, err, storepb.ErrRPCTimeout)
	_, err = c.Get(expired, "k")
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

// TestClosedClientSentinel: calls on a closed client fail with ErrClosed,
// still under the InvalidParams code the C ABI maps.
func TestClosedClientSentinel(t *testing.T) {
	m := startMaster(t, master.ServiceConfig{})
	c := newClient(t, m.Addr(), 4<<20)
	require.NoError(t, c.Close())
	err := c.Put(ctxT(t), "k", []byte("v"), nil)
	require.ErrorIs(t, err, ErrClosed)
	require.ErrorIs(t, err, storepb.ErrInvalidParams)
	_, err = c.Get(ctxT(t), "k")
	require.ErrorIs(t, err, ErrClosed)
	require.Equal(t, "store: INVALID_PARAMS: client closed", err.Error())
	require.NotErrorIs(t, storepb.ErrInvalidParams, ErrClosed, "a bad argument is not a closed client")
}
