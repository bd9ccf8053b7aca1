package master

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/mooncake-go/mooncake/internal/etcdtest"
	"github.com/mooncake-go/mooncake/store/ha"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// kvTestEvent is an event as docs/kv-events.md describes it.
type kvTestEvent struct {
	EventID        uint64   `msgpack:"event_id"`
	Timestamp      int64    `msgpack:"timestamp"`
	EventType      string   `msgpack:"event_type"`
	ModelName      string   `msgpack:"model_name"`
	BlockSize      int      `msgpack:"block_size"`
	AdditionalSalt string   `msgpack:"additional_salt"`
	LoraName       string   `msgpack:"lora_name"`
	TenantID       string   `msgpack:"tenant_id"`
	BackendID      string   `msgpack:"backend_id"`
	Medium         string   `msgpack:"medium"`
	DPRank         int      `msgpack:"dp_rank"`
	SeqHashes      []uint64 `msgpack:"seq_hashes"`
	ObjectKey      string   `msgpack:"object_key"`
	Type           string   `msgpack:"type"`
	BlockHashes    []uint64 `msgpack:"block_hashes"`
	BaseBlockIdx   *int     `msgpack:"base_block_idx"`
	ParentHash     any      `msgpack:"parent_hash"`
	TokenIDs       any      `msgpack:"token_ids"`
	fields         []string // the map's keys, sorted
}

// kvTestMsg is one received message, decoded.
type kvTestMsg struct {
	topic   string
	seq     uint64
	payload []byte
	ts      float64
	events  []kvTestEvent
	dpRank  int
}

func decodeKVMsg(t *testing.T, frames [][]byte) kvTestMsg {
	t.Helper()
	require.Len(t, frames, 3, "frames: topic, sequence, payload")
	require.Len(t, frames[1], 8, "the sequence frame is 8 bytes")
	m := kvTestMsg{topic: string(frames[0]), seq: binary.BigEndian.Uint64(frames[1]), payload: frames[2]}
	var raw []msgpack.RawMessage
	require.NoError(t, msgpack.Unmarshal(m.payload, &raw))
	require.Len(t, raw, 3, "payload: [timestamp, events, dp_rank]")
	require.NoError(t, msgpack.Unmarshal(raw[0], &m.ts))
	require.NoError(t, msgpack.Unmarshal(raw[2], &m.dpRank))
	var evs []map[string]msgpack.RawMessage
	require.NoError(t, msgpack.Unmarshal(raw[1], &evs))
	for _, fields := range evs {
		var ev kvTestEvent
		b, err := msgpack.Marshal(fields)
		require.NoError(t, err)
		require.NoError(t, msgpack.Unmarshal(b, &ev))
		for k := range fields {
			ev.fields = append(ev.fields, k)
		}
		slices.Sort(ev.fields)
		m.events = append(m.events, ev)
	}
	return m
}

// kvSub is a ZMQ SUB socket on a master's KV events.
type kvSub struct {
	t    *testing.T
	sock zmq4.Socket
	msgs chan zmq4.Msg
}

// subscribeKV connects a SUB to m's KV events with subscription topic and
// returns once the publisher has seen the subscription (wantTopics lists
// every subscription the publisher then knows of).
func subscribeKV(t *testing.T, m *Server, topic string, wantTopics ...string) *kvSub {
	t.Helper()
	sock := zmq4.NewSub(context.Background())
	s := &kvSub{t: t, sock: sock, msgs: make(chan zmq4.Msg, 1024)}
	done := make(chan struct{})
	t.Cleanup(func() {
		_ = sock.Close()
		<-done
	})
	require.NoError(t, sock.Dial(loopback(m.KVEventsAddr())))
	require.NoError(t, sock.SetOption(zmq4.OptionSubscribe, topic))
	go func() {
		defer close(done)
		for {
			msg, err := sock.Recv()
			if err != nil {
				return
			}
			s.msgs <- msg
		}
	}()
	// A PUB drops what it publishes before a subscription reaches it.
	require.Eventually(t, func() bool {
		return slices.Equal(m.kv.pub.(zmq4.Topics).Topics(), wantTopics)
	}, 10*time.Second, time.Millisecond, "the publisher never saw the subscription")
	return s
}

