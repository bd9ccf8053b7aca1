package store

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"math/rand/v2"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// fill writes a pattern of its own into every value of a worker's memory,
// so that what a get returns can be told from what was there.
func fill(mem []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 1))
	for i := range mem {
		mem[i] = byte(r.Uint32())
	}
}

// roundTrip checks, with two workers of one store, that a get returns
// exactly what a put wrote, in the order of its keys, and that a missing
// key fails by name without spoiling the worker.
func roundTrip(t *testing.T, newWorker func(o Options) (Worker, error), mem func(Worker) []byte) {
	ctx := context.Background()
	o := Options{ValueSize: 1000, BatchSize: 3}
	put, err := newWorker(o)
	require.NoError(t, err)
	defer put.Close()
	get, err := newWorker(o)
	require.NoError(t, err)
	defer get.Close()

	fill(mem(put), 1)
	want := bytes.Clone(mem(put))
	require.NoError(t, put.Put(ctx, []string{"a", "b", "c"}))
	fill(mem(put), 2)
	want2 := bytes.Clone(mem(put)[:o.ValueSize])
	require.NoError(t, put.Put(ctx, []string{"d"}))

	fill(mem(get), 3)
	require.NoError(t, get.Get(ctx, []string{"c", "a", "b"}))
	v := func(b []byte, i int) []byte { return b[i*o.ValueSize : (i+1)*o.ValueSize] }
	assert.Equal(t, v(want, 2), v(mem(get), 0), "c")
	assert.Equal(t, v(want, 0), v(mem(get), 1), "a")
	assert.Equal(t, v(want, 1), v(mem(get), 2), "b")
	require.NoError(t, get.Get(ctx, []string{"d"}))
	assert.Equal(t, want2, v(mem(get), 0), "d")

	err = get.Get(ctx, []string{"a", "nope", "c"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), `"nope": no such object`)
	require.NoError(t, get.Get(ctx, []string{"b"}), "the worker stays usable")
	assert.Equal(t, v(want, 1), v(mem(get), 0))
}

func TestTCPServerRoundTrip(t *testing.T) {
	defer goleak.VerifyNone(t)
	s, err := NewTCPServer(TCPServerConfig{ValueSize: 1000, Slots: 8})
	require.NoError(t, err)
	defer s.Close()
	roundTrip(t, func(o Options) (Worker, error) { return NewTCPWorker(o, s.Addr()) },
		func(w Worker) []byte { return w.(*tcpWorker).mem })

	// A worker of another value size is told so by the server.
	w, err := NewTCPWorker(Options{ValueSize: 10}, s.Addr())
	require.NoError(t, err)
	err = w.Put(context.Background(), []string{"x"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "tcp server: value size 10, the server holds 1000-byte values")
	require.NoError(t, w.Close())

	// A cancelled call returns promptly with the context's error.
	w, err = NewTCPWorker(Options{ValueSize: 1000}, s.Addr())
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, w.Get(ctx, []string{"a"}), context.Canceled)
	require.NoError(t, w.Close())
	require.NoError(t, s.Close())
}

func TestMemcpyStoreRoundTrip(t *testing.T) {
	s, err := NewMemcpyStore(Options{ValueSize: 1000, Keys: 8})
	require.NoError(t, err)
	roundTrip(t, func(o Options) (Worker, error) { return s.NewWorker(o) },
		func(w Worker) []byte { return w.(*memcpyWorker).mem })
	_, err = s.NewWorker(Options{ValueSize: 10})
	require.ErrorContains(t, err, "value size 10")
	require.NoError(t, s.Close())
}

