package master

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/mooncake-go/mooncake/store/storepb"
)

// grpcFixture is a Service served over a real loopback gRPC connection.
type grpcFixture struct {
	svc *Service
	clk *fakeClock
	c   storepb.MasterClient
	ctx context.Context
}

// newGRPCFixture serves a fresh Service on 127.0.0.1 and dials it. The
// cleanups stop the server, close the connection and then check that no
// goroutine outlives them.
func newGRPCFixture(t *testing.T) *grpcFixture {
	t.Helper()
	// Registered first, so it runs after the other cleanups.
	t.Cleanup(func() { goleak.VerifyNone(t, zmqPubWriter) })

	svc, clk := newTestService(t, ServiceConfig{Shards: 8})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer()
	NewGRPCServer(svc).Register(srv)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	t.Cleanup(func() {
		srv.Stop()
		require.NoError(t, <-served)
	})

	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, conn.Close()) })

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return &grpcFixture{svc: svc, clk: clk, c: storepb.NewMasterClient(conn), ctx: ctx}
}

// mount mounts two 1 MiB segments for client "c1" over gRPC.
func (f *grpcFixture) mount(t *testing.T) {
	t.Helper()
	for _, sg := range []*storepb.Segment{seg("1", 0x10000000, 1<<20), seg("2", 0x20000000, 1<<20)} {
		res, err := f.c.MountSegment(f.ctx, &storepb.MountSegmentRequest{ClientId: "c1", Segment: sg})
		require.NoError(t, err)
		require.NoError(t, res.AsError())
	}
}

// put is PutStart + PutEnd over gRPC, with one replica.
func (f *grpcFixture) put(t *testing.T, key string) {
	t.Helper()
	ps, err := f.c.PutStart(f.ctx, &storepb.PutStartRequest{ClientId: "c1", Key: key, ValueLength: 64})
	require.NoError(t, err)
	require.NoError(t, ps.Result.AsError())
	res, err := f.c.PutEnd(f.ctx, &storepb.PutEndRequest{ClientId: "c1", Key: key})
	require.NoError(t, err)
	require.NoError(t, res.AsError())
}

func code(r *storepb.Result) storepb.Code { return storepb.Code(r.GetCode()) }

func TestGRPCPutGet(t *testing.T) {
	f := newGRPCFixture(t)
	f.mount(t)

	ps, err := f.c.PutStart(f.ctx, &storepb.PutStartRequest{
		ClientId: "c1", Key: "k", ValueLength: 4096,
		Config: &storepb.ReplicateConfig{ReplicaNum: 2},
	})
	require.NoError(t, err)
	require.NoError(t, ps.Result.AsError())
	require.Len(t, ps.Replicas, 2)
	assert.NotEqual(t, ps.Replicas[0].GetMemory().SegmentName, ps.Replicas[1].GetMemory().SegmentName,
		"replicas on distinct segments")

	// Not readable before PutEnd.
	gr, err := f.c.GetReplicaList(f.ctx, &storepb.KeyRequest{ClientId: "c1", Key: "k"})
	require.NoError(t, err)
	assert.Equal(t, storepb.ObjectNotFound, code(gr.Result))

	res, err := f.c.PutEnd(f.ctx, &storepb.PutEndRequest{ClientId: "c1", Key: "k", Checksum: 42})
	require.NoError(t, err)
	require.NoError(t, res.AsError())

	gr, err = f.c.GetReplicaList(f.ctx, &storepb.KeyRequest{ClientId: "c1", Key: "k"})
	require.NoError(t, err)
	require.NoError(t, gr.Result.AsError())
	require.Len(t, gr.Replicas, 2)
	assert.Equal(t, DefaultLeaseTTL.Milliseconds(), gr.LeaseTtlMs)
	assert.Equal(t, uint32(42), gr.Checksum)
	assert.Equal(t, uint64(4096), gr.ValueLength)
	want := map[uint64]bool{}
	for _, r := range ps.Replicas {
		want[r.GetMemory().BufferAddress] = true
	}
	for _, r := range gr.Replicas {
		assert.Equal(t, storepb.ReplicaStatus_REPLICA_STATUS_COMPLETE, r.Status)
		assert.True(t, want[r.GetMemory().BufferAddress], "replica %v was not put", r)
		assert.Equal(t, uint64(4096), r.GetMemory().Size)
	}

	res, err = f.c.ExistKey(f.ctx, &storepb.KeyRequest{Key: "k"})
	require.NoError(t, err)
	assert.Equal(t, storepb.OK, code(res))
}

