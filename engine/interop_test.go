package engine_test

// Cross-implementation tests: our engine against the official Mooncake
// Transfer Engine (the PyPI wheel mooncake-transfer-engine-non-cuda, driven
// through testdata/official_peer.py), both directions, in P2PHANDSHAKE mode
// and with our HTTP metadata server. `make deps` installs the wheel into
// .venv-official; MOONCAKE_OFFICIAL_PYTHON points at another interpreter.
// Without it the tests skip and say why; they never pass vacuously.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/engine/metadata"
	"github.com/mooncake-go/mooncake/engine/transport"
	"github.com/mooncake-go/mooncake/internal/logtest"
	"github.com/mooncake-go/mooncake/internal/nettest"
)

const (
	peerBufSize   = 32 << 20 // the official peer's registered buffer
	ourLocalSize  = 32 << 20 // our source/destination memory
	ourTargetSize = 16 << 20 // our memory the official peer writes and reads
	callTimeout   = 30 * time.Second
)

// officialPython returns an interpreter that imports mooncake.engine, or
// skips the test naming what is missing.
func officialPython(t *testing.T) string {
	t.Helper()
	py := os.Getenv("MOONCAKE_OFFICIAL_PYTHON")
	if py == "" {
		root, err := filepath.Abs("..")
		require.NoError(t, err)
		py = filepath.Join(root, ".venv-official", "bin", "python")
		if _, err := os.Stat(py); err != nil {
			t.Skipf("official Mooncake not installed: %s is missing (run `make deps`, or set MOONCAKE_OFFICIAL_PYTHON)", py)
		}
	} else if _, err := os.Stat(py); err != nil {
		t.Skipf("official Mooncake not installed: MOONCAKE_OFFICIAL_PYTHON=%s: %v", py, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, py, "-c", "import mooncake.engine")
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		require.NoError(t, ctx.Err(), "importing mooncake.engine with %s hung", py)
		// The last line names the cause, e.g. the shared library not found.
		lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
		t.Skipf("official Mooncake unusable: %s -c 'import mooncake.engine': %v: %s", py, err, lines[len(lines)-1])
	}
	return py
}

// officialPeer is a running official engine in a child process.
type officialPeer struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	replies chan []byte     // one reply line each; closed at EOF
	stderr  *logtest.Buffer // the peer's, for failure reports

	Segment string // its segment name
	Addr    uint64 // its registered buffer
	Size    int
	RPCPort int
}

// peerReply is the union of the peer's reply fields.
type peerReply struct {
	OK       bool
	Error    string
	Segment  string
	Addr     uint64
	Size     int
	RPCPort  int `json:"rpc_port"`
	Data     []byte
	SHA256   string
	RC       int
	Notifies []struct{ Name, Msg string }
}

// tail is the last n bytes of s, marked as cut when it is.
func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// startOfficial starts the peer and initialises its engine against
// metadataURL ("P2PHANDSHAKE" or an HTTP URL), with env added to its
// environment. It is killed with the test.
func startOfficial(t *testing.T, py, metadataURL string, env ...string) *officialPeer {
	t.Helper()
	cmd := exec.Command(py, filepath.Join("testdata", "official_peer.py"))
	// TCP on loopback only; a short transfer timeout bounds failed calls.
	cmd.Env = append(os.Environ(), "MC_FORCE_TCP=1", "MC_TRANSFER_TIMEOUT=5", "PYTHONUNBUFFERED=1")
	cmd.Env = append(cmd.Env, env...)
	if metadataURL != metadata.P2PHandshake {
		cmd.Env = append(cmd.Env, "MC_TCP_BIND_ADDRESS=127.0.0.1")
	}
	p := &officialPeer{cmd: cmd, replies: make(chan []byte, 1), stderr: &logtest.Buffer{}}
	cmd.Stderr = p.stderr
	cmd.WaitDelay = 5 * time.Second
	var err error
	p.stdin, err = cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		defer close(p.replies)
		r := bufio.NewReaderSize(stdout, 1<<20)
		for {
			line, err := r.ReadBytes('\n')
			if err != nil {
				return
			}
			p.replies <- line
		}
	}()
	t.Cleanup(func() {
		// Always by pid, whatever state the peer is in.
		cmd.Process.Kill()
		<-readerDone
		cmd.Wait()
		if t.Failed() {
			t.Logf("official peer stderr:\n%s", tail(p.stderr.String(), 8000))
		}
	})

	r := p.call(t, map[string]any{"cmd": "init", "metadata": metadataURL, "host": "127.0.0.1",
		"name": "official-" + randName(), "size": peerBufSize}, 60*time.Second)
	p.Segment, p.Addr, p.Size, p.RPCPort = r.Segment, r.Addr, r.Size, r.RPCPort
	require.NotEmpty(t, p.Segment)
	require.NotZero(t, p.Addr)
	return p
}

