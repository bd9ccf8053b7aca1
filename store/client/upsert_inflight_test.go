package client

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/store/master"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// An upsert that meets another writer's put or upsert of the key in
// flight writes nothing, and says so: ObjectAlreadyExists, not success.
// (Only a put reports an existing key as success, write-once as
// Mooncake's.) The chaos soak found it: a client's acknowledged upsert was
// followed by its own reads of the value before it.
func TestUpsertMeetingWriteInFlightFails(t *testing.T) {
	m := startMaster(t, master.ServiceConfig{})
	a := newClient(t, m.Addr(), 16<<20)
	ctx := ctxT(t)
	v1, v2 := value(1, 5000), value(2, 5000)
	require.NoError(t, a.Put(ctx, "k", v1, nil))
	// Another client's upsert of k, started and not ended.
	_, err := m.Service().UpsertStart(ctx, "another-writer", "k", uint64(len(v2)), &storepb.ReplicateConfig{ReplicaNum: 1})
	require.NoError(t, err)

	err = a.Upsert(ctx, "k", v2, nil)
	require.ErrorIs(t, err, storepb.ErrObjectAlreadyExists, "an upsert that wrote nothing reported success")
	got, err := a.Get(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, v1, got)
	// A put meeting it is still write-once's success.
	require.NoError(t, a.Put(ctx, "k", v2, nil))
}
