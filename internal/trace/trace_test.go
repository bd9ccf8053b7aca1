package trace_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/internal/trace"
)

func TestReadTrace(t *testing.T) {
	good := `{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}`
	for _, tc := range []struct {
		name string
		in   string
		want []trace.Request // when no error
		err  string          // substring of the error, "" for none
	}{
		// Two lines, the last without a newline.
		{"two lines", good + "\n" + `{"timestamp": 7, "input_length": 10, "output_length": 0, "hash_ids": [0]}`,
			[]trace.Request{{0, 600, 5, []int64{0, 1}}, {7, 10, 0, []int64{0}}}, ""},
		// Blank lines and CRLF endings are fine; unknown fields ignored.
		{"blank lines", "\n" + good + "\r\n\n  \n" + strings.Replace(good, "}", `, "extra": "x"}`, 1),
			[]trace.Request{{0, 600, 5, []int64{0, 1}}, {0, 600, 5, []int64{0, 1}}}, ""},
		// An empty prompt has an empty list, which is not a missing one.
		{"empty hash_ids", `{"timestamp": 1, "input_length": 0, "output_length": 3, "hash_ids": []}`,
			[]trace.Request{{1, 0, 3, []int64{}}}, ""},
		// Nothing at all is an empty trace.
		{"empty", "", nil, ""},
		// The line number counts blank lines.
		{"bad json", good + "\n\n{\"timestamp\": 1,", nil, "malformed line 3: unexpected end of JSON input"},
		// An array where an object belongs.
		{"not an object", "[1, 2]", nil, "malformed line 1: json: cannot unmarshal"},
		// Anything after the object.
		{"trailing garbage", good + " x", nil, "malformed line 1: invalid character 'x'"},
		// Numbers must be numbers, ids integers.
		{"string length", `{"timestamp": 0, "input_length": "6", "output_length": 5, "hash_ids": [0]}`, nil,
			"malformed line 1: json: cannot unmarshal string"},
		{"fractional hash id", `{"timestamp": 0, "input_length": 6, "output_length": 5, "hash_ids": [0.5]}`, nil,
			"malformed line 1: json: cannot unmarshal number 0.5"},
		// Lengths and times are never negative.
		{"negative input", good + "\n" + strings.Replace(good, "600", "-600", 1), nil,
			"malformed line 2: negative input_length -600"},
		{"negative output", strings.Replace(good, `"output_length": 5`, `"output_length": -1`, 1), nil,
			"malformed line 1: negative output_length -1"},
		{"negative timestamp", strings.Replace(good, `"timestamp": 0`, `"timestamp": -3`, 1), nil,
			"malformed line 1: negative timestamp -3"},
		// A missing field is not a zero.
		{"missing timestamp", `{"input_length": 600, "output_length": 5, "hash_ids": [0, 1]}`, nil,
			"malformed line 1: missing timestamp"},
		{"missing hash_ids", `{"timestamp": 0, "input_length": 600, "output_length": 5}`, nil,
			"malformed line 1: missing hash_ids"},
		{"null hash_ids", `{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": null}`, nil,
			"malformed line 1: missing hash_ids"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := trace.ReadTrace(strings.NewReader(tc.in))
			if tc.err != "" {
				require.ErrorIs(t, err, trace.ErrSyntax)
				assert.Contains(t, err.Error(), tc.err)
				assert.True(t, strings.HasPrefix(err.Error(), "trace: "), err.Error())
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

// errReader fails after its data, as a broken file or pipe would.
type errReader struct{ data *strings.Reader }

var errBroken = errors.New("broken pipe")

func (r errReader) Read(p []byte) (int, error) {
	if r.data.Len() == 0 {
		return 0, errBroken
	}
	return r.data.Read(p)
}

func TestReadTraceReadError(t *testing.T) {
	_, err := trace.ReadTrace(errReader{strings.NewReader(
		`{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [0]}` + "\n")})
	require.ErrorIs(t, err, errBroken)
	assert.NotErrorIs(t, err, trace.ErrSyntax, "an I/O error is no syntax error")
	assert.Contains(t, err.Error(), "line 2")
}

func TestConversation(t *testing.T) {
	reqs := trace.Conversation()
	require.Len(t, reqs, trace.ConversationLines)
	assert.Equal(t, trace.Request{Timestamp: 0, InputLength: 6758, OutputLength: 500,
		HashIDs: []int64{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13}}, reqs[0])
	blocks := 0
	for i, r := range reqs {
		blocks += len(r.HashIDs)
		// Every prompt is cut in whole blocks of 512 tokens, the last one
		// partial.
		require.Equal(t, (r.InputLength+trace.BlockTokens-1)/trace.BlockTokens, int64(len(r.HashIDs)), "request %d", i)
		if i > 0 {
			require.LessOrEqual(t, reqs[i-1].Timestamp, r.Timestamp, "request %d: timestamps in order", i)
		}
	}
	assert.Equal(t, 288500, blocks)
	assert.Equal(t, int64(3536999), reqs[len(reqs)-1].Timestamp, "about an hour")

	// Callers get their own slice.
	reqs[0].Timestamp = 99
	assert.Zero(t, trace.Conversation()[0].Timestamp)
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "t.jsonl")
	require.NoError(t, os.WriteFile(path, []byte(`{"timestamp": 5, "input_length": 1, "output_length": 1, "hash_ids": [9]}`), 0o644))
	reqs, err := trace.Load(path)
	require.NoError(t, err)
	assert.Equal(t, []trace.Request{{5, 1, 1, []int64{9}}}, reqs)

	// An empty path is the embedded trace.
	reqs, err = trace.Load("")
	require.NoError(t, err)
	assert.Len(t, reqs, trace.ConversationLines)

	// The path is in the error.
	require.NoError(t, os.WriteFile(path, []byte("{}\n"), 0o644))
	_, err = trace.Load(path)
	require.ErrorIs(t, err, trace.ErrSyntax)
	assert.Contains(t, err.Error(), path)
	_, err = trace.Load(filepath.Join(dir, "none"))
	require.ErrorIs(t, err, os.ErrNotExist)
}
