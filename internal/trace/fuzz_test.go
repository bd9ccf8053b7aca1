package trace

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
)

// FuzzParseLine feeds the trace line decoder anything: it must not panic,
// a line it accepts must mean the same once written back, and ReadTrace
// must read it the same way.
func FuzzParseLine(f *testing.F) {
	lines := bytes.SplitN(conversation, []byte("\n"), 4)
	for _, l := range lines[:3] {
		f.Add(l)
	}
	for _, s := range []string{
		`{"timestamp": 0, "input_length": 0, "output_length": 0, "hash_ids": []}`,
		`{"timestamp": 1, "input_length": -1, "output_length": 0, "hash_ids": [1]}`,
		`{"timestamp": 1, "input_length": 1, "output_length": 0, "hash_ids": null}`,
		`{"timestamp": 1e3, "input_length": 1, "output_length": 0, "hash_ids": [1]}`,
		`{"timestamp": 1, "input_length": 1, "output_length": 0, "hash_ids": [9223372036854775807, -1]}`,
		`{"timestamp": 1, "timestamp": 2, "input_length": 1, "output_length": 0, "hash_ids": [1]}`,
		`{}`, `null`, `[]`, `{"hash_ids": [1,`, "",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		req, err := ParseLine(line)
		if err != nil {
			return
		}
		if req.Timestamp < 0 || req.InputLength < 0 || req.OutputLength < 0 || req.HashIDs == nil {
			t.Fatalf("accepted %q as %+v", line, req)
		}
		again, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		back, err := ParseLine(again)
		if err != nil {
			t.Fatalf("%q: rejected its own rewrite %s: %v", line, again, err)
		}
		assert.Equal(t, req, back)
		reqs, err := ReadTrace(bytes.NewReader(again))
		if err != nil {
			t.Fatalf("%s: ReadTrace: %v", again, err)
		}
		assert.Equal(t, []Request{req}, reqs)
	})
}