// call sends one command and returns its reply, failing the test on a
// protocol error or when no reply comes within timeout.
func (p *officialPeer) call(t *testing.T, req map[string]any, timeout time.Duration) peerReply {
	t.Helper()
	line, err := json.Marshal(req)
	require.NoError(t, err)
	werr := make(chan error, 1)
	// A large write must not block the test forever if the peer hangs.
	go func() { _, err := p.stdin.Write(append(line, '\n')); werr <- err }()
	var raw []byte
	select {
	case raw = <-p.replies:
	case <-time.After(timeout):
		p.cmd.Process.Kill()
		require.FailNowf(t, "official peer timed out", "%s: no reply in %v", req["cmd"], timeout)
	}
	// The reply (or the peer's exit) means the write is over.
	err = <-werr
	require.NotNil(t, raw, "%s: official peer exited (write: %v)", req["cmd"], err)
	require.NoError(t, err)
	var r peerReply
	require.NoError(t, json.Unmarshal(raw, &r), "%s: reply %q", req["cmd"], raw)
	require.True(t, r.OK, "%s: %s", req["cmd"], r.Error)
	return r
}

// put copies data into the peer's buffer at off.
func (p *officialPeer) put(t *testing.T, off int, data []byte) {
	t.Helper()
	p.call(t, map[string]any{"cmd": "put", "off": off, "data": data}, callTimeout)
}

// checksum is the SHA-256 of the peer's buffer [off, off+n).
func (p *officialPeer) checksum(t *testing.T, off, n int) string {
	t.Helper()
	return p.call(t, map[string]any{"cmd": "checksum", "off": off, "len": n}, callTimeout).SHA256
}

// transfer runs one official write or read between its buffer at off and
// remote; it returns the engine's return code.
func (p *officialPeer) transfer(t *testing.T, cmd, segment string, off int, remote uint64, n int) int {
	t.Helper()
	return p.call(t, map[string]any{"cmd": cmd, "segment": segment, "off": off, "remote": remote, "len": n}, callTimeout).RC
}

// awaitNotify polls the peer's get_notifies until want has arrived.
func (p *officialPeer) awaitNotify(t *testing.T, want engine.Notify) {
	t.Helper()
	var got []engine.Notify
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		for _, n := range p.call(t, map[string]any{"cmd": "notifies"}, callTimeout).Notifies {
			got = append(got, engine.Notify{Name: n.Name, Msg: n.Msg})
		}
		if slices.Contains(got, want) {
			return
		}
		time.Sleep(20 * time.Millisecond) // polling an external process
	}
	require.FailNowf(t, "notification not delivered", "want %+v, the official peer got %+v", want, got)
}

