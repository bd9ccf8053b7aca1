package master

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/mooncake-go/mooncake/internal/blockkey"
)

// KV events: the leader publishes every change of what the store holds on
// a ZMQ PUB socket, as official mooncake_master --enable_kv_events does, so
// cache-aware routers and indexers (the Conductor, official Mooncake's,
// Dynamo-style ones) follow the store without a gRPC client. One event per
// object key and medium: "stored" when a put (or upsert) ends or a copy
// lands on a medium that had none, "removed" when the last replica on a
// medium goes (remove, remove_all, regex removal, eviction, a segment
// lost). The wire format is docs/kv-events.md; decoders follow it.
//
// Publishing never slows a request: the service hands events to a bounded
// queue without waiting (a full queue drops the event and counts it), and
// one goroutine encodes, numbers and sends them, keeping the last Buffer
// messages for the replay socket.

// KV events defaults.
const (
	// DefaultKVEventsBind is the PUB endpoint. Official mooncake_master has
	// no default (its flag is required once enabled); its documentation's
	// examples, and Dynamo's default, bind port 5557.
	DefaultKVEventsBind = "tcp://*:5557"
	// DefaultKVEventsBuffer is the number of messages kept for replay.
	DefaultKVEventsBuffer = 10000
	// DefaultKVEventsQueue is the number of events that may wait for the
	// sender before new ones are dropped.
	DefaultKVEventsQueue = 1 << 16
)

// kvBatchMax bounds the events in one message, as official Mooncake's.
const kvBatchMax = 64

// KVEventsConfig configures the KV events publisher (ServerConfig.KVEvents).
type KVEventsConfig struct {
	// Bind is the ZMQ PUB endpoint ("tcp://host:port"; "*" for every
	// address, port 0 for a free one). Zero: DefaultKVEventsBind.
	Bind string
	// Replay, when set, is a ZMQ ROUTER endpoint that answers replay
	// requests from the buffered messages. Zero: none.
	Replay string
	// BackendID names the cache owner in every event ("backend_id"). Zero:
	// the master's advertised address.
	BackendID string
	// ModelName and BlockSize are copied into every event; zero means
	// unknown ("" and 0).
	ModelName string
	BlockSize int
	// Topic is the first frame of every message. Zero: "" (subscribers
	// subscribed to "" get everything).
	Topic string
	// Buffer is the number of messages kept for replay. Zero:
	// DefaultKVEventsBuffer.
	Buffer int
	// Queue is the number of events that may wait for the sender. Zero:
	// DefaultKVEventsQueue.
	Queue int
	// MaxSubscribers is the most connections the PUB socket, and the replay
	// socket, each serve at once (kvlimit.go); more are closed as they are
	// accepted. Zero: DefaultKVEventsMaxSubscribers.
	MaxSubscribers int
}

// Validate reports the first field that is out of range, by name.
func (c KVEventsConfig) Validate() error {
	for _, ep := range []struct{ name, v string }{{"Bind", c.Bind}, {"Replay", c.Replay}} {
		if ep.v != "" && !strings.Contains(ep.v, "://") {
			return fmt.Errorf("master: KVEventsConfig.%s %q is no ZMQ endpoint (tcp://host:port)", ep.name, ep.v)
		}
	}
	switch {
	case c.BlockSize < 0:
		return fmt.Errorf("master: KVEventsConfig.BlockSize is negative (%d)", c.BlockSize)
	case c.Buffer < 0:
		return fmt.Errorf("master: KVEventsConfig.Buffer is negative (%d)", c.Buffer)
	case c.Queue < 0:
		return fmt.Errorf("master: KVEventsConfig.Queue is negative (%d)", c.Queue)
	case c.MaxSubscribers < 0:
		return fmt.Errorf("master: KVEventsConfig.MaxSubscribers is negative (%d)", c.MaxSubscribers)
	}
	return nil
}

func (c KVEventsConfig) withDefaults() KVEventsConfig {
	if c.Bind == "" {
		c.Bind = DefaultKVEventsBind
	}
	if c.Buffer == 0 {
		c.Buffer = DefaultKVEventsBuffer
	}
	if c.Queue == 0 {
		c.Queue = DefaultKVEventsQueue
	}
	if c.MaxSubscribers == 0 {
		c.MaxSubscribers = DefaultKVEventsMaxSubscribers
	}
	return c
}

