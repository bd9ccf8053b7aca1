package client

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/store/master"
	"github.com/mooncake-go/mooncake/store/storepb"
)

func TestBatchGetRanges(t *testing.T) {
	m := startMaster(t, master.ServiceConfig{})
	a := newClient(t, m.Addr(), 32<<20)
	peer := newClient(t, m.Addr(), NoSegment, func(c *Config) { c.EngineConfig.Transport = "tcp" })
	ctx := ctxT(t)
	want := value(7, 3<<20+5)
	require.NoError(t, a.Put(ctx, "r", want, nil))

	reg := guarded(1 << 20)
	require.NoError(t, peer.RegisterBuffer(reg))
	for _, c := range []struct {
		name   string
		reader *Client
		buf    []byte // where the ranges land
	}{
		{"own segment", a, guarded(1 << 20)},
		{"tcp, staged", peer, guarded(1 << 20)},
		{"tcp, registered", peer, reg},
	} {
		t.Run(c.name, func(t *testing.T) {
			dsts := carve(c.buf, 16, 100, 0, 4096, 1000)
			srcs := []uint64{0, 50, 1 << 20, uint64(len(want) - 1000)} // the last one ends at the value's end
			rs := make([]Range, len(dsts))
			for i := range dsts {
				rs[i] = Range{Src: srcs[i], Dst: dsts[i]}
			}
			ns, errs := c.reader.BatchGetRanges(ctx, []string{"r", "missing"}, [][]Range{rs, {{Src: 0, Dst: make([]byte, 1)}}})
			require.NoError(t, errs[0])
			assert.Equal(t, 100+4096+1000, ns[0])
			for i, d := range dsts {
				assert.Equal(t, want[srcs[i]:srcs[i]+uint64(len(d))], d, "range %d", i)
			}
			guardsIntact(t, c.buf, dsts)
			assert.Equal(t, storepb.ObjectNotFound, codeOf(errs[1]))
		})
	}

	// A range past the end fails its key and reads nothing.
	dst := guarded(10)
	_, errs := peer.BatchGetRanges(ctx, []string{"r"}, [][]Range{{{Src: uint64(len(want) - 5), Dst: dst}}})
	assert.Equal(t, storepb.InvalidParams, codeOf(errs[0]))
	guardsIntact(t, dst, nil)
	_, errs = peer.BatchGetRanges(ctx, []string{"r"}, nil)
	assert.Equal(t, storepb.InvalidParams, codeOf(errs[0]))
}

func TestGetSessionAndReplicas(t *testing.T) {
	m := startMaster(t, master.ServiceConfig{})
	a := newClient(t, m.Addr(), 16<<20)
	b := newClient(t, m.Addr(), 16<<20)
	ctx := ctxT(t)
	require.NoError(t, a.Put(ctx, "s", value(3, 5000), &ReplicateConfig{Replicas: 2}))

	errs := b.StartGetSession(ctx, []string{"s", "absent", ""})
	require.NoError(t, errs[0])
	assert.Equal(t, storepb.ObjectNotFound, codeOf(errs[1]))
	assert.Equal(t, storepb.InvalidParams, codeOf(errs[2]))
	// The session's replica list is kept: the read needs no lookup.
	require.NotNil(t, b.leases.get("s", time.Now()))
	dst := make([]byte, 10)
	ns, rerrs := b.BatchGetRanges(ctx, []string{"s"}, [][]Range{{{Src: 4990, Dst: dst}}})
	require.NoError(t, rerrs[0])
	assert.Equal(t, 10, ns[0])
	assert.Equal(t, value(3, 5000)[4990:], dst)
	b.EndGetSession([]string{"s"})
	assert.Nil(t, b.leases.get("s", time.Now()))

	reps, errs := b.BatchReplicas(ctx, []string{"s", "absent"})
	require.NoError(t, errs[0])
	assert.Equal(t, storepb.ObjectNotFound, codeOf(errs[1]))
	require.Len(t, reps[0], 2)
	var names []string
	for _, r := range reps[0] {
		assert.Equal(t, storepb.ReplicaStatus_REPLICA_STATUS_COMPLETE, r.Status)
		names = append(names, r.GetMemory().GetSegmentName())
	}
	assert.ElementsMatch(t, []string{a.SegmentName(), b.SegmentName()}, names)
}
