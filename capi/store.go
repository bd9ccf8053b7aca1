package main

/*
#include "mooncake.h"
*/
import "C"

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/internal/secure"
	"github.com/mooncake-go/mooncake/store/client"
	"github.com/mooncake-go/mooncake/store/storepb"
)

//export mcgoStoreCreate
func mcgoStoreCreate(cfg *C.mc_store_config_t, out *C.mc_store_t, cerr *C.mc_error_t) C.mc_status_t {
	return guard(cerr, domainStore, func() error {
		if cfg == nil {
			return nullArg("cfg")
		}
		if out == nil {
			return nullArg("out")
		}
		*out = 0
		sc, opTimeout, err := storeConfig(cfg)
		if err != nil {
			return err
		}
		cl, err := client.New(context.Background(), sc)
		if err != nil {
			return err
		}
		*out = C.mc_store_t(newHandle(newStoreObj(cl, opTimeout)))
		return nil
	})
}

// storeEngine is the engine a store config names: live, and not poisoned
// (a store must not run over an engine a panic left inconsistent).
func storeEngine(h uint64) (*engine.Engine, error) {
	e, err := engines.of(h)
	if err != nil {
		return nil, err
	}
	if err := e.usable(h); err != nil {
		return nil, err
	}
	return e.Engine, nil
}

