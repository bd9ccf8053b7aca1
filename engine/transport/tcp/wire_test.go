package tcp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/engine/transport"
)

func TestHeaderLayout(t *testing.T) {
	var b [HeaderSize]byte
	PutHeader(b[:], Header{Size: 0x0102030405060708, Addr: 0x1112131415161718, Op: opWrite, V2: true})
	want := []byte{8, 7, 6, 5, 4, 3, 2, 1, 0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11, 0x81, 0, 0, 0, 0, 0, 0, 0}
	require.Equal(t, want, b[:])
	h, err := ParseHeader(b[:])
	require.NoError(t, err)
	require.Equal(t, Header{Size: 0x0102030405060708, Addr: 0x1112131415161718, Op: opWrite, V2: true}, h)

	// Padding is not initialised by the reference sender: ignore it.
	b[20] = 0xEE
	_, err = ParseHeader(b[:])
	require.NoError(t, err)

	var st [8]byte
	binary.LittleEndian.PutUint64(st[:], StatusOK)
	require.Equal(t, []byte{0, 0, 0, 0, 'V', 'T', 'C', 'M'}, st[:], `"MCTV" in the high half, little-endian`)
}

func TestParseRejects(t *testing.T) {
	for _, tc := range []struct {
		name string
		hdr  []byte
	}{
		{"short", make([]byte, 23)},
		{"unknown opcode", append(make([]byte, 16), 0x02, 0, 0, 0, 0, 0, 0, 0)},
		{"wrapping range", func() []byte {
			var b [HeaderSize]byte
			PutHeader(b[:], Header{Size: 16, Addr: ^uint64(0) - 4, Op: opRead, V2: true})
			return b[:]
		}()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseHeader(tc.hdr)
			require.ErrorIs(t, err, ErrMalformed)
		})
	}
	_, err := ParseStatus([]byte{1, 2, 3, 4, 5, 6, 7, 8})
	require.ErrorIs(t, err, ErrMalformed)
}

func FuzzParseHeader(f *testing.F) {
	var b [HeaderSize]byte
	PutHeader(b[:], Header{Size: 4096, Addr: 0x7f0000000000, Op: opRead, V2: true})
	f.Add(b[:])
	f.Add(make([]byte, 3))
	f.Fuzz(func(t *testing.T, in []byte) {
		h, err := ParseHeader(in)
		if err != nil {
			return
		}
		var out [HeaderSize]byte
		PutHeader(out[:], h)
		h2, err := ParseHeader(out[:])
		if err != nil || h2 != h {
			t.Fatalf("round trip %+v -> %+v, %v", h, h2, err)
		}
	})
}

// testMem is a Memory over one Go-allocated window, for serving tests.
type testMem struct {
	base []byte
}

type nopPin struct{}

func (nopPin) Release() {}

func (m *testMem) Acquire(addr, n uint64) (transport.Pinned, error) {
	lo := uint64(uintptr(unsafe.Pointer(&m.base[0])))
	if addr < lo || addr+n > lo+uint64(len(m.base)) || addr+n < addr {
		return nil, transport.ErrRejected
	}
	return nopPin{}, nil
}

