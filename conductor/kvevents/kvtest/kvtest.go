// Package kvtest is a KV-event publisher for tests: the engines' protocol
// (a PUB socket, a replay ROUTER socket, [topic, seq, payload] messages)
// over go-zeromq's ZMTP implementation, independent of the subscriber's
// own, so that tests drive the subscriber with sockets it did not write.
// The end to end suites run the subscriber against vLLM's own publisher
// (pyzmq over libzmq).
package kvtest

import (
	"context"
	"encoding/binary"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"
	"go.uber.org/goleak"
)

// Publisher publishes numbered batches and keeps them all for replay.
type Publisher struct {
	t      testing.TB
	cancel context.CancelFunc
	pub    zmq4.Socket
	router zmq4.Socket
	// Endpoint and Replay are the sockets' addresses, tcp://host:port;
	// Replay is empty without a replay socket.
	Endpoint, Replay string

	mu     sync.Mutex
	seq    int64
	buf    [][]byte
	closed bool
}

// New listens on addr ("127.0.0.1:0" for any port), with a replay socket
// if replay. The test's cleanup closes it.
func New(t testing.TB, addr string, replay bool) *Publisher {
	t.Helper()
	r := ""
	if replay {
		r = "127.0.0.1:0"
	}
	return Listen(t, addr, r)
}

// Listen is New with the replay socket's address ("" for none): a
// publisher restarted in place listens where the old one did.
func Listen(t testing.TB, addr, replayAddr string) *Publisher {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p := &Publisher{t: t, cancel: cancel, pub: zmq4.NewPub(ctx)}
	if err := p.pub.Listen("tcp://" + addr); err != nil {
		cancel()
		t.Fatalf("kvtest: listen %s: %v", addr, err)
	}
	p.Endpoint = "tcp://" + p.pub.Addr().String()
	if replayAddr != "" {
		p.router = zmq4.NewRouter(ctx)
		if err := p.router.Listen("tcp://" + replayAddr); err != nil {
			p.Close()
			t.Fatalf("kvtest: listen replay: %v", err)
		}
		p.Replay = "tcp://" + p.router.Addr().String()
		go p.serveReplay()
	}
	t.Cleanup(p.Close)
	return p
}

// Addr is the PUB socket's host:port.
func (p *Publisher) Addr() string { return p.pub.Addr().String() }

// Close closes both sockets and their connections.
func (p *Publisher) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	p.mu.Unlock()
	p.cancel()
	p.pub.Close()
	if p.router != nil {
		p.router.Close()
	}
}

func seqBytes(s int64) []byte { return binary.BigEndian.AppendUint64(nil, uint64(s)) }

// Publish numbers payload, keeps it for replay and, if live, sends it (a
// batch not sent live is one the subscriber missed). It returns its
// sequence number.
func (p *Publisher) Publish(payload []byte, live bool) int64 {
	p.mu.Lock()
	s := p.seq
	p.seq++
	p.buf = append(p.buf, payload)
	p.mu.Unlock()
	if live {
		if err := p.pub.Send(zmq4.NewMsgFrom([]byte{}, seqBytes(s), payload)); err != nil {
			p.t.Errorf("kvtest: send: %v", err)
		}
	}
	return s
}

func (p *Publisher) serveReplay() {
	for {
		m, err := p.router.Recv()
		if err != nil {
			return
		}
		if len(m.Frames) != 3 || len(m.Frames[2]) != 8 {
			continue
		}
		id, start := m.Frames[0], int64(binary.BigEndian.Uint64(m.Frames[2]))
		p.mu.Lock()
		buf := append([][]byte(nil), p.buf...)
		p.mu.Unlock()
		for s := max(start, 0); s < int64(len(buf)); s++ {
			_ = p.router.Send(zmq4.NewMsgFrom(id, []byte{}, []byte{}, seqBytes(s), buf[s]))
		}
		_ = p.router.Send(zmq4.NewMsgFrom(id, []byte{}, []byte{}, seqBytes(-1), []byte{}))
	}
}

// WaitSubscribed waits until a subscriber's subscription has reached the
// publisher.
func (p *Publisher) WaitSubscribed() {
	p.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for len(p.pub.(zmq4.Topics).Topics()) == 0 {
		if time.Now().After(deadline) {
			p.t.Fatal("kvtest: no subscriber within 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Batch is the payload of events, [ts, [event, ...], dp_rank], as vLLM's
// publisher encodes it.
func Batch(dpRank int, events ...map[string]any) []byte {
	evs := make([]any, len(events))
	for i, e := range events {
		evs[i] = e
	}
	b, err := msgpack.Marshal([]any{float64(time.Now().UnixNano()) / 1e9, evs, dpRank})
	if err != nil {
		panic(err)
	}
	return b
}

// Stored is vLLM's BlockStored of hashes on medium ("" for none).
func Stored(medium string, hashes ...uint64) map[string]any {
	e := map[string]any{"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": nil,
		"token_ids": []int{}, "block_size": 16, "lora_id": nil, "lora_name": nil, "medium": nil}
	if medium != "" {
		e["medium"] = medium
	}
	return e
}

// Removed is vLLM's BlockRemoved of hashes on medium ("" for none).
func Removed(medium string, hashes ...uint64) map[string]any {
	e := map[string]any{"type": "BlockRemoved", "block_hashes": hashes, "medium": nil}
	if medium != "" {
		e["medium"] = medium
	}
	return e
}

// Cleared is vLLM's AllBlocksCleared.
func Cleared() map[string]any { return map[string]any{"type": "AllBlocksCleared"} }

// IgnoreLeaks is for goleak.VerifyTestMain in packages whose tests use a
// Publisher: go-zeromq leaves a writer goroutine behind per closed PUB
// socket.
func IgnoreLeaks() goleak.Option {
	return goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run")
}