func TestGRPCErrors(t *testing.T) {
	f := newGRPCFixture(t)
	f.mount(t)
	f.put(t, "have")
	f.clk.Advance(time.Minute) // past the lease the put's reads might hold

	tests := []struct {
		name string
		call func() (*storepb.Result, error)
		want storepb.Code
	}{
		// Reading a key never put.
		{"get missing", func() (*storepb.Result, error) {
			r, err := f.c.GetReplicaList(f.ctx, &storepb.KeyRequest{Key: "nope"})
			return r.GetResult(), err
		}, storepb.ObjectNotFound},
		// ExistKey answers OBJECT_NOT_FOUND rather than a boolean.
		{"exist missing", func() (*storepb.Result, error) {
			return f.c.ExistKey(f.ctx, &storepb.KeyRequest{Key: "nope"})
		}, storepb.ObjectNotFound},
		// Puts are write-once.
		{"put existing", func() (*storepb.Result, error) {
			r, err := f.c.PutStart(f.ctx, &storepb.PutStartRequest{ClientId: "c1", Key: "have", ValueLength: 8})
			return r.GetResult(), err
		}, storepb.ObjectAlreadyExists},
		// The empty key is refused by every key RPC.
		{"put empty key", func() (*storepb.Result, error) {
			r, err := f.c.PutStart(f.ctx, &storepb.PutStartRequest{ClientId: "c1", ValueLength: 8})
			return r.GetResult(), err
		}, storepb.InvalidParams},
		{"get empty key", func() (*storepb.Result, error) {
			r, err := f.c.GetReplicaList(f.ctx, &storepb.KeyRequest{})
			return r.GetResult(), err
		}, storepb.InvalidParams},
		{"exist empty key", func() (*storepb.Result, error) {
			return f.c.ExistKey(f.ctx, &storepb.KeyRequest{})
		}, storepb.InvalidParams},
		// PutEnd without a PutStart.
		{"end missing", func() (*storepb.Result, error) {
			return f.c.PutEnd(f.ctx, &storepb.PutEndRequest{ClientId: "c1", Key: "nope"})
		}, storepb.ObjectNotFound},
		// Removing a key never put.
		{"remove missing", func() (*storepb.Result, error) {
			return f.c.Remove(f.ctx, &storepb.RemoveRequest{Key: "nope"})
		}, storepb.ObjectNotFound},
		// Unmounting a segment nobody mounted.
		{"unmount unknown", func() (*storepb.Result, error) {
			return f.c.UnmountSegment(f.ctx, &storepb.UnmountSegmentRequest{ClientId: "c1", SegmentId: "9"})
		}, storepb.SegmentNotFound},
		// A segment without a size cannot be mounted.
		{"mount zero size", func() (*storepb.Result, error) {
			return f.c.MountSegment(f.ctx, &storepb.MountSegmentRequest{ClientId: "c1", Segment: seg("3", 0, 0)})
		}, storepb.InvalidParams},
		// A value bigger than any segment finds no space.
		{"put too big", func() (*storepb.Result, error) {
			r, err := f.c.PutStart(f.ctx, &storepb.PutStartRequest{ClientId: "c1", Key: "big", ValueLength: 4 << 20})
			return r.GetResult(), err
		}, storepb.NoAvailableHandle},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := tt.call()
			require.NoError(t, err, "store errors are Results, not gRPC errors")
			assert.Equal(t, tt.want, code(res), "message: %s", res.GetMessage())
			assert.ErrorIs(t, res.AsError(), &storepb.Error{Code: tt.want})
		})
	}
}

