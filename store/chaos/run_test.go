package chaos

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/store/storepb"
)

// An operation is Fail only when the store certainly did nothing; a
// timeout or a failure midway is Unknown.
func TestClassify(t *testing.T) {
	wrap := func(err error) error { return fmt.Errorf("store call: %w", err) }
	cases := []struct {
		kind Kind
		err  error
		want Result
	}{
		{Put, nil, OK},
		{Get, storepb.ErrObjectNotFound, OK}, // it saw the key empty
		{Get, storepb.ErrTransferFail, Fail}, // a get changes nothing
		{Get, context.DeadlineExceeded, Unknown},
		{Put, wrap(context.DeadlineExceeded), Unknown},
		{Upsert, storepb.ErrRPCTimeout, Unknown},
		{Put, storepb.ErrTransferFail, Unknown}, // its revoke may not have landed
		{Put, storepb.ErrRPCFail, Unknown},
		{Put, storepb.ErrNoAvailableHandle, Fail}, // refused at the start
		{Upsert, storepb.ErrInvalidParams, Fail},
		{Upsert, storepb.ErrObjectAlreadyExists, Fail}, // another write in flight: refused
		{Remove, storepb.ErrObjectHasLease, Fail},
		{Remove, storepb.ErrObjectNotFound, Unknown}, // maybe a repeat of one that removed it
		{Remove, storepb.ErrInternal, Unknown},
	}
	for _, tc := range cases {
		assert.Equal(t, tc.want, classify(tc.kind, tc.err), "%s %v", tc.kind, tc.err)
	}
}

// settle attributes a get's bytes, or says why it cannot.
func TestSettle(t *testing.T) {
	v, err := EncodeValue("k", ValueID{2, 9}, 256)
	require.NoError(t, err)
	other, err := EncodeValue("j", ValueID{2, 9}, 256)
	require.NoError(t, err)

	op := Op{Kind: Get, Key: "k"}
	settle(&op, v, nil)
	assert.Equal(t, OK, op.Result)
	assert.Equal(t, ValueID{2, 9}, op.Value)
	assert.Equal(t, 256, op.Size)
	assert.NotZero(t, op.Digest)
	assert.True(t, op.Found())

	op = Op{Kind: Get, Key: "k"}
	settle(&op, other, nil)
	assert.True(t, op.Found())
	assert.True(t, op.Value.IsZero())
	assert.Equal(t, `the value of key "j" (w2#9)`, op.Err)

	op = Op{Kind: Get, Key: "k"}
	settle(&op, nil, storepb.ErrObjectNotFound)
	assert.Equal(t, OK, op.Result)
	assert.False(t, op.Found())
	assert.Empty(t, op.Err)

	op = Op{Kind: Get, Key: "k"}
	settle(&op, nil, storepb.ErrTransferFail)
	assert.Equal(t, Fail, op.Result)
	assert.NotEmpty(t, op.Err)
}