func randName() string {
	b := make([]byte, 4)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func randBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// requireSameBytes compares exactly and reports the first difference
// rather than megabytes of diff.
func requireSameBytes(t *testing.T, want, got []byte, msg string, args ...any) {
	t.Helper()
	if bytes.Equal(want, got) {
		return
	}
	what := fmt.Sprintf(msg, args...)
	require.Equalf(t, len(want), len(got), "%s: lengths differ", what)
	i := 0
	for want[i] == got[i] {
		i++
	}
	diff := 0
	for j := range want {
		if want[j] != got[j] {
			diff++
		}
	}
	require.FailNowf(t, "bytes differ", "%s: %d of %d bytes differ, first at offset %d (want %#x, got %#x)",
		what, diff, len(want), i, want[i], got[i])
}

// mmapped maps n bytes outside the Go heap, as Python or C callers pass.
func mmapped(t *testing.T, n int) []byte {
	t.Helper()
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Munmap(b) })
	return b
}

// interop is one of our engines facing one official peer.
type interop struct {
	py      string
	metaURL string
	p2p     bool
	metrics *prometheus.Registry // our engine's
	ours    *engine.Engine
	peer    *officialPeer
	seg     engine.SegmentID // the peer, opened by us
	local   []byte           // our memory for our own transfers
	target  []byte           // our memory the peer writes and reads
}

func (x *interop) addr(b []byte) uint64 { return uint64(engine.AddrOf(b)) }

