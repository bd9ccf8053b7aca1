package main

/*
#include <stdlib.h>
#include "mooncake.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"
	"unsafe"

	"github.com/mooncake-go/mooncake/engine"
)

// maxCount bounds the length of arrays C passes in, so that a garbage
// count is an error rather than a wild unsafe.Slice.
const maxCount = 1 << 24

// maxMillis is the largest millisecond count a time.Duration holds.
const maxMillis = math.MaxInt64 / 1_000_000

// defaultTimeout is the engine's request timeout when the config leaves it.
const defaultTimeout = 30 * time.Second

//export mcgoEngineCreate
func mcgoEngineCreate(cfg *C.mc_engine_config_t, out *C.mc_engine_t, cerr *C.mc_error_t) C.mc_status_t {
	return guard(cerr, domainEngine, func() error {
		if out == nil {
			return nullArg("out")
		}
		*out = 0
		h, err := createEngine(cfg)
		*out = C.mc_engine_t(h)
		return err
	})
}

// createEngine starts an engine from a C config (NULL: the defaults) and
// returns its handle.
func createEngine(cfg *C.mc_engine_config_t) (uint64, error) {
	ec, err := engineConfig(cfg)
	if err != nil {
		return 0, err
	}
	e, err := engine.New(context.Background(), ec)
	if err != nil {
		return 0, err
	}
	timeout := ec.Timeout
	if timeout == 0 {
		timeout = defaultTimeout
	}
	return newHandle(newEngineObj(e, timeout)), nil
}

// engineConfig reads a C engine config; NULL is the zero config.
func engineConfig(p *C.mc_engine_config_t) (engine.Config, error) {
	if p == nil {
		return engine.Config{}, nil
	}
	c, err := readStruct(p, p.struct_size, "mc_engine_config_t", C.MC_ENGINE_CONFIG_SIZE_V1)
	if err != nil {
		return engine.Config{}, err
	}
	p = &c
	if p.reserved != 0 {
		return engine.Config{}, invalidArg("mc_engine_config_t.reserved must be 0")
	}
	if p.timeout_ms > maxMillis || p.lanes > 64 || p.rpc_port > 65535 || p.data_port > 65535 {
		return engine.Config{}, invalidArg("mc_engine_config_t: lanes %d, rpc_port %d, data_port %d or timeout_ms %d out of range",
			p.lanes, p.rpc_port, p.data_port, p.timeout_ms)
	}
	return engine.Config{
		Metadata:        cString(p.metadata),
		LocalServerName: cString(p.local_server_name),
		Host:            cString(p.host),
		Transport:       cString(p.transport),
		Secret:          cString(p.secret),
		RPCPort:         int(p.rpc_port),
		DataPort:        int(p.data_port),
		Lanes:           int(p.lanes),
		SliceSize:       uint64(p.slice_size),
		Timeout:         time.Duration(p.timeout_ms) * time.Millisecond,
		MaxRetries:      int(p.max_retries),
	}, nil
}

//export mcgoEngineDestroy
func mcgoEngineDestroy(h C.mc_engine_t, cerr *C.mc_error_t) C.mc_status_t {
	return guard(cerr, domainEngine, func() error { return engines.destroy(uint64(h)) })
}

//export mcgoEngineName
func mcgoEngineName(h C.mc_engine_t, buf *C.char, bufLen C.size_t, lenOut *C.size_t, cerr *C.mc_error_t) C.mc_status_t {
	return engineCall(h, cerr, func(e *engineObj) error { return writeOut(buf, bufLen, lenOut, e.Name()) })
}

// writeOut is the len_out protocol of mooncake.h: write what fits of s,
// report the size it needs, fail with MC_ERR_BUFFER_TOO_SMALL when it did
// not fit.
func writeOut(buf *C.char, bufLen C.size_t, lenOut *C.size_t, s string) error {
	if buf == nil && bufLen > 0 {
		return nullArg("buf")
	}
	need := writeCString(unsafe.Pointer(buf), int(min(bufLen, math.MaxInt32)), s)
	if lenOut != nil {
		*lenOut = C.size_t(need)
	}
	if C.size_t(need) > bufLen {
		return abiErrorf(C.MC_ERR_BUFFER_TOO_SMALL, "%d bytes needed, buffer holds %d", need, bufLen)
	}
	return nil
}

//export mcgoEnginePorts
func mcgoEnginePorts(h C.mc_engine_t, rpc, data *C.uint32_t, cerr *C.mc_error_t) C.mc_status_t {
	return engineCall(h, cerr, func(e *engineObj) error {
		if rpc != nil {
			*rpc = C.uint32_t(e.RPCPort())
		}
		if data != nil {
			*data = C.uint32_t(e.DataPort())
		}
		return nil
	})
}

//export mcgoEngineRegisterMemory
func mcgoEngineRegisterMemory(h C.mc_engine_t, addr unsafe.Pointer, length C.uint64_t, location *C.char, remote C.int, cerr *C.mc_error_t) C.mc_status_t {
	return engineCall(h, cerr, func(e *engineObj) error {
		if addr == nil {
			return nullArg("addr")
		}
		return e.RegisterMemory(e.ctx, uintptr(addr), uint64(length), cString(location), remote != 0)
	})
}

//export mcgoEngineUnregisterMemory
func mcgoEngineUnregisterMemory(h C.mc_engine_t, addr unsafe.Pointer, cerr *C.mc_error_t) C.mc_status_t {
	return engineCall(h, cerr, func(e *engineObj) error {
		if addr == nil {
			return nullArg("addr")
		}
		return e.UnregisterMemory(e.ctx, uintptr(addr))
	})
}

//export mcgoEngineAllocateBuffer
func mcgoEngineAllocateBuffer(h C.mc_engine_t, size C.uint64_t, location *C.char, addrOut *unsafe.Pointer, cerr *C.mc_error_t) C.mc_status_t {
	return engineCall(h, cerr, func(e *engineObj) error {
		if addrOut == nil {
			return nullArg("addr_out")
		}
		*addrOut = nil
		if size == 0 || size > math.MaxInt64 {
			return invalidArg("allocate buffer: size %d", size)
		}
		b, err := e.AllocateBuffer(e.ctx, int(size), cString(location))
		if err != nil {
			return err
		}
		e.mu.Lock()
		if e.bufs == nil { // destroyed meanwhile
			e.mu.Unlock()
			_ = b.Free()
			return engine.ErrClosed
		}
		e.bufs[b.Addr()] = b
		e.mu.Unlock()
		// The address of mmap'd memory, not Go memory: C may keep it.
		*addrOut = unsafe.Pointer(unsafe.SliceData(b.Bytes()))
		return nil
	})
}

//export mcgoEngineFreeBuffer
func mcgoEngineFreeBuffer(h C.mc_engine_t, addr unsafe.Pointer, cerr *C.mc_error_t) C.mc_status_t {
	return engineCall(h, cerr, func(e *engineObj) error {
		e.mu.Lock()
		b, ok := e.bufs[uintptr(addr)]
		delete(e.bufs, uintptr(addr))
		e.mu.Unlock()
		if !ok {
			return invalidArg("free buffer %p: not allocated by mc_engine_allocate_buffer", addr)
		}
		return b.Free()
	})
}

//export mcgoEngineOpenSegment
func mcgoEngineOpenSegment(h C.mc_engine_t, name *C.char, out *C.mc_segment_t, cerr *C.mc_error_t) C.mc_status_t {
	return engineCall(h, cerr, func(e *engineObj) error {
		if name == nil {
			return nullArg("name")
		}
		if out == nil {
			return nullArg("out")
		}
		id, err := e.openSegment(C.GoString(name))
		if err != nil {
			return err
		}
		*out = C.mc_segment_t(id)
		return nil
	})
}

// openSegment opens the segment name within the engine's request timeout,
// or until the handle is destroyed.
func (e *engineObj) openSegment(name string) (engine.SegmentID, error) {
	ctx, cancel := context.WithTimeout(e.ctx, e.timeout)
	defer cancel()
	return e.OpenSegment(ctx, name)
}

//export mcgoEngineCloseSegment
func mcgoEngineCloseSegment(h C.mc_engine_t, seg C.mc_segment_t, cerr *C.mc_error_t) C.mc_status_t {
	return engineCall(h, cerr, func(e *engineObj) error { return e.CloseSegment(engine.SegmentID(seg)) })
}

//export mcgoEngineSegmentBuffers
func mcgoEngineSegmentBuffers(h C.mc_engine_t, seg C.mc_segment_t, out *C.mc_buffer_desc_t, capacity C.size_t, countOut *C.size_t, cerr *C.mc_error_t) C.mc_status_t {
	return engineCall(h, cerr, func(e *engineObj) error {
		if out == nil && capacity > 0 {
			return nullArg("out")
		}
		capacity = min(capacity, maxCount)
		bufs, err := e.SegmentBuffers(engine.SegmentID(seg))
		if err != nil {
			return err
		}
		if countOut != nil {
			*countOut = C.size_t(len(bufs))
		}
		if out != nil {
			dst := unsafe.Slice(out, int(capacity))
			for i := 0; i < len(bufs) && i < len(dst); i++ {
				dst[i] = C.mc_buffer_desc_t{addr: C.uint64_t(bufs[i].Addr), length: C.uint64_t(bufs[i].Length)}
			}
		}
		if C.size_t(len(bufs)) > capacity {
			return abiErrorf(C.MC_ERR_BUFFER_TOO_SMALL, "segment %d has %d buffers, room for %d", seg, len(bufs), capacity)
		}
		return nil
	})
}

//export mcgoEngineAllocateBatch
func mcgoEngineAllocateBatch(h C.mc_engine_t, capacity C.uint32_t, out *C.mc_batch_t, cerr *C.mc_error_t) C.mc_status_t {
	return engineCall(h, cerr, func(e *engineObj) error {
		if out == nil {
			return nullArg("out")
		}
		id, err := e.AllocateBatch(int(capacity))
		if err != nil {
			return err
		}
		*out = C.mc_batch_t(id)
		return nil
	})
}

//export mcgoEngineFreeBatch
func mcgoEngineFreeBatch(h C.mc_engine_t, b C.mc_batch_t, cerr *C.mc_error_t) C.mc_status_t {
	return engineCall(h, cerr, func(e *engineObj) error { return e.FreeBatch(engine.BatchID(b)) })
}

//export mcgoEngineSubmit
func mcgoEngineSubmit(h C.mc_engine_t, b C.mc_batch_t, reqs *C.mc_request_t, count C.size_t, notifyName, notifyMsg *C.char, withNotify C.int, cerr *C.mc_error_t) C.mc_status_t {
	return engineCall(h, cerr, func(e *engineObj) error {
		in, err := arrayAt(reqs, count, "requests", invalidArg)
		if err != nil {
			return err
		}
		rs := make([]engine.Request, len(in))
		for i, r := range in {
			if r.opcode != C.MC_OP_READ && r.opcode != C.MC_OP_WRITE || r.reserved != 0 {
				return invalidArg("request %d: opcode %d (want MC_OP_READ or MC_OP_WRITE), reserved %d (want 0)", i, r.opcode, r.reserved)
			}
			rs[i] = request(r.opcode, r.local, r.segment, r.remote_addr, r.length)
		}
		if withNotify != 0 && (notifyName == nil || notifyMsg == nil) {
			return nullArg("notify_name or notify_msg")
		}
		return e.submit(engine.BatchID(b), rs, withNotify, notifyName, notifyMsg)
	})
}

// request is an engine request from the fields of a C one (mc_request_t,
// struct transfer_request).
func request[Op, Seg, N ~int32 | ~uint64](op Op, local unsafe.Pointer, seg Seg, remote, length N) engine.Request {
	return engine.Request{Op: engine.Op(op), Local: uintptr(local), Segment: engine.SegmentID(seg), Remote: uint64(remote), Length: uint64(length)}
}

// submit submits rs to the batch b, with the notification name and msg
// when withNotify is set (NULL strings are "").
func (e *engineObj) submit(b engine.BatchID, rs []engine.Request, withNotify C.int, name, msg *C.char) error {
	var opts []engine.SubmitOption
	if withNotify != 0 {
		opts = append(opts, engine.WithNotify(engine.Notify{Name: cString(name), Msg: cString(msg)}))
	}
	return e.Submit(e.ctx, b, rs, opts...)
}

//export mcgoEngineTaskStatus
func mcgoEngineTaskStatus(h C.mc_engine_t, b C.mc_batch_t, task C.uint64_t, out *C.mc_transfer_status_t, cerr *C.mc_error_t) C.mc_status_t {
	return engineCall(h, cerr, func(e *engineObj) error {
		if out == nil {
			return nullArg("out")
		}
		if task > math.MaxInt32 {
			return invalidArg("batch %d has no task %d", b, task)
		}
		ts, err := e.TaskStatus(engine.BatchID(b), int(task))
		if err != nil {
			return err
		}
		*out = transferStatus(ts)
		return nil
	})
}

//export mcgoEngineBatchStatus
func mcgoEngineBatchStatus(h C.mc_engine_t, b C.mc_batch_t, out *C.mc_transfer_status_t, cerr *C.mc_error_t) C.mc_status_t {
	return engineCall(h, cerr, func(e *engineObj) error {
		if out == nil {
			return nullArg("out")
		}
		ts, err := e.BatchStatus(engine.BatchID(b))
		if err != nil {
			return err
		}
		*out = transferStatus(ts)
		return nil
	})
}

//export mcgoEngineWait
func mcgoEngineWait(h C.mc_engine_t, b C.mc_batch_t, timeoutMs C.int64_t, out *C.mc_transfer_status_t, cerr *C.mc_error_t) C.mc_status_t {
	return engineCall(h, cerr, func(e *engineObj) error {
		ctx := e.ctx // destroying the engine ends the wait
		if timeoutMs >= 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, time.Duration(min(int64(timeoutMs), math.MaxInt64/int64(time.Millisecond)))*time.Millisecond)
			defer cancel()
		}
		ts, err := e.Wait(ctx, engine.BatchID(b))
		if out != nil {
			*out = transferStatus(ts)
		}
		switch {
		case err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()):
			return abiErrorf(C.MC_ERR_TIMED_OUT, "batch %d: not final after %d ms", b, timeoutMs)
		case err != nil:
			return err
		case ts.Status == engine.Completed:
			return nil
		case ts.Err != nil:
			return fmt.Errorf("batch %d %s: %w", b, ts.Status, ts.Err)
		}
		return abiErrorf(C.MC_ERR_TRANSFER_FAILED, "batch %d: %s", b, ts.Status)
	})
}

// transferStatus converts a task or batch status for C.
func transferStatus(ts engine.TransferStatus) C.mc_transfer_status_t {
	out := C.mc_transfer_status_t{state: C.int32_t(ts.Status), transferred: C.uint64_t(ts.Transferred)}
	switch {
	case ts.Err != nil:
		out.error_code = C.int32_t(engine.CodeOf(ts.Err))
	case ts.Status.Done() && ts.Status != engine.Completed:
		out.error_code = C.MC_ERR_TRANSFER_FAILED
	}
	return out
}

//export mcgoEngineSendNotify
func mcgoEngineSendNotify(h C.mc_engine_t, seg C.mc_segment_t, name, msg *C.char, cerr *C.mc_error_t) C.mc_status_t {
	return engineCall(h, cerr, func(e *engineObj) error {
		if name == nil || msg == nil {
			return nullArg("name or msg")
		}
		return e.notify(engine.SegmentID(seg), engine.Notify{Name: C.GoString(name), Msg: C.GoString(msg)})
	})
}

// notify sends n to the engine serving an opened segment.
func (e *engineObj) notify(seg engine.SegmentID, n engine.Notify) error {
	target, ok := e.SegmentName(seg)
	if !ok {
		return invalidArg("notify segment %d: not open", seg)
	}
	ctx, cancel := context.WithTimeout(e.ctx, e.timeout)
	defer cancel()
	return e.SendNotify(ctx, target, n)
}

//export mcgoEngineGetNotifies
func mcgoEngineGetNotifies(h C.mc_engine_t, out **C.mc_notify_t, countOut *C.size_t, cerr *C.mc_error_t) C.mc_status_t {
	return engineCall(h, cerr, func(e *engineObj) error {
		if out == nil || countOut == nil {
			return nullArg("out or count_out")
		}
		*out, *countOut = nil, 0
		ns := e.Notifies()
		if len(ns) == 0 {
			return nil
		}
		arr, dst := cArray[C.mc_notify_t](len(ns))
		for i, n := range ns {
			dst[i].name, dst[i].name_len = cStrdup(n.Name), C.size_t(len(n.Name))
			dst[i].msg, dst[i].msg_len = cStrdup(n.Msg), C.size_t(len(n.Msg))
		}
		*out, *countOut = arr, C.size_t(len(ns))
		return nil
	})
}

// cArray allocates n zeroed Ts with C.calloc and views them.
func cArray[T any](n int) (*T, []T) {
	var t T
	p := (*T)(C.calloc(C.size_t(n), C.size_t(unsafe.Sizeof(t))))
	return p, unsafe.Slice(p, n)
}

// cStrdup copies s into C.malloc'd memory, NUL-terminated.
func cStrdup(s string) *C.char {
	p := C.malloc(C.size_t(len(s) + 1))
	writeCString(p, len(s)+1, s)
	return (*C.char)(p)
}

// arrayAt views count elements of the C array p, NULL only when count is 0
// (what names it then). A count over maxCount is an error of invalid, as
// "N what (at most M)".
func arrayAt[T any](p *T, count C.size_t, what string, invalid func(string, ...any) error) ([]T, error) {
	if count > maxCount {
		return nil, invalid("%d %s (at most %d)", count, what, maxCount)
	}
	if count == 0 {
		return nil, nil
	}
	if p == nil {
		return nil, nullArg(what)
	}
	return unsafe.Slice(p, int(count)), nil
}
