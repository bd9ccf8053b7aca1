package main

/*
#include "mooncake.h"
*/
import "C"

import (
	"context"
	"fmt"
	"unsafe"
)

// Values made of parts (ABI 1.1): mc_store_batch_put_from_parts and
// mc_store_batch_get_into_parts.

// partsAt views the parts of count keys, given as one flat array of
// buffers and lengths and a count of parts per key.
func partsAt(parts *unsafe.Pointer, lens *C.uint64_t, counts *C.size_t, count C.size_t) ([][][]byte, error) {
	if count == 0 {
		return nil, nil
	}
	if count > maxCount {
		return nil, invalidParams("%d keys (at most %d)", count, maxCount)
	}
	if counts == nil {
		return nil, nullArg("part_counts")
	}
	per := unsafe.Slice(counts, int(count))
	total := 0
	for i, n := range per {
		if n > maxCount || total+int(n) > maxCount {
			return nil, invalidParams("part_counts[%d] = %d: more than %d parts in all", i, n, maxCount)
		}
		total += int(n)
	}
	var flat []unsafe.Pointer
	var ls []C.uint64_t
	if total > 0 {
		if parts == nil || lens == nil {
			return nil, nullArg("parts or part_lens")
		}
		flat, ls = unsafe.Slice(parts, total), unsafe.Slice(lens, total)
	}
	out := make([][][]byte, count)
	j := 0
	for i, n := range per {
		ps := make([][]byte, n)
		for k := range ps {
			b, err := bytesAt(flat[j], ls[j], fmt.Sprintf("parts[%d] (key %d, part %d)", j, i, k))
			if err != nil {
				return nil, err
			}
			ps[k] = b
			j++
		}
		out[i] = ps
	}
	return out, nil
}

//export mcgoStoreBatchPutFromParts
func mcgoStoreBatchPutFromParts(h C.mc_store_t, keys **C.char, parts *unsafe.Pointer, partLens *C.uint64_t, partCounts *C.size_t,
	count C.size_t, crc *C.mc_replicate_config_t, codesOut *C.mc_status_t, cerr *C.mc_error_t) C.mc_status_t {
	return batchCall(h, keys, count, codesOut, cerr, func(s *storeObj, ks []string) (func(context.Context) []error, error) {
		ps, err := partsAt(parts, partLens, partCounts, count)
		if err != nil {
			return nil, err
		}
		rc, err := replicate(crc)
		return func(ctx context.Context) []error { return s.BatchPutFromParts(ctx, ks, ps, rc) }, err
	})
}

//export mcgoStoreBatchGetIntoParts
func mcgoStoreBatchGetIntoParts(h C.mc_store_t, keys **C.char, parts *unsafe.Pointer, partLens *C.uint64_t, partCounts *C.size_t,
	count C.size_t, lensOut *C.uint64_t, codesOut *C.mc_status_t, cerr *C.mc_error_t) C.mc_status_t {
	return batchCall(h, keys, count, codesOut, cerr, func(s *storeObj, ks []string) (func(context.Context) []error, error) {
		ps, err := partsAt(parts, partLens, partCounts, count)
		return func(ctx context.Context) []error {
			ns, errs := s.BatchGetIntoParts(ctx, ks, ps)
			lensResult(lensOut, ns)
			return errs
		}, err
	})
}
