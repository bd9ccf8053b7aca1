package main

/*
#include "mooncake.h"
*/
import "C"

import (
	"context"
	"unsafe"

	"github.com/mooncake-go/mooncake/store/client"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// Ranged reads, get sessions and replica descriptors (ABI 1.3):
// mc_store_batch_get_ranges, mc_store_batch_get_session_start/_end and
// mc_store_get_replicas; put sessions (ABI 1.4). The public wrappers are
// in store_ext.c.

// rangesAt views the ranges of count keys: the buffers, lengths and
// counts as partsAt reads them, with an offset in the value per buffer
// (offName names that array in errors). Range.Src is the offset.
func rangesAt(bufs *unsafe.Pointer, lens, srcs *C.uint64_t, counts *C.size_t, count C.size_t, offName string) ([][]client.Range, error) {
	dsts, err := partsAt(bufs, lens, counts, count)
	if err != nil {
		return nil, err
	}
	total := 0
	for _, ds := range dsts {
		total += len(ds)
	}
	if total > 0 && srcs == nil {
		return nil, nullArg(offName)
	}
	var flat []C.uint64_t
	if total > 0 {
		flat = unsafe.Slice(srcs, total)
	}
	out := make([][]client.Range, len(dsts))
	j := 0
	for i, ds := range dsts {
		rs := make([]client.Range, len(ds))
		for k, d := range ds {
			rs[k] = client.Range{Src: uint64(flat[j]), Dst: d}
			j++
		}
		out[i] = rs
	}
	return out, nil
}

//export mcgoStoreBatchGetRanges
func mcgoStoreBatchGetRanges(h C.mc_store_t, keys **C.char, bufs *unsafe.Pointer, lens *C.uint64_t, srcOffsets *C.uint64_t,
	rangeCounts *C.size_t, count C.size_t, lensOut *C.uint64_t, codesOut *C.mc_status_t, cerr *C.mc_error_t) C.mc_status_t {
	return batchCall(h, keys, count, codesOut, cerr, func(s *storeObj, ks []string) (func(context.Context) []error, error) {
		rs, err := rangesAt(bufs, lens, srcOffsets, rangeCounts, count, "src_offsets")
		return func(ctx context.Context) []error {
			ns, errs := s.BatchGetRanges(ctx, ks, rs)
			lensResult(lensOut, ns)
			return errs
		}, err
	})
}

//export mcgoStoreBatchGetSessionStart
func mcgoStoreBatchGetSessionStart(h C.mc_store_t, keys **C.char, count C.size_t, codesOut *C.mc_status_t, cerr *C.mc_error_t) C.mc_status_t {
	return batchCall(h, keys, count, codesOut, cerr, func(s *storeObj, ks []string) (func(context.Context) []error, error) {
		return func(ctx context.Context) []error { return s.StartGetSession(ctx, ks) }, nil
	})
}

//export mcgoStoreBatchGetSessionEnd
func mcgoStoreBatchGetSessionEnd(h C.mc_store_t, keys **C.char, count C.size_t, cerr *C.mc_error_t) C.mc_status_t {
	return storeCall(h, cerr, func(_ context.Context, s *storeObj) error {
		ks, err := keysAt(keys, count)
		if err != nil {
			return err
		}
		s.EndGetSession(ks)
		return nil
	})
}

// Put sessions (ABI 1.4): mc_store_batch_put_session_start/_end/_revoke
// and mc_store_batch_put_ranges.

//export mcgoStoreBatchPutSessionStart
func mcgoStoreBatchPutSessionStart(h C.mc_store_t, keys **C.char, sizes *C.uint64_t, count C.size_t, crc *C.mc_replicate_config_t,
	codesOut *C.mc_status_t, cerr *C.mc_error_t) C.mc_status_t {
	return batchCall(h, keys, count, codesOut, cerr, func(s *storeObj, ks []string) (func(context.Context) []error, error) {
		if len(ks) > 0 && sizes == nil {
			return nil, nullArg("sizes")
		}
		var ns []uint64
		for _, n := range unsafe.Slice(sizes, len(ks)) {
			ns = append(ns, uint64(n))
		}
		rc, err := replicate(crc)
		return func(ctx context.Context) []error { return s.StartPutSession(ctx, ks, ns, rc) }, err
	})
}

//export mcgoStoreBatchPutRanges
func mcgoStoreBatchPutRanges(h C.mc_store_t, keys **C.char, bufs *unsafe.Pointer, lens *C.uint64_t, dstOffsets *C.uint64_t,
	rangeCounts *C.size_t, count C.size_t, lensOut *C.uint64_t, codesOut *C.mc_status_t, cerr *C.mc_error_t) C.mc_status_t {
	return batchCall(h, keys, count, codesOut, cerr, func(s *storeObj, ks []string) (func(context.Context) []error, error) {
		rs, err := rangesAt(bufs, lens, dstOffsets, rangeCounts, count, "dst_offsets")
		if err != nil {
			return nil, err
		}
		prs := make([][]client.PutRange, len(rs))
		for i, r := range rs {
			prs[i] = make([]client.PutRange, len(r))
			for j, x := range r {
				prs[i][j] = client.PutRange{Dst: x.Src, Src: x.Dst}
			}
		}
		return func(ctx context.Context) []error {
			ns, errs := s.BatchPutRanges(ctx, ks, prs)
			lensResult(lensOut, ns)
			return errs
		}, nil
	})
}

//export mcgoStoreBatchPutSessionEnd
func mcgoStoreBatchPutSessionEnd(h C.mc_store_t, keys **C.char, count C.size_t, codesOut *C.mc_status_t, cerr *C.mc_error_t) C.mc_status_t {
	return batchCall(h, keys, count, codesOut, cerr, func(s *storeObj, ks []string) (func(context.Context) []error, error) {
		return func(ctx context.Context) []error { return s.EndPutSession(ctx, ks) }, nil
	})
}

//export mcgoStoreBatchPutSessionRevoke
func mcgoStoreBatchPutSessionRevoke(h C.mc_store_t, keys **C.char, count C.size_t, codesOut *C.mc_status_t, cerr *C.mc_error_t) C.mc_status_t {
	return batchCall(h, keys, count, codesOut, cerr, func(s *storeObj, ks []string) (func(context.Context) []error, error) {
		return func(ctx context.Context) []error { return s.RevokePutSession(ctx, ks) }, nil
	})
}

//export mcgoStoreGetReplicas
func mcgoStoreGetReplicas(h C.mc_store_t, key *C.char, out *C.mc_replica_desc_t, capacity C.size_t, countOut *C.size_t, cerr *C.mc_error_t) C.mc_status_t {
	return storeCall(h, cerr, func(ctx context.Context, s *storeObj) error {
		if key == nil || countOut == nil {
			return nullArg("key or count_out")
		}
		*countOut = 0
		if capacity > 0 && out == nil {
			return nullArg("out")
		}
		k := C.GoString(key)
		reps, errs := s.BatchReplicas(ctx, []string{k})
		if errs[0] != nil {
			return errs[0]
		}
		*countOut = C.size_t(len(reps[0]))
		var dst []C.mc_replica_desc_t
		if capacity > 0 {
			dst = unsafe.Slice(out, int(min(capacity, C.size_t(len(reps[0])))))
		}
		for i := range dst {
			replicaDesc(&dst[i], reps[0][i])
		}
		if len(reps[0]) > len(dst) {
			return abiErrorf(C.MC_ERR_BUFFER_TOO_SMALL, "%q has %d replicas, room for %d", k, len(reps[0]), capacity)
		}
		return nil
	})
}

// replicaDesc fills d from r. A striped replica is its first piece,
// address and size alike, so that the region d names is the replica's
// own bytes (the value's first ones): the fixed struct has no room for
// the other pieces, and the whole length at the first piece's address
// would run into other objects' memory.
func replicaDesc(d *C.mc_replica_desc_t, r *storepb.Replica) {
	*d = C.mc_replica_desc_t{status: C.int32_t(r.Status)}
	switch {
	case r.GetMemory() != nil:
		m := r.GetMemory()
		if len(m.Stripes) > 0 {
			m = m.Stripes[0]
		}
		d.kind = C.MC_REPLICA_MEMORY
		if m.Medium == storepb.Medium_MEDIUM_DISK {
			d.kind = C.MC_REPLICA_LOCAL_DISK
		}
		d.buffer_address, d.size = C.uint64_t(m.BufferAddress), C.uint64_t(m.Size)
		setName(d.segment_name[:], m.SegmentName)
		setName(d.transport_endpoint[:], m.TransportEndpoint)
	case r.GetDisk() != nil:
		dk := r.GetDisk()
		d.kind, d.size = C.MC_REPLICA_DISK, C.uint64_t(dk.Size)
		setName(d.segment_name[:], dk.SegmentName)
		setName(d.transport_endpoint[:], dk.TransportEndpoint)
		setName(d.file_path[:], dk.Path)
	}
}

// setName copies s into a fixed C array, cut to fit and NUL-terminated.
func setName(dst []C.char, s string) {
	n := min(len(s), len(dst)-1)
	for i := 0; i < n; i++ {
		dst[i] = C.char(s[i])
	}
	dst[n] = 0
}
