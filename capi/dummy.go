package main

/*
#include "mooncake.h"
*/
import "C"

import (
	"context"
	"math"
	"sync"
	"unsafe"

	"github.com/mooncake-go/mooncake/store/realclient"
)

// The dummy client of ABI 1.9 (mc_dummy_*): a store client that forwards
// to the real client (`mooncake client`) on this host and shares its pool,
// as the official setup_dummy does.

// dummyObj is a dummy client as C sees it.
type dummyObj struct {
	*realclient.Dummy
	lifetime

	// ops is held for reading by every call in progress and for writing by
	// close, so that close unmaps the shared memory only after them.
	ops    sync.RWMutex
	closed bool // under ops
}

var dummies = handleKind[*dummyObj]{name: "dummy client", wrong: "an engine or a store, not a dummy client"}

// close cancels the calls in progress (their socket I/O ends at once),
// waits for them, then hangs up.
func (d *dummyObj) close() error {
	d.cancel()
	d.ops.Lock()
	defer d.ops.Unlock()
	d.closed = true
	return d.Dummy.Close()
}

// dummyCall is the body of a dummy export: f runs on the dummy h under
// guard, as a call in progress.
func dummyCall(h C.mc_dummy_t, cerr *C.mc_error_t, f func(ctx context.Context, d *dummyObj) error) C.mc_status_t {
	return guard(cerr, domainStore, func() error {
		d, err := dummies.of(uint64(h))
		if err != nil {
			return err
		}
		d.ops.RLock()
		defer d.ops.RUnlock()
		if d.closed {
			return abiErrorf(C.MC_ERR_INVALID_HANDLE, "dummy client handle %d: closed", h)
		}
		return d.run(uint64(h), func() error { return f(d.ctx, d) })
	})
}

//export mcgoDummyCreate
func mcgoDummyCreate(addr *C.char, poolSize, stagingSize C.uint64_t, out *C.mc_dummy_t, cerr *C.mc_error_t) C.mc_status_t {
	return guard(cerr, domainStore, func() error {
		if addr == nil || out == nil {
			return nullArg("server_address or out")
		}
		*out = 0
		if poolSize > math.MaxInt64 || stagingSize > math.MaxInt64 {
			return invalidParams("mem_pool_size %d or local_buffer_size %d out of range", poolSize, stagingSize)
		}
		d, err := realclient.Dial(context.Background(), C.GoString(addr), uint64(poolSize), uint64(stagingSize))
		if err != nil {
			return err
		}
		o := &dummyObj{Dummy: d}
		o.init("dummy client")
		*out = C.mc_dummy_t(newHandle(o))
		return nil
	})
}

//export mcgoDummyClose
func mcgoDummyClose(h C.mc_dummy_t, cerr *C.mc_error_t) C.mc_status_t {
	return guard(cerr, domainStore, func() error { return dummies.destroy(uint64(h)) })
}

//export mcgoDummyAlloc
func mcgoDummyAlloc(h C.mc_dummy_t, size C.uint64_t, addrOut *unsafe.Pointer, cerr *C.mc_error_t) C.mc_status_t {
	return dummyCall(h, cerr, func(_ context.Context, d *dummyObj) error {
		if addrOut == nil {
			return nullArg("addr_out")
		}
		*addrOut = nil
		b, err := d.Alloc(uint64(size))
		if err != nil {
			return err
		}
		*addrOut = unsafe.Pointer(unsafe.SliceData(b))
		return nil
	})
}

//export mcgoDummyFree
func mcgoDummyFree(h C.mc_dummy_t, addr unsafe.Pointer, cerr *C.mc_error_t) C.mc_status_t {
	return dummyCall(h, cerr, func(_ context.Context, d *dummyObj) error {
		if addr == nil {
			return nullArg("addr")
		}
		// One byte names the buffer: Free finds it by its start.
		return d.Free(unsafe.Slice((*byte)(addr), 1))
	})
}

//export mcgoDummyRegisterShared
func mcgoDummyRegisterShared(h C.mc_dummy_t, fd C.int, offset C.uint64_t, addr unsafe.Pointer, length C.uint64_t, cerr *C.mc_error_t) C.mc_status_t {
	return dummyCall(h, cerr, func(ctx context.Context, d *dummyObj) error {
		if addr == nil {
			return nullArg("addr")
		}
		mem, err := bytesAt(addr, length, "addr")
		if err != nil {
			return err
		}
		return d.RegisterShared(ctx, int(fd), uint64(offset), mem)
	})
}

