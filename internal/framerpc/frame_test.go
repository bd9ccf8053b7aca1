package framerpc

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// sampleCalls are calls as a Conn makes them: the round-trip test's
// cases and the fuzzers' seeds.
func sampleCalls() []call {
	return []call{
		{id: 1, method: callMethod, msg: []byte{}},
		{id: 2, timeout: 1500 * time.Millisecond, method: "/mooncake.store.Master/PutEnd",
			md: metadata.MD{"authorization": {"Bearer tok"}, "tenant": {"a", "b"}}, msg: []byte("\x0a\x03key")},
		{id: math.MaxUint64, timeout: time.Duration(math.MaxInt64), method: "m",
			md: metadata.MD{"trace-bin": {"\x00\x01\xff"}, "empty": {""}}, msg: bytes.Repeat([]byte{0xab}, 300)},
	}
}

func frameOf(t testing.TB, c call) []byte {
	t.Helper()
	b, err := appendCall(nil, c.id, c.timeout, c.method, c.md, c.msg)
	if err != nil {
		t.Fatalf("appendCall(%+v): %v", c, err)
	}
	return b
}

func TestCallRoundTrip(t *testing.T) {
	for _, want := range sampleCalls() {
		prefix := []byte("earlier frame")
		b, err := appendCall(prefix, want.id, want.timeout, want.method, want.md, want.msg)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.HasPrefix(b, prefix) {
			t.Fatal("appendCall overwrote what it appends to")
		}
		body, err := readFrame(bytes.NewReader(b[len(prefix):]), nil, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		got, err := parseCall(body)
		if err != nil {
			t.Fatalf("parseCall of %+v: %v", want, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("round trip: got %+v, want %+v", got, want)
		}
	}
}

func TestAppendCallLimits(t *testing.T) {
	many := metadata.MD{}
	for i := range maxMetadata + 1 {
		many.Append("k", string(rune('a'+i%26)))
	}
	for _, tc := range []struct {
		name   string
		method string
		md     metadata.MD
	}{
		{"method too long", strings.Repeat("m", math.MaxUint16+1), nil},
		{"too many pairs", "m", many},
		{"metadata too large", "m", metadata.MD{"k": {strings.Repeat("v", maxMetadataBytes)}}},
	} {
		if _, err := appendCall(nil, 1, 0, tc.method, tc.md, nil); err == nil {
			t.Errorf("%s: no error", tc.name)
		}
	}
	// At the limits, it encodes and decodes.
	c := call{id: 1, method: strings.Repeat("m", math.MaxUint16), msg: []byte{},
		md: metadata.MD{"k": {strings.Repeat("v", maxMetadataBytes-1)}}}
	if got, err := parseCall(frameOf(t, c)[lenSize:]); err != nil || !reflect.DeepEqual(got, c) {
		t.Fatalf("a call at the limits: %v", err)
	}
}

func TestParseCallMalformed(t *testing.T) {
	good := frameOf(t, sampleCalls()[1])[lenSize:]
	le16 := func(v uint16) []byte { return binary.LittleEndian.AppendUint16(nil, v) }
	head := func(timeout uint64) []byte {
		return binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(nil, 7), timeout)
	}
	cat := func(bs ...[]byte) []byte { return bytes.Join(bs, nil) }
	pairs := cat(head(0), le16(1), []byte("m"), le16(2), le16(1), []byte("k"), []byte{1, 0, 0, 0}, []byte("v"))
	for _, tc := range []struct {
		name string
		body []byte
	}{
		{"empty", nil},
		{"header only", head(0)},
		{"negative timeout", cat(head(1<<63), le16(1), []byte("m"), le16(0))},
		{"no method", cat(head(0), le16(0), le16(0))},
		{"method past the end", cat(head(0), le16(5), []byte("m"))},
		{"no metadata count", cat(head(0), le16(1), []byte("m"))},
		{"pair missing", pairs},
		{"value past the end", pairs[:len(pairs)-1]},
		{"too many pairs", cat(head(0), le16(1), []byte("m"), le16(maxMetadata+1))},
		{"metadata too large", cat(head(0), le16(1), []byte("m"), le16(1), le16(1), []byte("k"),
			binary.LittleEndian.AppendUint32(nil, maxMetadataBytes), bytes.Repeat([]byte("v"), maxMetadataBytes))},
		{"truncated", good[:len(good)-len(sampleCalls()[1].msg)-1]},
	} {
		if c, err := parseCall(tc.body); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %+v, %v; want ErrMalformed", tc.name, c, err)
		}
	}
}

func TestAnswerRoundTrip(t *testing.T) {
	for _, kind := range []byte{answerOK, answerStatus} {
		msg := []byte("reply")
		b := append(appendAnswer(nil, 42, kind, len(msg)), msg...)
		body, err := readFrame(bytes.NewReader(b), nil, 1<<10)
		if err != nil {
			t.Fatal(err)
		}
		id, k, m, err := parseAnswer(body)
		if err != nil || id != 42 || k != kind || !bytes.Equal(m, msg) {
			t.Fatalf("kind %d: %d, %d, %q, %v", kind, id, k, m, err)
		}
	}
	for _, body := range [][]byte{nil, make([]byte, answerHead-1), append(make([]byte, 8), 2)} {
		if _, _, _, err := parseAnswer(body); !errors.Is(err, ErrMalformed) {
			t.Errorf("parseAnswer(%x): %v, want ErrMalformed", body, err)
		}
	}
}

