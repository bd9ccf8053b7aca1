package master

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/mooncake-go/mooncake/store/storepb"
)

// GRPCServer serves the storepb.Master gRPC service over a Service.
//
// Store errors travel in the responses' Result (Mooncake's ErrorCode
// numbers), never as gRPC status errors, so that a batch can fail item by
// item and a client tells "the master said no" from "the RPC failed". The
// only status error is InvalidArgument for a nil request, which the gRPC
// codec never produces but a direct in-process caller can.
type GRPCServer struct {
	storepb.UnimplementedMasterServer
	svc      atomic.Pointer[Service]
	standby  atomic.Bool
	watchers atomic.Int32              // WatchObjects streams being served
	tails    atomic.Pointer[tailStore] // a standby's fetched records (HA)
}

var _ storepb.MasterServer = (*GRPCServer)(nil)

// NewGRPCServer returns a GRPCServer over s. It holds no state of its own:
// s may be served by several GRPCServers and used directly at the same time.
func NewGRPCServer(s *Service) *GRPCServer {
	g := &GRPCServer{}
	g.svc.Store(s)
	return g
}

// serve switches g to s; nil makes every new call fail with
// codes.Unavailable, as a standby master answers. Calls already running
// finish on the service they started on.
func (g *GRPCServer) serve(s *Service) {
	if s == nil {
		g.standby.Store(true)
		return
	}
	g.svc.Store(s)
	g.standby.Store(false)
}

// unaryStandby answers codes.Unavailable while g is on standby, so that
// clients look for the leader elsewhere.
func (g *GRPCServer) unaryStandby(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if (g.standby.Load() || g.svc.Load() == nil) && info.FullMethod != storepb.Master_JournalTail_FullMethodName {
		return nil, status.Error(codes.Unavailable, "master: standby, not the leader")
	}
	return h(ctx, req)
}

// JournalFetch serves a standby the leader's records (replicate.go).
func (g *GRPCServer) JournalFetch(ctx context.Context, req *storepb.JournalFetchRequest) (*storepb.JournalFetchResponse, error) {
	if req == nil {
		return nil, errNilRequest
	}
	j, ok := g.svc.Load().j.(*etcdJournal)
	if !ok || req.Standby == "" {
		return nil, status.Error(codes.FailedPrecondition, "master: no journal to fetch, or no standby named")
	}
	wait := min(time.Duration(req.WaitMs)*time.Millisecond, 5*time.Second)
	first, recs, behind, err := j.fetch(ctx, req.Standby, req.Addr, req.Term, req.After, wait)
	if err != nil {
		return nil, status.Error(codes.FailedPrecondition, err.Error())
	}
	resp := &storepb.JournalFetchResponse{Behind: behind, Term: j.term}
	if len(recs) > 0 {
		if resp.Batch, err = proto.Marshal(&storepb.JournalBatch{FirstSeq: first, Records: recs}); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
	}
	return resp, nil
}

// JournalTail hands a new leader the records this standby fetched under
// a designation (replicate.go). Served on standby.
func (g *GRPCServer) JournalTail(ctx context.Context, req *storepb.JournalTailRequest) (*storepb.JournalTailResponse, error) {
	if req == nil {
		return nil, errNilRequest
	}
	t := g.tails.Load()
	if t == nil {
		return &storepb.JournalTailResponse{}, nil
	}
	first, recs := t.take(req.Designation)
	resp := &storepb.JournalTailResponse{}
	if len(recs) > 0 {
		resp.Batch = encodeBatch(first, recs)
	}
	return resp, nil
}

// Register registers g as the Master service of srv.
func (g *GRPCServer) Register(srv grpc.ServiceRegistrar) { storepb.RegisterMasterServer(srv, g) }

var errNilRequest = status.Error(codes.InvalidArgument, "master: nil request")

// checkBatch refuses a batch of n keys over ServiceConfig.MaxBatch.
func (s *Service) checkBatch(n int) error {
	if n > s.cfg.MaxBatch {
		return status.Errorf(codes.InvalidArgument, "master: batch of %d keys is over the limit of %d keys (max_batch_size)",
			n, s.cfg.MaxBatch)
	}
	return nil
}