// kvMedia is a set of media an object is readable from.
type kvMedia uint8

const (
	kvCPU  kvMedia = 1 << iota // a DRAM replica
	kvDisk                     // an SSD tier replica
)

func (m kvMedia) String() string {
	if m == kvDisk {
		return "disk"
	}
	return "cpu"
}

func mediaOf(reps []replica) kvMedia {
	var m kvMedia
	for _, r := range reps {
		if r.onDisk() {
			m |= kvDisk
		} else {
			m |= kvCPU
		}
	}
	return m
}

// kvEvent is one change waiting for the sender.
type kvEvent struct {
	removed bool
	medium  kvMedia // one medium
	key     string
	at      int64 // ms since the epoch
}

// kvMessage is a sent message, kept for replay.
type kvMessage struct {
	seq     uint64
	payload []byte
}

// kvPublisher owns the PUB (and replay ROUTER) sockets and the goroutines
// that feed them.
type kvPublisher struct {
	cfg       KVEventsConfig
	backendID string
	log       *slog.Logger
	pub       zmq4.Socket
	router    zmq4.Socket // nil without a replay endpoint
	pubLim    *kvConnLimit
	replayLim *kvConnLimit // nil without a replay endpoint

	queue chan kvEvent
	// hold is taken by the sender around each message; tests hold it to
	// stop the sender and fill the queue.
	hold                        sync.Mutex
	published, dropped, batches atomic.Uint64
	// lost is set by a drop; the next message skips a sequence number so
	// subscribers see the gap.
	lost atomic.Bool

	// The sender's state.
	seq     uint64
	eventID uint64
	batch   []kvEvent
	enc     *msgpack.Encoder
	buf     bytes.Buffer

	// ring holds the last cfg.Buffer messages, oldest at ring[head].
	mu   sync.Mutex
	ring []kvMessage
	head int

	cancel context.CancelFunc
	done   chan struct{}
	wg     sync.WaitGroup
	once   sync.Once
}