//export mcgoDummyUnregisterShared
func mcgoDummyUnregisterShared(h C.mc_dummy_t, addr unsafe.Pointer, cerr *C.mc_error_t) C.mc_status_t {
	return dummyCall(h, cerr, func(ctx context.Context, d *dummyObj) error {
		if addr == nil {
			return nullArg("addr")
		}
		ok, err := d.UnregisterShared(ctx, unsafe.Slice((*byte)(addr), 1))
		if err == nil && !ok {
			err = invalidParams("no shared region registered at %p", addr)
		}
		return err
	})
}

//export mcgoDummyBatchPut
func mcgoDummyBatchPut(h C.mc_dummy_t, keys **C.char, values *unsafe.Pointer, lens *C.uint64_t, count C.size_t, upsert C.int,
	crc *C.mc_replicate_config_t, codesOut *C.mc_status_t, cerr *C.mc_error_t) C.mc_status_t {
	return dummyCall(h, cerr, func(ctx context.Context, d *dummyObj) error {
		ks, err := keysAt(keys, count)
		if err != nil {
			return err
		}
		vs, err := buffersAt(values, lens, count, "values")
		if err != nil {
			return err
		}
		rc, err := replicate(crc)
		if err != nil || len(ks) == 0 {
			return err
		}
		return batchResult(ks, d.BatchPut(ctx, ks, vs, rc, upsert != 0), codesOut)
	})
}

//export mcgoDummyBatchGetInto
func mcgoDummyBatchGetInto(h C.mc_dummy_t, keys **C.char, bufs *unsafe.Pointer, bufLens *C.uint64_t, count C.size_t,
	lensOut *C.uint64_t, codesOut *C.mc_status_t, cerr *C.mc_error_t) C.mc_status_t {
	return dummyCall(h, cerr, func(ctx context.Context, d *dummyObj) error {
		ks, err := keysAt(keys, count)
		if err != nil {
			return err
		}
		dsts, err := buffersAt(bufs, bufLens, count, "bufs")
		if err != nil || len(ks) == 0 {
			return err
		}
		ns, errs := d.BatchGetInto(ctx, ks, dsts)
		lensResult(lensOut, ns)
		return batchResult(ks, errs, codesOut)
	})
}

//export mcgoDummyBatchExist
func mcgoDummyBatchExist(h C.mc_dummy_t, keys **C.char, count C.size_t, existsOut *C.int32_t, codesOut *C.mc_status_t, cerr *C.mc_error_t) C.mc_status_t {
	return dummyCall(h, cerr, func(ctx context.Context, d *dummyObj) error {
		ks, err := keysAt(keys, count)
		if err != nil || len(ks) == 0 {
			return err
		}
		if existsOut == nil {
			return nullArg("exists_out")
		}
		ok, errs := d.BatchExist(ctx, ks)
		out := unsafe.Slice(existsOut, len(ks))
		for i := range out {
			out[i] = cBool(ok[i])
		}
		return batchResult(ks, errs, codesOut)
	})
}

//export mcgoDummyGetSize
func mcgoDummyGetSize(h C.mc_dummy_t, key *C.char, sizeOut *C.uint64_t, cerr *C.mc_error_t) C.mc_status_t {
	return dummyCall(h, cerr, func(ctx context.Context, d *dummyObj) error {
		if key == nil || sizeOut == nil {
			return nullArg("key or size_out")
		}
		*sizeOut = 0
		n, err := d.Size(ctx, C.GoString(key))
		if err != nil {
			return err
		}
		*sizeOut = C.uint64_t(n)
		return nil
	})
}

//export mcgoDummyBatchRemove
func mcgoDummyBatchRemove(h C.mc_dummy_t, keys **C.char, count C.size_t, force C.int, codesOut *C.mc_status_t, cerr *C.mc_error_t) C.mc_status_t {
	return dummyCall(h, cerr, func(ctx context.Context, d *dummyObj) error {
		ks, err := keysAt(keys, count)
		if err != nil || len(ks) == 0 {
			return err
		}
		return batchResult(ks, d.BatchRemove(ctx, ks, force != 0), codesOut)
	})
}

//export mcgoDummyRemoveAll
func mcgoDummyRemoveAll(h C.mc_dummy_t, force C.int, removedOut *C.uint64_t, cerr *C.mc_error_t) C.mc_status_t {
	return dummyCall(h, cerr, func(ctx context.Context, d *dummyObj) error {
		if removedOut != nil {
			*removedOut = 0
		}
		n, err := d.RemoveAll(ctx, force != 0)
		if removedOut != nil {
			*removedOut = C.uint64_t(n)
		}
		return err
	})
}