func TestSlotsEvictOldest(t *testing.T) {
	s := newSlots(2)
	put := func(keys ...string) {
		at, err := s.reserve(keys, nil)
		require.NoError(t, err)
		s.publish(keys, at)
	}
	put("a")
	put("b")
	// An unpublished put is not visible yet.
	at, err := s.reserve([]string{"c"}, nil)
	require.NoError(t, err)
	_, err = s.find([]string{"c"}, nil)
	require.ErrorContains(t, err, `"c": no such object`)
	_, err = s.find([]string{"a"}, nil)
	require.ErrorContains(t, err, `"a": no such object`, "c's slot was a's")
	s.publish([]string{"c"}, at)
	got, err := s.find([]string{"c", "b"}, nil)
	require.NoError(t, err)
	assert.Equal(t, []int{0, 1}, got)
	// b again takes slot 1, its own; then again slot 0, evicting c and
	// leaving slot 1 free, whose next put evicts nothing.
	put("b")
	put("b")
	got, err = s.find([]string{"b"}, nil)
	require.NoError(t, err)
	assert.Equal(t, []int{0}, got)
	_, err = s.find([]string{"c"}, nil)
	require.ErrorContains(t, err, `"c": no such object`)
	put("x")
	got, err = s.find([]string{"x", "b"}, nil)
	require.NoError(t, err)
	assert.Equal(t, []int{1, 0}, got)
	_, err = s.reserve([]string{"x", "y", "z"}, nil)
	require.ErrorContains(t, err, "3 objects in one put, more than the 2")
}

// request is a well-formed request of keys (values of size for a put).
func request(op byte, size int, keys ...string) []byte {
	b := appendTCPRequest(nil, op, size, keys)
	if op == tcpPut {
		b = append(b, make([]byte, size*len(keys))...)
	}
	return b
}

func TestTCPServerRefusesMalformed(t *testing.T) {
	defer goleak.VerifyNone(t)
	s, err := NewTCPServer(TCPServerConfig{ValueSize: 16, Slots: 4})
	require.NoError(t, err)
	defer s.Close()
	long := string(bytes.Repeat([]byte{'k'}, tcpMaxKey+1))
	for _, tc := range []struct {
		name, req, want string
	}{
		{"op", "X\x10\x00\x00\x00\x01\x00\x00\x00", `request op 'X'`},
		{"value size", string(request(tcpGet, 17, "a")), "value size 17, the server holds 16-byte values"},
		{"no keys", string(request(tcpGet, 16)), "0 keys in a request (want 1 to 4)"},
		{"too many keys", string(request(tcpPut, 16, "a", "b", "c", "d", "e")), "5 keys in a request (want 1 to 4)"},
		{"huge count", "G\x10\x00\x00\x00\xff\xff\xff\xff", "4294967295 keys"},
		{"empty key", "G\x10\x00\x00\x00\x01\x00\x00\x00\x00\x00", "key 0: length 0"},
		{"long key", string(request(tcpGet, 16, long)), "key 0: length 1025 (want 1 to 1024)"},
		{"cut header", "G\x10\x00", "request header: unexpected EOF"},
		{"cut key", "G\x10\x00\x00\x00\x02\x00\x00\x00\x01\x00a\x05\x00ab", "key 1: unexpected EOF"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", s.Addr())
			require.NoError(t, err)
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			_, err = c.Write([]byte(tc.req))
			require.NoError(t, err)
			// A cut request is only cut once the client stops sending.
			c.(*net.TCPConn).CloseWrite()
			err = readTCPReply(c, tcpValues)
			require.Error(t, err)
			assert.Contains(t, err.Error(), "tcp server: "+tc.want)
			// Then the server hangs up.
			n, err := c.Read(make([]byte, 1))
			assert.Zero(t, n)
			assert.ErrorIs(t, err, io.EOF)
		})
	}
	// And serves the next client as ever.
	w, err := NewTCPWorker(Options{ValueSize: 16}, s.Addr())
	require.NoError(t, err)
	require.NoError(t, w.Put(context.Background(), []string{"a"}))
	require.NoError(t, w.Get(context.Background(), []string{"a"}))
	require.NoError(t, w.Close())
}