// startKVPublisher binds the sockets and starts the sender and the replay
// server. backendID replaces a zero cfg.BackendID.
func startKVPublisher(cfg KVEventsConfig, backendID string, log *slog.Logger) (*kvPublisher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if cfg.BackendID != "" {
		backendID = cfg.BackendID
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &kvPublisher{cfg: cfg, backendID: backendID, log: log, queue: make(chan kvEvent, cfg.Queue),
		batch: make([]kvEvent, 0, kvBatchMax), cancel: cancel, done: make(chan struct{})}
	p.enc = msgpack.NewEncoder(&p.buf)
	p.enc.UseCompactInts(true)
	p.pubLim = &kvConnLimit{max: cfg.MaxSubscribers, log: log.With("socket", "kv_events pub")}
	p.pub = zmq4.NewPub(kvContext(ctx, p.pubLim))
	// zmq4 queues a PUB's messages without bound by default: bound them by
	// the replay buffer (a subscriber further behind replays).
	if err := p.pub.SetOption(zmq4.OptionHWM, cfg.Buffer); err != nil {
		cancel()
		_ = p.pub.Close()
		return nil, fmt.Errorf("master: kv events PUB high-water mark: %w", err)
	}
	if err := kvListen(p.pub, cfg.Bind); err != nil {
		cancel()
		_ = p.pub.Close()
		return nil, &ListenError{Listener: "kv_events", Addr: cfg.Bind, Err: err}
	}
	if cfg.Replay != "" {
		p.replayLim = &kvConnLimit{max: cfg.MaxSubscribers, log: log.With("socket", "kv_events replay")}
		p.router = zmq4.NewRouter(kvContext(ctx, p.replayLim))
		if err := kvListen(p.router, cfg.Replay); err != nil {
			cancel()
			_ = p.pub.Close()
			_ = p.router.Close()
			return nil, &ListenError{Listener: "kv_events_replay", Addr: cfg.Replay, Err: err}
		}
		p.wg.Go(p.serveReplay)
	}
	p.wg.Go(p.run)
	return p, nil
}

// endpoint is the endpoint s is bound to, its port resolved.
func endpoint(s zmq4.Socket) string {
	if s == nil || s.Addr() == nil {
		return ""
	}
	return s.Addr().Network() + "://" + s.Addr().String()
}

// close stops the goroutines and closes the sockets. Events still queued
// are not sent. It is idempotent.
func (p *kvPublisher) close() {
	p.once.Do(func() {
		close(p.done)
		p.cancel() // unblocks the replay server's Recv
		if p.router != nil {
			// Closed before the wait: it cuts a reply stuck writing to a
			// peer that stopped reading.
			_ = p.router.Close()
		}
		p.wg.Wait()
		_ = p.pub.Close() // after the sender, its only user
	})
}

// publish queues ev without waiting: a full queue drops it.
func (p *kvPublisher) publish(ev kvEvent) {
	select {
	case p.queue <- ev:
	default:
		p.dropped.Add(1)
		p.lost.Store(true)
	}
}

// run is the sender: it takes the queued events in batches of up to
// kvBatchMax and sends each batch as one message.
func (p *kvPublisher) run() {
	for {
		select {
		case <-p.done:
			return
		case ev := <-p.queue:
			p.hold.Lock()
			p.batch = append(p.batch[:0], ev)
		more:
			for len(p.batch) < kvBatchMax {
				select {
				case ev := <-p.queue:
					p.batch = append(p.batch, ev)
				default:
					break more
				}
			}
			p.send(p.batch)
			p.hold.Unlock()
		}
	}
}

// send encodes batch as one message, sends it and keeps it for replay.
func (p *kvPublisher) send(batch []kvEvent) {
	if p.lost.Swap(false) {
		p.seq++ // the gap tells subscribers that events were dropped
	}
	p.buf.Reset()
	if err := p.encode(batch); err != nil {
		// Only a bug gets here: the values are strings and numbers.
		p.log.Error("master: kv events: encoding failed", "err", err)
		p.dropped.Add(uint64(len(batch)))
		return
	}
	m := kvMessage{seq: p.seq, payload: bytes.Clone(p.buf.Bytes())}
	p.seq++
	// Kept and counted before it is sent: whatever a subscriber has
	// received, a replay can give and the counter includes. (zmq4's PUB
	// only queues the message; its writer sends it.)
	p.keep(m)
	p.published.Add(uint64(len(batch)))
	p.batches.Add(1)
	if err := p.pub.SendMulti(zmq4.NewMsgFrom([]byte(p.cfg.Topic), seqFrame(m.seq), m.payload)); err != nil {
		p.log.Warn("master: kv events: send failed", "seq", m.seq, "err", err)
	}
}

func seqFrame(seq uint64) []byte { return binary.BigEndian.AppendUint64(nil, seq) }

// keep adds m to the replay ring, replacing the oldest once it is full.
func (p *kvPublisher) keep(m kvMessage) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.ring) < p.cfg.Buffer {
		p.ring = append(p.ring, m)
		return
	}
	p.ring[p.head] = m
	p.head = (p.head + 1) % len(p.ring)
}

// since returns the kept messages numbered from or after start, in order.
func (p *kvPublisher) since(start uint64) []kvMessage {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []kvMessage
	for i := range p.ring {
		if m := p.ring[(p.head+i)%len(p.ring)]; m.seq >= start {
			out = append(out, m)
		}
	}
	return out
}

// encode writes the payload of batch: [timestamp, [event, ...], dp_rank].
func (p *kvPublisher) encode(batch []kvEvent) error {
	e := p.enc
	err := errors.Join(e.EncodeArrayLen(3), e.EncodeFloat64(float64(time.Now().UnixMicro())/1e6),
		e.EncodeArrayLen(len(batch)))
	for _, ev := range batch {
		p.eventID++
		err = errors.Join(err, p.encodeEvent(ev))
	}
	return errors.Join(err, e.EncodeInt(0))
}