// refused counts the peer requests our engine's TCP server has refused.
func (x *interop) refused(t *testing.T) float64 {
	t.Helper()
	mfs, err := x.metrics.Gather()
	require.NoError(t, err)
	n := 0.0
	for _, mf := range mfs {
		if mf.GetName() == "mooncake_te_served_failures_total" {
			for _, m := range mf.GetMetric() {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n
}

// goTransfer runs reqs in one batch on our engine and returns its outcome.
func (x *interop) goTransfer(t *testing.T, reqs []engine.Request, opts ...engine.SubmitOption) engine.TransferStatus {
	t.Helper()
	b, err := x.ours.AllocateBatch(len(reqs))
	require.NoError(t, err)
	require.NoError(t, x.ours.Submit(context.Background(), b, reqs, opts...))
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	st, err := x.ours.Wait(ctx, b)
	require.NoError(t, err)
	require.NoError(t, x.ours.FreeBatch(b))
	return st
}

// setupInterop starts our engine and an official peer that share
// metadataURL, and opens each from the other.
func setupInterop(t *testing.T, py string, httpMeta bool) *interop {
	t.Helper()
	cfg := engine.Config{Transport: "tcp", Host: "127.0.0.1"}
	metaURL := metadata.P2PHandshake
	if httpMeta {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		served := make(chan error, 1)
		go func() { served <- metadata.NewServer().Serve(ctx, ln) }()
		t.Cleanup(func() {
			cancel()
			select {
			case err := <-served:
				require.NoError(t, err)
			case <-time.After(10 * time.Second):
				t.Error("metadata server did not stop")
			}
		})
		metaURL = "http://" + ln.Addr().String() + "/metadata"
		cfg.Metadata, cfg.LocalServerName = metaURL, "go-"+randName()
	}
	x := &interop{py: py, metaURL: metaURL, p2p: !httpMeta, metrics: prometheus.NewRegistry()}
	// Mapped before the engine starts, so unmapped only after it closed.
	x.local = mmapped(t, ourLocalSize)
	x.target = mmapped(t, ourTargetSize)
	cfg.Registerer = x.metrics
	var err error
	x.ours, err = engine.New(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, x.ours.Close()) })
	require.NoError(t, x.ours.RegisterMemory(context.Background(), engine.AddrOf(x.local), ourLocalSize, "cpu:0", true))
	require.NoError(t, x.ours.RegisterMemory(context.Background(), engine.AddrOf(x.target), ourTargetSize, "cpu:0", true))

	x.peer = startOfficial(t, py, metaURL)
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	x.seg, err = x.ours.OpenSegment(ctx, x.peer.Segment)
	require.NoError(t, err)
	return x
}

func TestOfficialInterop(t *testing.T) {
	py := officialPython(t)
	// A secret from the environment would make our wire differ from theirs.
	t.Setenv("MC_TE_SECRET", "")
	for _, mode := range []struct {
		name string
		http bool
	}{
		{"P2PHandshake", false}, // segment names are host:rpcport, descriptors over the handshake socket
		{"HTTPMetadata", true},  // descriptors and rpc_meta in our HTTP metadata server
	} {
		t.Run(mode.name, func(t *testing.T) {
			x := setupInterop(t, py, mode.http)
			t.Run("Descriptors", x.testDescriptors)
			t.Run("OursWritesReadsOfficial", x.testOursToOfficial)
			t.Run("OfficialWritesReadsOurs", x.testOfficialToOurs)
			t.Run("OfficialOutOfRangeRejected", x.testOutOfRange)
			t.Run("OursOutOfRangeRejected", x.testOursOutOfRange)
			t.Run("Notify", x.testNotify)
			t.Run("Probe", x.testProbe)
		})
	}
}

// testDescriptors: each side decodes the other's segment descriptor.
func (x *interop) testDescriptors(t *testing.T) {
	bufs, err := x.ours.SegmentBuffers(x.seg)
	require.NoError(t, err)
	require.Len(t, bufs, 1)
	require.Equal(t, x.peer.Addr, bufs[0].Addr)
	require.Equal(t, uint64(x.peer.Size), bufs[0].Length)

	// get_first_buffer_address opens our segment and reads buffers[0]:
	// the first region we registered, as the official engine lists them
	// in registration order (not by address).
	r := x.peer.call(t, map[string]any{"cmd": "first_buffer", "segment": x.ours.Name()}, callTimeout)
	require.Equal(t, uint64(engine.AddrOf(x.local)), r.Addr)
}

// testOursToOfficial: our engine writes into the official peer's buffer,
// the peer checks the bytes, then we read back fresh bytes it holds.
func (x *interop) testOursToOfficial(t *testing.T) {
	for _, tc := range []struct {
		name   string
		n      int
		remote int // offset in the peer's buffer
	}{
		{"1 byte", 1, 0},                                             // smallest request: one slice, one frame
		{"4 KiB unaligned", 4 << 10, 4097},                           // one slice at an odd remote address
		{"1 MiB+odd", 1<<20 + 1<<18 + 3, 12345},                      // a full slice plus a tail too big to absorb
		{"8 MiB", 8 << 20, 8 << 20},                                  // eight slices spread over the lanes
		{"8 MiB+1 at the end", 8<<20 + 1, peerBufSize - (8<<20 + 1)}, // a one-byte tail absorbed; ends at the buffer's end
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := randBytes(tc.n)
			copy(x.local, data)
			remote := x.peer.Addr + uint64(tc.remote)
			st := x.goTransfer(t, []engine.Request{{Op: engine.Write, Local: engine.AddrOf(x.local),
				Segment: x.seg, Remote: remote, Length: uint64(tc.n)}})
			require.Equal(t, engine.Completed, st.Status, "write: %v", st.Err)
			require.Equal(t, uint64(tc.n), st.Transferred)
			require.Equal(t, sum(data), x.peer.checksum(t, tc.remote, tc.n), "official buffer after our write")

			// Read back other bytes than we wrote, so a stale read shows.
			fresh := randBytes(tc.n)
			x.peer.put(t, tc.remote, fresh)
			dst := x.local[16<<20 : 16<<20+tc.n]
			clear(dst)
			st = x.goTransfer(t, []engine.Request{{Op: engine.Read, Local: engine.AddrOf(dst),
				Segment: x.seg, Remote: remote, Length: uint64(tc.n)}})
			require.Equal(t, engine.Completed, st.Status, "read: %v", st.Err)
			requireSameBytes(t, fresh, dst, "our read of the official buffer")
		})
	}

	// One batch of scattered requests: many slices in flight on every lane
	// at once, which the official server must take pipelined.
	t.Run("batch", func(t *testing.T) {
		lens := []int{1, 4 << 10, 1<<20 + 7, 3<<20 + 1, 64 << 10, 2 << 20}
		var writes, reads []engine.Request
		var want []byte
		roff, loff := 0, 0
		remotes := make([]int, len(lens))
		for i, n := range lens {
			remotes[i] = roff
			writes = append(writes, engine.Request{Op: engine.Write, Local: engine.AddrOf(x.local[loff:]),
				Segment: x.seg, Remote: x.peer.Addr + uint64(roff), Length: uint64(n)})
			reads = append(reads, engine.Request{Op: engine.Read, Local: engine.AddrOf(x.local[16<<20+loff:]),
				Segment: x.seg, Remote: x.peer.Addr + uint64(roff), Length: uint64(n)})
			roff += n + 333
			loff += n
		}
		want = randBytes(loff)
		copy(x.local, want)
		st := x.goTransfer(t, writes)
		require.Equal(t, engine.Completed, st.Status, "write: %v", st.Err)
		loff = 0
		for i, n := range lens {
			require.Equal(t, sum(want[loff:loff+n]), x.peer.checksum(t, remotes[i], n), "request %d", i)
			loff += n
		}

		clear(x.local[16<<20 : 16<<20+loff])
		st = x.goTransfer(t, reads)
		require.Equal(t, engine.Completed, st.Status, "read: %v", st.Err)
		requireSameBytes(t, want, x.local[16<<20:16<<20+loff], "our batched read of the official buffer")
	})
}

