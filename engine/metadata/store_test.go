package metadata

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// TestMain fails the package if any test leaves a goroutine behind: etcd
// clients, embedded etcd servers and HTTP servers must all be closed.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestOpen(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		conn    string
		wantNil bool   // no store: P2P handshake mode
		want    any    // type of the store
		wantErr string // error substring
	}{
		// The serverless mode, under its name and as the empty default.
		{name: "p2p", conn: "P2PHANDSHAKE", wantNil: true},
		{name: "empty", conn: "", wantNil: true},
		// HTTP needs no server to open: the client dials per request.
		{name: "http", conn: "http://127.0.0.1:1/metadata", want: (*HTTP)(nil)},
		{name: "https", conn: "https://127.0.0.1:1/metadata", want: (*HTTP)(nil)},
		{name: "memory", conn: "memory://open-test", want: (*Memory)(nil)},
		// Mooncake has Redis; we do not, and say so rather than guess.
		{name: "redis", conn: "redis://127.0.0.1:6379", wantErr: "unsupported connection string"},
		{name: "unknown scheme", conn: "zk://h:1", wantErr: "unsupported connection string"},
		// etcd with nothing after the scheme.
		{name: "etcd no endpoints", conn: "etcd://", wantErr: "no endpoints"},
		{name: "etcd only separators", conn: "etcd://,;", wantErr: "no endpoints"},
		// An HTTP URL without a host.
		{name: "http no host", conn: "http:///metadata", wantErr: "want http://host:port/path"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Open(tt.conn)
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			if tt.wantNil {
				require.Nil(t, s)
				return
			}
			require.IsType(t, tt.want, s)
			require.NoError(t, s.Close())
		})
	}
}

func TestMemoryShared(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	a, err := Open("memory://shared-test")
	require.NoError(t, err)
	b, err := Open("memory://shared-test")
	require.NoError(t, err)
	other, err := Open("memory://shared-test-other")
	require.NoError(t, err)

	require.NoError(t, a.Put(ctx, "k", []byte("v")))
	got, err := b.Get(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, []byte("v"), got)

	// A store of another name is another store.
	_, err = other.Get(ctx, "k")
	require.ErrorIs(t, err, ErrNotFound)

	// Values are copied in and out: callers may reuse their buffers.
	got[0] = 'x'
	again, err := a.Get(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, []byte("v"), again)

	require.NoError(t, b.Delete(ctx, "k"))
	_, err = a.Get(ctx, "k")
	require.ErrorIs(t, err, ErrNotFound)
}

func TestKeys(t *testing.T) {
	tests := []struct {
		name    string
		cluster string // MC_METADATA_CLUSTER_ID
		segment string
		wantSeg string
		wantRPC string
	}{
		// A plain segment name goes under ram/.
		{name: "plain", segment: "127.0.0.1:15001",
			wantSeg: "mooncake/ram/127.0.0.1:15001", wantRPC: "mooncake/rpc_meta/127.0.0.1:15001"},
		// A name with '/' is taken as a full key below the prefix.
		{name: "slash", segment: "nvmeof/host1",
			wantSeg: "mooncake/nvmeof/host1", wantRPC: "mooncake/rpc_meta/nvmeof/host1"},
		// The cluster id is one more level, for every key.
		{name: "cluster", cluster: "c1", segment: "h:1",
			wantSeg: "mooncake/c1/ram/h:1", wantRPC: "mooncake/c1/rpc_meta/h:1"},
		{name: "cluster slash", cluster: "c1", segment: "a/b",
			wantSeg: "mooncake/c1/a/b", wantRPC: "mooncake/c1/rpc_meta/a/b"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("MC_METADATA_CLUSTER_ID", tt.cluster)
			assert.Equal(t, tt.wantSeg, SegmentKey(tt.segment))
			assert.Equal(t, tt.wantRPC, RPCMetaKey(tt.segment))
		})
	}
}

// mooncakeTCPDesc is a descriptor as an official TCP engine publishes it.
const mooncakeTCPDesc = `{"name":"127.0.0.1:15001","protocol":"tcp","tcp_data_port":15234,` +
	`"tcp_proto_version":2,"timestamp":"2025-06-01 12:00:00","buffers":` +
	`[{"name":"cpu:0","addr":140000000000,"length":1048576}]}`