// loopback dials a wildcard-bound endpoint on 127.0.0.1.
func loopback(ep string) string {
	return strings.Replace(strings.Replace(ep, "0.0.0.0", "127.0.0.1", 1), "[::]", "127.0.0.1", 1)
}

func (s *kvSub) next() kvTestMsg {
	s.t.Helper()
	select {
	case msg := <-s.msgs:
		return decodeKVMsg(s.t, msg.Frames)
	case <-time.After(10 * time.Second):
		s.t.Fatal("no KV events message within 10s")
		return kvTestMsg{}
	}
}

// events receives messages until it has n events; it returns them and the
// messages' sequence numbers.
func (s *kvSub) events(n int) ([]kvTestEvent, []uint64) {
	s.t.Helper()
	var evs []kvTestEvent
	var seqs []uint64
	for len(evs) < n {
		m := s.next()
		seqs = append(seqs, m.seq)
		evs = append(evs, m.events...)
	}
	require.Len(s.t, evs, n, "more events than expected")
	return evs, seqs
}

// zmqPubWriter is the goroutine zmq4 starts for every PUB socket and never
// stops (its Close skips the writer): one per publisher closed, which
// leak checks must let pass.
var zmqPubWriter = goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run")

// startKVMaster starts a master on loopback with KV events (free ports).
func startKVMaster(t *testing.T, kv KVEventsConfig) (*Server, *Service) {
	return startKVMasterWith(t, ServiceConfig{Shards: 8}, kv)
}

func startKVMasterWith(t *testing.T, svc ServiceConfig, kv KVEventsConfig) (*Server, *Service) {
	t.Helper()
	// Registered first, so it runs after the other cleanups: the sender,
	// the replay server and the subscribers' readers are gone.
	t.Cleanup(func() { goleak.VerifyNone(t, zmqPubWriter) })
	kv.Bind = "tcp://127.0.0.1:0"
	m, _ := startAdminMaster(t, ServerConfig{Service: svc, KVEvents: &kv})
	require.NotNil(t, m.Service())
	return m, m.Service()
}

var (
	kvStoredFields  = []string{"additional_salt", "backend_id", "base_block_idx", "block_hashes", "block_size", "dp_rank", "event_id", "event_type", "lora_name", "medium", "model_name", "object_key", "parent_hash", "seq_hashes", "tenant_id", "timestamp", "token_ids", "type"}
	kvRemovedFields = []string{"additional_salt", "backend_id", "block_hashes", "block_size", "dp_rank", "event_id", "event_type", "lora_name", "medium", "model_name", "object_key", "seq_hashes", "tenant_id", "timestamp", "type"}
)