func startServer(t testing.TB, mem transport.Memory) *Server {
	s, err := Listen("127.0.0.1:0", ServerConfig{Memory: mem, PayloadTimeout: 2 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

// TestServerMalformedStreams sends hostile byte streams: the server must
// answer with a rejection or hang up, never panic, never write outside the
// registered window, and keep serving other connections.
func TestServerMalformedStreams(t *testing.T) {
	win := make([]byte, 1<<16)
	guard := make([]byte, 4096) // not registered
	mem := &testMem{base: win}
	s := startServer(t, mem)
	base := uint64(uintptr(unsafe.Pointer(&win[0])))
	hdr := func(op uint8, v2 bool, addr, size uint64) []byte {
		var b [HeaderSize]byte
		PutHeader(b[:], Header{Size: size, Addr: addr, Op: op, V2: v2})
		return b[:]
	}
	for _, tc := range []struct {
		name   string
		send   []byte
		expect []byte // what the server answers before anything else; nil: it hangs up
	}{
		{"bad opcode closes", append(make([]byte, 16), 7, 0, 0, 0, 0, 0, 0, 0), nil},
		{"v2 write outside window is rejected and drained",
			append(hdr(opWrite, true, uint64(uintptr(unsafe.Pointer(&guard[0]))), 16), make([]byte, 16)...), status(StatusRejected)},
		{"v2 read past the end is rejected", hdr(opRead, true, base+1<<16-8, 16), status(StatusRejected)},
		{"v2 zero-length is rejected", hdr(opRead, true, base, 0), status(StatusRejected)},
		{"v1 write outside window closes", hdr(opWrite, false, 8, 16), nil},
		{"truncated header closes", []byte{1, 2, 3}, nil},
		{"truncated payload closes", append(hdr(opWrite, true, base, 1024), 1, 2, 3), nil},
		{"huge rejected write closes", hdr(opWrite, true, 8, 1<<40), status(StatusRejected)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", s.Addr().String())
			require.NoError(t, err)
			defer c.Close()
			_, err = c.Write(tc.send)
			require.NoError(t, err)
			c.(*net.TCPConn).CloseWrite()
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			got, err := io.ReadAll(c)
			if err != nil && !errors.Is(err, net.ErrClosed) {
				var ne net.Error
				require.False(t, errors.As(err, &ne) && ne.Timeout(), "server neither answered nor hung up")
			}
			require.Equal(t, tc.expect, nilIfEmpty(got))
		})
	}
	require.Equal(t, make([]byte, 4096), guard)

	// The server still serves a well-formed request.
	c, err := net.Dial("tcp", s.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	payload := bytes.Repeat([]byte{9}, 32)
	_, err = c.Write(append(hdr(opWrite, true, base+64, 32), payload...))
	require.NoError(t, err)
	var st [StatusSize]byte
	_, err = io.ReadFull(c, st[:])
	require.NoError(t, err)
	require.Equal(t, status(StatusOK), st[:])
	require.Equal(t, payload, win[64:96])
}

func status(v uint64) []byte {
	var b [StatusSize]byte
	binary.LittleEndian.PutUint64(b[:], v)
	return b[:]
}

func nilIfEmpty(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return b
}

// FuzzServerStream feeds arbitrary bytes to a live server over a real
// connection. It must never panic nor write outside its window.
func FuzzServerStream(f *testing.F) {
	win := make([]byte, 4096)
	s := startServer(f, &testMem{base: win})
	base := uint64(uintptr(unsafe.Pointer(&win[0])))
	var h [HeaderSize]byte
	PutHeader(h[:], Header{Size: 8, Addr: base, Op: opWrite, V2: true})
	f.Add(append(h[:], 1, 2, 3, 4, 5, 6, 7, 8))
	PutHeader(h[:], Header{Size: 8, Addr: base - 8, Op: opRead, V2: true})
	f.Add(h[:])
	f.Fuzz(func(t *testing.T, in []byte) {
		c, err := net.Dial("tcp", s.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(3 * time.Second))
		c.Write(in)
		c.(*net.TCPConn).CloseWrite()
		io.Copy(io.Discard, c)
	})
}

// TestPipelinedReads sends several READs in one write, one of them outside
// the window: the answers come back in order, the refused one with no data.
func TestPipelinedReads(t *testing.T) {
	win := make([]byte, 1<<16)
	for i := range win {
		win[i] = byte(i * 7)
	}
	s := startServer(t, &testMem{base: win})
	base := uint64(uintptr(unsafe.Pointer(&win[0])))
	var req []byte
	for _, r := range []struct{ addr, size uint64 }{{base, 100}, {base + 1<<16 - 4, 8}, {base + 1000, 3000}, {base + 5, 1}} {
		var h [HeaderSize]byte
		PutHeader(h[:], Header{Size: r.size, Addr: r.addr, Op: opRead, V2: true})
		req = append(req, h[:]...)
	}
	c, err := net.Dial("tcp", s.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Write(req)
	require.NoError(t, err)
	want := append(status(StatusOK), win[:100]...)
	want = append(want, status(StatusRejected)...)
	want = append(want, status(StatusOK)...)
	want = append(want, win[1000:4000]...)
	want = append(want, status(StatusOK)...)
	want = append(want, win[5])
	got := make([]byte, len(want))
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = io.ReadFull(c, got)
	require.NoError(t, err)
	require.Equal(t, want, got)
}
