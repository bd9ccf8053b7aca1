package main

/*
#include <stdlib.h>
#include "mooncake.h"
#include "transfer_engine_c.h"
*/
import "C"

import (
	"context"
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

// forceTCP is Mooncake's MC_FORCE_TCP: no shared-memory shortcut.
func forceTCP() bool {
	switch strings.ToLower(os.Getenv("MC_FORCE_TCP")) {
	case "1", "true", "yes", "on":
		return true
	}
	return false
}

//export mcgoTeCreate
func mcgoTeCreate(metadata, name, host *C.char, rpcPort C.uint64_t) (h C.uint64_t) {
	defer func() {
		if recovered(recover()) {
			h = 0
		}
	}()
	if rpcPort > 65535 {
		slog.Error("createTransferEngine: rpc_port out of range", "rpc_port", uint64(rpcPort))
		return 0
	}
	cfg := engine.Config{Metadata: cString(metadata), LocalServerName: cString(name), Host: cString(host), RPCPort: int(rpcPort)}
	if forceTCP() {
		cfg.Transport = "tcp"
	}
	e, err := engine.New(cfg)
	if err != nil {
		slog.Error("createTransferEngine failed", "err", err)
		return 0
	}
	return C.uint64_t(newHandle(&engineObj{Engine: e, timeout: defaultTimeout, bufs: map[uintptr]*engine.Buffer{}}))
}

//export mcgoTeDestroy
func mcgoTeDestroy(h C.uint64_t) {
	defer func() { recovered(recover()) }()
	if _, err := engineOf(uint64(h)); err != nil {
		return
	}
	if v, ok := releaseHandle(uint64(h)); ok {
		_ = v.(*engineObj).close()
	}
}

//export mcgoTeCheck
func mcgoTeCheck(h C.uint64_t) (rc C.int) {
	defer func() {
		if recovered(recover()) {
			rc = teInvalid
		}
	}()
	_, err := engineOf(uint64(h))
	return teCode(err)
}

//export mcgoTeLocalIPAndPort
func mcgoTeLocalIPAndPort(h C.uint64_t, buf *C.char, n C.size_t) (rc C.int) {
	defer func() {
		if recovered(recover()) {
			rc = teInvalid
		}
	}()
	e, err := engineOf(uint64(h))
	if err != nil {
		return teCode(err)
	}
	if buf == nil {
		return teInvalid
	}
	// As Mooncake (snprintf): truncated to fit, success all the same.
	writeCString(unsafe.Pointer(buf), int(min(n, math.MaxInt32)), e.Name())
	return 0
}

//export mcgoTeOpenSegment
func mcgoTeOpenSegment(h C.uint64_t, name *C.char, noCache C.int) (id C.int32_t) {
	defer func() {
		if recovered(recover()) {
			id = C.int32_t(teInvalid)
		}
	}()
	e, err := engineOf(uint64(h))
	if err != nil || name == nil {
		return C.int32_t(teInvalid)
	}
	var seg C.mc_segment_t
	if noCache != 0 {
		// Forget the cached descriptor (opening an open name only looks it
		// up): the reopening below fetches the peer's current one.
		ctx, cancel := context.WithTimeout(context.Background(), e.timeout)
		id, err := e.OpenSegment(ctx, C.GoString(name))
		cancel()
		if err == nil && id != engine.LocalSegment {
			_ = e.CloseSegment(id)
		}
	}
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
}

//export mcgoTeCloseSegment
func mcgoTeCloseSegment(h C.uint64_t, id C.int32_t) (rc C.int) {
	defer func() {
		if recovered(recover()) {
			rc = teInvalid
		}
	}()
	e, err := engineOf(uint64(h))
	if err != nil || id < 0 {
		return teInvalid
	}
	return teCode(e.CloseSegment(engine.SegmentID(id)))
}

//export mcgoTeRegister
func mcgoTeRegister(h C.uint64_t, addr unsafe.Pointer, length C.size_t, location *C.char, remote C.int) (rc C.int) {
	defer func() {
		if recovered(recover()) {
			rc = teInvalid
		}
	}()
	e, err := engineOf(uint64(h))
	if err != nil || addr == nil {
		return teInvalid
	}
	return teCode(e.RegisterMemory(uintptr(addr), uint64(length), cString(location), remote != 0))
}

//export mcgoTeUnregister
func mcgoTeUnregister(h C.uint64_t, addr unsafe.Pointer) (rc C.int) {
	defer func() {
		if recovered(recover()) {
			rc = teInvalid
		}
	}()
	e, err := engineOf(uint64(h))
	if err != nil || addr == nil {
		return teInvalid
	}
	return teCode(e.UnregisterMemory(uintptr(addr)))
}

//export mcgoTeRegisterBatch
func mcgoTeRegisterBatch(h C.uint64_t, list *C.buffer_entry_t, n C.size_t, location *C.char) (rc C.int) {
	defer func() {
		if recovered(recover()) {
			rc = teInvalid
		}
	}()
	e, err := engineOf(uint64(h))
	if err != nil || n > maxCount || (list == nil && n > 0) {
		return teInvalid
	}
	loc := cString(location)
	for _, b := range unsafe.Slice(list, int(n)) {
		if b.addr == nil {
			return teInvalid
		}
		if err := e.RegisterMemory(uintptr(b.addr), uint64(b.length), loc, true); err != nil {
			return teCode(err)
		}
	}
	return 0
}

//export mcgoTeUnregisterBatch
func mcgoTeUnregisterBatch(h C.uint64_t, addrs *unsafe.Pointer, n C.size_t) (rc C.int) {
	defer func() {
		if recovered(recover()) {
			rc = teInvalid
		}
	}()
	e, err := engineOf(uint64(h))
	if err != nil || n > maxCount || (addrs == nil && n > 0) {
		return teInvalid
	}
	for _, a := range unsafe.Slice(addrs, int(n)) {
		if err := e.UnregisterMemory(uintptr(a)); err != nil {
			return teCode(err)
		}
	}
	return 0
}

//export mcgoTeAllocateBatch
func mcgoTeAllocateBatch(h C.uint64_t, size C.size_t) (id C.uint64_t) {
	defer func() {
		if recovered(recover()) {
			id = math.MaxUint64
		}
	}()
	e, err := engineOf(uint64(h))
	if err != nil || size > math.MaxInt32 {
		return math.MaxUint64 // INVALID_BATCH
	}
	b, err := e.AllocateBatch(int(size))
	if err != nil {
		return math.MaxUint64
	}
	return C.uint64_t(b)
}

//export mcgoTeSubmit
func mcgoTeSubmit(h C.uint64_t, b C.uint64_t, entries *C.struct_transfer_request, n C.size_t, name, msg *C.char, withNotify C.int) (rc C.int) {
	defer func() {
		if recovered(recover()) {
			rc = teInvalid
		}
	}()
	e, err := engineOf(uint64(h))
	if err != nil || n > maxCount || (entries == nil && n > 0) {
		return teInvalid
	}
	rs := make([]engine.Request, n)
	for i, r := range unsafe.Slice(entries, int(n)) {
		if r.opcode != C.OPCODE_READ && r.opcode != C.OPCODE_WRITE || r.target_id < 0 {
			return teInvalid
		}
		// file_id is not read: callers built against older headers leave
		// it as uninitialised padding.
		rs[i] = engine.Request{Op: engine.Op(r.opcode), Local: uintptr(r.source), Segment: engine.SegmentID(r.target_id),
			Remote: uint64(r.target_offset), Length: uint64(r.length)}
	}
	var opts []engine.SubmitOption
	if withNotify != 0 {
		opts = append(opts, engine.WithNotify(engine.Notify{Name: cString(name), Msg: cString(msg)}))
	}
	return teCode(e.Submit(engine.BatchID(b), rs, opts...))
}

//export mcgoTeStatus
func mcgoTeStatus(h C.uint64_t, b C.uint64_t, task C.size_t, out *C.struct_transfer_status) (rc C.int) {
	defer func() {
		if recovered(recover()) {
			rc = teInvalid
		}
	}()
	e, err := engineOf(uint64(h))
	if err != nil || out == nil || task > math.MaxInt32 {
		return teInvalid
	}
	ts, err := e.TaskStatus(engine.BatchID(b), int(task))
	if err != nil {
		return teCode(err)
	}
	out.status = C.int(ts.Status)
	out.transferred_bytes = C.uint64_t(ts.Transferred)
	return 0
}

//export mcgoTeFreeBatch
func mcgoTeFreeBatch(h C.uint64_t, b C.uint64_t) (rc C.int) {
	defer func() {
		if recovered(recover()) {
			rc = teInvalid
		}
	}()
	e, err := engineOf(uint64(h))
	if err != nil {
		return teInvalid
	}
	return teCode(e.FreeBatch(engine.BatchID(b)))
}

//export mcgoTeGetNotifs
func mcgoTeGetNotifs(h C.uint64_t, size *C.int) (out *C.notify_msg_t) {
	defer func() {
		if recovered(recover()) {
			out = nil
		}
	}()
	if size != nil {
		*size = 0
	}
	e, err := engineOf(uint64(h))
	if err != nil || size == nil {
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
	arr := (*C.notify_msg_t)(C.calloc(C.size_t(len(ns)), C.sizeof_notify_msg_t))
	dst := unsafe.Slice(arr, len(ns))
	for i, n := range ns {
		dst[i].name, dst[i].msg = cStrdup(n.Name), cStrdup(n.Msg)
	}
	*size = C.int(len(ns))
	return arr
}

//export mcgoTeGenNotify
func mcgoTeGenNotify(h C.uint64_t, target C.uint64_t, name, msg *C.char) (rc C.int) {
	defer func() {
		if recovered(recover()) {
			rc = teInvalid
		}
	}()
	e, err := engineOf(uint64(h))
	if err != nil {
		return teInvalid
	}
	return teCode(e.notify(engine.SegmentID(target), engine.Notify{Name: cString(name), Msg: cString(msg)}))
}
