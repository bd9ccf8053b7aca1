package engine_test

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/engine/metadata"
	"github.com/mooncake-go/mooncake/internal/etcdtest"
)

// eventually polls cond for up to 10 s: notifications arrive asynchronously.
func eventually(t *testing.T, cond func() bool) {
	t.Helper()
	require.Eventually(t, cond, 10*time.Second, 5*time.Millisecond)
}

func TestNotifyAndProbe(t *testing.T) {
	target := newEngine(t, engine.Config{Transport: "tcp"})
	init := newEngine(t, engine.Config{Transport: "tcp"})
	dst := anonMem(t, 1<<20)
	require.NoError(t, target.RegisterMemory(context.Background(), addr(dst), 1<<20, "", true))
	src := anonMem(t, 1<<20)
	src[100] = 42
	require.NoError(t, init.RegisterMemory(context.Background(), addr(src), 1<<20, "", true))
	ctx := context.Background()
	seg, err := init.OpenSegment(ctx, target.Name())
	require.NoError(t, err)

	require.NoError(t, init.Probe(ctx, target.Name()))
	require.ErrorIs(t, init.Probe(ctx, "127.0.0.1:1"), engine.ErrSocket, "nothing listens on port 1")

	// The notify of a batch goes out only after its data is in place.
	b, err := init.AllocateBatch(1)
	require.NoError(t, err)
	require.NoError(t, init.Submit(context.Background(), b, []engine.Request{{Op: engine.Write, Local: addr(src), Segment: seg, Remote: uint64(addr(dst)), Length: 1 << 20}},
		engine.WithNotify(engine.Notify{Name: "req-1", Msg: "kv ready"})))
	var got []engine.Notify
	eventually(t, func() bool { got = append(got, target.Notifies()...); return len(got) > 0 })
	require.Equal(t, []engine.Notify{{Name: "req-1", Msg: "kv ready"}}, got)
	require.Equal(t, byte(42), dst[100])
	_, err = init.Wait(ctx, b)
	require.NoError(t, err)
	require.NoError(t, init.FreeBatch(b))

	// A notify by name, and the queue drains on read.
	require.NoError(t, target.SendNotify(ctx, init.Name(), engine.Notify{Name: "n", Msg: "m"}))
	eventually(t, func() bool { return len(init.Notifies()) == 1 })
	require.Empty(t, init.Notifies())
	require.Empty(t, target.Notifies())
}

func TestFailedBatchSendsNoNotify(t *testing.T) {
	target := newEngine(t, engine.Config{Transport: "tcp"})
	init := newEngine(t, engine.Config{Transport: "tcp"})
	src := anonMem(t, 4096)
	require.NoError(t, init.RegisterMemory(context.Background(), addr(src), 4096, "", true))
	seg, err := init.OpenSegment(context.Background(), target.Name())
	require.NoError(t, err)
	b, err := init.AllocateBatch(1)
	require.NoError(t, err)
	require.NoError(t, init.Submit(context.Background(), b, []engine.Request{{Op: engine.Write, Local: addr(src), Segment: seg, Remote: 0x1000, Length: 16}},
		engine.WithNotify(engine.Notify{Name: "x", Msg: "y"})))
	st, err := init.Wait(context.Background(), b)
	require.NoError(t, err)
	require.Equal(t, engine.Failed, st.Status)
	// Prove a later notify arrives, so the missing one was never sent.
	require.NoError(t, init.SendNotify(context.Background(), target.Name(), engine.Notify{Name: "later"}))
	eventually(t, func() bool {
		n := target.Notifies()
		if len(n) > 0 {
			require.Equal(t, "later", n[0].Name)
			return true
		}
		return false
	})
}

func TestMetadataBackends(t *testing.T) {
	hs := httptest.NewServer(metadata.NewServer())
	defer hs.Close()
	for _, tc := range []struct {
		name string
		conn string
	}{
		{"in-memory", "memory://" + t.Name()},
		{"http server", hs.URL + "/metadata"},
		{"etcd", "etcd://" + etcdtest.Start(t)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			target := newEngine(t, engine.Config{Transport: "tcp", Metadata: tc.conn, LocalServerName: "prefill-0"})
			init := newEngine(t, engine.Config{Transport: "tcp", Metadata: tc.conn, LocalServerName: "decode-0"})
			dst := anonMem(t, 1<<16)
			// Registered after the peer started: the published descriptor
			// is refreshed on every registration.
			require.NoError(t, target.RegisterMemory(context.Background(), addr(dst), 1<<16, "cpu:0", true))
			src := anonMem(t, 1<<16)
			src[7] = 7
			require.NoError(t, init.RegisterMemory(context.Background(), addr(src), 1<<16, "cpu:0", true))

			ctx := context.Background()
			seg, err := init.OpenSegment(ctx, "prefill-0")
			require.NoError(t, err)
			bufs, err := init.SegmentBuffers(seg)
			require.NoError(t, err)
			require.Equal(t, []uint64{uint64(addr(dst))}, []uint64{bufs[0].Addr})
			st := transfer(t, init, []engine.Request{{Op: engine.Write, Local: addr(src), Segment: seg, Remote: uint64(addr(dst)), Length: 1 << 16}})
			require.Equal(t, engine.Completed, st.Status, "%v", st.Err)
			require.Equal(t, byte(7), dst[7])
			require.NoError(t, init.SendNotify(ctx, "prefill-0", engine.Notify{Name: "a", Msg: "b"}))
			eventually(t, func() bool { return len(target.Notifies()) == 1 })

			_, err = init.OpenSegment(ctx, "no-such-segment")
			require.Equal(t, engine.CodeMetadata, engine.CodeOf(err))

			// Close removes the engine's records.
			store, err := metadata.Open(tc.conn)
			require.NoError(t, err)
			defer store.Close()
			_, err = store.Get(ctx, metadata.SegmentKey("prefill-0"))
			require.NoError(t, err)
			require.NoError(t, target.Close())
			_, err = store.Get(ctx, metadata.SegmentKey("prefill-0"))
			require.ErrorIs(t, err, metadata.ErrNotFound)
			_, err = store.Get(ctx, metadata.RPCMetaKey("prefill-0"))
			require.ErrorIs(t, err, metadata.ErrNotFound)
		})
	}
}