// checkBatchPut refuses a batch put over ServiceConfig.MaxBatch, or whose
// values add up to more than ServiceConfig.MaxBatchValueBytes.
func (s *Service) checkBatchPut(items []*storepb.PutStartRequest) error {
	if err := s.checkBatch(len(items)); err != nil {
		return err
	}
	var total uint64
	for _, it := range items {
		// No wrap-around: a sum past the limit is refused as soon as it is.
		if total += it.GetValueLength(); total > s.cfg.MaxBatchValueBytes || total < it.GetValueLength() {
			return status.Errorf(codes.InvalidArgument, "master: batch put of more than %d value bytes is over the limit (max_batch_value_size)",
				s.cfg.MaxBatchValueBytes)
		}
	}
	return nil
}

// putStart is one PutStart or UpsertStart item. A nil item reads as an
// empty key and so answers InvalidParams.
func (g *GRPCServer) putStart(ctx context.Context, t string, req *storepb.PutStartRequest, upsert bool) *storepb.PutStartResponse {
	start := g.svc.Load().PutStart
	if upsert {
		start = g.svc.Load().UpsertStart
	}
	reps, err := start(ctx, req.GetClientId(), scopeKey(t, req.GetKey()), req.GetValueLength(), req.GetConfig())
	return &storepb.PutStartResponse{Result: storepb.NewResult(err), Replicas: reps}
}

func (g *GRPCServer) getReplicaList(key string) *storepb.GetReplicaListResponse {
	reps, ttl, sum, n, err := g.svc.Load().GetReplicaList(key)
	if err != nil {
		return &storepb.GetReplicaListResponse{Result: storepb.NewResult(err)}
	}
	return &storepb.GetReplicaListResponse{
		Result: storepb.NewResult(nil), Replicas: reps,
		LeaseTtlMs: ttl.Milliseconds(), Checksum: sum, ValueLength: n,
	}
}

// existKey is OK when key is readable and ObjectNotFound when it is not,
// as Mooncake's ExistKey; an invalid key is InvalidParams.
func (g *GRPCServer) existKey(key string) *storepb.Result {
	ok, err := g.svc.Load().ExistKey(key)
	switch {
	case err != nil:
		return storepb.NewResult(err)
	case !ok:
		return storepb.NewResult(storeErr(storepb.ObjectNotFound, "%q", clientKey(key)))
	}
	return storepb.NewResult(nil)
}

// batchDurable answers one Result per item of n, running f on each
// without waiting for its journal record, then waiting once for them all:
// items that succeeded fail together if the journal does.
func batchDurable(ctx context.Context, svc *Service, n int, f func(i int) (uint64, error)) []*storepb.Result {
	out := make([]*storepb.Result, n)
	oks := make([]storepb.Result, n) // one allocation for the usual answers
	var last uint64
	for i := range n {
		seq, err := f(i)
		if out[i] = &oks[i]; err != nil {
			out[i] = storepb.NewResult(err)
		}
		last = max(last, seq)
	}
	if err := svc.durable(ctx, last); err != nil {
		for i, r := range out {
			if r.Code == int32(storepb.OK) {
				out[i] = storepb.NewResult(err)
			}
		}
	}
	return out
}

// PutStart reserves the replicas of a new object; see Service.PutStart.
func (g *GRPCServer) PutStart(ctx context.Context, req *storepb.PutStartRequest) (*storepb.PutStartResponse, error) {
	if req == nil {
		return nil, errNilRequest
	}
	t, err := callerTenant(ctx)
	if err != nil {
		return nil, err
	}
	return g.putStart(ctx, t, req, false), nil
}

// PutEnd makes a started object readable; see Service.PutEnd.
func (g *GRPCServer) PutEnd(ctx context.Context, req *storepb.PutEndRequest) (*storepb.Result, error) {
	if req == nil {
		return nil, errNilRequest
	}
	t, err := callerTenant(ctx)
	if err != nil {
		return nil, err
	}
	return storepb.NewResult(g.svc.Load().PutEnd(ctx, req.ClientId, scopeKey(t, req.Key), req.Checksum)), nil
}

// PutRevoke gives a started object's space back; see Service.PutRevoke.
func (g *GRPCServer) PutRevoke(ctx context.Context, req *storepb.KeyRequest) (*storepb.Result, error) {
	if req == nil {
		return nil, errNilRequest
	}
	t, err := callerTenant(ctx)
	if err != nil {
		return nil, err
	}
	return storepb.NewResult(g.svc.Load().PutRevoke(ctx, req.ClientId, scopeKey(t, req.Key))), nil
}

