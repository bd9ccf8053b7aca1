package kvevents

import (
	"bufio"
	"bytes"
	"io"
	"testing"
)

// peerBytes is what a ZMTP 3.0 PUB peer sends: its greeting, READY, then
// a message [topic, seq, payload] and a PING command.
func peerBytes() []byte {
	var b bytes.Buffer
	var g [64]byte
	g[0], g[9], g[10] = 0xff, 0x7f, 3
	copy(g[12:], "NULL")
	b.Write(g[:])
	z := &zconn{w: bufio.NewWriter(&b)}
	_ = z.command("READY", "Socket-Type", "PUB")
	_ = z.send([]byte("kv"), []byte{0, 0, 0, 0, 0, 0, 0, 7}, []byte("payload"))
	_ = z.command("PING", "TTL", "")
	return b.Bytes()
}

// FuzzZMTP feeds a subscriber's connection arbitrary bytes from its peer:
// the handshake and the framing never panic, never return a message over
// the limit, and end in an error once the bytes run out (the loop ends).
func FuzzZMTP(f *testing.F) {
	f.Add(peerBytes())
	f.Add(peerBytes()[:70])
	long := peerBytes()
	long = append(long, 0x02, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff) // a frame claiming 2^64-1 bytes
	f.Add(long)
	f.Fuzz(func(t *testing.T, in []byte) {
		const limit = 1 << 12
		z := &zconn{r: bufio.NewReader(bytes.NewReader(in)), w: bufio.NewWriter(io.Discard), max: limit}
		if err := z.handshake("SUB"); err != nil {
			return
		}
		for {
			msg, err := z.recv()
			if err != nil {
				return
			}
			total := 0
			for _, fr := range msg {
				total += len(fr)
			}
			if total > limit {
				t.Fatalf("a message of %d bytes passed a limit of %d", total, limit)
			}
		}
	})
}
