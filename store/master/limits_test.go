package master

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/mooncake-go/mooncake/engine/transport/conn"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// limitsMaster starts a master with the given limits and one mounted
// 1 MiB segment of client "c1".
func limitsMaster(t *testing.T, cfg ServerConfig) (*Server, storepb.MasterClient, context.Context) {
	t.Helper()
	m, c := startAdminMaster(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	mountOver(t, ctx, c, "c1", seg("1", 0x10000000, 1<<20))
	return m, c, ctx
}

// requireUntouched checks that a refused request applied nothing: no
// key of keys is known and no byte of the pool is allocated.
func requireUntouched(t *testing.T, m *Server, keys []string) {
	t.Helper()
	st := m.Service().Stats()
	assert.Zero(t, st.Used, "a refused request reserved space")
	for _, k := range keys {
		sh := m.Service().shardOf(k)
		sh.mu.Lock()
		_, ok := sh.objects[k]
		sh.mu.Unlock()
		assert.False(t, ok, "%s was started", k)
	}
}

func TestLimitKeyLength(t *testing.T) {
	m, c, ctx := limitsMaster(t, ServerConfig{Service: ServiceConfig{MaxKeyLen: 16}})
	long := strings.Repeat("k", 17)

	ps, err := c.PutStart(ctx, &storepb.PutStartRequest{ClientId: "c1", Key: long, ValueLength: 64})
	require.NoError(t, err)
	assert.Equal(t, storepb.InvalidParams, code(ps.Result))
	assert.Contains(t, ps.Result.Message, "key of 17 bytes is over the limit of 16 bytes")
	requireUntouched(t, m, []string{long})

	// Every call that takes a key says the same.
	gr, err := c.GetReplicaList(ctx, &storepb.KeyRequest{Key: long})
	require.NoError(t, err)
	assert.Equal(t, storepb.InvalidParams, code(gr.Result))
	ex, err := c.ExistKey(ctx, &storepb.KeyRequest{Key: long})
	require.NoError(t, err)
	assert.Equal(t, storepb.InvalidParams, code(ex))
	rm, err := c.Remove(ctx, &storepb.RemoveRequest{Key: long})
	require.NoError(t, err)
	assert.Equal(t, storepb.InvalidParams, code(rm))

	// A key at the limit is fine.
	ps, err = c.PutStart(ctx, &storepb.PutStartRequest{ClientId: "c1", Key: long[:16], ValueLength: 64})
	require.NoError(t, err)
	require.NoError(t, ps.Result.AsError())
}

func TestLimitValueSize(t *testing.T) {
	m, c, ctx := limitsMaster(t, ServerConfig{Service: ServiceConfig{MaxValueLen: 1024, MaxBatchValueBytes: 2048}})

	// One value over the per-value limit.
	ps, err := c.PutStart(ctx, &storepb.PutStartRequest{ClientId: "c1", Key: "big", ValueLength: 1025})
	require.NoError(t, err)
	assert.Equal(t, storepb.InvalidParams, code(ps.Result))
	assert.Contains(t, ps.Result.Message, "value of 1025 bytes is over the limit of 1024 bytes")
	us, err := c.UpsertStart(ctx, &storepb.PutStartRequest{ClientId: "c1", Key: "big", ValueLength: 1025})
	require.NoError(t, err)
	assert.Equal(t, storepb.InvalidParams, code(us.Result))
	requireUntouched(t, m, []string{"big"})

	// Three values each within the per-value limit, together over the
	// per-batch one: refused whole, none started.
	items := func(n int) []*storepb.PutStartRequest {
		var out []*storepb.PutStartRequest
		for i := range n {
			out = append(out, &storepb.PutStartRequest{ClientId: "c1", Key: fmt.Sprint("b", i), ValueLength: 1000})
		}
		return out
	}
	keys := []string{"b0", "b1", "b2"}
	for _, upsert := range []bool{false, true} {
		call := c.BatchPutStart
		if upsert {
			call = c.BatchUpsertStart
		}
		_, err = call(ctx, &storepb.BatchPutStartRequest{Items: items(3)})
		assert.Equal(t, codes.InvalidArgument, status.Code(err), "upsert=%v: %v", upsert, err)
		assert.ErrorContains(t, err, "over the limit (max_batch_value_size)")
		requireUntouched(t, m, keys)
	}
	// Two fit.
	resp, err := c.BatchPutStart(ctx, &storepb.BatchPutStartRequest{Items: items(2)})
	require.NoError(t, err)
	for _, it := range resp.Items {
		require.NoError(t, it.Result.AsError())
	}
}

func TestLimitBatchSize(t *testing.T) {
	m, c, ctx := limitsMaster(t, ServerConfig{Service: ServiceConfig{MaxBatch: 4}})
	keys := []string{"k0", "k1", "k2", "k3", "k4"}
	var items []*storepb.PutStartRequest
	var ends []*storepb.PutEndRequest
	for _, k := range keys {
		items = append(items, &storepb.PutStartRequest{ClientId: "c1", Key: k, ValueLength: 64})
		ends = append(ends, &storepb.PutEndRequest{ClientId: "c1", Key: k})
	}
	// Every batch call, with one key more than the limit.
	calls := map[string]func() error{
		"BatchPutStart": func() error {
			_, err := c.BatchPutStart(ctx, &storepb.BatchPutStartRequest{Items: items})
			return err
		},
		"BatchUpsertStart": func() error {
			_, err := c.BatchUpsertStart(ctx, &storepb.BatchPutStartRequest{Items: items})
			return err
		},
		"BatchPutEnd": func() error {
			_, err := c.BatchPutEnd(ctx, &storepb.BatchPutEndRequest{Items: ends})
			return err
		},
		"BatchPutRevoke": func() error {
			_, err := c.BatchPutRevoke(ctx, &storepb.BatchKeyRequest{ClientId: "c1", Keys: keys})
			return err
		},
		"BatchGetReplicaList": func() error {
			_, err := c.BatchGetReplicaList(ctx, &storepb.BatchKeyRequest{Keys: keys})
			return err
		},
		"BatchExistKey": func() error {
			_, err := c.BatchExistKey(ctx, &storepb.BatchKeyRequest{Keys: keys})
			return err
		},
		"BatchRemove": func() error {
			_, err := c.BatchRemove(ctx, &storepb.BatchRemoveRequest{Keys: keys})
			return err
		},
	}
	for name, call := range calls {
		err := call()
		assert.Equal(t, codes.InvalidArgument, status.Code(err), "%s: %v", name, err)
		assert.ErrorContains(t, err, "batch of 5 keys is over the limit of 4 keys", name)
	}
	requireUntouched(t, m, keys)

	// At the limit the batch runs.
	resp, err := c.BatchPutStart(ctx, &storepb.BatchPutStartRequest{Items: items[:4]})
	require.NoError(t, err)
	require.Len(t, resp.Items, 4)
	for _, it := range resp.Items {
		require.NoError(t, it.Result.AsError())
	}
}

func TestLimitRequestSize(t *testing.T) {
	_, c, ctx := limitsMaster(t, ServerConfig{MaxRecvMsgSize: 64 << 10})
	keys := func(n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = fmt.Sprintf("%01000d", i) // 1000 bytes each
		}
		return out
	}
	_, err := c.BatchExistKey(ctx, &storepb.BatchKeyRequest{Keys: keys(100)})
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	assert.ErrorContains(t, err, "larger than max")
	_, err = c.BatchExistKey(ctx, &storepb.BatchKeyRequest{Keys: keys(50)})
	require.NoError(t, err)
}

