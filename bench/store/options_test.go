package store

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    Options
		bad  string // the field the error names; empty: valid
	}{
		// Every zero field has a default.
		{"zero", Options{}, ""},
		{"put", Options{Op: OpPut, ValueSize: 4 << 10, BatchSize: 128, Clients: 4, Duration: time.Second}, ""},
		{"op", Options{Op: "delete"}, "Op"},
		{"value size", Options{ValueSize: -1}, "ValueSize"},
		{"batch size", Options{BatchSize: -1}, "BatchSize"},
		{"clients", Options{Clients: -2}, "Clients"},
		{"duration", Options{Duration: -time.Second}, "Duration"},
		{"warmup", Options{Warmup: -time.Second}, "Warmup"},
		{"keys negative", Options{Keys: -1}, "Keys"},
		// A batch never names a key twice, so the working set holds one.
		{"keys under a batch", Options{BatchSize: 8, Keys: 7}, "Keys"},
		{"keys one batch", Options{BatchSize: 8, Keys: 8}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.o.Validate()
			if tc.bad == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), "store: "+tc.bad+" ")
		})
	}
}

func TestOptionsWithDefaults(t *testing.T) {
	o := Options{}.WithDefaults()
	assert.Equal(t, Options{Op: OpGet, ValueSize: 1 << 20, BatchSize: 1, Clients: 1, Duration: 5 * time.Second,
		Keys: DefaultWorkingSet >> 20, KeyPrefix: DefaultKeyPrefix}, o)
	// Small values: the working set is still DefaultWorkingSet bytes.
	assert.Equal(t, DefaultWorkingSet/4096, Options{ValueSize: 4096}.WithDefaults().Keys)
	// Huge values: at least one batch per client.
	assert.Equal(t, 12, Options{ValueSize: 1 << 30, BatchSize: 3, Clients: 4}.WithDefaults().Keys)
	// Set fields stay.
	set := Options{Op: OpPut, ValueSize: 7, BatchSize: 2, Clients: 3, Duration: time.Second, Warmup: time.Second,
		Keys: 9, KeyPrefix: "p/"}
	assert.Equal(t, set, set.WithDefaults())
}

func TestKey(t *testing.T) {
	assert.Equal(t, "mcbench-000000000000", Key(DefaultKeyPrefix, 0))
	assert.Equal(t, "p/000000000042", Key("p/", 42))
	assert.Equal(t, "p/123456789012", Key("p/", 123456789012))
	assert.Len(t, Key("", 1<<20), 12)
}
