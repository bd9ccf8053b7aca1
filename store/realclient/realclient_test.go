package realclient

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/store/client"
	"github.com/mooncake-go/mooncake/store/master"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// The helper processes of the tests that kill one side with SIGKILL run
// this test binary again with helperEnv set; see helperMain.
const helperEnv = "MC_REALCLIENT_TEST_HELPER"

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		helperMain(mode)
		return
	}
	os.Exit(m.Run())
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// socketName is an abstract socket name of the test's own.
func socketName(t testing.TB) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("@mc-realclient-test-%x", b)
}

// counting is a Store whose shared-memory registrations are counted, so
// that a test sees the real client free a dummy's memory.
type counting struct {
	Store
	registered atomic.Int64 // bytes registered now
}

func (c *counting) RegisterBuffer(b []byte) error {
	err := c.Store.RegisterBuffer(b)
	if err == nil {
		c.registered.Add(int64(len(b)))
	}
	return err
}

func (c *counting) UnregisterBuffer(b []byte) error {
	err := c.Store.UnregisterBuffer(b)
	if err == nil {
		c.registered.Add(-int64(len(b)))
	}
	return err
}

// realClient starts a master, a store client with a segment (the real
// client's) and a Server over it.
func realClient(t *testing.T) (*Server, *client.Client, *counting) {
	t.Helper()
	m, err := master.Start(master.ServerConfig{Service: master.ServiceConfig{}, Listen: "127.0.0.1:0"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close() })
	c, err := client.New(context.Background(), client.Config{Master: m.Addr(), SegmentSize: 64 << 20,
		LocalBufferSize: 8 << 20, EngineConfig: engine.Config{Host: "127.0.0.1"}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	st := &counting{Store: c}
	srv, err := Listen(Config{Store: st, Socket: socketName(t)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Close() })
	return srv, c, st
}

func dial(t *testing.T, addr string, pool, staging uint64) *Dummy {
	t.Helper()
	d, err := Dial(ctxT(t), addr, pool, staging)
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Close() })
	return d
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*131) + seed
	}
	return b
}

func code(err error) storepb.Code {
	var e *storepb.Error
	if errors.As(err, &e) {
		return e.Code
	}
	return storepb.OK
}

// Two dummies (two TP ranks) share the real client's pool: what one puts
// the other and the real client read, whichever memory it came from.
func TestTwoDummiesShareOnePool(t *testing.T) {
	srv, real, st := realClient(t)
	ctx := ctxT(t)
	a := dial(t, srv.Addr(), 4<<20, 1<<20)
	b := dial(t, srv.Addr(), 4<<20, 1<<20)
	require.NoError(t, srv.WaitSessions(ctx, 2))
	require.GreaterOrEqual(t, st.registered.Load(), int64(2*(5<<20)))

	// From the pool (zero-copy) and from Go memory (staged), in one batch.
	pooled, err := a.Alloc(1 << 20)
	require.NoError(t, err)
	copy(pooled, pattern(1<<20, 1))
	heap := pattern(300<<10, 2)
	keys := []string{"tp0-pooled", "tp0-heap"}
	require.Equal(t, []error{nil, nil}, a.BatchPut(ctx, keys, [][]byte{pooled, heap}, nil, false))

	// Rank 1 reads both, into its pool and into Go memory.
	into, err := b.Alloc(1 << 20)
	require.NoError(t, err)
	dst := make([]byte, 1<<20)
	ns, errs := b.BatchGetInto(ctx, []string{"tp0-pooled", "tp0-heap"}, [][]byte{into, dst})
	require.Equal(t, []error{nil, nil}, errs)
	require.Equal(t, []int{1 << 20, 300 << 10}, ns)
	require.Equal(t, pattern(1<<20, 1), into)
	require.Equal(t, heap, dst[:ns[1]])

	// The real client sees one pool.
	got, err := real.Get(ctx, "tp0-heap")
	require.NoError(t, err)
	require.Equal(t, heap, got)
	ok, errs := b.BatchExist(ctx, []string{"tp0-pooled", "nope"})
	require.Equal(t, []bool{true, false}, ok)
	require.Equal(t, []error{nil, nil}, errs)
	n, err := b.Size(ctx, "tp0-pooled")
	require.NoError(t, err)
	require.EqualValues(t, 1<<20, n)
	v, err := b.Get(ctx, "tp0-heap")
	require.NoError(t, err)
	require.Equal(t, heap, v)

	// Missing keys and removal, per key.
	_, err = b.Get(ctx, "nope")
	require.Equal(t, storepb.ObjectNotFound, code(err))
	require.Equal(t, []error{nil}, a.BatchRemove(ctx, []string{"tp0-heap"}, true))
	_, err = real.Get(ctx, "tp0-heap")
	require.Equal(t, storepb.ObjectNotFound, code(err))
	require.NoError(t, a.Free(pooled))
	require.Error(t, a.Free(pooled)) // twice
}