// TestLimitConcurrentStreams holds the one stream a connection may have
// with a watch: a second call on that connection waits (gRPC queues it
// until a stream frees), while another connection is served.
func TestLimitConcurrentStreams(t *testing.T) {
	m, c, ctx := limitsMaster(t, ServerConfig{MaxConcurrentStreams: 1})
	wctx, stop := context.WithCancel(ctx)
	stream, err := c.WatchObjects(wctx, &storepb.WatchObjectsRequest{})
	require.NoError(t, err)
	resp, err := stream.Recv()
	require.NoError(t, err)
	require.True(t, resp.Synced)

	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	_, err = c.ExistKey(short, &storepb.KeyRequest{Key: "k"})
	assert.Equal(t, codes.DeadlineExceeded, status.Code(err), "a second stream was served: %v", err)

	conn, err := grpc.NewClient(m.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	ex, err := storepb.NewMasterClient(conn).ExistKey(ctx, &storepb.KeyRequest{Key: "k"})
	require.NoError(t, err)
	assert.Equal(t, storepb.ObjectNotFound, code(ex))

	// The watch ends: the connection's stream is free again.
	stop()
	ex, err = c.ExistKey(ctx, &storepb.KeyRequest{Key: "k"})
	require.NoError(t, err)
	assert.Equal(t, storepb.ObjectNotFound, code(ex))
}

func TestLimitWatchers(t *testing.T) {
	m, c, ctx := limitsMaster(t, ServerConfig{Service: ServiceConfig{MaxWatchers: 2}})
	watch := func(ctx context.Context) (grpc.ServerStreamingClient[storepb.WatchObjectsResponse], error) {
		stream, err := c.WatchObjects(ctx, &storepb.WatchObjectsRequest{})
		require.NoError(t, err)
		_, err = stream.Recv()
		return stream, err
	}
	first, stop := context.WithCancel(ctx)
	_, err := watch(first)
	require.NoError(t, err)
	_, err = watch(ctx)
	require.NoError(t, err)

	_, err = watch(ctx)
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	assert.ErrorContains(t, err, "2 WatchObjects streams open, the limit")

	// A watcher that goes makes room for another.
	stop()
	require.Eventually(t, func() bool { return m.api.watchers.Load() == 1 }, 10*time.Second, 5*time.Millisecond)
	_, err = watch(ctx)
	require.NoError(t, err)
}

func TestLimitAdminBody(t *testing.T) {
	m, _ := startAdminMaster(t, ServerConfig{MaxAdminBody: 1024})
	do := func(body io.Reader, length int64) (int, string) {
		req, err := http.NewRequest("GET", "http://"+m.AdminAddr()+"/health", body)
		require.NoError(t, err)
		req.ContentLength = length // -1: chunked
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}
	tests := []struct {
		name   string
		size   int
		length int64 // declared; -1: chunked
		want   int
	}{
		// A declared length over the limit is refused before any byte is read.
		{"declared over", 2048, 2048, http.StatusRequestEntityTooLarge},
		// A chunked body is read up to the limit, no further.
		{"chunked over", 2048, -1, http.StatusRequestEntityTooLarge},
		{"at the limit", 1024, 1024, http.StatusOK},
		{"chunked under", 512, -1, http.StatusOK},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, body := do(strings.NewReader(strings.Repeat("x", tc.size)), tc.length)
			assert.Equal(t, tc.want, code, body)
			if tc.want == http.StatusRequestEntityTooLarge {
				assert.Contains(t, body, "request body over the limit of 1024 bytes")
			}
		})
	}
	// A refused body's connection lingers half-closed for 500 ms in
	// net/http (closeWriteAndWait), longer than the next test's leak check
	// waits: close the server and wait for its connections here.
	require.NoError(t, m.Close())
	require.Eventually(t, func() bool {
		buf := make([]byte, 1<<20)
		return !bytes.Contains(buf[:runtime.Stack(buf, true)], []byte("net/http.(*conn).serve"))
	}, 10*time.Second, 10*time.Millisecond)
}

