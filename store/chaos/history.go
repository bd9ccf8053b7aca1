package chaos

import (
	"sort"
	"sync"
	"time"

	"github.com/mooncake-go/mooncake/internal/table"
)

// Kind is what an operation does.
type Kind uint8

// Operation kinds.
const (
	Put Kind = iota + 1
	Get
	Upsert
	Remove
)

func (k Kind) String() string {
	switch k {
	case Put:
		return "put"
	case Get:
		return "get"
	case Upsert:
		return "upsert"
	case Remove:
		return "remove"
	}
	return "?"
}

// writes reports whether k writes a value.
func (k Kind) writes() bool { return k == Put || k == Upsert }

// Result is how an operation ended, as Jepsen records them.
type Result uint8

// Results.
const (
	// OK: it happened (a get that found nothing is OK with no value).
	OK Result = iota + 1
	// Fail: it certainly did not happen (the store refused it before
	// doing anything).
	Fail
	// Unknown: it may or may not have happened, or happen later (a
	// timeout, a lost connection, a failure in the middle).
	Unknown
)

func (r Result) String() string {
	switch r {
	case OK:
		return "ok"
	case Fail:
		return "fail"
	case Unknown:
		return "unknown"
	}
	return "?"
}

// Op is one operation of the history with its outcome. Times are since
// the run began, on this process's monotonic clock.
type Op struct {
	Index  int
	Client int // the workload client (its own store client) that ran it
	Kind   Kind
	Key    string
	// Value is the write's value, or what a get read (zero: found nothing).
	Value ValueID
	// Size and Digest (CRC-32C) are of the bytes written or read.
	Size   int
	Digest uint32
	// Invoke and Complete bound when the operation took effect, if it did.
	Invoke, Complete time.Duration
	Result           Result
	// Err is the error's text (Fail, Unknown), or for an OK get whose bytes
	// are no value of this key, why.
	Err string
	// Final marks the reads of every key after the workload and the
	// faults ended.
	Final bool
}

// Found reports whether a get read a value (bytes, attributable or not).
func (o *Op) Found() bool { return o.Kind == Get && o.Result == OK && o.Size > 0 }

// FaultEvent is one fault the nemesis injected (or failed to).
type FaultEvent struct {
	At     time.Duration // when it was injected
	Healed time.Duration // when it was undone (zero: not yet, or nothing to undo)
	Name   string        // the schedule's name: kill-node, kill-master, ...
	What   string        // what it did: which process, which link
	Err    string        // why it failed, if it did
}

// Eviction is a key the master reported evicted (by its eviction, or its
// last replica lost with its segment), when the watch saw it. The
// eviction happened at or before At.
type Eviction struct {
	At  time.Duration
	Key string
}

// Vanished is a key that was readable when the eviction watch ended and
// was not when the next one began: evicted, removed or lost between From
// and To, with no event seen.
type Vanished struct {
	Key      string
	From, To time.Duration
}

// History records a run: operations, faults and evictions. Its methods
// are safe for concurrent use.
type History struct {
	start time.Time

	mu        sync.Mutex
	ops       []Op
	faults    []FaultEvent
	evictions []Eviction
	vanished  []Vanished
	notes     []string
}

// NewHistory starts a history whose times count from now.
func NewHistory() *History { return &History{start: time.Now()} }

// Since is the history's time of t.
func (h *History) Since(t time.Time) time.Duration { return t.Sub(h.start) }

// Now is the history's time now.
func (h *History) Now() time.Duration { return time.Since(h.start) }

// Add records a completed operation and returns its index.
func (h *History) Add(op Op) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	op.Index = len(h.ops)
	h.ops = append(h.ops, op)
	return op.Index
}

// AddFault records a fault; the index lets Healed mark it undone.
func (h *History) AddFault(f FaultEvent) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.faults = append(h.faults, f)
	return len(h.faults) - 1
}

// Healed marks fault i undone now (or failing to be, err).
func (h *History) Healed(i int, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.faults[i].Healed = h.Now()
	if err != nil {
		h.faults[i].Err = "heal: " + err.Error()
	}
}

// AddEviction records an eviction the watch saw.
func (h *History) AddEviction(e Eviction) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.evictions = append(h.evictions, e)
}

// AddVanished records a key gone while no watch was open.
func (h *History) AddVanished(v Vanished) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.vanished = append(h.vanished, v)
}

// Vanished returns the keys gone while no watch was open, in order.
func (h *History) Vanished() []Vanished {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Vanished(nil), h.vanished...)
}

// Note records something the run saw that is neither an operation nor a
// fault (a watch that had to reconnect), for the report.
func (h *History) Note(s string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.notes = append(h.notes, s)
}

// Len is the number of operations recorded.
func (h *History) Len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.ops)
}

// Ops returns the operations ordered by invocation.
func (h *History) Ops() []Op {
	h.mu.Lock()
	ops := append([]Op(nil), h.ops...)
	h.mu.Unlock()
	sort.SliceStable(ops, func(i, j int) bool { return ops[i].Invoke < ops[j].Invoke })
	return ops
}

// Faults returns the faults in order.
func (h *History) Faults() []FaultEvent {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]FaultEvent(nil), h.faults...)
}

// Evictions returns the evictions in order.
func (h *History) Evictions() []Eviction {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Eviction(nil), h.evictions...)
}

// Notes returns the notes in order.
func (h *History) Notes() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.notes...)
}

// opColumns is the Parquet schema of a history: one row per operation.
var opColumns = table.Table[Op]{
	table.Int64("index", func(o *Op) int64 { return int64(o.Index) }),
	table.Int32("client", func(o *Op) int { return o.Client }),
	table.String("op", func(o *Op) string { return o.Kind.String() }),
	table.String("key", func(o *Op) string { return o.Key }),
	table.Int64("writer", func(o *Op) int64 { return int64(o.Value.Writer) }),
	table.Int64("version", func(o *Op) int64 { return int64(o.Value.Seq) }),
	table.Int64("size", func(o *Op) int64 { return int64(o.Size) }),
	table.Int64("digest", func(o *Op) int64 { return int64(o.Digest) }),
	table.Int64("invoke_ns", func(o *Op) int64 { return int64(o.Invoke) }),
	table.Int64("complete_ns", func(o *Op) int64 { return int64(o.Complete) }),
	table.String("result", func(o *Op) string { return o.Result.String() }),
	table.String("error", func(o *Op) string { return o.Err }),
	table.Bool("final", func(o *Op) bool { return o.Final }),
}

// OpColumns names the columns of WriteParquet's file, in order.
func OpColumns() []string { return opColumns.Names() }

// WriteParquet writes the operations, ordered by invocation, to a Parquet
// file at path: one row each, the columns of OpColumns.
func (h *History) WriteParquet(path string) error {
	return opColumns.WriteParquet(path, h.Ops())
}
