package realclient

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
)

// The wire protocol between a dummy client and the real client: frames on
// one stream socket, a request and then its response, one at a time.
//
//	frame    = length u32 | version u8 | op u8 | flags u16 | body
//	           (length counts everything after itself; little endian)
//	request  = replicas u32 | pinTTLms u64 | arg0 u64 | arg1 u64
//	           | npref u16 | npref × string | nitems u32 | nitems × item
//	item     = key string | region u32 | off u64 | len u64
//	response = code i32 | msg string | value u64 | nres u32 | nres × result
//	result   = code i32 | n u64
//	string   = len u16 | bytes
//
// No frame carries a value: an item names bytes of shared memory by region
// (0: the session's own memory, pool then staging; others: memory the
// dummy registered with OpRegister), offset and length, and the response
// says how many the real client moved there. File descriptors travel as
// SCM_RIGHTS ancillary data: the memfd of the session's memory with the
// response of OpHello, the dummy's with OpRegister.

// Version is the protocol version. The real client answers a Hello of any
// other version with ErrVersion, so that mismatched builds fail at setup
// with a message instead of misreading each other's frames.
const Version = 1

// Op is what a request asks; its response has the same op with respBit set.
type Op uint8

// The requests.
const (
	OpHello      Op = 1 // arg0 = pool bytes, arg1 = staging bytes, replicas = pid; value = shared bytes
	OpPut        Op = 2 // items: key, value at off, len bytes; flags: FlagUpsert
	OpGet        Op = 3 // items: key, room at off, len bytes; result n = bytes read
	OpExist      Op = 4 // items: key; result n = 1 if it exists
	OpSize       Op = 5 // items: key; result n = its size
	OpRemove     Op = 6 // items: key; flags: FlagForce
	OpRemoveAll  Op = 7 // flags: FlagForce; value = objects removed
	OpRegister   Op = 8 // with an fd; arg0 = bytes, arg1 = offset in the fd; value = region
	OpUnregister Op = 9 // arg0 = region
	lastOp       Op = OpUnregister
	respBit      Op = 0x80
)