// A put from the pool sends no payload: the request is a few dozen bytes
// for a MiB, and yet the real client stores the bytes the dummy wrote in
// the shared memory.
func TestPoolPutIsZeroCopy(t *testing.T) {
	srv, real, _ := realClient(t)
	ctx := ctxT(t)
	d := dial(t, srv.Addr(), 4<<20, 64<<10) // staging far smaller than the value
	buf, err := d.Alloc(2 << 20)
	require.NoError(t, err)
	copy(buf, pattern(len(buf), 9))
	before := srv.RequestBytes()
	require.Equal(t, []error{nil}, d.BatchPut(ctx, []string{"zc"}, [][]byte{buf}, nil, false))
	require.Less(t, srv.RequestBytes()-before, uint64(128), "the put sent its payload over the socket")
	got, err := real.Get(ctx, "zc")
	require.NoError(t, err)
	require.Equal(t, pattern(2<<20, 9), got)

	// The same value from Go memory does not fit the staging buffer: that
	// key fails with a message naming the remedy, the others of its batch
	// go through.
	errs := d.BatchPut(ctx, []string{"big", "small"}, [][]byte{pattern(2<<20, 1), pattern(10, 1)}, nil, false)
	require.Equal(t, storepb.InvalidParams, code(errs[0]))
	require.Contains(t, errs[0].Error(), "alloc_from_mem_pool")
	require.NoError(t, errs[1])
}

// Values from Go memory that together exceed the staging buffer travel in
// several rounds, each of which fits.
func TestStagingRounds(t *testing.T) {
	srv, _, _ := realClient(t)
	ctx := ctxT(t)
	d := dial(t, srv.Addr(), 0, 100<<10)
	var keys []string
	var vals [][]byte
	for i := range 5 {
		keys = append(keys, fmt.Sprintf("round-%d", i))
		vals = append(vals, pattern(40<<10, byte(i)))
	}
	before := srv.RequestBytes()
	require.Equal(t, make([]error, 5), d.BatchPut(ctx, keys, vals, &client.ReplicateConfig{Replicas: 1}, true))
	require.Greater(t, srv.RequestBytes()-before, uint64(0))
	dsts := make([][]byte, 5)
	for i := range dsts {
		dsts[i] = make([]byte, 40<<10)
	}
	ns, errs := d.BatchGetInto(ctx, keys, dsts)
	require.Equal(t, make([]error, 5), errs)
	for i := range dsts {
		require.Equal(t, 40<<10, ns[i])
		require.Equal(t, vals[i], dsts[i], "key %d", i)
	}
	_, err := d.Alloc(4096)
	require.Error(t, err) // no pool asked for
	n, err := d.RemoveAll(ctx, true)
	require.NoError(t, err)
	require.GreaterOrEqual(t, n, 5)
}