// testOfficialToOurs: the official engine writes into and reads from our
// registered memory, single requests and batches.
func (x *interop) testOfficialToOurs(t *testing.T) {
	base := x.addr(x.target)
	for _, tc := range []struct {
		name   string
		n      int
		remote int // offset in our target memory
	}{
		{"1 byte", 1, 0},                          // smallest request
		{"4 KiB unaligned", 4 << 10, 999},         // odd address in our memory
		{"1 MiB+odd", 1<<20 + 1<<18 + 3, 1 << 20}, // spans several of their slices
		{"8 MiB", 8 << 20, 8<<20 - 4096},          // large; ends inside the region
		{"last byte", 1, ourTargetSize - 1},       // the region's very last byte
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := randBytes(tc.n)
			x.peer.put(t, 0, data)
			require.Zero(t, x.peer.transfer(t, "write", x.ours.Name(), 0, base+uint64(tc.remote), tc.n), "transfer_sync_write")
			requireSameBytes(t, data, x.target[tc.remote:tc.remote+tc.n], "our memory after the official write")

			fresh := randBytes(tc.n)
			copy(x.target[tc.remote:], fresh)
			require.Zero(t, x.peer.transfer(t, "read", x.ours.Name(), 16<<20, base+uint64(tc.remote), tc.n), "transfer_sync_read")
			require.Equal(t, sum(fresh), x.peer.checksum(t, 16<<20, tc.n), "official buffer after its read of ours")
		})
	}

	// One batch of several buffers of different sizes to scattered places.
	t.Run("batch", func(t *testing.T) {
		lens := []int{1, 4 << 10, 1<<20 + 7, 3<<20 + 1}
		remotes := []int{5, 100 << 10, 2 << 20, 6<<20 + 3}
		offs := make([]int, len(lens))
		ruint := make([]uint64, len(lens))
		datas := make([][]byte, len(lens))
		off := 0
		for i, n := range lens {
			offs[i], ruint[i], datas[i] = off, base+uint64(remotes[i]), randBytes(n)
			x.peer.put(t, off, datas[i])
			off += n + 1000
		}
		r := x.peer.call(t, map[string]any{"cmd": "batch_write", "segment": x.ours.Name(),
			"offs": offs, "remotes": ruint, "lens": lens}, callTimeout)
		require.Zero(t, r.RC, "batch_transfer_sync_write")
		for i, n := range lens {
			requireSameBytes(t, datas[i], x.target[remotes[i]:remotes[i]+n], "batch buffer %d", i)
		}

		for i, n := range lens {
			datas[i] = randBytes(n)
			copy(x.target[remotes[i]:], datas[i])
			offs[i] += 16 << 20
		}
		r = x.peer.call(t, map[string]any{"cmd": "batch_read", "segment": x.ours.Name(),
			"offs": offs, "remotes": ruint, "lens": lens}, callTimeout)
		require.Zero(t, r.RC, "batch_transfer_sync_read")
		for i, n := range lens {
			require.Equal(t, sum(datas[i]), x.peer.checksum(t, offs[i], n), "batch buffer %d", i)
		}
	})
}

