package engine_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/engine"
)

// TestSameHostPaths moves data to a target in another process through both
// same-host paths (memfd mapping and process_vm), then checks that once the
// target unregisters memory the initiator stops trusting its cached view
// and the target's own checks reject the stale range.
func TestSameHostPaths(t *testing.T) {
	info, tp := startTargetIO(t, "auto", "")
	init := newEngine(t, engine.Config{Transport: "shm"})
	const n = 1 << 20
	src := anonMem(t, 2*n)
	rand.Read(src[:n])
	require.NoError(t, init.RegisterMemory(context.Background(), addr(src), 2*n, "", true))
	seg, err := init.OpenSegment(context.Background(), info.Name)
	require.NoError(t, err)

	for _, tc := range []struct {
		name   string
		remote uint64
	}{
		{"memfd buffer, mapped", info.Addr + 4096},
		{"anonymous memory, process_vm", info.Anon},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clear(src[n:])
			st := transfer(t, init, []engine.Request{{Op: engine.Write, Local: addr(src), Segment: seg, Remote: tc.remote, Length: n}})
			require.Equal(t, engine.Completed, st.Status, "%v", st.Err)
			st = transfer(t, init, []engine.Request{{Op: engine.Read, Local: addr(src[n:]), Segment: seg, Remote: tc.remote, Length: n}})
			require.Equal(t, engine.Completed, st.Status, "%v", st.Err)
			require.True(t, bytes.Equal(src[:n], src[n:]))
		})
	}

	require.Equal(t, "ok", tp.command(t, "unregister"))
	// The view refreshed after the unregistration no longer covers the
	// range, and Transport "shm" has no TCP to ask the target itself.
	st := transfer(t, init, []engine.Request{{Op: engine.Write, Local: addr(src), Segment: seg, Remote: info.Anon, Length: 64}})
	require.Equal(t, engine.Failed, st.Status)

	// In auto mode the fallback is TCP, and the target rejects the range it
	// no longer has, while its registered buffer stays reachable.
	auto := newEngine(t, engine.Config{})
	require.NoError(t, auto.RegisterMemory(context.Background(), addr(src), 2*n, "", true))
	seg, err = auto.OpenSegment(context.Background(), info.Name)
	require.NoError(t, err)
	st = transfer(t, auto, []engine.Request{{Op: engine.Write, Local: addr(src), Segment: seg, Remote: info.Anon, Length: 64}})
	require.Equal(t, engine.Failed, st.Status)
	st = transfer(t, auto, []engine.Request{{Op: engine.Read, Local: addr(src[n:]), Segment: seg, Remote: info.Addr + 4096, Length: n}})
	require.Equal(t, engine.Completed, st.Status, "%v", st.Err)
	require.True(t, bytes.Equal(src[:n], src[n:]))
}
