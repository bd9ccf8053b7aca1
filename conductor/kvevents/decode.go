package kvevents

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// Kind is what an event says happened to its blocks.
type Kind uint8

// Event kinds: vLLM's BlockStored, BlockRemoved and AllBlocksCleared, the
// KV Events API's stored, removed and cleared.
const (
	Stored Kind = iota + 1
	Removed
	Cleared
)

func (k Kind) String() string {
	switch k {
	case Stored:
		return "stored"
	case Removed:
		return "removed"
	case Cleared:
		return "cleared"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Media, as Event.Medium normalises them. The publishers spell them
// differently (vLLM "GPU", "CPU", "STORAGE"; SGLang "GPU", "CPU_PINNED",
// "DISK"; the KV Events API "gpu", "cpu", "disk").
const (
	GPU  = "GPU"
	CPU  = "CPU"
	Disk = "DISK"
)

// Event is one decoded KV-cache event.
type Event struct {
	Kind Kind
	// Hashes are the blocks' 64-bit identities, in order: vLLM's block
	// hashes as it publishes them (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES;
	// a hash published as bytes is read as its last 8 bytes, big-endian,
	// which is the same number), or the KV Events API's seq_hashes.
	Hashes []uint64
	// Parent is the hash of the block before Hashes[0], when HasParent.
	Parent    uint64
	HasParent bool
	// Tokens are the token ids of the stored blocks, when published.
	Tokens []int
	// BlockSize is the tokens per block, when published (0 otherwise).
	BlockSize int
	// Medium is where the blocks are (GPU, CPU, Disk, or another medium
	// upper-cased); empty when the publisher did not say.
	Medium string
	// LoRA is the adapter's name; empty for the base model.
	LoRA string
	// Key is the store key of the object the event is about (the
	// master's object_key), if any.
	Key string
	// Tenant, Backend and Model are the KV Events API envelope's
	// tenant_id, backend_id and model_name, when published.
	Tenant, Backend, Model string
	// ID is the KV Events API's event_id (0 when absent).
	ID uint64
}

// Batch is one published message: vLLM's KVEventBatch, [ts, events,
// data_parallel_rank].
type Batch struct {
	// Time is the publisher's timestamp, seconds since the epoch.
	Time   float64
	Events []Event
	// DPRank is the data-parallel rank of the publisher, when HasDPRank.
	DPRank    int
	HasDPRank bool
	// Skipped counts the events of kinds this decoder does not know
	// (newer publishers may add some); they are left out of Events.
	Skipped int
}

// ErrMalformed is wrapped by every error Decode returns.
var ErrMalformed = errors.New("kvevents: malformed payload")

// Limits on what one payload may claim, so that a corrupt or hostile one
// cannot make the decoder allocate much before it runs out of bytes.
const (
	maxEvents = 1 << 20
	maxHashes = 1 << 20
)

// Decode reads a payload frame: a msgpack array [ts, [event, ...]
// (, dp_rank)]. Each event is a map, either vLLM's tagged struct
// ({"type": "BlockStored", "block_hashes": [...], ...}) or the KV Events
// API's ({"event_type": "stored", "seq_hashes": [...], ...}), or an older
// vLLM's tagged array (["BlockStored", block_hashes, parent, token_ids,
// block_size, lora_id, medium, ...]). Fields it does not know are skipped.
func Decode(payload []byte) (Batch, error) {
	r := bytes.NewReader(payload)
	d := msgpack.NewDecoder(r)
	var b Batch
	n, err := d.DecodeArrayLen()
	if err != nil {
		return b, malformed("batch", err)
	}
	if n < 2 || n > 3 {
		return b, malformed("batch", fmt.Errorf("array of %d, want [ts, events(, dp_rank)]", n))
	}
	if b.Time, err = d.DecodeFloat64(); err != nil {
		return b, malformed("ts", err)
	}
	ne, err := d.DecodeArrayLen()
	if err != nil {
		return b, malformed("events", err)
	}
	if ne > maxEvents {
		return b, malformed("events", fmt.Errorf("%d events", ne))
	}
	for i := 0; i < ne; i++ {
		e, ok, err := decodeEvent(d)
		if err != nil {
			return b, malformed(fmt.Sprintf("events[%d]", i), err)
		}
		if !ok {
			b.Skipped++
			continue
		}
		b.Events = append(b.Events, e)
	}
	if n == 3 {
		if isNil(d) {
			_ = d.DecodeNil()
		} else {
			r, err := d.DecodeInt64()
			if err != nil || r < 0 || r > math.MaxInt32 {
				return b, malformed("dp_rank", fmt.Errorf("%d: %v", r, err))
			}
			b.DPRank, b.HasDPRank = int(r), true
		}
	}
	if r.Len() > 0 {
		return b, malformed("batch", fmt.Errorf("%d bytes after the batch", r.Len()))
	}
	return b, nil
}

func malformed(what string, err error) error {
	return fmt.Errorf("%w: %s: %v", ErrMalformed, what, err)
}

func isNil(d *msgpack.Decoder) bool {
	c, err := d.PeekCode()
	return err == nil && c == msgpcode.Nil
}

// decodeEvent reads one event; ok is false for an event of an unknown
// type, which it skips.
func decodeEvent(d *msgpack.Decoder) (e Event, ok bool, err error) {
	c, err := d.PeekCode()
	if err != nil {
		return e, false, err
	}
	if msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32 {
		return decodeArrayEvent(d)
	}
	n, err := d.DecodeMapLen()
	if err != nil {
		return e, false, err
	}
	var tag, std string
	for i := 0; i < n; i++ {
		k, err := d.DecodeString()
		if err != nil {
			return e, false, fmt.Errorf("key: %w", err)
		}
		if err := e.field(d, k, &tag, &std); err != nil {
			return e, false, fmt.Errorf("%s: %w", k, err)
		}
	}
	// The KV Events API's event_type wins over its vLLM-style alias.
	switch {
	case std != "":
		e.Kind = stdKind(std)
	case tag != "":
		e.Kind = vllmKind(tag)
	default:
		return e, false, errors.New("no type or event_type")
	}
	return e, e.Kind != 0, nil
}

func (e *Event) field(d *msgpack.Decoder, k string, tag, std *string) error {
	var err error
	switch k {
	case "type":
		*tag, err = optString(d)
	case "event_type":
		*std, err = optString(d)
	case "block_hashes", "seq_hashes":
		// The master publishes both, equal: keep the first.
		var h []uint64
		if h, err = hashes(d); err == nil && e.Hashes == nil {
			e.Hashes = h
		}
	case "parent_block_hash", "parent_hash":
		if isNil(d) {
			return d.DecodeNil()
		}
		e.Parent, err = hash(d)
		e.HasParent = err == nil
	case "token_ids":
		e.Tokens, err = tokens(d)
	case "block_size":
		e.BlockSize, err = optInt(d)
	case "medium":
		var m string
		m, err = optString(d)
		e.Medium = normMedium(m)
	case "lora_name":
		e.LoRA, err = optString(d)
	case "object_key":
		e.Key, err = optString(d)
	case "tenant_id":
		e.Tenant, err = optString(d)
	case "backend_id":
		e.Backend, err = optString(d)
	case "model_name":
		e.Model, err = optString(d)
	case "event_id":
		if isNil(d) {
			return d.DecodeNil()
		}
		e.ID, err = d.DecodeUint64()
	default:
		err = d.Skip()
	}
	return err
}

// decodeArrayEvent reads an older vLLM's array-like tagged event.
func decodeArrayEvent(d *msgpack.Decoder) (e Event, ok bool, err error) {
	n, err := d.DecodeArrayLen()
	if err != nil || n < 1 {
		return e, false, fmt.Errorf("tagged array of %d: %v", n, err)
	}
	tag, err := d.DecodeString()
	if err != nil {
		return e, false, fmt.Errorf("tag: %w", err)
	}
	e.Kind = vllmKind(tag)
	var fields []string
	switch e.Kind {
	case Stored:
		fields = []string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name"}
	case Removed:
		fields = []string{"block_hashes", "medium"}
	}
	var unused string
	for i := 1; i < n; i++ {
		f := "?"
		if i-1 < len(fields) {
			f = fields[i-1]
		}
		if err := e.field(d, f, &unused, &unused); err != nil {
			return e, false, fmt.Errorf("%s: %w", f, err)
		}
	}
	return e, e.Kind != 0, nil
}

func vllmKind(tag string) Kind {
	switch tag {
	case "BlockStored":
		return Stored
	case "BlockRemoved":
		return Removed
	case "AllBlocksCleared":
		return Cleared
	}
	return 0
}

func stdKind(t string) Kind {
	switch t {
	case "stored":
		return Stored
	case "removed":
		return Removed
	case "cleared":
		return Cleared
	}
	return 0
}

func normMedium(m string) string {
	switch u := strings.ToUpper(m); u {
	case "CPU_PINNED":
		return CPU
	case "STORAGE":
		return Disk
	default:
		return u
	}
}

func optString(d *msgpack.Decoder) (string, error) {
	if isNil(d) {
		return "", d.DecodeNil()
	}
	return d.DecodeString()
}

func optInt(d *msgpack.Decoder) (int, error) {
	if isNil(d) {
		return 0, d.DecodeNil()
	}
	v, err := d.DecodeInt64()
	if err != nil {
		return 0, err
	}
	if v < 0 || v > math.MaxInt32 {
		return 0, fmt.Errorf("%d out of range", v)
	}
	return int(v), nil
}

func hashes(d *msgpack.Decoder) ([]uint64, error) {
	n, err := d.DecodeArrayLen()
	if err != nil {
		return nil, err
	}
	if n > maxHashes {
		return nil, fmt.Errorf("%d hashes", n)
	}
	out := make([]uint64, 0, min(max(n, 0), 1024))
	for i := 0; i < n; i++ {
		h, err := hash(d)
		if err != nil {
			return nil, err
		}
		out = append(out, h)
	}
	return out, nil
}

// hash reads one block hash: an integer (a negative one is read as its
// two's complement, as a signed 64-bit encoder would have written a large
// unsigned hash) or bytes, of which the last 8 are the identity.
func hash(d *msgpack.Decoder) (uint64, error) {
	c, err := d.PeekCode()
	if err != nil {
		return 0, err
	}
	switch {
	case c == msgpcode.Uint64 || c == msgpcode.Uint32 || c == msgpcode.Uint16 || c == msgpcode.Uint8 || msgpcode.IsFixedNum(c):
		return d.DecodeUint64()
	case c == msgpcode.Int64 || c == msgpcode.Int32 || c == msgpcode.Int16 || c == msgpcode.Int8:
		v, err := d.DecodeInt64()
		return uint64(v), err
	case c == msgpcode.Bin8 || c == msgpcode.Bin16 || c == msgpcode.Bin32:
		b, err := d.DecodeBytes()
		if err != nil {
			return 0, err
		}
		if len(b) == 0 {
			return 0, errors.New("empty hash")
		}
		var tail [8]byte
		copy(tail[max(0, 8-len(b)):], b[max(0, len(b)-8):])
		return binary.BigEndian.Uint64(tail[:]), nil
	}
	return 0, fmt.Errorf("hash of msgpack type 0x%02x", c)
}

func tokens(d *msgpack.Decoder) ([]int, error) {
	if isNil(d) {
		return nil, d.DecodeNil()
	}
	n, err := d.DecodeArrayLen()
	if err != nil {
		return nil, err
	}
	if n > maxHashes*64 {
		return nil, fmt.Errorf("%d tokens", n)
	}
	out := make([]int, 0, min(max(n, 0), 1<<14))
	for i := 0; i < n; i++ {
		t, err := d.DecodeInt64()
		if err != nil {
			return nil, err
		}
		if t < 0 || t > math.MaxInt32 {
			return nil, fmt.Errorf("token %d out of range", t)
		}
		out = append(out, int(t))
	}
	return out, nil
}