// testOutOfRange: requests from the official engine outside our registered
// memory are refused by our server, touch nothing, and leave our engine
// serving.
//
// These requests come from a second official peer with its connection pool
// off. The wheel's pooled client misbehaves after rejections, whoever the
// server is (official against official too): every fifth request or so
// fails locally without reaching the server, even a valid one, and the next
// one waits a second. Without the pool every request reaches the server,
// so each failure here is provably our refusal.
func (x *interop) testOutOfRange(t *testing.T) {
	const page = 4096
	// Pages: guard | registered | registered | guard | private (registered,
	// not remote-accessible).
	arena := mmapped(t, 5*page)
	reg := arena[page : 3*page]
	private := arena[4*page:]
	require.NoError(t, x.ours.RegisterMemory(context.Background(), engine.AddrOf(reg), uint64(len(reg)), "cpu:0", true))
	require.NoError(t, x.ours.RegisterMemory(context.Background(), engine.AddrOf(private), page, "cpu:0", false))
	t.Cleanup(func() {
		require.NoError(t, x.ours.UnregisterMemory(context.Background(), engine.AddrOf(reg)))
		require.NoError(t, x.ours.UnregisterMemory(context.Background(), engine.AddrOf(private)))
	})
	rand.Read(arena)
	before := bytes.Clone(arena)
	start, end := x.addr(reg), x.addr(reg)+uint64(len(reg))
	strict := startOfficial(t, x.py, x.metaURL, "MC_TCP_ENABLE_CONNECTION_POOL=0")
	strict.put(t, 0, randBytes(2<<20))

	for _, tc := range []struct {
		name   string
		remote uint64
		n      int
	}{
		{"crosses the end", end - 100, 200},            // starts inside, ends in the guard page
		{"crosses the start", start - 50, 100},         // starts in the guard page
		{"wholly past the end", end + 10, 100},         // only unregistered bytes
		{"large past the end", end - page, 1 << 20},    // a payload bigger than the region
		{"not remote-accessible", x.addr(private), 64}, // registered, but private
	} {
		t.Run(tc.name, func(t *testing.T) {
			refused := x.refused(t)
			require.Negative(t, strict.transfer(t, "write", x.ours.Name(), 0, tc.remote, tc.n), "transfer_sync_write")
			require.Negative(t, strict.transfer(t, "read", x.ours.Name(), 0, tc.remote, tc.n), "transfer_sync_read")
			require.Equal(t, refused+2, x.refused(t), "refusals counted by our server")
		})
	}
	requireSameBytes(t, before, arena, "our memory after refused requests")

	// Still serving: the same peer, on a new connection, and the pooled one.
	for _, p := range []*officialPeer{strict, x.peer} {
		data := randBytes(len(reg))
		p.put(t, 0, data)
		require.Zero(t, p.transfer(t, "write", x.ours.Name(), 0, start, len(reg)))
		requireSameBytes(t, data, reg, "registered memory after a valid write")
	}
	requireSameBytes(t, before[:page], arena[:page], "guard page")
	requireSameBytes(t, before[3*page:], arena[3*page:], "guard and private pages")
}