// Puts and removals publish stored and removed events with the format of
// docs/kv-events.md: the key's block as seq_hash (none for a key that
// names no block), the envelope from the config, sequence numbers from 0
// and event ids from 1 with no gap.
func TestKVEventsPutRemove(t *testing.T) {
	m, svc := startKVMaster(t, KVEventsConfig{BackendID: "pool-a", ModelName: "llama", BlockSize: 16})
	sub := subscribeKV(t, m, "", "")
	require.NoError(t, svc.MountSegment(t.Context(), "c1", seg("1", 0x10000000, 1<<20)))

	start := time.Now().UnixMilli()
	keys := []struct {
		key    string
		hashes []uint64
	}{
		{"llama@0@00000000000000ff", []uint64{255}}, // BlockKey's form
		{"trace@blk-42", []uint64{42}},              // the trace replay's
		{"12345", []uint64{12345}},                  // official: decimal
		{"0xABCDEF", []uint64{0xabcdef}},            // official: 0x hex
		{"config.json", []uint64{}},                 // no block
	}
	for _, k := range keys {
		put(t, svc, "c1", k.key, 64, nil)
	}
	require.NoError(t, svc.Remove(t.Context(), "llama@0@00000000000000ff", true))
	require.NoError(t, svc.Remove(t.Context(), "config.json", true))
	assert.Equal(t, 1, must(svc.RemoveByRegex(t.Context(), "^trace@", true)))
	assert.Equal(t, 2, svc.RemoveAll(t.Context(), true))

	evs, seqs := sub.events(len(keys) * 2)
	for i, s := range seqs {
		assert.Equal(t, uint64(i), s, "sequence numbers run from 0 without a gap")
	}
	removed := []string{"llama@0@00000000000000ff", "config.json", "trace@blk-42"}
	for i, ev := range evs {
		assert.Equal(t, uint64(i+1), ev.EventID, "event ids run from 1")
		assert.GreaterOrEqual(t, ev.Timestamp, start)
		assert.LessOrEqual(t, ev.Timestamp, time.Now().UnixMilli())
		assert.Equal(t, "llama", ev.ModelName)
		assert.Equal(t, 16, ev.BlockSize)
		assert.Equal(t, "pool-a", ev.BackendID)
		assert.Equal(t, "default", ev.TenantID)
		assert.Equal(t, "cpu", ev.Medium)
		assert.Empty(t, ev.AdditionalSalt)
		assert.Empty(t, ev.LoraName)
		assert.Zero(t, ev.DPRank)
		assert.Equal(t, ev.SeqHashes, ev.BlockHashes)
		if i < len(keys) {
			assert.Equal(t, keys[i].key, ev.ObjectKey)
			assert.Equal(t, keys[i].hashes, ev.SeqHashes, ev.ObjectKey)
			assert.Equal(t, "stored", ev.EventType)
			assert.Equal(t, "BlockStored", ev.Type)
			assert.Equal(t, kvStoredFields, ev.fields)
			require.NotNil(t, ev.BaseBlockIdx)
			assert.Zero(t, *ev.BaseBlockIdx)
			assert.Nil(t, ev.ParentHash)
			assert.Nil(t, ev.TokenIDs)
			continue
		}
		assert.Equal(t, "removed", ev.EventType)
		assert.Equal(t, "BlockRemoved", ev.Type)
		assert.Equal(t, kvRemovedFields, ev.fields)
		if j := i - len(keys); j < len(removed) {
			assert.Equal(t, removed[j], ev.ObjectKey)
		}
	}
	// RemoveAll publishes one removed per key, in shard order.
	var last []string
	for _, ev := range evs[len(evs)-2:] {
		last = append(last, ev.ObjectKey)
	}
	assert.ElementsMatch(t, []string{"12345", "0xABCDEF"}, last)
	assert.Equal(t, uint64(len(evs)), m.kv.published.Load())
	assert.Zero(t, m.kv.dropped.Load())
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// A put into a full pool evicts: every evicted key is published removed.
func TestKVEventsEviction(t *testing.T) {
	// A watermark of 1 keeps the background loop from evicting while the
	// pool fills: only the put that finds it full evicts (5%).
	m, svc := startKVMasterWith(t, ServiceConfig{Shards: 8, EvictionHighWatermark: 1}, KVEventsConfig{})
	sub := subscribeKV(t, m, "", "")
	require.NoError(t, svc.MountSegment(t.Context(), "c1", seg("1", 0x10000000, 100*1024)))
	for i := range 100 {
		put(t, svc, "c1", fmt.Sprintf("k%d", i), 1024, nil)
	}
	put(t, svc, "c1", "next", 1024, nil) // the pool is full: evicts first
	evicted := int(svc.Stats().EvictedKeys)
	require.Positive(t, evicted)

	evs, _ := sub.events(100 + evicted + 1)
	var gone []string
	for _, ev := range evs[100 : 100+evicted] {
		assert.Equal(t, "removed", ev.EventType)
		gone = append(gone, ev.ObjectKey)
	}
	assert.Equal(t, "stored", evs[len(evs)-1].EventType)
	assert.Equal(t, "next", evs[len(evs)-1].ObjectKey)
	for _, k := range gone {
		_, _, _, _, err := svc.GetReplicaList(k)
		assert.ErrorIs(t, err, storepb.ErrObjectNotFound, "%s published removed but readable", k)
	}
	assert.Equal(t, 100+1-evicted, svc.Stats().Keys)
	// The advertised address names the backend without a BackendID.
	assert.Equal(t, m.Addr(), evs[0].BackendID)
}

// The medium follows the object's copies: stored cpu at the put, stored
// disk when its SSD copy lands, removed cpu when eviction drops the DRAM
// copy, removed disk when the object goes.
func TestKVEventsMedia(t *testing.T) {
	m, svc := startKVMaster(t, KVEventsConfig{})
	sub := subscribeKV(t, m, "", "")
	require.NoError(t, svc.MountSegment(t.Context(), "a", seg("1", 1<<20, 1<<20)))
	disk := seg("2", 32<<20, 4<<20)
	disk.Medium = storepb.Medium_MEDIUM_DISK
	require.NoError(t, svc.MountSegment(t.Context(), "a", disk))

	put(t, svc, "a", "k", 4096, nil)
	tasks := svc.takeTasks(t.Context(), "a")
	require.Len(t, tasks, 1, "the put queues an offload")
	require.NoError(t, svc.MoveEnd(t.Context(), "a", tasks[0].Id, true))
	sh := svc.shardOf("k")
	sh.mu.Lock()
	svc.evictLocked(sh, "k", sh.objects["k"], true)
	sh.mu.Unlock()
	require.NoError(t, svc.Remove(t.Context(), "k", true))

	evs, _ := sub.events(4)
	var got []string
	for _, ev := range evs {
		got = append(got, ev.EventType+" "+ev.Medium)
	}
	assert.Equal(t, []string{"stored cpu", "stored disk", "removed cpu", "removed disk"}, got)
}

// replayKV asks m's replay socket for the messages from start on and
// returns them and whether the end marker came.
func replayKV(t *testing.T, m *Server, start uint64) []kvTestMsg {
	t.Helper()
	d := zmq4.NewDealer(context.Background())
	defer d.Close()
	require.NoError(t, d.Dial(loopback(m.KVEventsReplayAddr())))
	require.NoError(t, d.Send(zmq4.NewMsgFrom(nil, binary.BigEndian.AppendUint64(nil, start))))
	var out []kvTestMsg
	for {
		msg, err := recvTimeout(t, d)
		require.NoError(t, err)
		require.Len(t, msg.Frames, 4, "[empty, topic, seq, payload] or the end marker")
		require.Empty(t, msg.Frames[0], "the empty delimiter")
		if binary.BigEndian.Uint64(msg.Frames[2]) == 1<<64-1 {
			assert.Empty(t, msg.Frames[1], "end marker: empty topic")
			assert.Empty(t, msg.Frames[3], "end marker: empty payload")
			return out
		}
		out = append(out, decodeKVMsg(t, msg.Frames[1:4]))
	}
}

func recvTimeout(t *testing.T, s zmq4.Socket) (zmq4.Msg, error) {
	t.Helper()
	type res struct {
		m   zmq4.Msg
		err error
	}
	ch := make(chan res, 1)
	go func() {
		m, err := s.Recv()
		ch <- res{m, err}
	}()
	select {
	case r := <-ch:
		return r.m, r.err
	case <-time.After(10 * time.Second):
		t.Fatal("no replay answer within 10s")
		return zmq4.Msg{}, nil
	}
}

// A subscriber that joins late gets the messages it missed from the replay
// socket: exactly the buffered ones from the asked sequence number on,
// byte for byte as published, then the end marker; the buffer keeps only
// the last Buffer messages.
func TestKVEventsReplay(t *testing.T) {
	m, svc := startKVMaster(t, KVEventsConfig{Replay: "tcp://127.0.0.1:0", Topic: "kv", Buffer: 4})
	early := subscribeKV(t, m, "", "")
	require.NoError(t, svc.MountSegment(t.Context(), "c1", seg("1", 0x10000000, 1<<20)))
	var all []kvTestMsg
	for i := range 3 {
		put(t, svc, "c1", fmt.Sprint(i), 64, nil)
		all = append(all, early.next()) // one message per put: none waits to be batched
	}
	late := subscribeKV(t, m, "kv", "", "kv")
	for i := range 3 {
		put(t, svc, "c1", fmt.Sprint(3+i), 64, nil)
		all = append(all, early.next())
		got := late.next()
		assert.Equal(t, all[len(all)-1], got, "both subscribers get the same message")
	}
	for i, msg := range all {
		assert.Equal(t, "kv", msg.topic)
		assert.Equal(t, uint64(i), msg.seq)
	}

	// The late subscriber missed 0..2; the buffer keeps 2..5.
	assert.Equal(t, all[2:], replayKV(t, m, 0), "from 0: what the buffer holds")
	assert.Equal(t, all[3:], replayKV(t, m, 3))
	assert.Empty(t, replayKV(t, m, 6), "nothing published from 6 on: just the end marker")
}

// A full queue drops events and counts them, and the puts that made them
// do not wait: with the sender held, a queue of two takes two events (the
// sender may hold a third), and the next message skips a sequence number
// so subscribers see the loss.
func TestKVEventsQueueFull(t *testing.T) {
	m, svc := startKVMaster(t, KVEventsConfig{Queue: 2})
	sub := subscribeKV(t, m, "", "")
	require.NoError(t, svc.MountSegment(t.Context(), "c1", seg("1", 0x10000000, 1<<20)))

	m.kv.hold.Lock()
	const n = 10
	for i := range n {
		put(t, svc, "c1", fmt.Sprint(i), 64, nil) // would hang here if publishing blocked
	}
	dropped := m.kv.dropped.Load()
	assert.Contains(t, []uint64{n - 2, n - 3}, dropped)
	m.kv.hold.Unlock()

	evs, seqs := sub.events(n - int(dropped))
	assert.Equal(t, uint64(1), seqs[0], "sequence number 0 is skipped: events were lost before it")
	for i := 1; i < len(seqs); i++ {
		assert.Equal(t, seqs[i-1]+1, seqs[i])
	}
	for i, ev := range evs {
		assert.Equal(t, uint64(i+1), ev.EventID)
	}
	assert.Equal(t, uint64(len(evs)), m.kv.published.Load())
	metrics := adminDo(t, m, "GET", "/metrics").body
	assert.Contains(t, metrics, fmt.Sprintf("mooncake_master_kv_events_dropped_total %d\n", dropped))
	assert.Contains(t, metrics, fmt.Sprintf("mooncake_master_kv_events_published_total %d\n", len(evs)))
	// Official mooncake_master's status endpoint, on the admin port.
	st := adminDo(t, m, "GET", "/kv_events/status")
	assert.Equal(t, 200, st.code)
	assert.JSONEq(t, fmt.Sprintf(`{"enabled":true,"published_batches":%d,"published_events":%d,"dropped_events":%d,"skipped_unparsed_keys":0}`,
		len(seqs), len(evs), dropped), st.body)
	plain, _ := startAdminMaster(t, ServerConfig{})
	assert.JSONEq(t, `{"enabled":false,"published_batches":0,"published_events":0,"dropped_events":0,"skipped_unparsed_keys":0}`,
		adminDo(t, plain, "GET", "/kv_events/status").body)
}

// Bad configurations are refused by field.
func TestKVEventsConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		cfg   KVEventsConfig
		field string
	}{
		{KVEventsConfig{}, ""},
		{KVEventsConfig{Bind: "127.0.0.1:5557"}, "Bind"},
		{KVEventsConfig{Replay: "localhost"}, "Replay"},
		{KVEventsConfig{BlockSize: -1}, "BlockSize"},
		{KVEventsConfig{Buffer: -1}, "Buffer"},
		{KVEventsConfig{Queue: -1}, "Queue"},
		{KVEventsConfig{MaxSubscribers: -1}, "MaxSubscribers"},
	} {
		err := tc.cfg.Validate()
		if tc.field == "" {
			assert.NoError(t, err)
			continue
		}
		require.Error(t, err, tc.field)
		assert.Contains(t, err.Error(), "KVEventsConfig."+tc.field)
	}
	// A taken endpoint fails Start with a ListenError naming it.
	m, _ := startKVMaster(t, KVEventsConfig{})
	_, err := Start(ServerConfig{Listen: "127.0.0.1:0", KVEvents: &KVEventsConfig{Bind: loopback(m.KVEventsAddr())}})
	var le *ListenError
	require.ErrorAs(t, err, &le)
	assert.Equal(t, "kv_events", le.Listener)
}