func (o Op) String() string {
	names := [...]string{"", "hello", "put", "get", "exist", "size", "remove", "remove-all", "register", "unregister"}
	if o&respBit != 0 {
		return (o &^ respBit).String() + "-response"
	}
	if int(o) < len(names) && o != 0 {
		return names[o]
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// Flags of a request.
const (
	FlagUpsert      uint16 = 1 << 0 // OpPut overwrites
	FlagForce       uint16 = 1 << 1 // OpRemove, OpRemoveAll ignore leases
	FlagSoftPin     uint16 = 1 << 2 // OpPut: ReplicateConfig.SoftPin
	FlagHardPin     uint16 = 1 << 3
	FlagPreferLocal uint16 = 1 << 4
)

const (
	headerLen = 8
	// MaxFrame bounds a frame: frames carry keys, never values, so a
	// batch of 4096 keys of 4 KiB fits with room to spare.
	MaxFrame  = 32 << 20
	maxString = math.MaxUint16
	itemMin   = 2 + 4 + 8 + 8
	resultLen = 4 + 8
)

// Errors of the protocol.
var (
	ErrFrame   = errors.New("realclient: malformed frame")
	ErrVersion = errors.New("realclient: protocol version mismatch")
)

// Item names one key and, for puts and gets, bytes of the shared memory.
type Item struct {
	Key      string
	Region   uint32
	Off, Len uint64
}

// Request is one call of a dummy client.
type Request struct {
	Op        Op
	Flags     uint16
	Replicas  uint32
	PinTTLms  uint64
	Arg0      uint64
	Arg1      uint64
	Preferred []string
	Items     []Item
}

// Result is the outcome of one item: a Mooncake error code (0 for
// success) and a count whose meaning depends on the op.
type Result struct {
	Code int32
	N    uint64
}

// Response answers a Request: Code and Msg for the call as a whole (a
// call that fails as a whole has no Results), else one Result per item.
type Response struct {
	Op      Op
	Version uint8
	Code    int32
	Msg     string
	Value   uint64
	Results []Result
}

// writer appends the encoding of fields to a frame.
type writer struct{ b []byte }

func (w *writer) u16(v uint16) { w.b = binary.LittleEndian.AppendUint16(w.b, v) }
func (w *writer) u32(v uint32) { w.b = binary.LittleEndian.AppendUint32(w.b, v) }
func (w *writer) u64(v uint64) { w.b = binary.LittleEndian.AppendUint64(w.b, v) }
func (w *writer) str(s string) {
	if len(s) > maxString {
		s = s[:maxString] // only messages can be this long; keys are checked before
	}
	w.u16(uint16(len(s)))
	w.b = append(w.b, s...)
}

func (w *writer) header(op Op, flags uint16) {
	w.b = append(w.b[:0], 0, 0, 0, 0, Version, byte(op))
	w.u16(flags)
}

// finish writes the frame's length and returns the frame.
func (w *writer) finish() ([]byte, error) {
	if len(w.b) > MaxFrame {
		return nil, fmt.Errorf("%w: %d bytes, more than %d", ErrFrame, len(w.b), MaxFrame)
	}
	binary.LittleEndian.PutUint32(w.b, uint32(len(w.b)-4))
	return w.b, nil
}

// AppendRequest encodes r as one frame, reusing buf's storage.
func AppendRequest(buf []byte, r *Request) ([]byte, error) {
	w := writer{b: buf}
	w.header(r.Op, r.Flags)
	w.u32(r.Replicas)
	w.u64(r.PinTTLms)
	w.u64(r.Arg0)
	w.u64(r.Arg1)
	if len(r.Preferred) > math.MaxUint16 {
		return nil, fmt.Errorf("%w: %d preferred segments", ErrFrame, len(r.Preferred))
	}
	w.u16(uint16(len(r.Preferred)))
	for _, s := range r.Preferred {
		if len(s) > maxString {
			return nil, fmt.Errorf("%w: preferred segment of %d bytes", ErrFrame, len(s))
		}
		w.str(s)
	}
	w.u32(uint32(len(r.Items)))
	for _, it := range r.Items {
		if len(it.Key) > maxString {
			return nil, fmt.Errorf("%w: key of %d bytes, more than %d", ErrFrame, len(it.Key), maxString)
		}
		w.str(it.Key)
		w.u32(it.Region)
		w.u64(it.Off)
		w.u64(it.Len)
	}
	return w.finish()
}

// AppendResponse encodes r as one frame, reusing buf's storage.
func AppendResponse(buf []byte, r *Response) ([]byte, error) {
	w := writer{b: buf}
	w.header(r.Op|respBit, 0)
	w.u32(uint32(r.Code))
	w.str(r.Msg)
	w.u64(r.Value)
	w.u32(uint32(len(r.Results)))
	for _, res := range r.Results {
		w.u32(uint32(res.Code))
		w.u64(res.N)
	}
	return w.finish()
}

// reader decodes fields of a frame; the first shortfall sticks in err.
type reader struct {
	b   []byte
	err error
}

func (r *reader) need(n int) []byte {
	if r.err != nil {
		return nil
	}
	if len(r.b) < n {
		r.err = fmt.Errorf("%w: %d bytes short", ErrFrame, n-len(r.b))
		return nil
	}
	p := r.b[:n]
	r.b = r.b[n:]
	return p
}

func (r *reader) u16() uint16 {
	if p := r.need(2); p != nil {
		return binary.LittleEndian.Uint16(p)
	}
	return 0
}

func (r *reader) u32() uint32 {
	if p := r.need(4); p != nil {
		return binary.LittleEndian.Uint32(p)
	}
	return 0
}

func (r *reader) u64() uint64 {
	if p := r.need(8); p != nil {
		return binary.LittleEndian.Uint64(p)
	}
	return 0
}

func (r *reader) str() string {
	return string(r.need(int(r.u16())))
}

// count reads a count of elements of at least min bytes each, refusing
// one the rest of the frame cannot hold (so that a forged count cannot
// make the decoder allocate).
func (r *reader) count(n uint64, min int) int {
	if r.err == nil && n > uint64(len(r.b)/min) {
		r.err = fmt.Errorf("%w: %d elements in %d bytes", ErrFrame, n, len(r.b))
	}
	if r.err != nil {
		return 0
	}
	return int(n)
}

// header checks a frame's length and version and returns its op, flags and body.
func header(frame []byte) (Op, uint16, []byte, error) {
	if len(frame) < headerLen {
		return 0, 0, nil, fmt.Errorf("%w: %d bytes, less than a header", ErrFrame, len(frame))
	}
	if n := binary.LittleEndian.Uint32(frame); uint64(n) != uint64(len(frame)-4) {
		return 0, 0, nil, fmt.Errorf("%w: length %d, frame of %d", ErrFrame, n, len(frame)-4)
	}
	if v := frame[4]; v != Version {
		return Op(frame[5]), 0, nil, fmt.Errorf("%w: got version %d, speak %d", ErrVersion, v, Version)
	}
	return Op(frame[5]), binary.LittleEndian.Uint16(frame[6:]), frame[headerLen:], nil
}

// DecodeRequest decodes one request frame (as ReadFrame returns it).
func DecodeRequest(frame []byte) (*Request, error) {
	op, flags, body, err := header(frame)
	if err != nil {
		return nil, err
	}
	if op == 0 || op > lastOp {
		return nil, fmt.Errorf("%w: unknown request %v", ErrFrame, op)
	}
	r := reader{b: body}
	q := &Request{Op: op, Flags: flags, Replicas: r.u32(), PinTTLms: r.u64(), Arg0: r.u64(), Arg1: r.u64()}
	if n := r.count(uint64(r.u16()), 2); n > 0 {
		q.Preferred = make([]string, n)
		for i := range q.Preferred {
			q.Preferred[i] = r.str()
		}
	}
	if n := r.count(uint64(r.u32()), itemMin); n > 0 {
		q.Items = make([]Item, n)
		for i := range q.Items {
			q.Items[i] = Item{Key: r.str(), Region: r.u32(), Off: r.u64(), Len: r.u64()}
		}
	}
	if r.err == nil && len(r.b) != 0 {
		r.err = fmt.Errorf("%w: %d trailing bytes", ErrFrame, len(r.b))
	}
	if r.err != nil {
		return nil, fmt.Errorf("%v request: %w", op, r.err)
	}
	return q, nil
}

// DecodeResponse decodes one response frame.
func DecodeResponse(frame []byte) (*Response, error) {
	op, flags, body, err := header(frame)
	if err != nil {
		return nil, err
	}
	if flags != 0 {
		return nil, fmt.Errorf("%w: response flags %#x (reserved, zero)", ErrFrame, flags)
	}
	if op&respBit == 0 || op&^respBit == 0 || op&^respBit > lastOp {
		return nil, fmt.Errorf("%w: %v is not a response", ErrFrame, op)
	}
	r := reader{b: body}
	p := &Response{Op: op &^ respBit, Version: Version, Code: int32(r.u32()), Msg: r.str(), Value: r.u64()}
	if n := r.count(uint64(r.u32()), resultLen); n > 0 {
		p.Results = make([]Result, n)
		for i := range p.Results {
			p.Results[i] = Result{Code: int32(r.u32()), N: r.u64()}
		}
	}
	if r.err == nil && len(r.b) != 0 {
		r.err = fmt.Errorf("%w: %d trailing bytes", ErrFrame, len(r.b))
	}
	if r.err != nil {
		return nil, fmt.Errorf("%v: %w", p.Op|respBit, r.err)
	}
	return p, nil
}

// ReadFrame reads one frame from r into buf (grown as needed) and returns
// it; a length over MaxFrame is refused before anything is allocated.
func ReadFrame(r io.Reader, buf []byte) ([]byte, error) {
	var l [4]byte
	if _, err := io.ReadFull(r, l[:]); err != nil {
		return nil, err
	}
	return readRest(r, buf, l[:])
}

// readRest reads the rest of a frame whose first bytes (at least its
// length) are in got.
func readRest(r io.Reader, buf, got []byte) ([]byte, error) {
	n := binary.LittleEndian.Uint32(got)
	if n > MaxFrame-4 || n < headerLen-4 {
		return nil, fmt.Errorf("%w: length %d", ErrFrame, n)
	}
	total := int(n) + 4
	if len(got) > total {
		return nil, fmt.Errorf("%w: %d bytes after a frame", ErrFrame, len(got)-total)
	}
	if cap(buf) < total {
		buf = make([]byte, total)
	}
	buf = buf[:total]
	copy(buf, got)
	if _, err := io.ReadFull(r, buf[len(got):]); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return buf, nil
}