// A frame's length is not trusted: one over the limit is refused before
// anything is allocated for it.
func TestReadFrameLimit(t *testing.T) {
	huge := binary.LittleEndian.AppendUint32(nil, math.MaxUint32)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := readFrame(bytes.NewReader(huge), nil, 1<<20)
	runtime.ReadMemStats(&after)
	var tl *TooLargeError
	if !errors.As(err, &tl) || tl.Size != math.MaxUint32 || tl.Limit != 1<<20 {
		t.Fatalf("a frame of 4 GiB: %v", err)
	}
	if n := after.TotalAlloc - before.TotalAlloc; n > 64<<10 {
		t.Fatalf("refusing a frame allocated %d bytes", n)
	}

	for _, tc := range []struct {
		name string
		in   []byte
		want error
	}{
		{"nothing", nil, io.EOF},
		{"part of a length", []byte{1, 0}, io.ErrUnexpectedEOF},
		{"no body", []byte{1, 0, 0, 0}, io.ErrUnexpectedEOF},
		{"part of a body", []byte{3, 0, 0, 0, 'a'}, io.ErrUnexpectedEOF},
	} {
		if _, err := readFrame(bytes.NewReader(tc.in), nil, 16); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	// A frame at the limit is read, into the buffer given when it fits.
	buf := make([]byte, 0, 16)
	got, err := readFrame(bytes.NewReader([]byte{4, 0, 0, 0, 'a', 'b', 'c', 'd'}), buf, 4)
	if err != nil || string(got) != "abcd" || &got[0] != &buf[:1][0] {
		t.Fatalf("a frame at the limit: %q, %v", got, err)
	}
}

func TestChainUnary(t *testing.T) {
	var order []string
	ic := func(name string) grpc.UnaryServerInterceptor {
		return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			order = append(order, name)
			return h(ctx, req)
		}
	}
	if ChainUnary() != nil {
		t.Fatal("ChainUnary() is not nil")
	}
	chain := ChainUnary(ic("a"), ic("b"), ic("c"))
	out, err := chain(context.Background(), "req", &grpc.UnaryServerInfo{}, func(_ context.Context, req any) (any, error) {
		order = append(order, "handler")
		return req.(string) + "!", nil
	})
	if err != nil || out != "req!" || strings.Join(order, ",") != "a,b,c,handler" {
		t.Fatalf("chain ran %v, answered %v, %v", order, out, err)
	}
}

// The decoders of network bytes never panic, and what they accept
// encodes back to itself.

func FuzzParseCall(f *testing.F) {
	for _, c := range sampleCalls() {
		f.Add(frameOf(f, c)[lenSize:])
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		c, err := parseCall(body)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("an error not ErrMalformed: %v", err)
			}
			return
		}
		b, err := appendCall(nil, c.id, c.timeout, c.method, c.md, c.msg)
		if err != nil {
			t.Fatalf("a call parsed does not encode: %v", err)
		}
		if n := binary.LittleEndian.Uint32(b); int(n) != len(b)-lenSize {
			t.Fatalf("length %d for a body of %d bytes", n, len(b)-lenSize)
		}
		again, err := parseCall(b[lenSize:])
		if err != nil {
			t.Fatalf("a call re-encoded does not parse: %v", err)
		}
		if !reflect.DeepEqual(again, c) {
			t.Fatalf("parsed %+v, re-encoded and parsed %+v", c, again)
		}
	})
}

func FuzzParseAnswer(f *testing.F) {
	for i, c := range sampleCalls() {
		f.Add(append(appendAnswer(nil, c.id, byte(i%2), len(c.msg)), c.msg...)[lenSize:])
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		id, kind, msg, err := parseAnswer(body)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("an error not ErrMalformed: %v", err)
			}
			return
		}
		b := append(appendAnswer(nil, id, kind, len(msg)), msg...)
		if n := binary.LittleEndian.Uint32(b); int(n) != len(b)-lenSize {
			t.Fatalf("length %d for a body of %d bytes", n, len(b)-lenSize)
		}
		id2, kind2, msg2, err := parseAnswer(b[lenSize:])
		if err != nil || id2 != id || kind2 != kind || !bytes.Equal(msg2, msg) {
			t.Fatalf("re-encoded: %d, %d, %q, %v; want %d, %d, %q", id2, kind2, msg2, err, id, kind, msg)
		}
	})
}

func FuzzReadFrame(f *testing.F) {
	var stream []byte
	for _, c := range sampleCalls() {
		b := frameOf(f, c)
		f.Add(b, uint32(len(b)))
		stream = append(stream, b...)
	}
	f.Add(stream, uint32(1<<10))
	f.Add(binary.LittleEndian.AppendUint32(nil, math.MaxUint32), uint32(1<<20))
	f.Fuzz(func(t *testing.T, in []byte, limit uint32) {
		lim := int(limit % (1 << 20))
		r := bytes.NewReader(in)
		var buf []byte
		for {
			capBefore := cap(buf)
			left := r.Len()
			body, err := readFrame(r, buf, lim)
			if cap(body) > max(lim, capBefore) {
				t.Fatalf("a buffer of %d bytes for a limit of %d", cap(body), lim)
			}
			var tl *TooLargeError
			switch {
			case err == nil:
				if len(body) > lim || left-r.Len() != lenSize+len(body) {
					t.Fatalf("a body of %d bytes read from %d bytes, limit %d", len(body), left-r.Len(), lim)
				}
				buf = body
				continue
			case errors.As(err, &tl):
				if tl.Size <= tl.Limit || tl.Limit != lim {
					t.Fatalf("%v at a limit of %d", err, lim)
				}
			case errors.Is(err, io.EOF):
				if left != 0 {
					t.Fatalf("io.EOF with %d bytes left", left)
				}
			case !errors.Is(err, io.ErrUnexpectedEOF):
				t.Fatalf("unexpected error %v", err)
			}
			return
		}
	})
}
