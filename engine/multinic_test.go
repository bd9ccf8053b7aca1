package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/engine/metadata"
)

// TestExtraHostsDescriptor: an engine with a second address serves its
// data port there too and publishes it as mcgo_tcp_data_addrs, leaving
// every field an official engine reads as a one-address engine writes it;
// the descriptor survives a parse and re-encode with both addresses; a
// peer reads the right bytes through it.
func TestExtraHostsDescriptor(t *testing.T) {
	ctx := context.Background()
	meta := "memory://" + t.Name()
	target := newEngine(t, engine.Config{Metadata: meta, Transport: "tcp", ExtraHosts: []string{"127.0.0.2"}})
	remote := anonMem(t, 1<<20)
	for i := range remote {
		remote[i] = byte(i*7 + 1)
	}
	require.NoError(t, target.RegisterMemory(ctx, addr(remote), uint64(len(remote)), "", true))

	raw, err := metadata.OpenMemory(t.Name()).Get(ctx, metadata.SegmentKey(target.Name()))
	require.NoError(t, err)
	var fields map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(raw, &fields))
	// What Mooncake's TCP transport reads: one data port, reached at the
	// rpc_meta host, and the buffers.
	require.JSONEq(t, strconv.Itoa(target.DataPort()), string(fields["tcp_data_port"]))
	require.JSONEq(t, `"tcp"`, string(fields["protocol"]))
	require.JSONEq(t, `2`, string(fields["tcp_proto_version"]))
	require.Contains(t, string(fields["buffers"]), `"addr":`+strconv.FormatUint(uint64(addr(remote)), 10))
	second := net.JoinHostPort("127.0.0.2", strconv.Itoa(target.DataPort()))
	require.JSONEq(t, `["`+second+`"]`, string(fields["mcgo_tcp_data_addrs"]), "the second address, on the same port")

	desc, err := metadata.ParseSegmentDesc(raw)
	require.NoError(t, err)
	require.Equal(t, []string{second}, desc.TCPDataAddrs)
	again, err := json.Marshal(desc)
	require.NoError(t, err)
	desc2, err := metadata.ParseSegmentDesc(again)
	require.NoError(t, err)
	require.Equal(t, desc, desc2, "round trip")

	// The second address serves: read through a descriptor that names
	// only it, then through the published one.
	init := newEngine(t, engine.Config{Metadata: meta, Transport: "tcp", SliceSize: 64 << 10})
	local := anonMem(t, len(remote))
	require.NoError(t, init.RegisterMemory(ctx, addr(local), uint64(len(local)), "", false))
	seg, err := init.OpenSegment(ctx, target.Name())
	require.NoError(t, err)
	st := transfer(t, init, []engine.Request{{Op: engine.Read, Local: addr(local), Segment: seg,
		Remote: uint64(addr(remote)), Length: uint64(len(remote))}})
	require.Equal(t, engine.Completed, st.Status, "%v", st.Err)
	require.Equal(t, remote, local)

	only := *desc
	only.Name, only.TCPDataHost, only.TCPDataPort, only.TCPDataAddrs = "second-only", "", 0, []string{second}
	b, err := json.Marshal(&only)
	require.NoError(t, err)
	store := metadata.OpenMemory(t.Name())
	require.NoError(t, store.Put(ctx, metadata.SegmentKey("second-only"), b))
	rpc, err := store.Get(ctx, metadata.RPCMetaKey(target.Name()))
	require.NoError(t, err)
	require.NoError(t, store.Put(ctx, metadata.RPCMetaKey("second-only"), rpc))
	seg2, err := init.OpenSegment(ctx, "second-only")
	require.NoError(t, err)
	clear(local)
	st = transfer(t, init, []engine.Request{{Op: engine.Read, Local: addr(local), Segment: seg2,
		Remote: uint64(addr(remote)), Length: uint64(len(remote))}})
	require.Equal(t, engine.Completed, st.Status, "%v", st.Err)
	require.Equal(t, remote, local)
}

// TestBindAddressesEnv: MC_TCP_BIND_ADDRESSES lists the host's addresses,
// the first taking Host's place; a bad entry, there or in ExtraHosts,
// fails New and names it; without it nothing extra is published.
func TestBindAddressesEnv(t *testing.T) {
	ctx := context.Background()
	t.Run("list", func(t *testing.T) {
		t.Setenv("MC_TCP_BIND_ADDRESS", "")
		t.Setenv("MC_TCP_BIND_ADDRESSES", "127.0.0.3, 127.0.0.4")
		e, err := engine.New(ctx, engine.Config{Metadata: "memory://" + t.Name(), Transport: "tcp"})
		require.NoError(t, err)
		t.Cleanup(func() { e.Close() })
		require.Equal(t, "127.0.0.3", e.Host())
		require.Equal(t, []string{net.JoinHostPort("127.0.0.4", strconv.Itoa(e.DataPort()))}, published(t, e).TCPDataAddrs)
	})
	t.Run("none", func(t *testing.T) {
		e := newEngine(t, engine.Config{Metadata: "memory://" + t.Name(), Transport: "tcp"})
		require.Empty(t, published(t, e).TCPDataAddrs)
	})
	for _, bad := range []struct {
		name string
		cfg  engine.Config
		env  string
	}{
		{"config", engine.Config{ExtraHosts: []string{"nic2.example"}}, ""},
		{"env", engine.Config{}, "127.0.0.1,nic2.example"},
	} {
		t.Run(bad.name, func(t *testing.T) {
			t.Setenv("MC_TCP_BIND_ADDRESSES", bad.env)
			bad.cfg.Transport = "tcp"
			_, err := engine.New(ctx, bad.cfg)
			var ee *engine.Error
			require.True(t, errors.As(err, &ee), "%v", err)
			require.Equal(t, engine.CodeInvalidArgument, ee.Code)
			require.ErrorContains(t, err, "nic2.example")
		})
	}
}

// published is the descriptor e published to its memory:// metadata.
func published(t *testing.T, e *engine.Engine) *metadata.SegmentDesc {
	t.Helper()
	raw, err := metadata.OpenMemory(t.Name()).Get(context.Background(), metadata.SegmentKey(e.Name()))
	require.NoError(t, err)
	d, err := metadata.ParseSegmentDesc(raw)
	require.NoError(t, err)
	return d
}