// A dummy that closes, or is killed, has its shared memory freed by the
// real client.
func TestDummyDeathFreesItsMemory(t *testing.T) {
	srv, real, st := realClient(t)
	ctx := ctxT(t)

	d := dial(t, srv.Addr(), 1<<20, 1<<20)
	require.NoError(t, srv.WaitSessions(ctx, 1))
	require.NoError(t, d.Close())
	require.NoError(t, srv.WaitSessions(ctx, 0))
	require.Zero(t, st.registered.Load())

	// kill -9 of a dummy process after a put from its pool.
	cmd, out := helper(t, "dummy", srv.Addr())
	require.Equal(t, "put", readLine(t, out))
	require.Equal(t, 1, srv.Sessions())
	require.Positive(t, st.registered.Load())
	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
	require.NoError(t, srv.WaitSessions(ctx, 0))
	require.Zero(t, st.registered.Load())
	got, err := real.Get(ctx, "from-dead-dummy") // its object outlives it
	require.NoError(t, err)
	require.Equal(t, pattern(8192, 5), got)
}

// kill -9 of the real client during a call: that call and the next fail
// at once with ErrGone, saying so, instead of hanging.
func TestRealClientKilledMidCall(t *testing.T) {
	sock := socketName(t)
	cmd, out := helper(t, "stuck-real", sock)
	require.Equal(t, "ready", readLine(t, out))
	d, err := Dial(ctxT(t), sock, 1<<20, 1<<20, WithCallTimeout(time.Hour))
	require.NoError(t, err)
	defer d.Close()

	done := make(chan []error, 1)
	go func() { done <- d.BatchPut(context.Background(), []string{"k"}, [][]byte{[]byte("v")}, nil, false) }()
	require.Equal(t, "in-call", readLine(t, out))
	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
	var errs []error
	select {
	case errs = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the call in progress still waits for a killed real client")
	}
	require.ErrorIs(t, errs[0], ErrGone)
	require.Equal(t, storepb.RPCFail, code(errs[0]))
	require.Contains(t, errs[0].Error(), "hung up")
	ok, errs := d.BatchExist(context.Background(), []string{"k"})
	require.False(t, ok[0])
	require.ErrorIs(t, errs[0], ErrGone)

	// No real client at all: Dial says where it looked.
	_, err = Dial(ctxT(t), sock, 1<<20, 1<<20)
	require.ErrorContains(t, err, "no real client at "+sock)
	require.Equal(t, storepb.RPCFail, code(err))
}

// Malformed frames get an INVALID_PARAMS answer saying what is wrong and
// the connection closed; the server goes on serving others.
func TestMalformedFrames(t *testing.T) {
	srv, _, st := realClient(t)
	ctx := ctxT(t)
	hello, err := AppendRequest(nil, &Request{Op: OpHello, Arg0: 4096, Arg1: 4096})
	require.NoError(t, err)
	good, err := AppendRequest(nil, &Request{Op: OpGet, Items: []Item{{Key: "k", Off: 0, Len: 10}}})
	require.NoError(t, err)
	with := func(f []byte, edit func(b []byte) []byte) []byte { return edit(append([]byte(nil), f...)) }
	cases := []struct {
		name      string
		afterHelo bool   // sent after a good hello
		frame     []byte // raw bytes
		want      string // in the answer's message
	}{
		// A version this build does not speak.
		{"version", false, with(hello, func(b []byte) []byte { b[4] = 9; return b }), "version mismatch"},
		// An op that does not exist.
		{"unknown op", true, with(good, func(b []byte) []byte { b[5] = 77; return b }), "unknown request"},
		// An item count the frame cannot hold.
		{"huge count", true, with(good, func(b []byte) []byte { copy(b[headerLen+30:], []byte{0xff, 0xff, 0xff, 0xff}); return b }), "elements in"},
		// A frame one byte longer than its fields.
		{"trailing", true, append(with(good, func(b []byte) []byte { b[0]++; return b }), 0), "trailing"},
		// The first request is not a hello.
		{"no hello", false, good, "not hello"},
		// A hello asking for no memory.
		{"empty hello", false, mustReq(t, &Request{Op: OpHello}), "must be positive"},
		// A get of bytes outside the shared memory: answered per key (no
		// want), the session goes on.
		{"out of range", true, mustReq(t, &Request{Op: OpGet, Items: []Item{{Key: "k", Off: 1 << 40, Len: 1}}}), ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("unix", srv.Addr())
			require.NoError(t, err)
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(30 * time.Second))
			if tc.afterHelo {
				_, err = c.Write(hello)
				require.NoError(t, err)
				f, err := ReadFrame(c, nil)
				require.NoError(t, err)
				r, err := DecodeResponse(f)
				require.NoError(t, err)
				require.Zero(t, r.Code)
			}
			_, err = c.Write(tc.frame)
			require.NoError(t, err)
			f, err := ReadFrame(c, nil)
			require.NoError(t, err)
			r, err := DecodeResponse(f)
			require.NoError(t, err)
			msg := r.Msg
			if tc.want == "" { // answered per key
				require.Zero(t, r.Code)
				require.Len(t, r.Results, 1)
				require.Equal(t, int32(storepb.InvalidParams), r.Results[0].Code)
				require.Contains(t, msg, "outside the 8192 shared bytes")
				return
			}
			require.Equal(t, int32(storepb.InvalidParams), r.Code)
			require.Contains(t, msg, tc.want)
			_, err = ReadFrame(c, nil)
			require.ErrorIs(t, err, io.EOF) // hung up
		})
	}
	require.NoError(t, srv.WaitSessions(ctx, 0))
	require.Zero(t, st.registered.Load())
	d := dial(t, srv.Addr(), 0, 4096)
	_, errs := d.BatchExist(ctx, []string{"x"})
	require.NoError(t, errs[0])
}