// zmtpGreetingNull is a ZMTP 3.0 client greeting with the NULL mechanism.
func zmtpGreetingNull() []byte {
	g := make([]byte, zmtpGreeting)
	g[0], g[9], g[10] = 0xff, 0x7f, 3
	copy(g[12:], "NULL")
	return g
}

// TestLimitKVEventsSubscribers fills the KV events PUB socket's
// connections: one more is closed before the ZMTP greeting; a peer that
// announces a frame over kvMaxFrame is cut (zmq4 would allocate it) and
// its place given back; the subscribers within the limit get events.
func TestLimitKVEventsSubscribers(t *testing.T) {
	m, svc := startKVMaster(t, KVEventsConfig{MaxSubscribers: 2})
	lim := m.kv.pubLim
	openNow := func() int { n, _ := lim.counts(); return n }
	addr := loopback(strings.TrimPrefix(m.KVEventsAddr(), "tcp://"))
	sub := subscribeKV(t, m, "", "")
	require.Eventually(t, func() bool { return openNow() == 1 }, 10*time.Second, time.Millisecond)

	// What the publisher sends a raw peer until it hangs up.
	answer := func(send []byte) []byte {
		c, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		defer c.Close()
		_, _ = c.Write(send)
		// Within kvHandshakeTimeout: a hang-up must come from a limit.
		require.NoError(t, c.SetReadDeadline(time.Now().Add(kvHandshakeTimeout/2)))
		b, err := io.ReadAll(c)
		assert.NotErrorIs(t, err, os.ErrDeadlineExceeded, "the publisher kept the connection")
		return b
	}
	// A greeting, then a READY command claiming 1 TiB.
	huge := append(zmtpGreetingNull(), 0x06, 0, 0, 1, 0, 0, 0, 0, 0)
	got := answer(huge)
	assert.GreaterOrEqual(t, len(got), zmtpGreeting, "the publisher greeted the peer within the limit")
	require.Eventually(t, func() bool { return openNow() == 1 }, 10*time.Second, time.Millisecond,
		"the cut connection still counts")

	// A second subscriber fills the socket; a third peer is not greeted.
	subscribeKV(t, m, "x", "", "x")
	require.Equal(t, 2, openNow())
	assert.Empty(t, answer(zmtpGreetingNull()), "a connection over the limit was served")
	_, refused := lim.counts()
	assert.Equal(t, uint64(1), refused)

	// Those within the limit still get events.
	require.NoError(t, svc.MountSegment(t.Context(), "c1", seg("1", 0x10000000, 1<<20)))
	put(t, svc, "c1", "k", 64, nil)
	evs, _ := sub.events(1)
	assert.Equal(t, "k", evs[0].ObjectKey)
}

