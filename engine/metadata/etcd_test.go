package metadata

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/internal/etcdtest"
	"github.com/mooncake-go/mooncake/internal/nettest"
)

func startEtcd(t *testing.T) string { return etcdtest.Start(t) }

func TestEtcd(t *testing.T) {
	addr := startEtcd(t)
	ctx := t.Context()

	s, err := Open("etcd://" + addr)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, s.Close()) })
	require.IsType(t, (*Etcd)(nil), s)

	key := SegmentKey("127.0.0.1:15001")
	desc := []byte(`{"name":"127.0.0.1:15001","protocol":"tcp","tcp_data_port":15234,"buffers":[]}`)

	// An absent key is ErrNotFound, not an empty value.
	_, err = s.Get(ctx, key)
	require.ErrorIs(t, err, ErrNotFound)

	require.NoError(t, s.Put(ctx, key, desc))
	got, err := s.Get(ctx, key)
	require.NoError(t, err)
	assert.Equal(t, desc, got)

	// Put replaces; etcd has no rpc_meta rule of its own.
	desc2 := []byte(`{"name":"127.0.0.1:15001","protocol":"tcp","tcp_data_port":15235,"buffers":[]}`)
	require.NoError(t, s.Put(ctx, key, desc2))
	got, err = s.Get(ctx, key)
	require.NoError(t, err)
	assert.Equal(t, desc2, got)

	// An empty value is a value.
	require.NoError(t, s.Put(ctx, key+"-empty", nil))
	got, err = s.Get(ctx, key+"-empty")
	require.NoError(t, err)
	assert.Empty(t, got)

	require.NoError(t, s.Delete(ctx, key))
	_, err = s.Get(ctx, key)
	require.ErrorIs(t, err, ErrNotFound)
	// Deleting again is not an error.
	require.NoError(t, s.Delete(ctx, key))

	// A second client, with the endpoint spelled as a URL, sees the same data.
	s2, err := OpenEtcd([]string{"http://" + addr})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, s2.Close()) })
	require.NoError(t, s.Put(ctx, RPCMetaKey("a"), []byte(`{"ip_or_host_name":"127.0.0.1","rpc_port":15001}`)))
	got, err = s2.Get(ctx, RPCMetaKey("a"))
	require.NoError(t, err)
	m, err := ParseRPCMeta(got)
	require.NoError(t, err)
	assert.Equal(t, RPCMeta{IPOrHostName: "127.0.0.1", RPCPort: 15001}, m)

	// Close is idempotent, and operations after it fail.
	require.NoError(t, s2.Close())
	require.NoError(t, s2.Close())
	_, err = s2.Get(ctx, RPCMetaKey("a"))
	require.ErrorIs(t, err, errEtcdClosed)
	require.ErrorIs(t, s2.Put(ctx, "k", nil), errEtcdClosed)
	require.ErrorIs(t, s2.Delete(ctx, "k"), errEtcdClosed)
}

func TestOpenEtcdErrors(t *testing.T) {
	t.Parallel()
	// No endpoint at all, however spelled, is refused before dialing.
	for _, eps := range [][]string{nil, {}, {"", " "}} {
		_, err := OpenEtcd(eps)
		require.ErrorContains(t, err, "no endpoints")
	}
	_, err := Open("etcd://")
	require.ErrorContains(t, err, "no endpoints")
}

func TestOpenEtcdUnreachable(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for the 5 s dial timeout")
	}
	t.Parallel()
	// A port nobody listens on.
	addr := nettest.RefusedAddr(t)

	start := time.Now()
	_, err := OpenEtcd([]string{addr})
	require.ErrorContains(t, err, "unreachable")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Less(t, time.Since(start), 3*etcdDialTimeout)
}