// BatchPutStart is PutStart per item, one response per item.
func (g *GRPCServer) BatchPutStart(ctx context.Context, req *storepb.BatchPutStartRequest) (*storepb.BatchPutStartResponse, error) {
	if req == nil {
		return nil, errNilRequest
	}
	t, err := callerTenant(ctx)
	if err != nil {
		return nil, err
	}
	if err := g.svc.Load().checkBatchPut(req.Items); err != nil {
		return nil, err
	}
	return g.batchPutStart(ctx, t, req, false), nil
}

// batchPutStart starts every item, then waits once for their records.
func (g *GRPCServer) batchPutStart(ctx context.Context, t string, req *storepb.BatchPutStartRequest, upsert bool) *storepb.BatchPutStartResponse {
	svc := g.svc.Load()
	out := &storepb.BatchPutStartResponse{Items: make([]*storepb.PutStartResponse, len(req.Items))}
	results := batchDurable(ctx, svc, len(req.Items), func(i int) (uint64, error) {
		it := req.Items[i]
		reps, seq, err := svc.startSeq(ctx, it.GetClientId(), scopeKey(t, it.GetKey()), it.GetValueLength(), it.GetConfig(), upsert)
		out.Items[i] = &storepb.PutStartResponse{}
		if err == nil {
			out.Items[i].Replicas = describeLive(reps)
		}
		return seq, err
	})
	for i, r := range results {
		out.Items[i].Result = r
		if r.Code != int32(storepb.OK) {
			out.Items[i].Replicas = nil
		}
	}
	return out
}

// BatchPutEnd is PutEnd per item, one Result per item.
func (g *GRPCServer) BatchPutEnd(ctx context.Context, req *storepb.BatchPutEndRequest) (*storepb.BatchResult, error) {
	if req == nil {
		return nil, errNilRequest
	}
	t, err := callerTenant(ctx)
	if err != nil {
		return nil, err
	}
	svc := g.svc.Load()
	if err := svc.checkBatch(len(req.Items)); err != nil {
		return nil, err
	}
	return &storepb.BatchResult{Results: batchDurable(ctx, svc, len(req.Items), func(i int) (uint64, error) {
		it := req.Items[i]
		return svc.putEndSeq(it.GetClientId(), scopeKey(t, it.GetKey()), it.GetChecksum())
	})}, nil
}

// BatchPutRevoke is PutRevoke per key, one Result per key.
func (g *GRPCServer) BatchPutRevoke(ctx context.Context, req *storepb.BatchKeyRequest) (*storepb.BatchResult, error) {
	if req == nil {
		return nil, errNilRequest
	}
	t, err := callerTenant(ctx)
	if err != nil {
		return nil, err
	}
	svc := g.svc.Load()
	if err := svc.checkBatch(len(req.Keys)); err != nil {
		return nil, err
	}
	return &storepb.BatchResult{Results: batchDurable(ctx, svc, len(req.Keys), func(i int) (uint64, error) {
		return svc.revokeSeq(req.ClientId, scopeKey(t, req.Keys[i]))
	})}, nil
}

// UpsertStart is PutStart that may replace an existing object; see
// Service.UpsertStart. The client finishes it with PutEnd or PutRevoke.
func (g *GRPCServer) UpsertStart(ctx context.Context, req *storepb.PutStartRequest) (*storepb.PutStartResponse, error) {
	if req == nil {
		return nil, errNilRequest
	}
	t, err := callerTenant(ctx)
	if err != nil {
		return nil, err
	}
	return g.putStart(ctx, t, req, true), nil
}

// BatchUpsertStart is UpsertStart per item, one response per item.
func (g *GRPCServer) BatchUpsertStart(ctx context.Context, req *storepb.BatchPutStartRequest) (*storepb.BatchPutStartResponse, error) {
	if req == nil {
		return nil, errNilRequest
	}
	t, err := callerTenant(ctx)
	if err != nil {
		return nil, err
	}
	if err := g.svc.Load().checkBatchPut(req.Items); err != nil {
		return nil, err
	}
	return g.batchPutStart(ctx, t, req, true), nil
}

// GetReplicaList returns the complete replicas of a key and grants a lease;
// see Service.GetReplicaList.
func (g *GRPCServer) GetReplicaList(ctx context.Context, req *storepb.KeyRequest) (*storepb.GetReplicaListResponse, error) {
	if req == nil {
		return nil, errNilRequest
	}
	t, err := callerTenant(ctx)
	if err != nil {
		return nil, err
	}
	return g.getReplicaList(scopeKey(t, req.Key)), nil
}