// TestLimitKVEventsHandshake has a peer connect to the KV events PUB
// socket and say nothing: zmq4 handshakes in its accept loop, so the
// silent peer holds every later subscriber off until the deadline cuts it.
func TestLimitKVEventsHandshake(t *testing.T) {
	defer func(d time.Duration) { kvHandshakeTimeout = d }(kvHandshakeTimeout)
	kvHandshakeTimeout = 200 * time.Millisecond
	m, _ := startKVMaster(t, KVEventsConfig{})
	c, err := net.Dial("tcp", loopback(strings.TrimPrefix(m.KVEventsAddr(), "tcp://")))
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
	b, err := io.ReadAll(c)
	require.NoError(t, err, "the silent peer was not cut")
	assert.Len(t, b, zmtpGreeting, "greeted, then cut")
	require.Eventually(t, func() bool { n, _ := m.kv.pubLim.counts(); return n == 0 }, 10*time.Second, time.Millisecond)
	subscribeKV(t, m, "", "") // the accept loop is free again
}

func TestZMTPReader(t *testing.T) {
	greeting := make([]byte, zmtpGreeting)
	tests := []struct {
		name   string
		chunks [][]byte // fed in turn
		frames int
		err    bool
	}{
		// A short frame (READY), then a short message frame.
		{"short frames", [][]byte{greeting, {0x04, 3, 'a', 'b', 'c'}, {0x00, 1, 'x'}}, 2, false},
		// Bytes split anywhere: inside the greeting, the size, the body.
		{"split", [][]byte{greeting[:10], greeting[10:], {0x06, 0, 0, 0}, {0, 0, 0, 0, 2, 'a'}, {'b'}}, 1, false},
		// An empty frame counts.
		{"empty frame", [][]byte{greeting, {0x00, 0}}, 1, false},
		// A long size at the limit is fine; over it is refused.
		{"long at the limit", [][]byte{greeting, {0x02, 0, 0, 0, 0, 0, 1, 0, 0}}, 0, false},
		{"long over the limit", [][]byte{greeting, {0x02, 0, 0, 0, 0, 0, 1, 0, 1}}, 0, true},
		{"long huge", [][]byte{greeting, {0x06, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}}, 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			z := zmtpReader{need: zmtpGreeting}
			var err error
			for _, c := range tc.chunks {
				if err = z.feed(c); err != nil {
					break
				}
			}
			assert.Equal(t, tc.err, err != nil, "%v", err)
			assert.Equal(t, tc.frames, z.frames)
		})
	}
}

