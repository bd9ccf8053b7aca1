package p2p

import (
	"bytes"
	"context"
	"log/slog"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/internal/etcdtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// quiet swallows the logs of the nodes under test.
var quiet = slog.New(slog.DiscardHandler)

// testTimeout bounds every call a test makes.
const testTimeout = time.Minute

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// node is a Store under test with its engine's private metrics.
type node struct {
	*Store
	reg *prometheus.Registry
}

// newNode starts a Store on loopback with its own engine, speaking TCP as
// nodes on different hosts would. edit adjusts the config; it runs before
// New. The Store closes when the test ends.
func newNode(t testing.TB, etcd string, edit func(*Config)) *node {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg := Config{
		Metadata:     etcd,
		Timeout:      10 * time.Second,
		Logger:       quiet,
		EngineConfig: engine.Config{Host: "127.0.0.1", Transport: "tcp", Registerer: reg},
	}
	if edit != nil {
		edit(&cfg)
	}
	s, err := New(testCtx(t), cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return &node{Store: s, reg: reg}
}

// served is how many bytes the node's engine has served to peers.
func (n *node) served(t *testing.T) uint64 {
	t.Helper()
	mfs, err := n.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == "mooncake_te_served_bytes_total" {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return uint64(sum)
}

// buffers are memory outside the Go heap (the engine reads and writes it
// from its own goroutines), carved from one mapping with a guard page
// between buffers so that none is adjacent to the next.
type buffers struct {
	bufs  [][]byte
	addrs []uintptr
	sizes []uint64
}

func newBuffers(t testing.TB, sizes ...uint64) *buffers {
	t.Helper()
	const gap = 4096
	var total uint64
	for _, n := range sizes {
		total += (n+gap-1)/gap*gap + gap
	}
	m, err := unix.Mmap(-1, 0, int(total), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(m) })
	b := &buffers{sizes: sizes}
	var off uint64
	for _, n := range sizes {
		buf := m[off : off+n : off+n]
		b.bufs = append(b.bufs, buf)
		b.addrs = append(b.addrs, engine.AddrOf(buf))
		off += (n+gap-1)/gap*gap + gap
	}
	return b
}

// fill writes reproducible random bytes, the same stream across buffers.
func (b *buffers) fill(seed uint64) {
	r := rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8), 'p', '2', 'p'})
	for _, buf := range b.bufs {
		r.Read(buf)
	}
}

// equal reports whether b and o hold the same bytes, however split.
func (b *buffers) equal(o *buffers) bool {
	x, y := b.bufs, o.bufs
	var i, j int
	var xs, ys []byte
	for {
		if len(xs) == 0 && i < len(x) {
			xs, i = x[i], i+1
		}
		if len(ys) == 0 && j < len(y) {
			ys, j = y[j], j+1
		}
		if len(xs) == 0 || len(ys) == 0 {
			return len(xs) == 0 && len(ys) == 0 && i == len(x) && j == len(y)
		}
		n := min(len(xs), len(ys))
		if !bytes.Equal(xs[:n], ys[:n]) {
			return false
		}
		xs, ys = xs[n:], ys[n:]
	}
}

// record reads name straight from etcd.
func (n *node) record(t *testing.T, name string) *record {
	t.Helper()
	r, err := n.meta.get(testCtx(t), name)
	if err != nil {
		t.Fatalf("get %q: %v", name, err)
	}
	return r
}

func startEtcd(t testing.TB) string {
	t.Helper()
	return etcdtest.Start(t)
}
