package netlab

import (
	"testing"
	"time"
)

// TestBucket: a rate-limited link serialises packets at its rate, drops
// what would wait past its queue bound, and with sparse set lets small
// packets (pure TCP acknowledgements) go ahead of the queued bulk.
func TestBucket(t *testing.T) {
	t0 := time.Unix(1000, 0)
	const rate = 8e6 // 1 MB/s: 10 000 bytes take 10 ms, 64 bytes 64 us
	ack := 64 * time.Microsecond
	for _, tc := range []struct {
		name    string
		sparse  int
		wantAck time.Duration // when the acknowledgement leaves
	}{
		// One FIFO: behind the 40 ms of bulk queued before it.
		{"fifo", 0, 40*time.Millisecond + ack},
		// Ahead of the bulk, on the wire at once.
		{"sparse", SparseAcks, ack},
		// Too big to count as sparse: queued like the bulk.
		{"sparse, bigger packet", 32, 40*time.Millisecond + ack},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := bucket{rate: rate, queue: 50 * time.Millisecond, sparse: tc.sparse}
			for i := range 4 {
				at, ok := b.depart(t0, t0, 10000)
				if want := time.Duration(i+1) * 10 * time.Millisecond; !ok || at.Sub(t0) != want {
					t.Fatalf("bulk packet %d leaves at %v (ok %v), want %v", i, at.Sub(t0), ok, want)
				}
			}
			at, ok := b.depart(t0, t0, 64)
			if !ok || at.Sub(t0) != tc.wantAck {
				t.Fatalf("acknowledgement leaves at %v (ok %v), want %v", at.Sub(t0), ok, tc.wantAck)
			}
			// Either way the link's time is spent: the next bulk packet
			// leaves after the 40 ms queued and the acknowledgement.
			at, ok = b.depart(t0, t0, 10000)
			if want := 50*time.Millisecond + ack; !ok || at.Sub(t0) != want {
				t.Fatalf("bulk after the acknowledgement leaves at %v (ok %v), want %v", at.Sub(t0), ok, want)
			}
			// The queue is now 50 ms deep: one more would wait past it.
			if _, ok := b.depart(t0, t0, 10000); ok {
				t.Fatal("a packet beyond the queue bound was not dropped")
			}
		})
	}
}
