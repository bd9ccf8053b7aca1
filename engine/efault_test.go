package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/mooncake-go/mooncake/engine"
)

// A WRITE whose local memory cannot be read (the socket write fails with
// EFAULT, here on pages made PROT_NONE after registration) fails at once,
// not at its deadline: the peer, holding half a request, would otherwise
// wait for the rest while the initiator waited for its answer.
func TestUnreadableLocalMemoryFailsFast(t *testing.T) {
	const deadline = 20 * time.Second
	target := newEngine(t, engine.Config{Transport: "tcp"})
	remote := anonMem(t, 1<<20)
	require.NoError(t, target.RegisterMemory(context.Background(), addr(remote), uint64(len(remote)), "", true))
	init := newEngine(t, engine.Config{Transport: "tcp", Timeout: deadline})
	local := anonMem(t, 1<<20)
	require.NoError(t, init.RegisterMemory(context.Background(), addr(local), uint64(len(local)), "", false))
	require.NoError(t, unix.Mprotect(local, unix.PROT_NONE))
	t.Cleanup(func() { _ = unix.Mprotect(local, unix.PROT_READ|unix.PROT_WRITE) })
	seg, err := init.OpenSegment(context.Background(), target.Name())
	require.NoError(t, err)

	start := time.Now()
	st := transfer(t, init, []engine.Request{{Op: engine.Write, Local: addr(local), Segment: seg,
		Remote: uint64(addr(remote)), Length: uint64(len(local))}})
	took := time.Since(start)
	require.Equal(t, engine.Failed, st.Status, "%v", st.Err)
	require.Less(t, took, deadline/2, "the failed write waited for its deadline")

	// The engines go on: a readable buffer writes.
	require.NoError(t, unix.Mprotect(local, unix.PROT_READ|unix.PROT_WRITE))
	local[0] = 42
	st = transfer(t, init, []engine.Request{{Op: engine.Write, Local: addr(local), Segment: seg,
		Remote: uint64(addr(remote)), Length: uint64(len(local))}})
	require.Equal(t, engine.Completed, st.Status, "%v", st.Err)
	require.Equal(t, byte(42), remote[0])
}