func mustReq(t *testing.T, r *Request) []byte {
	f, err := AppendRequest(nil, r)
	require.NoError(t, err)
	return f
}

// helper starts this test binary as a helper process of mode with arg
// and returns it and its stdout.
func helper(t *testing.T, mode, arg string) (*exec.Cmd, *bufio.Reader) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+mode, "MC_REALCLIENT_TEST_ARG="+arg)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd, bufio.NewReader(out)
}

// readLine reads one line of a helper's stdout (bounded by the test's
// own timeout: a helper that dies closes the pipe).
func readLine(t *testing.T, r *bufio.Reader) string {
	t.Helper()
	l, err := r.ReadString('\n')
	require.NoError(t, err)
	return string(bytes.TrimSpace([]byte(l)))
}

// stuck is a Store whose puts block until the process is killed: the
// interleaving TestRealClientKilledMidCall needs.
type stuck struct{ Store }

func (stuck) RegisterBuffer([]byte) error   { return nil }
func (stuck) UnregisterBuffer([]byte) error { return nil }
func (stuck) BatchPutFrom(context.Context, []string, [][]byte, *client.ReplicateConfig) []error {
	fmt.Println("in-call")
	select {}
}

// helperMain runs a helper process: "stuck-real" serves on the socket in
// MC_REALCLIENT_TEST_ARG with a Store whose puts never return; "dummy"
// dials the real client there, puts one object from its pool and waits
// to be killed.
func helperMain(mode string) {
	arg := os.Getenv("MC_REALCLIENT_TEST_ARG")
	switch mode {
	case "stuck-real":
		srv, err := Listen(Config{Store: stuck{}, Socket: arg})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		defer srv.Close()
		fmt.Println("ready")
		select {}
	case "dial":
		d, err := Dial(context.Background(), arg, 1<<20, 1<<20)
		if err != nil {
			fmt.Println("refused:", err)
			os.Exit(0)
		}
		_ = d.Close()
		fmt.Println("accepted")
		os.Exit(0)
	case "dummy":
		d, err := Dial(context.Background(), arg, 1<<20, 1<<20)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		b, err := d.Alloc(8192)
		if err == nil {
			copy(b, pattern(8192, 5))
			if errs := d.BatchPut(context.Background(), []string{"from-dead-dummy"}, [][]byte{b}, nil, false); errs[0] != nil {
				err = errs[0]
			}
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		fmt.Println("put")
		var mu sync.Mutex
		mu.Lock()
		mu.Lock() // until killed
	}
	os.Exit(3)
}

// Memory of the dummy's own (a memfd mapping, as MooncakeHostMemAllocator
// makes) registered with the real client moves without any copy: the
// real client maps the same pages, then stops when it is unregistered or
// the dummy leaves.
func TestRegisteredSharedMemory(t *testing.T) {
	srv, real, st := realClient(t)
	ctx := ctxT(t)
	d := dial(t, srv.Addr(), 0, 4096) // staging far smaller than the values
	base := st.registered.Load()

	m, err := newShm(1 << 20)
	require.NoError(t, err)
	defer m.close()
	copy(m.mem, pattern(512<<10, 4))
	require.NoError(t, d.RegisterShared(ctx, m.fd, 0, m.mem))
	require.Equal(t, base+1<<20, st.registered.Load())

	before := srv.RequestBytes()
	require.Equal(t, []error{nil}, d.BatchPut(ctx, []string{"host-pool"}, [][]byte{m.mem[:512<<10]}, nil, false))
	require.Less(t, srv.RequestBytes()-before, uint64(128))
	got, err := real.Get(ctx, "host-pool")
	require.NoError(t, err)
	require.Equal(t, pattern(512<<10, 4), got)

	// A get into the second half lands there directly.
	ns, errs := d.BatchGetInto(ctx, []string{"host-pool"}, [][]byte{m.mem[512<<10:]})
	require.Equal(t, []error{nil}, errs)
	require.Equal(t, []int{512 << 10}, ns)
	require.Equal(t, pattern(512<<10, 4), m.mem[512<<10:])

	ok, err := d.UnregisterShared(ctx, m.mem)
	require.True(t, ok)
	require.NoError(t, err)
	require.Equal(t, base, st.registered.Load())
	// Unregistered, it is ordinary memory again: too big for staging.
	errs = d.BatchPut(ctx, []string{"again"}, [][]byte{m.mem[:512<<10]}, nil, false)
	require.Equal(t, storepb.InvalidParams, code(errs[0]))

	// Registered again, then the dummy leaves: the real client lets go.
	require.NoError(t, d.RegisterShared(ctx, m.fd, 0, m.mem))
	require.NoError(t, d.Close())
	require.NoError(t, srv.WaitSessions(ctx, 0))
	require.Zero(t, st.registered.Load())
}

// A register request must bring exactly one fd; without one it fails as
// a whole with a message, and the session goes on.
func TestRegisterWithoutFD(t *testing.T) {
	srv, _, st := realClient(t)
	ctx := ctxT(t)
	d := dial(t, srv.Addr(), 0, 4096)
	before := st.registered.Load()
	d.mu.Lock()
	_, err := d.roundTrip(ctx, &Request{Op: OpRegister, Arg0: 4096})
	d.mu.Unlock()
	require.Equal(t, storepb.InvalidParams, code(err))
	require.ErrorContains(t, err, "0 fds came with the request")
	require.Equal(t, before, st.registered.Load())
	_, errs := d.BatchExist(ctx, []string{"still-served"})
	require.NoError(t, errs[0])
	require.Error(t, d.RegisterShared(ctx, -1, 0, make([]byte, 10)))
	ok, err := d.UnregisterShared(ctx, make([]byte, 10)) // nothing registered there
	require.False(t, ok)
	require.NoError(t, err)
}

// A dummy that registers more bytes than its file holds (a bug in the
// caller, or a file shrunk since it was mapped) is refused: the real
// client would take SIGBUS, and die with every dummy's calls, at the
// first put or get that touched the pages past the end.
func TestRegisterPastTheEndOfTheFile(t *testing.T) {
	srv, _, st := realClient(t)
	ctx := ctxT(t)
	d := dial(t, srv.Addr(), 0, 4096)
	before := st.registered.Load()

	m, err := newShm(4096)
	require.NoError(t, err)
	defer m.close()
	// Mapping past the end of a file succeeds; touching it does not.
	mem, err := unix.Mmap(m.fd, 0, 3*4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	require.NoError(t, err)
	defer unix.Munmap(mem)

	err = d.RegisterShared(ctx, m.fd, 0, mem)
	require.Equal(t, storepb.InvalidParams, code(err), "err %v", err)
	require.ErrorContains(t, err, "past the end")
	err = d.RegisterShared(ctx, m.fd, 4096, mem[:4096])
	require.Equal(t, storepb.InvalidParams, code(err), "err %v", err)
	require.Equal(t, before, st.registered.Load())
	// Had it been taken, this put would read the pages past the end.
	errs := d.BatchPut(ctx, []string{"past-the-end"}, [][]byte{mem[4096:]}, nil, false)
	require.Equal(t, storepb.InvalidParams, code(errs[0]))
	// What the file does hold registers.
	require.NoError(t, d.RegisterShared(ctx, m.fd, 0, mem[:4096]))
}

// quick is a Store that answers existence checks at once, so that a
// dummy can make the real client's answers pile up.
type quick struct{ Store }

func (quick) RegisterBuffer([]byte) error   { return nil }
func (quick) UnregisterBuffer([]byte) error { return nil }
func (quick) BatchExist(_ context.Context, keys []string) ([]bool, []error) {
	return make([]bool, len(keys)), make([]error, len(keys))
}

// Close ends a session whose dummy sends calls but never reads the
// answers (a stopped process, say), where the real client is blocked
// writing one: it must not wait for that dummy forever.
func TestCloseWithADummyThatDoesNotRead(t *testing.T) {
	srv, err := Listen(Config{Store: quick{}, Socket: socketName(t)})
	require.NoError(t, err)
	defer srv.Close()
	c, err := net.Dial("unix", srv.Addr())
	require.NoError(t, err)
	defer c.Close()
	uc := c.(*net.UnixConn)
	_, err = uc.Write(mustReq(t, &Request{Op: OpHello, Arg0: 4096, Arg1: 4096}))
	require.NoError(t, err)
	b, oob := make([]byte, 4096), make([]byte, unix.CmsgSpace(4))
	_, oobn, _, _, err := uc.ReadMsgUnix(b, oob)
	require.NoError(t, err)
	fd, err := fdOf(oob[:oobn])
	require.NoError(t, err)
	require.GreaterOrEqual(t, fd, 0)
	unix.Close(fd)

	items := make([]Item, 2000)
	for i := range items {
		items[i].Key = fmt.Sprintf("key-%06d", i)
	}
	req := mustReq(t, &Request{Op: OpExist, Items: items})
	// Send until the real client stops reading: then it is blocked on an
	// answer this side does not read (a write that cannot finish within a
	// second means nothing on the other side reads).
	for {
		require.NoError(t, uc.SetWriteDeadline(time.Now().Add(time.Second)))
		if _, err := uc.Write(req); err != nil {
			require.ErrorIs(t, err, os.ErrDeadlineExceeded)
			break
		}
	}
	done := make(chan error, 1)
	go func() { done <- srv.Close() }()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("Close still waits for a dummy that does not read")
	}
	require.Zero(t, srv.Sessions())
}

// A hello answer that claims more shared bytes than its memfd holds (a
// real client of another build, or a broken one) fails Dial: mapped, the
// pages past the end would kill the dummy with SIGBUS at first touch.
func TestHelloClaimsMoreThanTheFile(t *testing.T) {
	ln, err := net.ListenUnix("unix", unixAddr(socketName(t)))
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		c, err := ln.AcceptUnix()
		if err != nil {
			return
		}
		defer c.Close()
		if _, err := ReadFrame(c, nil); err != nil {
			return
		}
		m, err := newShm(4096)
		if err != nil {
			return
		}
		defer m.close()
		f, _ := AppendResponse(nil, &Response{Op: OpHello, Value: 1 << 20})
		_, _, _ = c.WriteMsgUnix(f, unix.UnixRights(m.fd), nil)
		_, _ = c.Read(make([]byte, 1)) // until the dummy hangs up
	}()
	d, err := Dial(ctxT(t), ln.Addr().String(), 512<<10, 4096)
	if err == nil {
		d.Close()
	}
	require.ErrorIs(t, err, ErrFrame)
	require.ErrorContains(t, err, "past the end")
}

