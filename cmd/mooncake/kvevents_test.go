package main

import (
	"context"
	"encoding/binary"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"
)

// `mooncake master --enable_kv_events` binds the endpoints it is given
// (port 0 resolved in its startup line) and publishes a put's stored event
// with the flags' envelope; the replay endpoint hands it back.
func TestMasterKVEvents(t *testing.T) {
	cmd, addrs, c := startKVMaster(t, "--kv_events_model_name", "llama", "--kv_events_block_size", "16", "--kv_events_topic", "kv")
	require.True(t, strings.HasPrefix(addrs["kv_events"], "tcp://127.0.0.1:"), addrs)
	require.NotEqual(t, "tcp://127.0.0.1:0", addrs["kv_events"], "the bound port")
	require.True(t, strings.HasPrefix(addrs["kv_events_replay"], "tcp://127.0.0.1:"), addrs)
	putKeys(t, c, "llama@0@00000000000000ff")

	// The replay endpoint has the message whatever a subscriber missed:
	// ask until the sender has sent it.
	d := zmq4.NewDealer(context.Background())
	defer d.Close()
	require.NoError(t, d.Dial(addrs["kv_events_replay"]))
	var msgs [][][]byte
	require.Eventually(t, func() bool {
		msgs = replay(t, d)
		return len(msgs) > 0
	}, 20*time.Second, 10*time.Millisecond)
	require.Len(t, msgs, 1)
	assert.Equal(t, "kv", string(msgs[0][0]))
	assert.Equal(t, uint64(0), binary.BigEndian.Uint64(msgs[0][1]))
	var payload struct {
		_msgpack struct{} `msgpack:",as_array"`
		TS       float64
		Events   []struct {
			Type      string   `msgpack:"event_type"`
			Key       string   `msgpack:"object_key"`
			Hashes    []uint64 `msgpack:"seq_hashes"`
			Backend   string   `msgpack:"backend_id"`
			Model     string   `msgpack:"model_name"`
			BlockSize int      `msgpack:"block_size"`
		}
		DPRank int
	}
	require.NoError(t, msgpack.Unmarshal(msgs[0][2], &payload))
	require.Len(t, payload.Events, 1)
	ev := payload.Events[0]
	assert.Equal(t, "stored", ev.Type)
	assert.Equal(t, "llama@0@00000000000000ff", ev.Key)
	assert.Equal(t, []uint64{255}, ev.Hashes)
	assert.Equal(t, "pool-a", ev.Backend)
	assert.Equal(t, "llama", ev.Model)
	assert.Equal(t, 16, ev.BlockSize)
	stopOnSIGTERM(t, cmd, "master")
}

// replay asks for every buffered message and returns their [topic, seq,
// payload] frames, up to the end marker.
func replay(t *testing.T, d zmq4.Socket) [][][]byte {
	t.Helper()
	require.NoError(t, d.Send(zmq4.NewMsgFrom(nil, make([]byte, 8))))
	var out [][][]byte
	for {
		msg, err := d.Recv()
		require.NoError(t, err)
		require.Len(t, msg.Frames, 4)
		if binary.BigEndian.Uint64(msg.Frames[2]) == 1<<64-1 {
			return out
		}
		out = append(out, msg.Frames[1:])
	}
}