// storeConfig reads a C store config; the second result is its
// op_timeout_ms.
func storeConfig(p *C.mc_store_config_t) (client.Config, time.Duration, error) {
	c, err := readStruct(p, p.struct_size, "mc_store_config_t", C.MC_STORE_CONFIG_SIZE_V1, C.MC_STORE_CONFIG_SIZE_V2,
		C.MC_STORE_CONFIG_SIZE_V3, C.MC_STORE_CONFIG_SIZE_V4, C.MC_STORE_CONFIG_SIZE_V5, C.MC_STORE_CONFIG_SIZE_V6)
	if err != nil {
		return client.Config{}, 0, err
	}
	p = &c
	if p.reserved != 0 {
		return client.Config{}, 0, invalidParams("mc_store_config_t.reserved must be 0")
	}
	if p.rpc_timeout_ms > maxMillis || p.op_timeout_ms > maxMillis {
		return client.Config{}, 0, invalidParams("mc_store_config_t: rpc_timeout_ms %d or op_timeout_ms %d out of range",
			p.rpc_timeout_ms, p.op_timeout_ms)
	}
	cfg := client.Config{
		Master:          cString(p.master),
		ClusterID:       cString(p.cluster_id),
		SegmentSize:     int64(p.segment_size),
		LocalBufferSize: int64(p.local_buffer_size),
		RPCTimeout:      time.Duration(p.rpc_timeout_ms) * time.Millisecond,
		NoChecksum:      p.no_checksum != 0,
		ReportExisting:  p.report_existing != 0,
		Replicate:       client.ReplicateConfig{Replicas: int(p.replicas)},
		// ABI 1.8: a caller of an older header has zeros here (NULL).
		Token: cmp.Or(cString(p.auth_token), os.Getenv("MC_AUTH_TOKEN")),
		MasterTLS: secure.TLS{CAFile: cString(p.tls_ca_file), CertFile: cString(p.tls_cert_file),
			KeyFile: cString(p.tls_key_file), ServerName: cString(p.tls_server_name)}, // ServerName: ABI 1.12
		// ABI 1.10; zero: the client reads MOONCAKE_TENANT_ID.
		TenantID: cString(p.tenant_id),
	}
	if cfg.SegmentSize < 0 {
		cfg.SegmentSize = client.NoSegment
	}
	if p.engine != 0 {
		e, err := storeEngine(uint64(p.engine))
		if err != nil {
			return client.Config{}, 0, err
		}
		cfg.Engine = e
	} else {
		cfg.EngineConfig = engine.Config{Host: cString(p.local_hostname), Metadata: cString(p.metadata),
			MetadataToken: cfg.Token, Secret: cString(p.te_secret)} // zero: the engine reads MC_TE_SECRET
		if h, port, err := net.SplitHostPort(cfg.EngineConfig.Host); err == nil {
			n, err := strconv.Atoi(port)
			if err != nil || n < 0 || n > 65535 {
				return client.Config{}, 0, invalidParams("mc_store_config_t.local_hostname %q: bad port", cfg.EngineConfig.Host)
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
			return client.Config{}, 0, invalidParams("mc_store_config_t.protocol %q (want tcp, rdma, shm or auto)", proto)
		}
	}
	if err := ssdFromEnv(&cfg); err != nil { // store_ssd.go
		return client.Config{}, 0, err
	}
	if err := cfg.Validate(); err != nil {
		return client.Config{}, 0, invalidParams("%v", err)
	}
	return cfg, time.Duration(p.op_timeout_ms) * time.Millisecond, nil
}

//export mcgoStoreClose
func mcgoStoreClose(h C.mc_store_t, cerr *C.mc_error_t) C.mc_status_t {
	// Calls in progress finish first: they may be copying from or into
	// memory that closing frees.
	return guard(cerr, domainStore, func() error { return stores.destroy(uint64(h)) })
}

//export mcgoStoreName
func mcgoStoreName(h C.mc_store_t, buf *C.char, bufLen C.size_t, lenOut *C.size_t, cerr *C.mc_error_t) C.mc_status_t {
	return storeCall(h, cerr, func(_ context.Context, s *storeObj) error { return writeOut(buf, bufLen, lenOut, s.SegmentName()) })
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
func mcgoStoreRegisterBuffer(h C.mc_store_t, addr unsafe.Pointer, length C.uint64_t, cerr *C.mc_error_t) C.mc_status_t {
	return storeCall(h, cerr, func(_ context.Context, s *storeObj) error {
		if addr == nil {
			return nullArg("addr")
		}
		b, err := bytesAt(addr, length, "addr")
		if err != nil {
			return err
		}
		return s.RegisterBuffer(b)
	})
}

//export mcgoStoreUnregisterBuffer
func mcgoStoreUnregisterBuffer(h C.mc_store_t, addr unsafe.Pointer, cerr *C.mc_error_t) C.mc_status_t {
	return storeCall(h, cerr, func(_ context.Context, s *storeObj) error {
		if addr == nil {
			return nullArg("addr")
		}
		// The client finds a registration by its first byte.
		return s.UnregisterBuffer(unsafe.Slice((*byte)(addr), 1))
	})
}

// replicate reads a C replicate config; NULL is nil (the store's default).
func replicate(p *C.mc_replicate_config_t) (*client.ReplicateConfig, error) {
	if p == nil {
		return nil, nil
	}
	c, err := readStruct(p, p.struct_size, "mc_replicate_config_t", C.MC_REPLICATE_CONFIG_SIZE_V1, C.MC_REPLICATE_CONFIG_SIZE_V2)
	if err != nil {
		return nil, err
	}
	p = &c
	if p.soft_pin_ttl_ms > maxMillis || p.replicas > math.MaxInt32 || p.n_preferred > maxCount || p.stripe_count > math.MaxInt32 {
		return nil, invalidParams("mc_replicate_config_t: replicas %d, soft_pin_ttl_ms %d, n_preferred %d or stripe_count %d out of range",
			p.replicas, p.soft_pin_ttl_ms, p.n_preferred, p.stripe_count)
	}
	rc := &client.ReplicateConfig{
		Replicas:    int(p.replicas),
		SoftPin:     p.soft_pin != 0,
		SoftPinTTL:  time.Duration(p.soft_pin_ttl_ms) * time.Millisecond,
		HardPin:     p.hard_pin != 0,
		PreferLocal: p.prefer_local != 0,
		Stripes:     int(p.stripe_count), // ABI 1.11
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

// put is the body of put, put_from and upsert; f is the client's method.
func put(h C.mc_store_t, key *C.char, value unsafe.Pointer, length C.uint64_t, crc *C.mc_replicate_config_t, cerr *C.mc_error_t,
	f func(s *storeObj, ctx context.Context, key string, v []byte, rc *client.ReplicateConfig) error) C.mc_status_t {
	return storeCall(h, cerr, func(ctx context.Context, s *storeObj) error {
		if key == nil {
			return nullArg("key")
		}
		v, err := bytesAt(value, length, "value")
		if err != nil {
			return err
		}
		rc, err := replicate(crc)
		if err != nil {
			return err
		}
		return f(s, ctx, C.GoString(key), v, rc)
	})
}

//export mcgoStorePut
func mcgoStorePut(h C.mc_store_t, key *C.char, value unsafe.Pointer, length C.uint64_t, rc *C.mc_replicate_config_t, cerr *C.mc_error_t) C.mc_status_t {
	return put(h, key, value, length, rc, cerr, (*storeObj).Put)
}

//export mcgoStorePutFrom
func mcgoStorePutFrom(h C.mc_store_t, key *C.char, value unsafe.Pointer, length C.uint64_t, rc *C.mc_replicate_config_t, cerr *C.mc_error_t) C.mc_status_t {
	return put(h, key, value, length, rc, cerr, (*storeObj).PutFrom)
}

//export mcgoStoreUpsert
func mcgoStoreUpsert(h C.mc_store_t, key *C.char, value unsafe.Pointer, length C.uint64_t, rc *C.mc_replicate_config_t, cerr *C.mc_error_t) C.mc_status_t {
	return put(h, key, value, length, rc, cerr, (*storeObj).Upsert)
}

//export mcgoStoreGet
func mcgoStoreGet(h C.mc_store_t, key *C.char, buf unsafe.Pointer, bufLen C.uint64_t, lenOut *C.uint64_t, cerr *C.mc_error_t) C.mc_status_t {
	return storeCall(h, cerr, func(ctx context.Context, s *storeObj) error {
		if key == nil {
			return nullArg("key")
		}
		if lenOut == nil {
			return nullArg("len_out")
		}
		*lenOut = 0
		dst, err := bytesAt(buf, bufLen, "buf")
		if err != nil {
			return err
		}
		k := C.GoString(key)
		if len(dst) > 0 {
			n, err := s.GetInto(ctx, k, dst)
			if err == nil {
				*lenOut = C.uint64_t(n)
				return nil
			}
			if !errors.Is(err, storepb.ErrInvalidParams) {
				return err
			}
		}
		// An empty buffer, or one GetInto found too small: report the size.
		size, err := s.Size(ctx, k)
		if err != nil {
			return err
		}
		*lenOut = C.uint64_t(size)
		if size <= uint64(len(dst)) { // the failure was not the size
			return invalidParams("get %q into a buffer of %d bytes", k, len(dst))
		}
		return abiErrorf(C.MC_ERR_BUFFER_TOO_SMALL, "get %q: value of %d bytes, buffer of %d", k, size, len(dst))
	})
}

//export mcgoStoreGetInto
func mcgoStoreGetInto(h C.mc_store_t, key *C.char, buf unsafe.Pointer, bufLen C.uint64_t, lenOut *C.uint64_t, cerr *C.mc_error_t) C.mc_status_t {
	return storeCall(h, cerr, func(ctx context.Context, s *storeObj) error {
		if key == nil {
			return nullArg("key")
		}
		if buf == nil {
			return nullArg("buf")
		}
		if lenOut != nil {
			*lenOut = 0
		}
		dst, err := bytesAt(buf, bufLen, "buf")
		if err != nil {
			return err
		}
		n, err := s.GetInto(ctx, C.GoString(key), dst)
		if err != nil {
			return err
		}
		if lenOut != nil {
			*lenOut = C.uint64_t(n)
		}
		return nil
	})
}

// keyCall is the body of a call on one key that writes a result to out
// (zeroed first): key and out must not be NULL, named as what.
func keyCall[T any](h C.mc_store_t, key *C.char, out *T, what string, cerr *C.mc_error_t, f func(s *storeObj, ctx context.Context, key string) (T, error)) C.mc_status_t {
	return storeCall(h, cerr, func(ctx context.Context, s *storeObj) error {
		if key == nil || out == nil {
			return nullArg(what)
		}
		var zero T
		*out = zero
		v, err := f(s, ctx, C.GoString(key))
		if err != nil {
			return err
		}
		*out = v
		return nil
	})
}

//export mcgoStoreGetSize
func mcgoStoreGetSize(h C.mc_store_t, key *C.char, sizeOut *C.uint64_t, cerr *C.mc_error_t) C.mc_status_t {
	return keyCall(h, key, sizeOut, "key or size_out", cerr, func(s *storeObj, ctx context.Context, k string) (C.uint64_t, error) {
		n, err := s.Size(ctx, k)
		return C.uint64_t(n), err
	})
}

//export mcgoStoreExist
func mcgoStoreExist(h C.mc_store_t, key *C.char, existsOut *C.int32_t, cerr *C.mc_error_t) C.mc_status_t {
	return keyCall(h, key, existsOut, "key or exists_out", cerr, func(s *storeObj, ctx context.Context, k string) (C.int32_t, error) {
		ok, err := s.Exist(ctx, k)
		return cBool(ok), err
	})
}

// cBool is 1 for true, 0 for false.
func cBool(b bool) C.int32_t {
	if b {
		return 1
	}
	return 0
}

// keysAt copies count C strings.
func keysAt(p **C.char, count C.size_t) ([]string, error) {
	cs, err := arrayAt(p, count, "keys", invalidParams)
	if err != nil || len(cs) == 0 {
		return nil, err
	}
	ks := make([]string, len(cs))
	for i, k := range cs {
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

// batchCall is the body of a batch call on count keys: prepare reads the
// call's other arguments and returns the operation, which runs unless the
// batch is empty and returns an error per key; those go to codesOut and
// the first fails the call (batchResult).
func batchCall(h C.mc_store_t, keys **C.char, count C.size_t, codesOut *C.mc_status_t, cerr *C.mc_error_t,
	prepare func(s *storeObj, ks []string) (op func(ctx context.Context) []error, err error)) C.mc_status_t {
	return storeCall(h, cerr, func(ctx context.Context, s *storeObj) error {
		ks, err := keysAt(keys, count)
		if err != nil {
			return err
		}
		op, err := prepare(s, ks)
		if err != nil || len(ks) == 0 {
			return err
		}
		return batchResult(ks, op(ctx), codesOut)
	})
}

// batchResult writes per-key codes and returns the call's error: the
// first failure, else nil.
func batchResult(keys []string, errs []error, codesOut *C.mc_status_t) error {
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
	return first
}

// lensResult writes the byte counts of a batch get to out, if not NULL.
func lensResult(out *C.uint64_t, ns []int) {
	if out != nil {
		dst := unsafe.Slice(out, len(ns))
		for i, n := range ns {
			dst[i] = C.uint64_t(n)
		}
	}
}

// batchPut is the body of the batch put forms; f is the client's method.
func batchPut(h C.mc_store_t, keys **C.char, values *unsafe.Pointer, lens *C.uint64_t, count C.size_t, crc *C.mc_replicate_config_t,
	codesOut *C.mc_status_t, cerr *C.mc_error_t,
	f func(s *storeObj, ctx context.Context, ks []string, vs [][]byte, rc *client.ReplicateConfig) []error) C.mc_status_t {
	return batchCall(h, keys, count, codesOut, cerr, func(s *storeObj, ks []string) (func(context.Context) []error, error) {
		vs, err := buffersAt(values, lens, count, "values")
		if err != nil {
			return nil, err
		}
		rc, err := replicate(crc)
		if err != nil {
			return nil, err
		}
		return func(ctx context.Context) []error { return f(s, ctx, ks, vs, rc) }, nil
	})
}

//export mcgoStoreBatchPut
func mcgoStoreBatchPut(h C.mc_store_t, keys **C.char, values *unsafe.Pointer, lens *C.uint64_t, count C.size_t, rc *C.mc_replicate_config_t, codesOut *C.mc_status_t, cerr *C.mc_error_t) C.mc_status_t {
	return batchPut(h, keys, values, lens, count, rc, codesOut, cerr, (*storeObj).BatchPut)
}

//export mcgoStoreBatchPutFrom
func mcgoStoreBatchPutFrom(h C.mc_store_t, keys **C.char, values *unsafe.Pointer, lens *C.uint64_t, count C.size_t, rc *C.mc_replicate_config_t, codesOut *C.mc_status_t, cerr *C.mc_error_t) C.mc_status_t {
	return batchPut(h, keys, values, lens, count, rc, codesOut, cerr, (*storeObj).BatchPutFrom)
}

//export mcgoStoreBatchUpsert
func mcgoStoreBatchUpsert(h C.mc_store_t, keys **C.char, values *unsafe.Pointer, lens *C.uint64_t, count C.size_t, rc *C.mc_replicate_config_t, codesOut *C.mc_status_t, cerr *C.mc_error_t) C.mc_status_t {
	return batchPut(h, keys, values, lens, count, rc, codesOut, cerr, (*storeObj).BatchUpsert)
}

//export mcgoStoreBatchGetInto
func mcgoStoreBatchGetInto(h C.mc_store_t, keys **C.char, bufs *unsafe.Pointer, bufLens *C.uint64_t, count C.size_t, lensOut *C.uint64_t, codesOut *C.mc_status_t, cerr *C.mc_error_t) C.mc_status_t {
	return batchCall(h, keys, count, codesOut, cerr, func(s *storeObj, ks []string) (func(context.Context) []error, error) {
		dsts, err := buffersAt(bufs, bufLens, count, "bufs")
		return func(ctx context.Context) []error {
			ns, errs := s.BatchGetInto(ctx, ks, dsts)
			lensResult(lensOut, ns)
			return errs
		}, err
	})
}

//export mcgoStoreBatchExist
func mcgoStoreBatchExist(h C.mc_store_t, keys **C.char, count C.size_t, existsOut *C.int32_t, codesOut *C.mc_status_t, cerr *C.mc_error_t) C.mc_status_t {
	return batchCall(h, keys, count, codesOut, cerr, func(s *storeObj, ks []string) (func(context.Context) []error, error) {
		if len(ks) > 0 && existsOut == nil {
			return nil, nullArg("exists_out")
		}
		return func(ctx context.Context) []error {
			ok, errs := s.BatchExist(ctx, ks)
			out := unsafe.Slice(existsOut, len(ks))
			for i := range out {
				out[i] = cBool(ok[i])
			}
			return errs
		}, nil
	})
}

//export mcgoStoreRemove
func mcgoStoreRemove(h C.mc_store_t, key *C.char, force C.int, cerr *C.mc_error_t) C.mc_status_t {
	return storeCall(h, cerr, func(ctx context.Context, s *storeObj) error {
		if key == nil {
			return nullArg("key")
		}
		return s.Remove(ctx, C.GoString(key), force != 0)
	})
}

//export mcgoStoreBatchRemove
func mcgoStoreBatchRemove(h C.mc_store_t, keys **C.char, count C.size_t, force C.int, codesOut *C.mc_status_t, cerr *C.mc_error_t) C.mc_status_t {
	return batchCall(h, keys, count, codesOut, cerr, func(s *storeObj, ks []string) (func(context.Context) []error, error) {
		return func(ctx context.Context) []error { return s.BatchRemove(ctx, ks, force != 0) }, nil
	})
}

//export mcgoStoreRemoveAll
func mcgoStoreRemoveAll(h C.mc_store_t, force C.int, removedOut *C.uint64_t, cerr *C.mc_error_t) C.mc_status_t {
	return storeCall(h, cerr, func(ctx context.Context, s *storeObj) error {
		n, err := s.RemoveAll(ctx, force != 0)
		return storeCount(removedOut, n, err)
	})
}

//export mcgoStoreRemoveByRegex
func mcgoStoreRemoveByRegex(h C.mc_store_t, regex *C.char, force C.int, removedOut *C.uint64_t, cerr *C.mc_error_t) C.mc_status_t {
	return storeCall(h, cerr, func(ctx context.Context, s *storeObj) error {
		if regex == nil {
			return nullArg("regex")
		}
		n, err := s.RemoveByRegex(ctx, C.GoString(regex), force != 0)
		return storeCount(removedOut, n, err)
	})
}

// storeCount stores n in *out when out is not NULL and passes err on.
func storeCount(out *C.uint64_t, n int, err error) error {
	if out != nil {
		*out = C.uint64_t(n)
	}
	return err
}