func TestGRPCBatch(t *testing.T) {
	f := newGRPCFixture(t)
	f.mount(t)
	f.put(t, "have")
	f.clk.Advance(time.Minute)

	tests := []struct {
		name string
		call func() ([]*storepb.Result, error)
		want []storepb.Code
	}{
		// A new key starts, an existing one and an empty one fail.
		{"put start", func() ([]*storepb.Result, error) {
			r, err := f.c.BatchPutStart(f.ctx, &storepb.BatchPutStartRequest{Items: []*storepb.PutStartRequest{
				{ClientId: "c1", Key: "a", ValueLength: 8},
				{ClientId: "c1", Key: "have", ValueLength: 8},
				{ClientId: "c1", Key: "", ValueLength: 8},
				{ClientId: "c1", Key: "b", ValueLength: 8},
			}})
			var out []*storepb.Result
			for _, it := range r.GetItems() {
				out = append(out, it.GetResult())
			}
			return out, err
		}, []storepb.Code{storepb.OK, storepb.ObjectAlreadyExists, storepb.InvalidParams, storepb.OK}},
		// Only the started keys end.
		{"put end", func() ([]*storepb.Result, error) {
			r, err := f.c.BatchPutEnd(f.ctx, &storepb.BatchPutEndRequest{Items: []*storepb.PutEndRequest{
				{ClientId: "c1", Key: "a"}, {ClientId: "c1", Key: "nope"},
			}})
			return r.GetResults(), err
		}, []storepb.Code{storepb.OK, storepb.ObjectNotFound}},
		// "b" is still in flight and can be revoked; "a" has ended.
		{"put revoke", func() ([]*storepb.Result, error) {
			r, err := f.c.BatchPutRevoke(f.ctx, &storepb.BatchKeyRequest{ClientId: "c1", Keys: []string{"b", "a"}})
			return r.GetResults(), err
		}, []storepb.Code{storepb.OK, storepb.ObjectNotFound}},
		// Upsert replaces an existing key and creates a new one.
		{"upsert start", func() ([]*storepb.Result, error) {
			r, err := f.c.BatchUpsertStart(f.ctx, &storepb.BatchPutStartRequest{Items: []*storepb.PutStartRequest{
				{ClientId: "c1", Key: "have", ValueLength: 16},
				{ClientId: "c1", Key: "", ValueLength: 16},
				{ClientId: "c1", Key: "c", ValueLength: 16},
			}})
			var out []*storepb.Result
			for _, it := range r.GetItems() {
				out = append(out, it.GetResult())
			}
			return out, err
		}, []storepb.Code{storepb.OK, storepb.InvalidParams, storepb.OK}},
		// Ends the upserts through the plain PutEnd.
		{"upsert end", func() ([]*storepb.Result, error) {
			r, err := f.c.BatchPutEnd(f.ctx, &storepb.BatchPutEndRequest{Items: []*storepb.PutEndRequest{
				{ClientId: "c1", Key: "have"}, {ClientId: "c1", Key: "c"},
			}})
			return r.GetResults(), err
		}, []storepb.Code{storepb.OK, storepb.OK}},
		// Readable keys answer replicas, the rest their own error.
		{"get replica list", func() ([]*storepb.Result, error) {
			r, err := f.c.BatchGetReplicaList(f.ctx, &storepb.BatchKeyRequest{Keys: []string{"a", "b", "", "have"}})
			var out []*storepb.Result
			for _, it := range r.GetItems() {
				if it.GetResult().GetCode() == 0 && len(it.Replicas) == 0 {
					t.Errorf("OK item without replicas: %v", it)
				}
				out = append(out, it.GetResult())
			}
			return out, err
		}, []storepb.Code{storepb.OK, storepb.ObjectNotFound, storepb.InvalidParams, storepb.OK}},
		// Code 0 for an existing key, ObjectNotFound otherwise.
		{"exist key", func() ([]*storepb.Result, error) {
			r, err := f.c.BatchExistKey(f.ctx, &storepb.BatchKeyRequest{Keys: []string{"a", "b", "c", ""}})
			return r.GetResults(), err
		}, []storepb.Code{storepb.OK, storepb.ObjectNotFound, storepb.OK, storepb.InvalidParams}},
		// The reads above leased "a"; without force it stays.
		{"remove leased", func() ([]*storepb.Result, error) {
			r, err := f.c.BatchRemove(f.ctx, &storepb.BatchRemoveRequest{Keys: []string{"a", "b"}})
			return r.GetResults(), err
		}, []storepb.Code{storepb.ObjectHasLease, storepb.ObjectNotFound}},
		// Force removes through the lease, once.
		{"remove forced", func() ([]*storepb.Result, error) {
			r, err := f.c.BatchRemove(f.ctx, &storepb.BatchRemoveRequest{Keys: []string{"a", "a"}, Force: true})
			return r.GetResults(), err
		}, []storepb.Code{storepb.OK, storepb.ObjectNotFound}},
		// An empty batch answers an empty list.
		{"empty", func() ([]*storepb.Result, error) {
			r, err := f.c.BatchExistKey(f.ctx, &storepb.BatchKeyRequest{})
			return r.GetResults(), err
		}, nil},
	}
	// The cases run in order: each builds on the state the last one left.
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := tt.call()
			require.NoError(t, err)
			got := make([]storepb.Code, len(res))
			for i, r := range res {
				got[i] = code(r)
			}
			assert.Equal(t, tt.want, slicesOrNil(got))
		})
	}
}

