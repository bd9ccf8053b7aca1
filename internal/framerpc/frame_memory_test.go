package framerpc

import (
	"encoding/binary"
	"io"
	"net"
	"runtime"
	"testing"
	"time"
)

// A frame's length is the peer's word until its bytes arrive: a
// connection that claims a frame near the limit and sends a few bytes
// of it must not make the server allocate the whole claim (gRPC reads a
// message's bytes as they come). Otherwise any peer of the master's
// port, before a token is checked, holds MaxRecvMsgSize (256 MiB) of the
// master's memory per connection for 4 bytes.
func TestClaimedLengthAllocatesOnlyWhatArrives(t *testing.T) {
	const claim = 200 << 20
	s := startServer(t, handlerFunc(echo), serverOpts{cfg: ServerConfig{MaxRecvMsgSize: 256 << 20}})
	nc, err := net.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	head := make([]byte, len(Preface))
	if _, err := io.WriteString(nc, Preface); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(nc, head); err != nil || string(head) != Preface {
		t.Fatalf("preface: %q, %v", head, err)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	frame := binary.LittleEndian.AppendUint32(nil, claim)
	frame = append(frame, make([]byte, 1<<10)...)
	if _, err := nc.Write(frame); err != nil {
		t.Fatal(err)
	}
	// The server hangs up once the frame ends short: it has read (and
	// allocated for) the claim by then.
	_ = nc.(*net.TCPConn).CloseWrite()
	if n, err := io.Copy(io.Discard, nc); err != nil || n != 0 {
		t.Fatalf("after a frame cut short: %d bytes, %v; want the server to hang up", n, err)
	}
	runtime.ReadMemStats(&after)
	if got := after.TotalAlloc - before.TotalAlloc; got > claim/8 {
		t.Fatalf("a claim of %d MiB with 1 KiB sent allocated %d MiB", claim>>20, got>>20)
	}
}