// BatchGetReplicaList is GetReplicaList per key, one response per key.
func (g *GRPCServer) BatchGetReplicaList(ctx context.Context, req *storepb.BatchKeyRequest) (*storepb.BatchGetReplicaListResponse, error) {
	if req == nil {
		return nil, errNilRequest
	}
	t, err := callerTenant(ctx)
	if err != nil {
		return nil, err
	}
	if err := g.svc.Load().checkBatch(len(req.Keys)); err != nil {
		return nil, err
	}
	out := &storepb.BatchGetReplicaListResponse{Items: make([]*storepb.GetReplicaListResponse, len(req.Keys))}
	for i, k := range req.Keys {
		out.Items[i] = g.getReplicaList(scopeKey(t, k))
	}
	return out, nil
}

// ExistKey answers OK when the key is readable, ObjectNotFound when not.
func (g *GRPCServer) ExistKey(ctx context.Context, req *storepb.KeyRequest) (*storepb.Result, error) {
	if req == nil {
		return nil, errNilRequest
	}
	t, err := callerTenant(ctx)
	if err != nil {
		return nil, err
	}
	return g.existKey(scopeKey(t, req.Key)), nil
}

// BatchExistKey is ExistKey per key, one Result per key.
func (g *GRPCServer) BatchExistKey(ctx context.Context, req *storepb.BatchKeyRequest) (*storepb.BatchResult, error) {
	if req == nil {
		return nil, errNilRequest
	}
	t, err := callerTenant(ctx)
	if err != nil {
		return nil, err
	}
	if err := g.svc.Load().checkBatch(len(req.Keys)); err != nil {
		return nil, err
	}
	out := &storepb.BatchResult{Results: make([]*storepb.Result, len(req.Keys))}
	for i, k := range req.Keys {
		out.Results[i] = g.existKey(scopeKey(t, k))
	}
	return out, nil
}

// Remove deletes a readable object; see Service.Remove.
func (g *GRPCServer) Remove(ctx context.Context, req *storepb.RemoveRequest) (*storepb.Result, error) {
	if req == nil {
		return nil, errNilRequest
	}
	t, err := callerTenant(ctx)
	if err != nil {
		return nil, err
	}
	return storepb.NewResult(g.svc.Load().Remove(ctx, scopeKey(t, req.Key), req.Force)), nil
}

// BatchRemove is Remove per key, one Result per key.
func (g *GRPCServer) BatchRemove(ctx context.Context, req *storepb.BatchRemoveRequest) (*storepb.BatchResult, error) {
	if req == nil {
		return nil, errNilRequest
	}
	t, err := callerTenant(ctx)
	if err != nil {
		return nil, err
	}
	svc := g.svc.Load()
	if err := svc.checkBatch(len(req.Keys)); err != nil {
		return nil, err
	}
	return &storepb.BatchResult{Results: batchDurable(ctx, svc, len(req.Keys), func(i int) (uint64, error) {
		return svc.removeSeq(scopeKey(t, req.Keys[i]), req.Force)
	})}, nil
}

// RemoveAll removes every readable object of the caller's tenant and says
// how many.
func (g *GRPCServer) RemoveAll(ctx context.Context, req *storepb.RemoveAllRequest) (*storepb.RemoveAllResponse, error) {
	if req == nil {
		return nil, errNilRequest
	}
	t, err := callerTenant(ctx)
	if err != nil {
		return nil, err
	}
	n, err := g.svc.Load().RemoveTenant(ctx, t, req.Force)
	return &storepb.RemoveAllResponse{Result: storepb.NewResult(err), Removed: int64(n)}, nil
}

// RemoveByRegex removes the readable objects whose key matches a pattern
// and says how many.
func (g *GRPCServer) RemoveByRegex(ctx context.Context, req *storepb.RemoveByRegexRequest) (*storepb.RemoveAllResponse, error) {
	if req == nil {
		return nil, errNilRequest
	}
	t, err := callerTenant(ctx)
	if err != nil {
		return nil, err
	}
	n, err := g.svc.Load().RemoveTenantByRegex(ctx, t, req.Regex, req.Force)
	return &storepb.RemoveAllResponse{Result: storepb.NewResult(err), Removed: int64(n)}, nil
}

// MountSegment adds a client's segment to the pool.
func (g *GRPCServer) MountSegment(ctx context.Context, req *storepb.MountSegmentRequest) (*storepb.Result, error) {
	if req == nil {
		return nil, errNilRequest
	}
	return storepb.NewResult(g.svc.Load().MountSegment(ctx, req.ClientId, req.Segment)), nil
}

