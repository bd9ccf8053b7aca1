package kvevents

import (
	"encoding/hex"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"
)

// vllmBatch is what vLLM 0.32's publisher encoder (msgspec) wrote for
// KVEventBatch(ts=1.5, events=[BlockStored(block_hashes=[1, 2**64-1],
// parent_block_hash=None, token_ids=[1, 2, 3], block_size=16, lora_id=None,
// medium="GPU", lora_name=None), BlockRemoved(block_hashes=[5],
// medium="GPU"), AllBlocksCleared()], data_parallel_rank=0).
const vllmBatch = "93cb3ff80000000000009388a474797065ab426c6f636b53746f726564ac626c6f636b5f6861736865739201cfffffffffffffffffb1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f69647393010203aa626c6f636b5f73697a6510a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c083a474797065ac426c6f636b52656d6f766564ac626c6f636b5f6861736865739105a66d656469756da347505581a474797065b0416c6c426c6f636b73436c656172656400"

func TestDecodeVLLM(t *testing.T) {
	p, err := hex.DecodeString(vllmBatch)
	require.NoError(t, err)
	b, err := Decode(p)
	require.NoError(t, err)
	assert.Equal(t, 1.5, b.Time)
	assert.True(t, b.HasDPRank)
	assert.Equal(t, 0, b.DPRank)
	require.Len(t, b.Events, 3)
	assert.Equal(t, Event{Kind: Stored, Hashes: []uint64{1, 1<<64 - 1}, Tokens: []int{1, 2, 3}, BlockSize: 16, Medium: GPU}, b.Events[0])
	assert.Equal(t, Event{Kind: Removed, Hashes: []uint64{5}, Medium: GPU}, b.Events[1])
	assert.Equal(t, Event{Kind: Cleared}, b.Events[2])
}

func pack(t testing.TB, v any) []byte {
	t.Helper()
	p, err := msgpack.Marshal(v)
	require.NoError(t, err)
	return p
}

func TestDecodeStandardEvents(t *testing.T) {
	p := pack(t, []any{
		1700000000.25,
		[]any{
			map[string]any{
				"event_id": uint64(42), "timestamp": int64(1739145600000), "event_type": "stored",
				"model_name": "m", "block_size": 64, "additional_salt": nil, "lora_name": nil,
				"tenant_id": "default", "backend_id": "pool-0", "medium": "cpu", "dp_rank": 0,
				"seq_hashes": []uint64{7, 9}, "base_block_idx": 0, "parent_hash": uint64(3), "token_ids": nil,
				// The master's compatibility aliases.
				"object_key": "0x7", "type": "BlockStored", "block_hashes": []uint64{7, 9},
			},
			map[string]any{"event_type": "removed", "seq_hashes": []uint64{9}, "medium": "disk"},
			map[string]any{"event_type": "cleared"},
			map[string]any{"event_type": "compacted"}, // a future kind: skipped
		},
	})
	b, err := Decode(p)
	require.NoError(t, err)
	assert.False(t, b.HasDPRank)
	assert.Equal(t, 1, b.Skipped)
	require.Len(t, b.Events, 3)
	assert.Equal(t, Event{Kind: Stored, Hashes: []uint64{7, 9}, Parent: 3, HasParent: true, BlockSize: 64,
		Medium: CPU, Key: "0x7", Tenant: "default", Backend: "pool-0", Model: "m", ID: 42}, b.Events[0])
	assert.Equal(t, Event{Kind: Removed, Hashes: []uint64{9}, Medium: Disk}, b.Events[1])
	assert.Equal(t, Cleared, b.Events[2].Kind)
}

func TestDecodeOlderArrayEventsAndByteHashes(t *testing.T) {
	h := make([]byte, 32)
	h[31], h[24] = 0x02, 0x01 // the last 8 bytes: 0x0100000000000002
	p := pack(t, []any{
		int64(2), // an integer timestamp
		[]any{
			[]any{"BlockStored", []any{h}, nil, []int{5, 6}, 2, nil, "CPU_PINNED"},
			[]any{"BlockRemoved", []any{int64(-1)}, "STORAGE"},
			[]any{"AllBlocksCleared"},
		},
		3,
	})
	b, err := Decode(p)
	require.NoError(t, err)
	assert.Equal(t, 3, b.DPRank)
	require.Len(t, b.Events, 3)
	assert.Equal(t, Event{Kind: Stored, Hashes: []uint64{0x0100000000000002}, Tokens: []int{5, 6}, BlockSize: 2, Medium: CPU}, b.Events[0])
	assert.Equal(t, Event{Kind: Removed, Hashes: []uint64{1<<64 - 1}, Medium: Disk}, b.Events[1])
	assert.Equal(t, Cleared, b.Events[2].Kind)
}

func TestDecodeMalformed(t *testing.T) {
	good, err := hex.DecodeString(vllmBatch)
	require.NoError(t, err)
	cases := map[string][]byte{
		"empty":          nil,
		"not an array":   pack(t, "x"),
		"short batch":    pack(t, []any{1.0}),
		"long batch":     pack(t, []any{1.0, []any{}, 0, 0}),
		"ts not number":  pack(t, []any{"now", []any{}}),
		"events not arr": pack(t, []any{1.0, 5}),
		"event no type":  pack(t, []any{1.0, []any{map[string]any{"block_hashes": []int{1}}}}),
		"hash a string":  pack(t, []any{1.0, []any{map[string]any{"type": "BlockRemoved", "block_hashes": []any{"h"}}}}),
		"empty hash":     pack(t, []any{1.0, []any{map[string]any{"type": "BlockRemoved", "block_hashes": []any{[]byte{}}}}}),
		"neg token":      pack(t, []any{1.0, []any{map[string]any{"type": "BlockStored", "token_ids": []int{-1}}}}),
		"neg dp rank":    pack(t, []any{1.0, []any{}, -2}),
		"truncated":      good[:len(good)-3],
		"trailing bytes": append(append([]byte{}, good...), 0xc0),
		"huge array":     {0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0xff, 0xff, 0xff, 0xff},
	}
	for name, p := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := Decode(p)
			require.Error(t, err)
			assert.True(t, errors.Is(err, ErrMalformed), "%v", err)
		})
	}
}

func FuzzDecode(f *testing.F) {
	good, _ := hex.DecodeString(vllmBatch)
	f.Add(good)
	f.Add(pack(f, []any{1.0, []any{map[string]any{"event_type": "stored", "seq_hashes": []uint64{1}}}, 0}))
	f.Add(pack(f, []any{1.0, []any{[]any{"BlockStored", []any{[]byte{1, 2}}, nil, []int{5}, 1, nil, nil}}}))
	f.Fuzz(func(t *testing.T, p []byte) {
		b, err := Decode(p)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		for _, e := range b.Events {
			if e.Kind < Stored || e.Kind > Cleared {
				t.Fatalf("event of kind %v", e.Kind)
			}
		}
	})
}

var msgpackMarshal = msgpack.Marshal
