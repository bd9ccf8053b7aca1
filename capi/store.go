package main

/*
#include "mooncake.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/store/client"
	"github.com/mooncake-go/mooncake/store/storepb"
)

func invalidParams(format string, args ...any) error {
	return &storepb.Error{Code: storepb.InvalidParams, Msg: fmt.Sprintf(format, args...)}
}

//export mcgoStoreCreate
func mcgoStoreCreate(cfg *C.mc_store_config_t, out *C.mc_store_t, cerr *C.mc_error_t) (st C.mc_status_t) {
	c := begin(cerr, domainStore)
	defer c.catch(&st)
	if cfg == nil {
		return c.fail(nullArg("cfg"))
	}
	if out == nil {
		return c.fail(nullArg("out"))
	}
	*out = 0
	sc, err := storeConfig(cfg)
	if err != nil {
		return c.fail(err)
	}
	cl, err := client.New(context.Background(), sc)
	if err != nil {
		return c.fail(err)
	}
	*out = C.mc_store_t(newHandle(&storeObj{Client: cl, regs: map[uintptr]uintptr{}}))
	return C.MC_OK
}

// storeConfig reads a C store config.
func storeConfig(p *C.mc_store_config_t) (client.Config, error) {
	if p.struct_size < C.sizeof_mc_store_config_t {
		return client.Config{}, abiErrorf(C.MC_ERR_STRUCT_SIZE, "mc_store_config_t.struct_size %d (want %d)",
			p.struct_size, C.sizeof_mc_store_config_t)
	}
	if p.reserved != 0 {
		return client.Config{}, invalidParams("mc_store_config_t.reserved must be 0")
	}
	if p.rpc_timeout_ms > maxMillis {
		return client.Config{}, invalidParams("mc_store_config_t.rpc_timeout_ms %d out of range", p.rpc_timeout_ms)
	}
	cfg := client.Config{
		Master:          cString(p.master),
		ClusterID:       cString(p.cluster_id),
		SegmentSize:     int64(p.segment_size),
		LocalBufferSize: int64(p.local_buffer_size),
		RPCTimeout:      time.Duration(p.rpc_timeout_ms) * time.Millisecond,
		NoChecksum:      p.no_checksum != 0,
		Replicate:       client.ReplicateConfig{Replicas: int(p.replicas)},
	}
	if cfg.SegmentSize < 0 {
		cfg.SegmentSize = client.NoSegment
	}
	if p.engine != 0 {
		e, err := engineOf(uint64(p.engine))
		if err != nil {
			return client.Config{}, err
		}
		cfg.Engine = e.Engine
	} else {
		cfg.EngineConfig = engine.Config{Host: cString(p.local_hostname), Metadata: cString(p.metadata)}
		if h, port, err := net.SplitHostPort(cfg.EngineConfig.Host); err == nil {
			n, err := strconv.Atoi(port)
			if err != nil || n < 0 || n > 65535 {
				return client.Config{}, invalidParams("mc_store_config_t.local_hostname %q: bad port", cfg.EngineConfig.Host)
			}
			cfg.EngineConfig.Host, cfg.EngineConfig.RPCPort = h, n
		}
		// Mooncake's protocol names a transport; here "tcp" (and "rdma",
		// which has no hardware to run on) is the default data path:
		// shared memory with same-host peers, TCP elsewhere.
		switch proto := strings.ToLower(cString(p.protocol)); proto {
		case "", "tcp", "rdma":
		case "shm", "auto":
			cfg.EngineConfig.Transport = proto
		default:
			return client.Config{}, invalidParams("mc_store_config_t.protocol %q (want tcp, rdma, shm or auto)", proto)
		}
	}
	if err := cfg.Validate(); err != nil {
		return client.Config{}, invalidParams("%v", err)
	}
	return cfg, nil
}

//export mcgoStoreClose
func mcgoStoreClose(h C.mc_store_t, cerr *C.mc_error_t) (st C.mc_status_t) {
	c := begin(cerr, domainStore)
	defer c.catch(&st)
	if _, err := storeOf(uint64(h)); err != nil {
		return c.fail(err)
	}
	v, ok := releaseHandle(uint64(h))
	if !ok {
		return c.fail(abiErrorf(C.MC_ERR_INVALID_HANDLE, "store handle %d: not a live handle", h))
	}
	// Calls in progress finish first: they may be copying from or into
	// memory that closing frees.
	return c.fail(v.(*storeObj).close())
}

//export mcgoStoreName
func mcgoStoreName(h C.mc_store_t, buf *C.char, bufLen C.size_t, lenOut *C.size_t, cerr *C.mc_error_t) (st C.mc_status_t) {
	c := begin(cerr, domainStore)
	defer c.catch(&st)
	s, err := enterStore(uint64(h))
	if err != nil {
		return c.fail(err)
	}
	defer s.leave()
	return c.fail(writeOut(buf, bufLen, lenOut, s.SegmentName()))
}

// bytesAt views n bytes of C memory at p; NULL is only valid for n == 0.
func bytesAt(p unsafe.Pointer, n C.uint64_t, what string) ([]byte, error) {
	if n > math.MaxInt {
		return nil, invalidParams("%s: length %d", what, n)
	}
	if p == nil {
		if n != 0 {
			return nil, nullArg(what)
		}
		return nil, nil
	}
	return unsafe.Slice((*byte)(p), int(n)), nil
}

//export mcgoStoreRegisterBuffer
func mcgoStoreRegisterBuffer(h C.mc_store_t, addr unsafe.Pointer, length C.uint64_t, cerr *C.mc_error_t) (st C.mc_status_t) {
	c := begin(cerr, domainStore)
	defer c.catch(&st)
	s, err := enterStore(uint64(h))
	if err != nil {
		return c.fail(err)
	}
	defer s.leave()
	if addr == nil {
		return c.fail(nullArg("addr"))
	}
	b, err := bytesAt(addr, length, "addr")
	if err != nil {
		return c.fail(err)
	}
	if err := s.RegisterBuffer(b); err != nil {
		return c.fail(err)
	}
	s.mu.Lock()
	s.regs[uintptr(addr)] = uintptr(length)
	s.mu.Unlock()
	return C.MC_OK
}

//export mcgoStoreUnregisterBuffer
func mcgoStoreUnregisterBuffer(h C.mc_store_t, addr unsafe.Pointer, cerr *C.mc_error_t) (st C.mc_status_t) {
	c := begin(cerr, domainStore)
	defer c.catch(&st)
	s, err := enterStore(uint64(h))
	if err != nil {
		return c.fail(err)
	}
	defer s.leave()
	if addr == nil {
		return c.fail(nullArg("addr"))
	}
	// The client finds a registration by its first byte.
	if err := s.UnregisterBuffer(unsafe.Slice((*byte)(addr), 1)); err != nil {
		return c.fail(err)
	}
	s.mu.Lock()
	delete(s.regs, uintptr(addr))
	s.mu.Unlock()
	return C.MC_OK
}

// replicate reads a C replicate config; NULL is nil (the store's default).
func replicate(p *C.mc_replicate_config_t) (*client.ReplicateConfig, error) {
	if p == nil {
		return nil, nil
	}
	if p.struct_size < C.sizeof_mc_replicate_config_t {
		return nil, abiErrorf(C.MC_ERR_STRUCT_SIZE, "mc_replicate_config_t.struct_size %d (want %d)",
			p.struct_size, C.sizeof_mc_replicate_config_t)
	}
	if p.soft_pin_ttl_ms > maxMillis || p.replicas > math.MaxInt32 || p.n_preferred > maxCount {
		return nil, invalidParams("mc_replicate_config_t: replicas %d, soft_pin_ttl_ms %d or n_preferred %d out of range",
			p.replicas, p.soft_pin_ttl_ms, p.n_preferred)
	}
	rc := &client.ReplicateConfig{
		Replicas:    int(p.replicas),
		SoftPin:     p.soft_pin != 0,
		SoftPinTTL:  time.Duration(p.soft_pin_ttl_ms) * time.Millisecond,
		HardPin:     p.hard_pin != 0,
		PreferLocal: p.prefer_local != 0,
	}
	if p.n_preferred > 0 {
		if p.preferred_segments == nil {
			return nil, nullArg("preferred_segments")
		}
		for i, s := range unsafe.Slice(p.preferred_segments, int(p.n_preferred)) {
			if s == nil {
				return nil, nullArg(fmt.Sprintf("preferred_segments[%d]", i))
			}
			rc.PreferredSegments = append(rc.PreferredSegments, C.GoString(s))
		}
	}
	return rc, nil
}

// put is the body of put, put_from and upsert.
func put(h C.mc_store_t, key *C.char, value unsafe.Pointer, length C.uint64_t, crc *C.mc_replicate_config_t, cerr *C.mc_error_t,
	f func(s *storeObj, ctx context.Context, key string, v []byte, rc *client.ReplicateConfig) error) (st C.mc_status_t) {
	c := begin(cerr, domainStore)
	defer c.catch(&st)
	s, err := enterStore(uint64(h))
	if err != nil {
		return c.fail(err)
	}
	defer s.leave()
	if key == nil {
		return c.fail(nullArg("key"))
	}
	v, err := bytesAt(value, length, "value")
	if err != nil {
		return c.fail(err)
	}
	rc, err := replicate(crc)
	if err != nil {
		return c.fail(err)
	}
	return c.fail(f(s, context.Background(), C.GoString(key), v, rc))
}

//export mcgoStorePut
func mcgoStorePut(h C.mc_store_t, key *C.char, value unsafe.Pointer, length C.uint64_t, rc *C.mc_replicate_config_t, cerr *C.mc_error_t) C.mc_status_t {
	return put(h, key, value, length, rc, cerr, func(s *storeObj, ctx context.Context, k string, v []byte, rc *client.ReplicateConfig) error {
		return s.Put(ctx, k, v, rc)
	})
}

//export mcgoStorePutFrom
func mcgoStorePutFrom(h C.mc_store_t, key *C.char, value unsafe.Pointer, length C.uint64_t, rc *C.mc_replicate_config_t, cerr *C.mc_error_t) C.mc_status_t {
	return put(h, key, value, length, rc, cerr, func(s *storeObj, ctx context.Context, k string, v []byte, rc *client.ReplicateConfig) error {
		return s.PutFrom(ctx, k, v, rc)
	})
}

//export mcgoStoreUpsert
func mcgoStoreUpsert(h C.mc_store_t, key *C.char, value unsafe.Pointer, length C.uint64_t, rc *C.mc_replicate_config_t, cerr *C.mc_error_t) C.mc_status_t {
	return put(h, key, value, length, rc, cerr, func(s *storeObj, ctx context.Context, k string, v []byte, rc *client.ReplicateConfig) error {
		return s.Upsert(ctx, k, v, rc)
	})
}

//export mcgoStoreGet
func mcgoStoreGet(h C.mc_store_t, key *C.char, buf unsafe.Pointer, bufLen C.uint64_t, lenOut *C.uint64_t, cerr *C.mc_error_t) (st C.mc_status_t) {
	c := begin(cerr, domainStore)
	defer c.catch(&st)
	s, err := enterStore(uint64(h))
	if err != nil {
		return c.fail(err)
	}
	defer s.leave()
	if key == nil {
		return c.fail(nullArg("key"))
	}
	if lenOut == nil {
		return c.fail(nullArg("len_out"))
	}
	*lenOut = 0
	dst, err := bytesAt(buf, bufLen, "buf")
	if err != nil {
		return c.fail(err)
	}
	ctx, k := context.Background(), C.GoString(key)
	if len(dst) > 0 {
		n, err := s.GetInto(ctx, k, dst)
		if err == nil {
			*lenOut = C.uint64_t(n)
			return C.MC_OK
		}
		if !errors.Is(err, storepb.ErrInvalidParams) {
			return c.fail(err)
		}
	}
	// An empty buffer, or one GetInto found too small: report the size.
	size, err := s.Size(ctx, k)
	if err != nil {
		return c.fail(err)
	}
	*lenOut = C.uint64_t(size)
	if size <= uint64(len(dst)) { // the failure was not the size
		return c.fail(invalidParams("get %q into a buffer of %d bytes", k, len(dst)))
	}
	return c.fail(abiErrorf(C.MC_ERR_BUFFER_TOO_SMALL, "get %q: value of %d bytes, buffer of %d", k, size, len(dst)))
}

//export mcgoStoreGetInto
func mcgoStoreGetInto(h C.mc_store_t, key *C.char, buf unsafe.Pointer, bufLen C.uint64_t, lenOut *C.uint64_t, cerr *C.mc_error_t) (st C.mc_status_t) {
	c := begin(cerr, domainStore)
	defer c.catch(&st)
	s, err := enterStore(uint64(h))
	if err != nil {
		return c.fail(err)
	}
	defer s.leave()
	if key == nil {
		return c.fail(nullArg("key"))
	}
	if buf == nil {
		return c.fail(nullArg("buf"))
	}
	if lenOut != nil {
		*lenOut = 0
	}
	dst, err := bytesAt(buf, bufLen, "buf")
	if err != nil {
		return c.fail(err)
	}
	n, err := s.GetInto(context.Background(), C.GoString(key), dst)
	if err != nil {
		return c.fail(err)
	}
	if lenOut != nil {
		*lenOut = C.uint64_t(n)
	}
	return C.MC_OK
}

//export mcgoStoreGetSize
func mcgoStoreGetSize(h C.mc_store_t, key *C.char, sizeOut *C.uint64_t, cerr *C.mc_error_t) (st C.mc_status_t) {
	c := begin(cerr, domainStore)
	defer c.catch(&st)
	s, err := enterStore(uint64(h))
	if err != nil {
		return c.fail(err)
	}
	defer s.leave()
	if key == nil || sizeOut == nil {
		return c.fail(nullArg("key or size_out"))
	}
	*sizeOut = 0
	n, err := s.Size(context.Background(), C.GoString(key))
	if err != nil {
		return c.fail(err)
	}
	*sizeOut = C.uint64_t(n)
	return C.MC_OK
}

// keysAt copies count C strings.
func keysAt(p **C.char, count C.size_t) ([]string, error) {
	if count > maxCount {
		return nil, invalidParams("%d keys (at most %d)", count, maxCount)
	}
	if count == 0 {
		return nil, nil
	}
	if p == nil {
		return nil, nullArg("keys")
	}
	ks := make([]string, count)
	for i, k := range unsafe.Slice(p, int(count)) {
		if k == nil {
			return nil, nullArg(fmt.Sprintf("keys[%d]", i))
		}
		ks[i] = C.GoString(k)
	}
	return ks, nil
}

// buffersAt views count C buffers with their lengths.
func buffersAt(p *unsafe.Pointer, lens *C.uint64_t, count C.size_t, what string) ([][]byte, error) {
	if count == 0 {
		return nil, nil
	}
	if p == nil || lens == nil {
		return nil, nullArg(what + " or their lengths")
	}
	ls := unsafe.Slice(lens, int(count))
	bs := make([][]byte, count)
	for i, ptr := range unsafe.Slice(p, int(count)) {
		b, err := bytesAt(ptr, ls[i], fmt.Sprintf("%s[%d]", what, i))
		if err != nil {
			return nil, err
		}
		bs[i] = b
	}
	return bs, nil
}

// batchResult writes per-key codes and returns the call's status: the
// first failure's code, else MC_OK.
func (c call) batchResult(keys []string, errs []error, codesOut *C.mc_status_t) C.mc_status_t {
	var codes []C.mc_status_t
	if codesOut != nil && len(keys) > 0 {
		codes = unsafe.Slice(codesOut, len(keys))
	}
	var first error
	for i, err := range errs {
		if codes != nil {
			codes[i] = C.MC_OK
			if err != nil {
				codes[i] = storeCode(err)
			}
		}
		if err != nil && first == nil {
			first = fmt.Errorf("key %d (%q): %w", i, keys[i], err)
		}
	}
	return c.fail(first)
}

// batchPut is the body of the batch put forms.
func batchPut(h C.mc_store_t, keys **C.char, values *unsafe.Pointer, lens *C.uint64_t, count C.size_t, crc *C.mc_replicate_config_t,
	codesOut *C.mc_status_t, cerr *C.mc_error_t, from bool,
	f func(s *storeObj, ctx context.Context, ks []string, vs [][]byte, rc *client.ReplicateConfig) []error) (st C.mc_status_t) {
	c := begin(cerr, domainStore)
	defer c.catch(&st)
	s, err := enterStore(uint64(h))
	if err != nil {
		return c.fail(err)
	}
	defer s.leave()
	ks, err := keysAt(keys, count)
	if err != nil {
		return c.fail(err)
	}
	vs, err := buffersAt(values, lens, count, "values")
	if err != nil {
		return c.fail(err)
	}
	rc, err := replicate(crc)
	if err != nil {
		return c.fail(err)
	}
	if len(ks) == 0 {
		return C.MC_OK
	}
	ctx := context.Background()
	if !from {
		return c.batchResult(ks, f(s, ctx, ks, vs, rc), codesOut)
	}
	// put_from takes registered memory only, as PutFrom: values outside
	// every registered buffer fail alone, the rest go to the master as one
	// batch.
	errs := make([]error, len(ks))
	var pk []string
	var pv [][]byte
	var idx []int
	for i := range ks {
		if len(vs[i]) > 0 && !s.registered(vs[i]) {
			errs[i] = invalidParams("put_from %q: buffer is not registered", ks[i])
			continue
		}
		pk, pv, idx = append(pk, ks[i]), append(pv, vs[i]), append(idx, i)
	}
	if len(pk) > 0 {
		for j, err := range f(s, ctx, pk, pv, rc) {
			errs[idx[j]] = err
		}
	}
	return c.batchResult(ks, errs, codesOut)
}

//export mcgoStoreBatchPut
func mcgoStoreBatchPut(h C.mc_store_t, keys **C.char, values *unsafe.Pointer, lens *C.uint64_t, count C.size_t, rc *C.mc_replicate_config_t, codesOut *C.mc_status_t, cerr *C.mc_error_t) C.mc_status_t {
	return batchPut(h, keys, values, lens, count, rc, codesOut, cerr, false, func(s *storeObj, ctx context.Context, ks []string, vs [][]byte, rc *client.ReplicateConfig) []error {
		return s.BatchPut(ctx, ks, vs, rc)
	})
}

//export mcgoStoreBatchPutFrom
func mcgoStoreBatchPutFrom(h C.mc_store_t, keys **C.char, values *unsafe.Pointer, lens *C.uint64_t, count C.size_t, rc *C.mc_replicate_config_t, codesOut *C.mc_status_t, cerr *C.mc_error_t) C.mc_status_t {
	return batchPut(h, keys, values, lens, count, rc, codesOut, cerr, true, func(s *storeObj, ctx context.Context, ks []string, vs [][]byte, rc *client.ReplicateConfig) []error {
		return s.BatchPut(ctx, ks, vs, rc)
	})
}

//export mcgoStoreBatchUpsert
func mcgoStoreBatchUpsert(h C.mc_store_t, keys **C.char, values *unsafe.Pointer, lens *C.uint64_t, count C.size_t, rc *C.mc_replicate_config_t, codesOut *C.mc_status_t, cerr *C.mc_error_t) C.mc_status_t {
	return batchPut(h, keys, values, lens, count, rc, codesOut, cerr, false, func(s *storeObj, ctx context.Context, ks []string, vs [][]byte, rc *client.ReplicateConfig) []error {
		return s.BatchUpsert(ctx, ks, vs, rc)
	})
}

//export mcgoStoreBatchGetInto
func mcgoStoreBatchGetInto(h C.mc_store_t, keys **C.char, bufs *unsafe.Pointer, bufLens *C.uint64_t, count C.size_t, lensOut *C.uint64_t, codesOut *C.mc_status_t, cerr *C.mc_error_t) (st C.mc_status_t) {
	c := begin(cerr, domainStore)
	defer c.catch(&st)
	s, err := enterStore(uint64(h))
	if err != nil {
		return c.fail(err)
	}
	defer s.leave()
	ks, err := keysAt(keys, count)
	if err != nil {
		return c.fail(err)
	}
	dsts, err := buffersAt(bufs, bufLens, count, "bufs")
	if err != nil {
		return c.fail(err)
	}
	if len(ks) == 0 {
		return C.MC_OK
	}
	ns, errs := s.BatchGetInto(context.Background(), ks, dsts)
	if lensOut != nil {
		out := unsafe.Slice(lensOut, len(ks))
		for i, n := range ns {
			out[i] = C.uint64_t(n)
		}
	}
	return c.batchResult(ks, errs, codesOut)
}

//export mcgoStoreExist
func mcgoStoreExist(h C.mc_store_t, key *C.char, existsOut *C.int32_t, cerr *C.mc_error_t) (st C.mc_status_t) {
	c := begin(cerr, domainStore)
	defer c.catch(&st)
	s, err := enterStore(uint64(h))
	if err != nil {
		return c.fail(err)
	}
	defer s.leave()
	if key == nil || existsOut == nil {
		return c.fail(nullArg("key or exists_out"))
	}
	*existsOut = 0
	ok, err := s.Exist(context.Background(), C.GoString(key))
	if err != nil {
		return c.fail(err)
	}
	if ok {
		*existsOut = 1
	}
	return C.MC_OK
}

//export mcgoStoreBatchExist
func mcgoStoreBatchExist(h C.mc_store_t, keys **C.char, count C.size_t, existsOut *C.int32_t, codesOut *C.mc_status_t, cerr *C.mc_error_t) (st C.mc_status_t) {
	c := begin(cerr, domainStore)
	defer c.catch(&st)
	s, err := enterStore(uint64(h))
	if err != nil {
		return c.fail(err)
	}
	defer s.leave()
	ks, err := keysAt(keys, count)
	if err != nil {
		return c.fail(err)
	}
	if len(ks) == 0 {
		return C.MC_OK
	}
	if existsOut == nil {
		return c.fail(nullArg("exists_out"))
	}
	ok, errs := s.BatchExist(context.Background(), ks)
	out := unsafe.Slice(existsOut, len(ks))
	for i := range out {
		out[i] = 0
		if ok[i] {
			out[i] = 1
		}
	}
	return c.batchResult(ks, errs, codesOut)
}

//export mcgoStoreRemove
func mcgoStoreRemove(h C.mc_store_t, key *C.char, force C.int, cerr *C.mc_error_t) (st C.mc_status_t) {
	c := begin(cerr, domainStore)
	defer c.catch(&st)
	s, err := enterStore(uint64(h))
	if err != nil {
		return c.fail(err)
	}
	defer s.leave()
	if key == nil {
		return c.fail(nullArg("key"))
	}
	return c.fail(s.Remove(context.Background(), C.GoString(key), force != 0))
}

//export mcgoStoreRemoveAll
func mcgoStoreRemoveAll(h C.mc_store_t, force C.int, removedOut *C.uint64_t, cerr *C.mc_error_t) (st C.mc_status_t) {
	c := begin(cerr, domainStore)
	defer c.catch(&st)
	s, err := enterStore(uint64(h))
	if err != nil {
		return c.fail(err)
	}
	defer s.leave()
	n, err := s.RemoveAll(context.Background(), force != 0)
	if removedOut != nil {
		*removedOut = C.uint64_t(n)
	}
	return c.fail(err)
}