func TestParseSegmentDesc(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		in       string
		wantErr  bool
		wantProt string // ProtocolName
		has      string // a protocol HasProtocol must report
		hasNot   string // and one it must not
	}{
		// An official TCP engine's descriptor.
		{name: "mooncake tcp", in: mooncakeTCPDesc, wantProt: "tcp", has: "tcp", hasNot: "rdma"},
		// A multi-protocol engine writes an array; the first is the name.
		{name: "protocol array", in: `{"name":"a","protocol":["rdma","tcp"],"buffers":[]}`,
			wantProt: "rdma", has: "tcp", hasNot: "nvlink"},
		// RDMA buffers carry keys; unknown fields are ignored.
		{name: "rdma keys", in: `{"name":"a","protocol":"rdma","rdma_server_name":"x","devices":[{"name":"mlx5_0"}],` +
			`"buffers":[{"name":"cpu:0","addr":1,"length":2,"rkey":[7],"lkey":[8]}]}`,
			wantProt: "rdma", has: "rdma", hasNot: "tcp"},
		// Our same-host extension.
		{name: "local", in: `{"name":"a","protocol":"tcp","buffers":[],"mcgo_local":{"host_id":"h","pid":3,"start_time":4,` +
			`"shared":[{"addr":1,"length":2,"fd":5}]}}`, wantProt: "tcp", has: "tcp", hasNot: "rdma"},
		// No protocol at all: parses, offers nothing.
		{name: "no protocol", in: `{"name":"a"}`, hasNot: "tcp"},
		// Highest possible buffer end without wrapping.
		{name: "buffer at top", in: `{"name":"a","buffers":[{"addr":18446744073709551614,"length":1}]}`},

		{name: "not json", in: `{"name":`, wantErr: true},
		{name: "empty", in: ``, wantErr: true},
		{name: "array", in: `[]`, wantErr: true},
		{name: "null", in: `null`, wantErr: true},
		{name: "no name", in: `{"protocol":"tcp","buffers":[]}`, wantErr: true},
		{name: "negative port", in: `{"name":"a","tcp_data_port":-1}`, wantErr: true},
		{name: "port too big", in: `{"name":"a","tcp_data_port":65536}`, wantErr: true},
		{name: "port wrong type", in: `{"name":"a","tcp_data_port":"1"}`, wantErr: true},
		{name: "negative addr", in: `{"name":"a","buffers":[{"addr":-1,"length":1}]}`, wantErr: true},
		// addr+length past 2^64 would alias low memory.
		{name: "buffer wraps", in: `{"name":"a","buffers":[{"addr":18446744073709551615,"length":2}]}`, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := ParseSegmentDesc([]byte(tt.in))
			if tt.wantErr {
				require.ErrorIs(t, err, ErrBadDescriptor)
				require.Nil(t, d)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.wantProt, d.ProtocolName())
			if tt.has != "" {
				assert.True(t, d.HasProtocol(tt.has), "HasProtocol(%q)", tt.has)
			}
			assert.False(t, d.HasProtocol(tt.hasNot), "HasProtocol(%q)", tt.hasNot)
		})
	}
}

func TestParseSegmentDescFields(t *testing.T) {
	t.Parallel()
	d, err := ParseSegmentDesc([]byte(mooncakeTCPDesc))
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1:15001", d.Name)
	assert.Equal(t, 15234, d.TCPDataPort)
	assert.Equal(t, 2, d.TCPProtoVersion)
	assert.Equal(t, []Buffer{{Name: "cpu:0", Addr: 140000000000, Length: 1048576}}, d.Buffers)
	assert.Nil(t, d.Local)

	// Marshalled back, every field the official engine wrote is there with
	// its value, and our extension is absent.
	out, err := json.Marshal(d)
	require.NoError(t, err)
	var orig, back map[string]any
	require.NoError(t, json.Unmarshal([]byte(mooncakeTCPDesc), &orig))
	require.NoError(t, json.Unmarshal(out, &back))
	for k, v := range orig {
		assert.Equal(t, v, back[k], k)
	}
	assert.NotContains(t, back, "mcgo_local")
}

func TestParseRPCMeta(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		in      string
		want    RPCMeta
		wantErr bool
	}{
		// As every Mooncake engine writes it.
		{name: "ok", in: `{"ip_or_host_name":"10.0.0.1","rpc_port":15001}`,
			want: RPCMeta{IPOrHostName: "10.0.0.1", RPCPort: 15001}},
		{name: "hostname", in: `{"ip_or_host_name":"node-1","rpc_port":65535}`,
			want: RPCMeta{IPOrHostName: "node-1", RPCPort: 65535}},
		// Unknown fields are ignored.
		{name: "extra field", in: `{"ip_or_host_name":"h","rpc_port":1,"x":true}`,
			want: RPCMeta{IPOrHostName: "h", RPCPort: 1}},

		{name: "not json", in: `{`, wantErr: true},
		{name: "empty", in: ``, wantErr: true},
		{name: "no host", in: `{"rpc_port":1}`, wantErr: true},
		{name: "no port", in: `{"ip_or_host_name":"h"}`, wantErr: true},
		{name: "port zero", in: `{"ip_or_host_name":"h","rpc_port":0}`, wantErr: true},
		{name: "port too big", in: `{"ip_or_host_name":"h","rpc_port":65536}`, wantErr: true},
		{name: "port string", in: `{"ip_or_host_name":"h","rpc_port":"1"}`, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := ParseRPCMeta([]byte(tt.in))
			if tt.wantErr {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, m)
		})
	}
}