func slicesOrNil(c []storepb.Code) []storepb.Code {
	if len(c) == 0 {
		return nil
	}
	return c
}

func TestGRPCPing(t *testing.T) {
	f := newGRPCFixture(t)
	f.mount(t)

	tests := []struct {
		name   string
		client string
		want   storepb.ClientStatus
	}{
		// A client that mounted is known.
		{"mounted", "c1", storepb.ClientStatus_CLIENT_STATUS_OK},
		// One the master has never seen must remount.
		{"unknown", "stranger", storepb.ClientStatus_CLIENT_STATUS_NEED_REMOUNT},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := f.c.Ping(f.ctx, &storepb.PingRequest{ClientId: tt.client})
			require.NoError(t, err)
			require.NoError(t, r.Result.AsError())
			assert.Equal(t, tt.want, r.ClientStatus)
		})
	}

	// After the remount the stranger is known.
	res, err := f.c.ReMountSegment(f.ctx, &storepb.ReMountSegmentRequest{
		ClientId: "stranger", Segments: []*storepb.Segment{seg("7", 0x70000000, 1<<20)}})
	require.NoError(t, err)
	require.NoError(t, res.AsError())
	r, err := f.c.Ping(f.ctx, &storepb.PingRequest{ClientId: "stranger"})
	require.NoError(t, err)
	assert.Equal(t, storepb.ClientStatus_CLIENT_STATUS_OK, r.ClientStatus)
	assert.Equal(t, 3, f.svc.Stats().Segments)

	// Unmounting is refused to another client and allowed to the owner.
	res, err = f.c.UnmountSegment(f.ctx, &storepb.UnmountSegmentRequest{ClientId: "c1", SegmentId: "7"})
	require.NoError(t, err)
	assert.Equal(t, storepb.InvalidParams, code(res))
	res, err = f.c.UnmountSegment(f.ctx, &storepb.UnmountSegmentRequest{ClientId: "stranger", SegmentId: "7"})
	require.NoError(t, err)
	require.NoError(t, res.AsError())
	assert.Equal(t, 2, f.svc.Stats().Segments)
}

func TestGRPCRemoveAll(t *testing.T) {
	f := newGRPCFixture(t)
	f.mount(t)
	for _, k := range []string{"x", "y", "z"} {
		f.put(t, k)
	}
	// A put in flight is not a readable object and is not counted.
	ps, err := f.c.PutStart(f.ctx, &storepb.PutStartRequest{ClientId: "c1", Key: "pending", ValueLength: 8})
	require.NoError(t, err)
	require.NoError(t, ps.Result.AsError())
	// Lease "x".
	res, err := f.c.ExistKey(f.ctx, &storepb.KeyRequest{Key: "x"})
	require.NoError(t, err)
	require.NoError(t, res.AsError())

	tests := []struct {
		name  string
		force bool
		want  int64
	}{
		// The leased "x" survives an unforced RemoveAll.
		{"unforced", false, 2},
		// Force takes it.
		{"forced", true, 1},
		// Nothing readable is left.
		{"again", true, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := f.c.RemoveAll(f.ctx, &storepb.RemoveAllRequest{Force: tt.force})
			require.NoError(t, err)
			require.NoError(t, r.Result.AsError())
			assert.Equal(t, tt.want, r.Removed)
		})
	}
	assert.Equal(t, 0, f.svc.Stats().Keys)
}

