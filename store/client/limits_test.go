package client

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/store/master"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// TestMasterLimitsReachCaller checks that a batch the master refuses whole
// (over its batch limit) reaches every item as INVALID_PARAMS naming the
// limit, not as an RPC failure to retry, and that nothing of it is stored.
func TestMasterLimitsReachCaller(t *testing.T) {
	m := startMaster(t, master.ServiceConfig{MaxBatch: 4})
	c := newClient(t, m.Addr(), 16<<20)
	ctx := ctxT(t)
	keys := make([]string, 5)
	values := make([][]byte, 5)
	for i := range keys {
		keys[i], values[i] = fmt.Sprint("lim", i), value(uint64(i), 1024)
	}
	for i, err := range c.BatchPut(ctx, keys, values, nil) {
		require.ErrorIs(t, err, storepb.ErrInvalidParams, "put item %d", i)
		assert.ErrorContains(t, err, "batch of 5 keys is over the limit of 4 keys")
	}
	_, errs := c.BatchExist(ctx, keys)
	for i, err := range errs {
		require.ErrorIs(t, err, storepb.ErrInvalidParams, "exist item %d", i)
	}
	// Nothing of the refused batch was stored.
	found, errs := c.BatchExist(ctx, keys[:4])
	for i := range found {
		require.NoError(t, errs[i])
		assert.False(t, found[i], keys[i])
	}
}