// ReMountSegment mounts a client's segments again after NEED_REMOUNT.
func (g *GRPCServer) ReMountSegment(ctx context.Context, req *storepb.ReMountSegmentRequest) (*storepb.Result, error) {
	if req == nil {
		return nil, errNilRequest
	}
	return storepb.NewResult(g.svc.Load().ReMountSegment(ctx, req.ClientId, req.Segments, req.Again)), nil
}

// UnmountSegment removes a segment and the replicas on it.
func (g *GRPCServer) UnmountSegment(ctx context.Context, req *storepb.UnmountSegmentRequest) (*storepb.Result, error) {
	if req == nil {
		return nil, errNilRequest
	}
	return storepb.NewResult(g.svc.Load().UnmountSegment(ctx, req.ClientId, req.SegmentId)), nil
}

// Ping records a client as alive; an unknown client is told to remount.
func (g *GRPCServer) Ping(ctx context.Context, req *storepb.PingRequest) (*storepb.PingResponse, error) {
	if req == nil {
		return nil, errNilRequest
	}
	v, st, tasks := g.svc.Load().PingTasks(ctx, req.ClientId)
	return &storepb.PingResponse{Result: storepb.NewResult(nil), ViewVersion: v, ClientStatus: st, Tasks: tasks}, nil
}

// MoveEnd reports a spill or promotion done or failed; see Service.MoveEnd.
func (g *GRPCServer) MoveEnd(ctx context.Context, req *storepb.MoveEndRequest) (*storepb.Result, error) {
	if req == nil {
		return nil, errNilRequest
	}
	return storepb.NewResult(g.svc.Load().MoveEnd(ctx, req.ClientId, req.TaskId, req.Ok)), nil
}

// watchBatch is the most events one WatchObjectsResponse carries.
const watchBatch = 1024

// WatchObjects streams the readable keys, then their changes as they
// happen (Service.Watch), in batches of what has piled up. It ends with
// Unavailable on a standby or when the master stops leading, with
// ResourceExhausted when the watcher fell too far behind.
func (g *GRPCServer) WatchObjects(_ *storepb.WatchObjectsRequest, stream grpc.ServerStreamingServer[storepb.WatchObjectsResponse]) error {
	svc := g.svc.Load()
	if g.standby.Load() || svc == nil {
		return status.Error(codes.Unavailable, "master: standby, not the leader")
	}
	defer g.watchers.Add(-1)
	if n := g.watchers.Add(1); int(n) > svc.cfg.MaxWatchers {
		return status.Errorf(codes.ResourceExhausted, "master: %d WatchObjects streams open, the limit (max_watchers)",
			svc.cfg.MaxWatchers)
	}
	t, err := callerTenant(stream.Context())
	if err != nil {
		return err
	}
	w, keys := svc.Watch(0)
	defer w.Close()
	keys = tenantKeys(t, keys)
	for {
		n := min(len(keys), watchBatch)
		resp := &storepb.WatchObjectsResponse{Events: make([]*storepb.ObjectEvent, n), Synced: n == len(keys)}
		for i, k := range keys[:n] {
			resp.Events[i] = &storepb.ObjectEvent{Kind: storepb.ObjectEventKind_OBJECT_EVENT_KIND_PUT, Key: k}
		}
		if err := stream.Send(resp); err != nil {
			return err
		}
		if keys = keys[n:]; len(keys) == 0 {
			break
		}
	}
	ctx := stream.Context()
	for {
		var ev ObjectEvent
		select {
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-w.Done():
			if errors.Is(w.Err(), ErrWatchBehind) {
				return status.Error(codes.ResourceExhausted, w.Err().Error())
			}
			return status.Error(codes.Unavailable, ErrWatchEnded.Error())
		case ev = <-w.Events():
		}
		// With what else has piled up.
		resp := &storepb.WatchObjectsResponse{}
		add := func(ev ObjectEvent) {
			if tt, k := splitKey(ev.Key); tt == t { // other tenants' keys are not the watcher's to see
				resp.Events = append(resp.Events, &storepb.ObjectEvent{Kind: ev.Kind, Key: k})
			}
		}
		add(ev)
	more:
		for len(resp.Events) < watchBatch {
			select {
			case ev = <-w.Events():
				add(ev)
			default:
				break more
			}
		}
		if len(resp.Events) == 0 {
			continue
		}
		if err := stream.Send(resp); err != nil {
			return err
		}
	}
}