func TestGRPCRemoveByRegex(t *testing.T) {
	f := newGRPCFixture(t)
	f.mount(t)
	for _, k := range []string{"blk/1", "blk/2", "blk/3", "other/blk/1", "keep"} {
		f.put(t, k)
	}
	// A put in flight is not a readable object and stays.
	ps, err := f.c.PutStart(f.ctx, &storepb.PutStartRequest{ClientId: "c1", Key: "blk/pending", ValueLength: 8})
	require.NoError(t, err)
	require.NoError(t, ps.Result.AsError())
	// Lease "blk/1".
	res, err := f.c.ExistKey(f.ctx, &storepb.KeyRequest{Key: "blk/1"})
	require.NoError(t, err)
	require.NoError(t, res.AsError())

	tests := []struct {
		name  string
		regex string
		force bool
		want  int64
		code  storepb.Code
	}{
		// The leased blk/1 survives an unforced removal.
		{"prefix unforced", "^blk/", false, 2, storepb.OK},
		{"prefix forced", "^blk/", true, 1, storepb.OK},
		// Unanchored: matches anywhere in the key.
		{"anywhere", "blk/[0-9]+$", true, 1, storepb.OK},
		{"no match", "^nothing", true, 0, storepb.OK},
		{"bad pattern", "blk/(", true, 0, storepb.InvalidParams},
		{"empty pattern", "", true, 0, storepb.InvalidParams},
		{"oversized pattern", strings.Repeat("a", MaxRegexLen+1), true, 0, storepb.InvalidParams},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := f.c.RemoveByRegex(f.ctx, &storepb.RemoveByRegexRequest{Regex: tt.regex, Force: tt.force})
			require.NoError(t, err)
			assert.Equal(t, tt.code, storepb.Code(r.Result.GetCode()), r.Result.GetMessage())
			assert.Equal(t, tt.want, r.Removed)
		})
	}
	ok, err := f.svc.ExistKey("keep")
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Equal(t, 1, f.svc.Stats().Keys) // keep
}

// A nil request cannot come off the wire, but an in-process caller can pass
// one: it is the only gRPC status error the server returns.
func TestGRPCNilRequest(t *testing.T) {
	svc, _ := newTestService(t, ServiceConfig{Shards: 1})
	g := NewGRPCServer(svc)
	ctx := context.Background()
	calls := []struct {
		name string
		call func() error
	}{
		{"PutStart", func() error { _, err := g.PutStart(ctx, nil); return err }},
		{"PutEnd", func() error { _, err := g.PutEnd(ctx, nil); return err }},
		{"PutRevoke", func() error { _, err := g.PutRevoke(ctx, nil); return err }},
		{"BatchPutStart", func() error { _, err := g.BatchPutStart(ctx, nil); return err }},
		{"BatchPutEnd", func() error { _, err := g.BatchPutEnd(ctx, nil); return err }},
		{"BatchPutRevoke", func() error { _, err := g.BatchPutRevoke(ctx, nil); return err }},
		{"UpsertStart", func() error { _, err := g.UpsertStart(ctx, nil); return err }},
		{"BatchUpsertStart", func() error { _, err := g.BatchUpsertStart(ctx, nil); return err }},
		{"GetReplicaList", func() error { _, err := g.GetReplicaList(ctx, nil); return err }},
		{"BatchGetReplicaList", func() error { _, err := g.BatchGetReplicaList(ctx, nil); return err }},
		{"ExistKey", func() error { _, err := g.ExistKey(ctx, nil); return err }},
		{"BatchExistKey", func() error { _, err := g.BatchExistKey(ctx, nil); return err }},
		{"Remove", func() error { _, err := g.Remove(ctx, nil); return err }},
		{"BatchRemove", func() error { _, err := g.BatchRemove(ctx, nil); return err }},
		{"RemoveAll", func() error { _, err := g.RemoveAll(ctx, nil); return err }},
		{"RemoveByRegex", func() error { _, err := g.RemoveByRegex(ctx, nil); return err }},
		{"MountSegment", func() error { _, err := g.MountSegment(ctx, nil); return err }},
		{"ReMountSegment", func() error { _, err := g.ReMountSegment(ctx, nil); return err }},
		{"UnmountSegment", func() error { _, err := g.UnmountSegment(ctx, nil); return err }},
		{"Ping", func() error { _, err := g.Ping(ctx, nil); return err }},
	}
	for _, c := range calls {
		assert.Equal(t, codes.InvalidArgument, status.Code(c.call()), c.name)
	}

	// A nil item inside a batch is an empty key: that item fails alone.
	r, err := g.BatchPutStart(ctx, &storepb.BatchPutStartRequest{Items: []*storepb.PutStartRequest{nil}})
	require.NoError(t, err)
	require.Len(t, r.Items, 1)
	assert.Equal(t, storepb.InvalidParams, code(r.Items[0].Result))
	br, err := g.BatchPutEnd(ctx, &storepb.BatchPutEndRequest{Items: []*storepb.PutEndRequest{nil}})
	require.NoError(t, err)
	assert.Equal(t, storepb.InvalidParams, code(br.Results[0]))
}