// encodeEvent writes one event map (docs/kv-events.md).
func (p *kvPublisher) encodeEvent(ev kvEvent) error {
	e := p.enc
	tenant, key := splitKey(ev.key) // the object's tenant and its client's key
	h, isBlock := blockkey.SeqHash(key)
	kind, compat := "stored", "BlockStored"
	n := 18 // fields of a stored event: 15 common, 3 of its own
	if ev.removed {
		kind, compat, n = "removed", "BlockRemoved", 15
	}
	str := func(k, v string) error { return errors.Join(e.EncodeString(k), e.EncodeString(v)) }
	hashes := func(k string) error {
		if !isBlock {
			return errors.Join(e.EncodeString(k), e.EncodeArrayLen(0))
		}
		return errors.Join(e.EncodeString(k), e.EncodeArrayLen(1), e.EncodeUint(h))
	}
	err := errors.Join(e.EncodeMapLen(n),
		e.EncodeString("event_id"), e.EncodeUint(p.eventID),
		e.EncodeString("timestamp"), e.EncodeInt(ev.at),
		str("event_type", kind),
		str("model_name", p.cfg.ModelName),
		e.EncodeString("block_size"), e.EncodeInt(int64(p.cfg.BlockSize)),
		str("additional_salt", ""),
		str("lora_name", ""),
		str("tenant_id", tenant),
		str("backend_id", p.backendID),
		str("medium", ev.medium.String()),
		e.EncodeString("dp_rank"), e.EncodeInt(0),
		hashes("seq_hashes"),
		str("object_key", key),
		str("type", compat),
		hashes("block_hashes"))
	if !ev.removed {
		err = errors.Join(err,
			e.EncodeString("base_block_idx"), e.EncodeInt(0),
			e.EncodeString("parent_hash"), e.EncodeNil(),
			e.EncodeString("token_ids"), e.EncodeNil())
	}
	return err
}

// kvReplayEnd is the sequence frame of the replay's end marker: -1.
var kvReplayEnd = seqFrame(^uint64(0))

// serveReplay answers replay requests on the ROUTER socket: a request
// [identity, empty, start seq] gets [identity, empty, topic, seq, payload]
// for every kept message from start on, then the end marker [identity,
// empty, empty, -1, empty].
func (p *kvPublisher) serveReplay() {
	for {
		msg, err := p.router.Recv()
		if err != nil {
			select {
			case <-p.done:
				return
			default:
				continue // a peer's broken message
			}
		}
		if len(msg.Frames) < 2 {
			continue
		}
		id, start := msg.Frames[0], msg.Frames[len(msg.Frames)-1]
		if len(start) != 8 {
			p.log.Warn("master: kv events: replay request without an 8-byte sequence number", "frames", len(msg.Frames))
			continue
		}
		for _, m := range p.since(binary.BigEndian.Uint64(start)) {
			if err := p.router.SendMulti(zmq4.NewMsgFrom(id, nil, []byte(p.cfg.Topic), seqFrame(m.seq), m.payload)); err != nil {
				break
			}
		}
		_ = p.router.SendMulti(zmq4.NewMsgFrom(id, nil, nil, kvReplayEnd, nil))
	}
}

// kvStatus is official mooncake_master's GET /kv_events/status answer.
type kvStatus struct {
	Enabled          bool   `json:"enabled"`
	PublishedBatches uint64 `json:"published_batches"`
	PublishedEvents  uint64 `json:"published_events"`
	DroppedEvents    uint64 `json:"dropped_events"`
	// SkippedUnparsedKeys counts what official's publisher skips without
	// an object key; this one publishes every key: always 0.
	SkippedUnparsedKeys uint64 `json:"skipped_unparsed_keys"`
}

// status reports p's counters; a nil p (no KV events) is disabled.
func (p *kvPublisher) status() kvStatus {
	if p == nil {
		return kvStatus{}
	}
	return kvStatus{Enabled: true, PublishedBatches: p.batches.Load(), PublishedEvents: p.published.Load(),
		DroppedEvents: p.dropped.Load()}
}

// kvMediaOf is mediaOf(reps) while the service publishes KV events, and
// nothing otherwise: the hooks cost one atomic load without a publisher.
func (s *Service) kvMediaOf(reps []replica) kvMedia {
	if s.kv.Load() == nil {
		return 0
	}
	return mediaOf(reps)
}

// kvChange publishes a change of the media key is readable from: removed
// for each medium before has and after lacks, then stored for each medium
// after gains, or, when refresh (a put ended), for every medium after has.
// The key's shard lock is held, which orders a key's events.
func (s *Service) kvChange(key string, before, after kvMedia, refresh bool) {
	p := s.kv.Load()
	if p == nil {
		return
	}
	at := time.Now().UnixMilli()
	for _, m := range []kvMedia{kvCPU, kvDisk} {
		if before&m != 0 && after&m == 0 {
			p.publish(kvEvent{removed: true, medium: m, key: key, at: at})
		}
	}
	stored := after &^ before
	if refresh {
		stored = after
	}
	for _, m := range []kvMedia{kvCPU, kvDisk} {
		if stored&m != 0 {
			p.publish(kvEvent{medium: m, key: key, at: at})
		}
	}
}