// Only the leader publishes: a master that lost its leadership publishes
// nothing for what its old term's service still does, and publishes again,
// on the same stream, once it leads again.
func TestKVEventsLeaderOnly(t *testing.T) {
	etcd := etcdtest.Start(t)
	m, _ := startAdminMaster(t, ServerConfig{
		HA:       &HAConfig{Etcd: []string{etcd}, ClusterID: "kv", LeaderTTL: 3 * time.Second},
		KVEvents: &KVEventsConfig{Bind: "tcp://127.0.0.1:0"}})
	require.Eventually(t, m.Leading, 20*time.Second, 10*time.Millisecond)
	sub := subscribeKV(t, m, "", "")
	old, term := m.Service(), m.Term()
	require.NoError(t, old.MountSegment(t.Context(), "c1", seg("1", 0x10000000, 1<<20)))
	put(t, old, "c1", "a", 64, nil)
	evs, _ := sub.events(1)
	assert.Equal(t, "a", evs[0].ObjectKey)

	// Revoke the leader's lease: the master steps down, then leads again
	// with a new term and service.
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd}, DialTimeout: 5 * time.Second})
	require.NoError(t, err)
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, ha.ViewKey("kv"))
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1)
	_, err = cli.Revoke(ctx, clientv3.LeaseID(resp.Kvs[0].Lease))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return m.Leading() && m.Term() != term }, 20*time.Second, 10*time.Millisecond)

	// The old term's service drops "a" (its journal is closed, so the
	// removal fails, but the object is gone from it): no event.
	_ = old.Remove(t.Context(), "a", true)
	svc := m.Service()
	require.NotSame(t, old, svc)
	require.NoError(t, svc.MountSegment(t.Context(), "c1", seg("1", 0x10000000, 1<<20)))
	put(t, svc, "c1", "b", 64, nil)
	evs, seqs := sub.events(1)
	assert.Equal(t, "stored", evs[0].EventType)
	assert.Equal(t, "b", evs[0].ObjectKey, "the old term's removal was published")
	assert.Equal(t, []uint64{1}, seqs, "one stream across terms")
}

// An upsert refreshes its key (stored again, nothing removed: the medium
// stays), and a segment unmounted under an object removes it.
func TestKVEventsUpsertAndUnmount(t *testing.T) {
	m, svc := startKVMaster(t, KVEventsConfig{})
	sub := subscribeKV(t, m, "", "")
	require.NoError(t, svc.MountSegment(t.Context(), "c1", seg("1", 0x10000000, 1<<20)))
	put(t, svc, "c1", "k", 64, nil)
	_, err := svc.UpsertStart(t.Context(), "c1", "k", 128, nil)
	require.NoError(t, err)
	require.NoError(t, svc.UpsertEnd(t.Context(), "c1", "k", 0))
	require.NoError(t, svc.UnmountSegment(t.Context(), "c1", "1"))

	evs, _ := sub.events(3)
	var got []string
	for _, ev := range evs {
		got = append(got, ev.EventType+" "+ev.Medium+" "+ev.ObjectKey)
	}
	assert.Equal(t, []string{"stored cpu k", "stored cpu k", "removed cpu k"}, got)
}