// testOursOutOfRange: the official server refuses our requests outside its
// buffer; each fails promptly on our side, and our lanes to it still work.
func (x *interop) testOursOutOfRange(t *testing.T) {
	end := x.peer.Addr + uint64(x.peer.Size)
	for _, tc := range []struct {
		name   string
		remote uint64
		n      uint64
	}{
		{"crosses the end", end - 100, 200},              // one small slice, half outside
		{"wholly past the end", end + 4096, 4096},        // nothing of it inside
		{"large crossing the end", end - 3<<20, 8 << 20}, // slices inside succeed, the rest are refused undrained
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, op := range []engine.Op{engine.Write, engine.Read} {
				start := time.Now()
				st := x.goTransfer(t, []engine.Request{{Op: op, Local: engine.AddrOf(x.local),
					Segment: x.seg, Remote: tc.remote, Length: tc.n}})
				require.Equal(t, engine.Failed, st.Status, "%v", op)
				require.ErrorIs(t, st.Err, transport.ErrRejected, "%v", op)
				require.Less(t, time.Since(start), 5*time.Second, "%v: failing took too long", op)
			}
		})
	}

	// A WRITE far larger than the socket buffers: Mooncake's server refuses
	// it after the header and hangs up without reading the payload, so our
	// send fails with a reset while the refusal waits unread in our socket.
	// It must still fail as refused, at once, not as a broken connection
	// retried.
	t.Run("refused mid-payload", func(t *testing.T) {
		// One slice for the whole request, so the payload outgrows the buffers.
		cfg := engine.Config{Transport: "tcp", Host: "127.0.0.1", SliceSize: 64 << 20}
		if !x.p2p {
			cfg.Metadata, cfg.LocalServerName = x.metaURL, "go-big-"+randName()
		}
		big, err := engine.New(context.Background(), cfg)
		require.NoError(t, err)
		defer func() { require.NoError(t, big.Close()) }()
		require.NoError(t, big.RegisterMemory(context.Background(), engine.AddrOf(x.local), ourLocalSize, "cpu:0", true))
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		seg, err := big.OpenSegment(ctx, x.peer.Segment)
		require.NoError(t, err)
		b, err := big.AllocateBatch(1)
		require.NoError(t, err)
		require.NoError(t, big.Submit(context.Background(), b, []engine.Request{{Op: engine.Write, Local: engine.AddrOf(x.local),
			Segment: seg, Remote: end - 1<<20, Length: 24 << 20}}))
		st, err := big.Wait(ctx, b)
		require.NoError(t, err)
		require.Equal(t, engine.Failed, st.Status)
		require.ErrorIs(t, st.Err, transport.ErrRejected)
	})

	// Valid requests batched with refused ones complete: after refusing a
	// request Mooncake's server hangs up, so the requests pipelined behind it
	// on that connection were never looked at and must be sent again
	// without being charged a retry.
	t.Run("valid neighbours of refused requests", func(t *testing.T) {
		var reqs []engine.Request
		for i := range 12 {
			r := engine.Request{Op: engine.Write, Local: engine.AddrOf(x.local[i<<20:]), Segment: x.seg,
				Remote: x.peer.Addr + uint64(i)<<20, Length: 1 << 20}
			if i%3 == 1 {
				r.Remote = end + uint64(i)<<20 // refused
			}
			reqs = append(reqs, r)
		}
		copy(x.local, randBytes(12<<20))
		b, err := x.ours.AllocateBatch(len(reqs))
		require.NoError(t, err)
		require.NoError(t, x.ours.Submit(context.Background(), b, reqs))
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		_, err = x.ours.Wait(ctx, b)
		require.NoError(t, err)
		for i := range reqs {
			st, err := x.ours.TaskStatus(b, i)
			require.NoError(t, err)
			if i%3 == 1 {
				require.Equal(t, engine.Failed, st.Status, "task %d", i)
				require.ErrorIs(t, st.Err, transport.ErrRejected, "task %d", i)
				continue
			}
			require.Equal(t, engine.Completed, st.Status, "task %d: %v", i, st.Err)
			require.Equal(t, sum(x.local[i<<20:(i+1)<<20]), x.peer.checksum(t, i<<20, 1<<20), "task %d", i)
		}
		require.NoError(t, x.ours.FreeBatch(b))
	})

	// The lanes recover: a valid transfer right after.
	data := randBytes(1 << 20)
	copy(x.local, data)
	st := x.goTransfer(t, []engine.Request{{Op: engine.Write, Local: engine.AddrOf(x.local),
		Segment: x.seg, Remote: x.peer.Addr, Length: uint64(len(data))}})
	require.Equal(t, engine.Completed, st.Status, "%v", st.Err)
	require.Equal(t, sum(data), x.peer.checksum(t, 0, len(data)))
}