// A real client that refuses a hello (more memory than it gives one
// dummy) makes Dial fail with its answer, and the connection is closed.
func TestRefusedHello(t *testing.T) {
	srv, err := Listen(Config{Store: quick{}, Socket: socketName(t), MaxShared: 1 << 20})
	require.NoError(t, err)
	defer srv.Close()
	_, err = Dial(ctxT(t), srv.Addr(), 1<<20, 1<<20)
	require.Equal(t, storepb.InvalidParams, code(err), "err %v", err)
	require.ErrorContains(t, err, "refused the dummy")
	require.NoError(t, srv.WaitSessions(ctxT(t), 0))
}

// A dummy cannot shrink the memory the real client reads from under it
// (a bug, or a stray ftruncate of an fd it was handed): the real client
// would take SIGBUS at the next put from those pages, and every dummy's
// calls would die with it. The session's memfd comes sealed against
// resizing; a registered one that allows sealing is sealed against
// shrinking when it is registered.
func TestSharedMemoryCannotShrink(t *testing.T) {
	srv, err := Listen(Config{Store: quick{}, Socket: socketName(t)})
	require.NoError(t, err)
	defer srv.Close()
	c, err := net.Dial("unix", srv.Addr())
	require.NoError(t, err)
	defer c.Close()
	uc := c.(*net.UnixConn)
	_, err = uc.Write(mustReq(t, &Request{Op: OpHello, Arg0: 4096, Arg1: 4096}))
	require.NoError(t, err)
	b, oob := make([]byte, 4096), make([]byte, unix.CmsgSpace(4))
	_, oobn, _, _, err := uc.ReadMsgUnix(b, oob)
	require.NoError(t, err)
	fd, err := fdOf(oob[:oobn])
	require.NoError(t, err)
	require.GreaterOrEqual(t, fd, 0)
	defer unix.Close(fd)
	require.ErrorIs(t, unix.Ftruncate(fd, 0), unix.EPERM, "the session's memfd can shrink")

	// The dummy's own memfd, made to allow sealing (as alloc_shared does).
	d := dial(t, srv.Addr(), 0, 4096)
	own, err := unix.MemfdCreate("dummy-own", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	require.NoError(t, err)
	defer unix.Close(own)
	require.NoError(t, unix.Ftruncate(own, 8192))
	mem, err := unix.Mmap(own, 0, 8192, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	require.NoError(t, err)
	defer unix.Munmap(mem)
	require.NoError(t, d.RegisterShared(ctxT(t), own, 0, mem))
	require.ErrorIs(t, unix.Ftruncate(own, 4096), unix.EPERM, "a registered memfd can shrink")
	require.NoError(t, unix.Ftruncate(own, 3*4096), "growing it harms no one")
}

// A dummy run by another user is refused unless the real client accepts
// every user: the abstract socket is reachable from every process in the
// network namespace.
func TestOtherUsersRefused(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a dummy as another user")
	}
	// The test binary sits in a directory only root may enter: run a copy
	// nobody can execute.
	dir, err := os.MkdirTemp("", "realclient-users-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755))
	bin, err := os.ReadFile(os.Args[0])
	require.NoError(t, err)
	exe := filepath.Join(dir, "realclient.test")
	require.NoError(t, os.WriteFile(exe, bin, 0o755))

	dialAs := func(socket string, uid uint32) string {
		cmd := exec.Command(exe, "-test.run=^$")
		cmd.Env = append(os.Environ(), helperEnv+"=dial", "MC_REALCLIENT_TEST_ARG="+socket)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
		cmd.Dir = dir
		out, err := cmd.Output()
		require.NoError(t, err)
		return string(bytes.TrimSpace(out))
	}
	const nobody = 65534
	for _, anyUser := range []bool{false, true} {
		srv, err := Listen(Config{Store: stuck{}, Socket: socketName(t), AnyUser: anyUser})
		require.NoError(t, err)
		assert.Equal(t, "accepted", dialAs(srv.Addr(), 0), "root is always accepted")
		got := dialAs(srv.Addr(), nobody)
		if anyUser {
			assert.Equal(t, "accepted", got)
		} else {
			assert.True(t, strings.HasPrefix(got, "refused:"), "another user: %s", got)
		}
		require.NoError(t, srv.Close())
	}
}