// TestLimitConnectionsPerPeer opens raw connections to the master's gRPC
// port from one address: as many as the per-peer limit get the server's
// HTTP/2 settings, the next is closed unanswered, and a client from
// another address is served.
func TestLimitConnectionsPerPeer(t *testing.T) {
	m, c, ctx := limitsMaster(t, ServerConfig{MaxConnsPerPeer: 2})
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}, Timeout: 5 * time.Second}
	// served opens a connection from 127.0.0.2, left open, and says
	// whether the server answered the HTTP/2 preface.
	served := func() bool {
		nc, err := d.Dial("tcp", m.Addr())
		if err != nil {
			t.Skipf("cannot dial from 127.0.0.2: %v", err)
		}
		t.Cleanup(func() { nc.Close() })
		require.NoError(t, nc.SetDeadline(time.Now().Add(10*time.Second)))
		// The client preface and an empty SETTINGS frame.
		_, _ = nc.Write(append([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), 0, 0, 0, 4, 0, 0, 0, 0, 0))
		frame := make([]byte, 9)
		_, err = io.ReadFull(nc, frame)
		assert.NotErrorIs(t, err, os.ErrDeadlineExceeded, "neither served nor refused")
		return err == nil && frame[3] == 4 // a SETTINGS frame
	}
	require.True(t, served())
	require.True(t, served())
	assert.False(t, served(), "a third connection from one peer was served")

	ex, err := c.ExistKey(ctx, &storepb.KeyRequest{Key: "k"})
	require.NoError(t, err)
	assert.Equal(t, storepb.ObjectNotFound, code(ex))
}

// TestLimitAdminConnections keeps admin HTTP connections open from one
// address past the admin server's per-peer limit: the next is closed
// unanswered.
func TestLimitAdminConnections(t *testing.T) {
	defer func(l conn.Limits) { adminLimits = l }(adminLimits)
	adminLimits = conn.Limits{Total: 8, PerPeer: 2}
	m, _ := startAdminMaster(t, ServerConfig{})
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}, Timeout: 5 * time.Second}
	health := func() string {
		nc, err := d.Dial("tcp", m.AdminAddr())
		if err != nil {
			t.Skipf("cannot dial from 127.0.0.2: %v", err)
		}
		t.Cleanup(func() { nc.Close() })
		require.NoError(t, nc.SetDeadline(time.Now().Add(10*time.Second)))
		_, _ = io.WriteString(nc, "GET /role HTTP/1.1\r\nHost: m\r\n\r\n")
		line, err := bufio.NewReader(nc).ReadString('\n')
		assert.NotErrorIs(t, err, os.ErrDeadlineExceeded, "neither served nor refused")
		return strings.TrimSpace(line)
	}
	require.Equal(t, "HTTP/1.1 200 OK", health())
	require.Equal(t, "HTTP/1.1 200 OK", health())
	assert.Empty(t, health(), "a third connection from one peer was served")
	assert.Equal(t, http.StatusOK, adminDo(t, m, "GET", "/role").code, "another peer is served")
	// The kept-alive connections end with the server, before the next
	// test's leak check.
	require.NoError(t, m.Close())
	require.Eventually(t, func() bool {
		buf := make([]byte, 1<<20)
		return !bytes.Contains(buf[:runtime.Stack(buf, true)], []byte("net/http.(*conn).serve"))
	}, 10*time.Second, 10*time.Millisecond)
}
