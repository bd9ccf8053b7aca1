package master

import (
	"context"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/mooncake-go/mooncake/store/storepb"
)

// fuzzHandler decodes a request of type R and hands it to a handler of the
// master's services; what it answers does not matter, only that it does.
type fuzzHandler func(g *GRPCServer, ctx context.Context, b []byte)

func handle[R any, PR interface {
	*R
	proto.Message
}, A any](h func(*GRPCServer, context.Context, PR) (A, error)) fuzzHandler {
	return func(g *GRPCServer, ctx context.Context, b []byte) {
		req := PR(new(R))
		if proto.Unmarshal(b, req) == nil {
			_, _ = h(g, ctx, req)
		}
	}
}

// fuzzHandlers is every unary call of the Master and Tier services a
// client may make, by the byte that picks it in FuzzMasterCalls' input.
var fuzzHandlers = []fuzzHandler{
	handle((*GRPCServer).PutStart),
	handle((*GRPCServer).PutEnd),
	handle((*GRPCServer).PutRevoke),
	handle((*GRPCServer).BatchPutStart),
	handle((*GRPCServer).BatchPutEnd),
	handle((*GRPCServer).BatchPutRevoke),
	handle((*GRPCServer).PutReserve),
	handle((*GRPCServer).BatchPutCommit),
	handle((*GRPCServer).UpsertStart),
	handle((*GRPCServer).BatchUpsertStart),
	handle((*GRPCServer).GetReplicaList),
	handle((*GRPCServer).BatchGetReplicaList),
	handle((*GRPCServer).ExistKey),
	handle((*GRPCServer).BatchExistKey),
	handle((*GRPCServer).Remove),
	handle((*GRPCServer).BatchRemove),
	handle((*GRPCServer).RemoveAll),
	handle((*GRPCServer).RemoveByRegex),
	handle((*GRPCServer).MountSegment),
	handle((*GRPCServer).ReMountSegment),
	handle((*GRPCServer).UnmountSegment),
	handle((*GRPCServer).Ping),
	handle((*GRPCServer).MoveEnd),
	handle((*GRPCServer).JournalFetch),
	handle((*GRPCServer).JournalTail),
	handle(func(g *GRPCServer, ctx context.Context, req *storepb.MountDiskRequest) (*storepb.MountDiskResponse, error) {
		return (&TierServer{g: g}).MountDisk(ctx, req)
	}),
}

// FuzzMasterCalls sends a master arbitrary requests, as any client on the
// network may, in arbitrary order, with time passing between them: every
// call answers (an error or a result) and never panics, the master's
// background work runs after them, and the pool's accounting and eviction
// order stay whole. Input: calls of [method, length, length bytes of
// request]; a method byte with its top bit set lets a second pass first.
func FuzzMasterCalls(f *testing.F) {
	add := func(calls ...[]byte) {
		var in []byte
		for _, c := range calls {
			in = append(in, c...)
		}
		f.Add(in)
	}
	call := func(method int, req proto.Message) []byte {
		b, _ := proto.Marshal(req)
		return append([]byte{byte(method), byte(len(b))}, b...)
	}
	start := &storepb.PutStartRequest{ClientId: "c1", Key: "k", ValueLength: 4096, Config: &storepb.ReplicateConfig{ReplicaNum: 2}}
	add(call(0, start), call(1, &storepb.PutEndRequest{ClientId: "c1", Key: "k", Checksum: 7}),
		call(10, &storepb.KeyRequest{Key: "k"}), call(14, &storepb.RemoveRequest{Key: "k"}))
	add(call(6, &storepb.PutReserveRequest{ClientId: "c1", ValueLength: 4096, Count: 4, Packed: true}),
		call(7, &storepb.BatchPutCommitRequest{ClientId: "c1", Items: []*storepb.PutCommitItem{{Slot: slotPrefix + "1", Key: "a"}}}),
		call(0x80|20, &storepb.UnmountSegmentRequest{ClientId: "c2", SegmentId: "2"}))
	add(call(18, &storepb.MountSegmentRequest{ClientId: "c3", Segment: seg("3", 3<<32, 1<<20)}),
		call(3, &storepb.BatchPutStartRequest{Items: []*storepb.PutStartRequest{start, {ClientId: "c3", Key: "s", ValueLength: 3 << 20,
			Config: &storepb.ReplicateConfig{StripeCount: 3}}}}),
		call(22, &storepb.MoveEndRequest{ClientId: "c1", TaskId: 1, Ok: true}))
	f.Fuzz(func(t *testing.T, in []byte) {
		s, clk := newTestService(t, ServiceConfig{})
		mountN(t, s, 2, 1<<20)
		g := NewGRPCServer(s)
		for len(in) >= 2 {
			m, n := in[0], int(in[1])
			b := in[2:min(len(in), 2+n)]
			in = in[min(len(in), 2+n):]
			if m&0x80 != 0 {
				clk.Advance(2 * time.Second)
			}
			fuzzHandlers[int(m&0x7f)%len(fuzzHandlers)](g, t.Context(), b)
		}
		clk.Advance(time.Minute)
		s.ReclaimPuts()
		s.evict(true)
		s.stepDrains()
		checkNoOverlap(t, s)
		checkEvictOrder(t, s)
	})
}
