package store

import (
	"fmt"
	"strconv"
	"time"
)

// The operations a run measures.
const (
	OpPut = "put" // store objects under keys never stored before
	OpGet = "get" // read objects preloaded before the clock starts
)

// DefaultWorkingSet is the size of the default working set of a get run:
// large enough that no CPU cache holds it.
const DefaultWorkingSet = 256 << 20

// DefaultKeyPrefix starts every key when Options.KeyPrefix is zero.
const DefaultKeyPrefix = "mcbench-"

// Options configures one run. Zero fields take the defaults named.
type Options struct {
	// Op is OpPut or OpGet. Zero: OpGet.
	Op string
	// ValueSize is the size of every object, in bytes. Zero: 1 MiB.
	ValueSize int
	// BatchSize is the number of objects one call puts or gets. Zero: 1.
	BatchSize int
	// Clients is the number of concurrent clients, each with its own
	// connection and calling in a loop. Zero: 1.
	Clients int
	// Duration is how long the clock runs. Zero: 5 s.
	Duration time.Duration
	// Warmup is how long every client calls, untimed, before the clock
	// starts. Zero: none.
	Warmup time.Duration
	// Keys is the working set of a get run: the objects preloaded, which
	// the clients read in turn. Zero: DefaultWorkingSet worth of objects,
	// and at least one batch per client. Puts use keys beyond it.
	Keys int
	// KeyPrefix starts every key (see Key). Zero: DefaultKeyPrefix.
	KeyPrefix string
}

// Validate names the first bad field.
func (o *Options) Validate() error {
	switch {
	case o.Op != "" && o.Op != OpPut && o.Op != OpGet:
		return fmt.Errorf("store: Op %q (want %s or %s)", o.Op, OpPut, OpGet)
	case o.ValueSize < 0:
		return fmt.Errorf("store: ValueSize %d", o.ValueSize)
	case o.BatchSize < 0:
		return fmt.Errorf("store: BatchSize %d", o.BatchSize)
	case o.Clients < 0:
		return fmt.Errorf("store: Clients %d", o.Clients)
	case o.Duration < 0:
		return fmt.Errorf("store: Duration %v", o.Duration)
	case o.Warmup < 0:
		return fmt.Errorf("store: Warmup %v", o.Warmup)
	case o.Keys < 0 || (o.Keys > 0 && o.Keys < max(o.BatchSize, 1)):
		// A batch never names a key twice.
		return fmt.Errorf("store: Keys %d (at least one batch, %d)", o.Keys, max(o.BatchSize, 1))
	}
	return nil
}

// WithDefaults returns o with its zero fields set to their defaults: the
// figures a run actually uses.
func (o Options) WithDefaults() Options {
	if o.Op == "" {
		o.Op = OpGet
	}
	if o.ValueSize == 0 {
		o.ValueSize = 1 << 20
	}
	if o.BatchSize == 0 {
		o.BatchSize = 1
	}
	if o.Clients == 0 {
		o.Clients = 1
	}
	if o.Duration == 0 {
		o.Duration = 5 * time.Second
	}
	if o.Keys == 0 {
		o.Keys = max(DefaultWorkingSet/o.ValueSize, o.BatchSize*o.Clients)
	}
	if o.KeyPrefix == "" {
		o.KeyPrefix = DefaultKeyPrefix
	}
	return o
}

// Key is the name of object i: the prefix, then i in twelve decimal digits,
// so that every key of a run has the same length. The official yardstick's
// Python driver names them the same way.
func Key(prefix string, i int) string {
	b := make([]byte, 0, len(prefix)+12)
	b = append(b, prefix...)
	var digits [20]byte
	d := strconv.AppendInt(digits[:0], int64(i), 10)
	for range 12 - len(d) {
		b = append(b, '0')
	}
	return string(append(b, d...))
}

// capacity is the memory each yardstick's store gets: twice the working set
// of a get run and at least 512 MiB. A long enough put run fills it and
// then makes the store evict, as a full KV cache does.
func (o Options) capacity() int64 {
	return max(512<<20, 2*int64(o.Keys)*int64(o.ValueSize))
}
