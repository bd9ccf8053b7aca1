package indexer

import (
	"errors"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// FuzzQueryBody feeds /query and /unregister bodies from the network, in
// JSON and msgpack: never a panic, and every refusal is a 400, 404 or
// 409 (ErrInvalid, ErrNotFound), never an internal error.
func FuzzQueryBody(f *testing.F) {
	f.Add([]byte(`{"model":"m","block_size":16,"token_ids":[1,2,3]}`), false)
	f.Add([]byte(`{"model":"m","block_size":16,"seq_hashes":[1,2]}`), false)
	packed, _ := msgpack.Marshal(map[string]any{"model": "m", "block_size": 16, "token_ids": []byte{1, 0, 0, 0}})
	f.Add(packed, true)
	x := New(Config{})
	f.Cleanup(x.Close)
	f.Fuzz(func(t *testing.T, body []byte, isPacked bool) {
		for _, h := range []handlerFunc{x.handleQuery, x.handleUnregister} {
			_, err := h(body, isPacked)
			if err != nil && !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrNotFound) {
				t.Fatalf("%q: %v", body, err)
			}
		}
	})
}