// testNotify: notifications both ways, alone and after a write.
func (x *interop) testNotify(t *testing.T) {
	// Official transfer_sync(..., TransferNotify) writes, then notifies us.
	data := randBytes(64 << 10)
	x.peer.put(t, 0, data)
	want := engine.Notify{Name: "official-" + randName(), Msg: "msg-" + randName()}
	r := x.peer.call(t, map[string]any{"cmd": "write", "segment": x.ours.Name(), "off": 0,
		"remote": x.addr(x.target), "len": len(data), "notify": map[string]string{"name": want.Name, "msg": want.Msg}}, callTimeout)
	require.Zero(t, r.RC, "transfer_sync with notify")
	var got []engine.Notify
	deadline := time.Now().Add(10 * time.Second)
	for !slices.Contains(got, want) && time.Now().Before(deadline) {
		got = append(got, x.ours.Notifies()...)
		if !slices.Contains(got, want) {
			time.Sleep(10 * time.Millisecond) // the peer sends it asynchronously to our handshake port
		}
	}
	require.Contains(t, got, want, "official notify to our Notifies()")
	requireSameBytes(t, data, x.target[:len(data)], "data written with the notify")

	// Our SendNotify reaches the official get_notifies.
	direct := engine.Notify{Name: "go-" + randName(), Msg: "direct"}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	require.NoError(t, x.ours.SendNotify(ctx, x.peer.Segment, direct))
	x.peer.awaitNotify(t, direct)

	// WithNotify: the notify follows the batch's data.
	data = randBytes(3<<20 + 5)
	copy(x.local, data)
	after := engine.Notify{Name: "go-" + randName(), Msg: "after write"}
	st := x.goTransfer(t, []engine.Request{{Op: engine.Write, Local: engine.AddrOf(x.local),
		Segment: x.seg, Remote: x.peer.Addr + 1000, Length: uint64(len(data))}}, engine.WithNotify(after))
	require.Equal(t, engine.Completed, st.Status, "%v", st.Err)
	x.peer.awaitNotify(t, after)
	require.Equal(t, sum(data), x.peer.checksum(t, 1000, len(data)))
}

// testProbe: each side probes the other's handshake port.
func (x *interop) testProbe(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	require.NoError(t, x.ours.Probe(ctx, x.peer.Segment), "our Probe of the official peer")
	r := x.peer.call(t, map[string]any{"cmd": "probe", "segment": x.ours.Name()}, callTimeout)
	require.Zero(t, r.RC, "official send_probe of our engine")

	// A probe of a port nobody serves fails rather than hangs.
	dead := nettest.RefusedAddr(t)
	if x.p2p { // a P2P name is the address itself
		require.ErrorIs(t, x.ours.Probe(ctx, dead), engine.ErrSocket)
	}
}
