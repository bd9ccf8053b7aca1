package main

/*
#include <stdlib.h>
#include "mooncake.h"
#include "transfer_engine_c.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"strings"
	"unsafe"

	"github.com/mooncake-go/mooncake/engine"
)

// Mooncake's C API (transfer_engine_c.h). shim.c turns its void* engine
// into the handle number these exports take; results are Mooncake's: 0 or
// a negative error.h code, -1 for a bad handle or a recovered panic.

const teInvalid = C.int(engine.CodeInvalidArgument)

// recovered reports whether a panic was caught, and logs it.
func recovered(r any) bool {
	if r == nil {
		return false
	}
	if panics.Add(1) == 1 {
		slog.Error("libmooncake: recovered a panic in the Mooncake C API; the call returned an error", "panic", fmt.Sprint(r))
	}
	return true
}

// teCode is the Mooncake result of err.
func teCode(err error) C.int {
	if err == nil {
		return 0
	}
	if _, ok := err.(*abiError); ok {
		return teInvalid
	}
	slog.Debug("libmooncake: Mooncake C API call failed", "err", err)
	return C.int(engine.CodeOf(err))
}

// teCall is the body of a Mooncake API export: f's result, or bad when f
// panics.
func teCall[T any](bad T, f func() T) (r T) {
	defer func() {
		if recovered(recover()) {
			r = bad
		}
	}()
	return f()
}

// teEngine is the body of a Mooncake API export on the engine h: f's
// result under teCall (a panic poisons the handle, as in mooncake.h), bad
// for a bad or poisoned handle.
func teEngine[T any](h C.uint64_t, bad T, f func(e *engineObj) T) T {
	return teCall(bad, func() T {
		r := bad
		if err := onEngine(uint64(h), func(e *engineObj) error { r = f(e); return nil }); err != nil {
			var ae *abiError
			if errors.As(err, &ae) && ae.code == statusPanic { // poisoned: say why, as mooncake.h's message would
				slog.Error("libmooncake: Mooncake C API call refused", "err", err)
			}
			return bad
		}
		return r
	})
}

// forceTCP is Mooncake's MC_FORCE_TCP: no shared-memory shortcut.
func forceTCP() bool {
	switch strings.ToLower(os.Getenv("MC_FORCE_TCP")) {
	case "1", "true", "yes", "on":
		return true
	}
	return false
}

//export mcgoTeCreate
func mcgoTeCreate(metadata, name, host *C.char, rpcPort C.uint64_t) C.uint64_t {
	return teCall(0, func() C.uint64_t {
		if rpcPort > 65535 {
			slog.Error("createTransferEngine: rpc_port out of range", "rpc_port", uint64(rpcPort))
			return 0
		}
		cfg := engine.Config{Metadata: cString(metadata), LocalServerName: cString(name), Host: cString(host), RPCPort: int(rpcPort)}
		if forceTCP() {
			cfg.Transport = "tcp"
		}
		e, err := engine.New(context.Background(), cfg)
		if err != nil {
			slog.Error("createTransferEngine failed", "err", err)
			return 0
		}
		return C.uint64_t(newHandle(newEngineObj(e, defaultTimeout)))
	})
}

//export mcgoTeDestroy
func mcgoTeDestroy(h C.uint64_t) {
	defer func() { recovered(recover()) }()
	_ = engines.destroy(uint64(h))
}

//export mcgoTeCheck
func mcgoTeCheck(h C.uint64_t) C.int {
	return teEngine(h, teInvalid, func(*engineObj) C.int { return 0 })
}

//export mcgoTeLocalIPAndPort
func mcgoTeLocalIPAndPort(h C.uint64_t, buf *C.char, n C.size_t) C.int {
	return teEngine(h, teInvalid, func(e *engineObj) C.int {
		if buf == nil {
			return teInvalid
		}
		// As Mooncake (snprintf): truncated to fit, success all the same.
		writeCString(unsafe.Pointer(buf), int(min(n, math.MaxInt32)), e.Name())
		return 0
	})
}

//export mcgoTeOpenSegment
func mcgoTeOpenSegment(h C.uint64_t, name *C.char, noCache C.int) C.int32_t {
	return teEngine(h, C.int32_t(teInvalid), func(e *engineObj) C.int32_t {
		if name == nil {
			return C.int32_t(teInvalid)
		}
		if noCache != 0 {
			// Forget the cached descriptor (opening an open name only looks it
			// up): the reopening below fetches the peer's current one.
			if id, err := e.openSegment(C.GoString(name)); err == nil && id != engine.LocalSegment {
				_ = e.CloseSegment(id)
			}
		}
		var seg C.mc_segment_t
		if st := mcgoEngineOpenSegment(C.mc_engine_t(h), name, &seg, nil); st != C.MC_OK {
			if st < -9000 {
				return C.int32_t(teInvalid)
			}
			return C.int32_t(st)
		}
		if seg > math.MaxInt32 {
			slog.Error("openSegment: segment id exceeds segment_id_t", "id", uint64(seg))
			return C.int32_t(teInvalid)
		}
		return C.int32_t(seg)
	})
}

//export mcgoTeCloseSegment
func mcgoTeCloseSegment(h C.uint64_t, id C.int32_t) C.int {
	return teEngine(h, teInvalid, func(e *engineObj) C.int {
		if id < 0 {
			return teInvalid
		}
		return teCode(e.CloseSegment(engine.SegmentID(id)))
	})
}

//export mcgoTeRegister
func mcgoTeRegister(h C.uint64_t, addr unsafe.Pointer, length C.size_t, location *C.char, remote C.int) C.int {
	return teEngine(h, teInvalid, func(e *engineObj) C.int {
		if addr == nil {
			return teInvalid
		}
		return teCode(e.RegisterMemory(e.ctx, uintptr(addr), uint64(length), cString(location), remote != 0))
	})
}

//export mcgoTeUnregister
func mcgoTeUnregister(h C.uint64_t, addr unsafe.Pointer) C.int {
	return teEngine(h, teInvalid, func(e *engineObj) C.int {
		if addr == nil {
			return teInvalid
		}
		return teCode(e.UnregisterMemory(e.ctx, uintptr(addr)))
	})
}

//export mcgoTeRegisterBatch
func mcgoTeRegisterBatch(h C.uint64_t, list *C.buffer_entry_t, n C.size_t, location *C.char) C.int {
	return teEngine(h, teInvalid, func(e *engineObj) C.int {
		bs, err := arrayAt(list, n, "list", invalidArg)
		if err != nil {
			return teInvalid
		}
		loc := cString(location)
		for _, b := range bs {
			if b.addr == nil {
				return teInvalid
			}
			if err := e.RegisterMemory(e.ctx, uintptr(b.addr), uint64(b.length), loc, true); err != nil {
				return teCode(err)
			}
		}
		return 0
	})
}

//export mcgoTeUnregisterBatch
func mcgoTeUnregisterBatch(h C.uint64_t, addrs *unsafe.Pointer, n C.size_t) C.int {
	return teEngine(h, teInvalid, func(e *engineObj) C.int {
		as, err := arrayAt(addrs, n, "addrs", invalidArg)
		if err != nil {
			return teInvalid
		}
		for _, a := range as {
			if err := e.UnregisterMemory(e.ctx, uintptr(a)); err != nil {
				return teCode(err)
			}
		}
		return 0
	})
}

//export mcgoTeAllocateBatch
func mcgoTeAllocateBatch(h C.uint64_t, size C.size_t) C.uint64_t {
	const invalidBatch = math.MaxUint64 // INVALID_BATCH
	return teEngine(h, invalidBatch, func(e *engineObj) C.uint64_t {
		if size > math.MaxInt32 {
			return invalidBatch
		}
		b, err := e.AllocateBatch(int(size))
		if err != nil {
			return invalidBatch
		}
		return C.uint64_t(b)
	})
}

//export mcgoTeSubmit
func mcgoTeSubmit(h C.uint64_t, b C.uint64_t, entries *C.struct_transfer_request, n C.size_t, name, msg *C.char, withNotify C.int) C.int {
	return teEngine(h, teInvalid, func(e *engineObj) C.int {
		in, err := arrayAt(entries, n, "entries", invalidArg)
		if err != nil {
			return teInvalid
		}
		rs := make([]engine.Request, n)
		for i, r := range in {
			if r.opcode != C.OPCODE_READ && r.opcode != C.OPCODE_WRITE || r.target_id < 0 {
				return teInvalid
			}
			// file_id is not read: callers built against older headers leave
			// it as uninitialised padding.
			rs[i] = request(r.opcode, r.source, r.target_id, r.target_offset, r.length)
		}
		return teCode(e.submit(engine.BatchID(b), rs, withNotify, name, msg))
	})
}

//export mcgoTeStatus
func mcgoTeStatus(h C.uint64_t, b C.uint64_t, task C.size_t, out *C.struct_transfer_status) C.int {
	return teEngine(h, teInvalid, func(e *engineObj) C.int {
		if out == nil || task > math.MaxInt32 {
			return teInvalid
		}
		ts, err := e.TaskStatus(engine.BatchID(b), int(task))
		if err != nil {
			return teCode(err)
		}
		out.status = C.int(ts.Status)
		out.transferred_bytes = C.uint64_t(ts.Transferred)
		return 0
	})
}

//export mcgoTeFreeBatch
func mcgoTeFreeBatch(h C.uint64_t, b C.uint64_t) C.int {
	return teEngine(h, teInvalid, func(e *engineObj) C.int { return teCode(e.FreeBatch(engine.BatchID(b))) })
}

//export mcgoTeGetNotifs
func mcgoTeGetNotifs(h C.uint64_t, size *C.int) *C.notify_msg_t {
	if size != nil {
		*size = 0
	}
	return teEngine(h, nil, func(e *engineObj) *C.notify_msg_t {
		if size == nil {
			return nil
		}
		ns := e.Notifies()
		if len(ns) == 0 {
			return nil
		}
		if len(ns) > math.MaxInt32 {
			ns = ns[:math.MaxInt32]
		}
		// Allocated with malloc, each string too, as freeNotifsMsgBuf frees.
		arr, dst := cArray[C.notify_msg_t](len(ns))
		for i, n := range ns {
			dst[i].name, dst[i].msg = cStrdup(n.Name), cStrdup(n.Msg)
		}
		*size = C.int(len(ns))
		return arr
	})
}

//export mcgoTeGenNotify
func mcgoTeGenNotify(h C.uint64_t, target C.uint64_t, name, msg *C.char) C.int {
	return teEngine(h, teInvalid, func(e *engineObj) C.int {
		return teCode(e.notify(engine.SegmentID(target), engine.Notify{Name: cString(name), Msg: cString(msg)}))
	})
}