func FuzzReadTCPRequest(f *testing.F) {
	f.Add(request(tcpGet, 8, "a", "bc"))
	f.Add(request(tcpPut, 8, "key"))
	f.Add(request(tcpGet, 9, "a"))
	f.Add([]byte("G\x08\x00\x00\x00\x05\x00\x00\x00"))
	f.Add([]byte{})
	lim := tcpLimits{valueSize: 8, maxCount: 4}
	f.Fuzz(func(t *testing.T, b []byte) {
		src := bytes.NewReader(b)
		r := bufio.NewReader(src)
		var req tcpRequest
		err := readTCPRequest(r, lim, &req)
		if err != nil {
			if len(b) > 0 {
				assert.NotErrorIs(t, err, io.EOF, "EOF only for an empty stream")
			}
			return
		}
		// What was decoded is valid and encodes to the bytes consumed.
		require.True(t, req.op == tcpGet || req.op == tcpPut)
		require.Equal(t, lim.valueSize, req.size)
		require.True(t, len(req.keys) >= 1 && len(req.keys) <= lim.maxCount)
		enc := appendTCPRequest(nil, req.op, req.size, req.keys)
		require.Equal(t, b[:len(enc)], enc)
		require.Equal(t, len(enc), len(b)-src.Len()-r.Buffered(), "bytes consumed")
	})
}

func TestRunFloors(t *testing.T) {
	defer goleak.VerifyNone(t)
	for _, tc := range []struct {
		name string
		o    Options
	}{
		{"get 1MiB", Options{Op: OpGet, ValueSize: 1 << 20, Clients: 2, Keys: 8}},
		{"put 4KiB x 128", Options{Op: OpPut, ValueSize: 4 << 10, BatchSize: 128, Clients: 2, Keys: 512}},
		{"get 4KiB x 128", Options{Op: OpGet, ValueSize: 4 << 10, BatchSize: 128, Clients: 2, Keys: 1000}},
	} {
		for _, sys := range []struct {
			name, topology string
			run            func(Options) (Result, error)
		}{
			{TCP, Remote, func(o Options) (Result, error) { return RunTCP(context.Background(), o, TCPConfig{}) }},
			{Memcpy, SameHost, func(o Options) (Result, error) { return RunMemcpy(context.Background(), o) }},
		} {
			t.Run(sys.name+" "+tc.name, func(t *testing.T) {
				o := tc.o
				o.Duration, o.Warmup = 200*time.Millisecond, 50*time.Millisecond
				res, err := sys.run(o)
				require.NoError(t, err)
				o = o.WithDefaults()
				assert.Equal(t, sys.name, res.Name)
				assert.Equal(t, sys.topology, res.Topology)
				assert.Equal(t, o.Op, res.Op)
				assert.GreaterOrEqual(t, res.Seconds, 0.2)
				require.Positive(t, res.Calls)
				assert.Equal(t, res.Calls*uint64(o.BatchSize), res.Ops)
				assert.Positive(t, res.GBPerS)
				assert.GreaterOrEqual(t, res.P99us, res.P50us)
			})
		}
	}
	_, err := RunTCP(context.Background(), Options{}, TCPConfig{Command: []string{"/nonexistent/mooncake"}})
	require.ErrorContains(t, err, "/nonexistent/mooncake")
}

func TestFloorRatios(t *testing.T) {
	row := func(name string, clients int, gbps float64) Result {
		return Result{Name: name, Op: OpGet, ValueSize: 1 << 20, BatchSize: 1, Clients: clients, GBPerS: gbps}
	}
	rs := []Result{row(Ours, 1, 3), row(TCP, 1, 4), row(Memcpy, 1, 6), row(Ours, 2, 5), row(TCP, 2, 10)}
	FloorRatios(rs)
	assert.Equal(t, []float64{0.75, 1, 1.5, 0.5, 1}, []float64{rs[0].XTCP, rs[1].XTCP, rs[2].XTCP, rs[3].XTCP, rs[4].XTCP})
	assert.Equal(t, []float64{0.5, 4.0 / 6, 1, 0, 0}, []float64{rs[0].XMemcpy, rs[1].XMemcpy, rs[2].XMemcpy, rs[3].XMemcpy, rs[4].XMemcpy})
}
