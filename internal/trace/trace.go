package trace

import (
	"bufio"
	"bytes"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
)

// BlockTokens is the number of tokens behind one hash id of the trace.
const BlockTokens = 512

// Request is one line of the trace: a conversation turn that reaches the
// prefill with InputLength tokens and decodes OutputLength more.
type Request struct {
	// Timestamp is the arrival time in milliseconds from the trace's start.
	Timestamp int64 `json:"timestamp"`
	// InputLength is the prompt length in tokens.
	InputLength int64 `json:"input_length"`
	// OutputLength is the number of tokens generated.
	OutputLength int64 `json:"output_length"`
	// HashIDs are the prompt's blocks of BlockTokens tokens. They are
	// chained: block i's id stands for the whole prefix up to block i, so
	// two requests share block i only if they share blocks 0..i.
	HashIDs []int64 `json:"hash_ids"`
}

// ErrSyntax is wrapped by every error of ReadTrace about a bad line; the
// message goes on with the line number and what is wrong with it.
var ErrSyntax = errors.New("trace: malformed line")

//go:embed data/conversation_trace.jsonl
var conversation []byte

// ConversationLines is the number of requests in the embedded trace.
const ConversationLines = 12031

// Conversation returns the conversation trace of the Mooncake paper
// (FAST'25), embedded in this package: 12,031 requests over about an hour.
// It is parsed once; the calls share the HashIDs, which must not be
// modified.
func Conversation() []Request {
	return slices.Clone(parsedConversation())
}

var parsedConversation = sync.OnceValue(func() []Request {
	reqs, err := ReadTrace(bytes.NewReader(conversation))
	if err != nil {
		// The file is part of the package and its test reads it.
		panic(err)
	}
	return reqs
})

// Load reads the trace at path, or the embedded conversation trace when
// path is empty.
func Load(path string) ([]Request, error) {
	if path == "" {
		return Conversation(), nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	reqs, err := ReadTrace(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return reqs, nil
}

// ReadTrace reads a trace in JSON Lines, one Request per line; blank lines
// are skipped and unknown fields ignored. A bad line ends the read with an
// error that wraps ErrSyntax and names the line (counted from 1).
func ReadTrace(r io.Reader) ([]Request, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	var reqs []Request
	for n := 1; ; n++ {
		line, err := br.ReadBytes('\n')
		if len(bytes.TrimSpace(line)) > 0 {
			req, perr := ParseLine(line)
			if perr != nil {
				return nil, fmt.Errorf("%w %d: %w", ErrSyntax, n, perr)
			}
			reqs = append(reqs, req)
		}
		if err == io.EOF {
			return reqs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("trace: line %d: %w", n, err)
		}
	}
}

// line mirrors Request with pointers, to tell a missing field from a zero.
type line struct {
	Timestamp    *int64   `json:"timestamp"`
	InputLength  *int64   `json:"input_length"`
	OutputLength *int64   `json:"output_length"`
	HashIDs      *[]int64 `json:"hash_ids"`
}

// ParseLine decodes one trace line (without the line number ReadTrace adds
// to its errors). Every field must be present, the numbers non-negative;
// hash_ids may be empty but not null.
func ParseLine(b []byte) (Request, error) {
	var l line
	if err := json.Unmarshal(b, &l); err != nil {
		return Request{}, err
	}
	for _, f := range []struct {
		name string
		v    *int64
	}{{"timestamp", l.Timestamp}, {"input_length", l.InputLength}, {"output_length", l.OutputLength}} {
		switch {
		case f.v == nil:
			return Request{}, fmt.Errorf("missing %s", f.name)
		case *f.v < 0:
			return Request{}, fmt.Errorf("negative %s %d", f.name, *f.v)
		}
	}
	if l.HashIDs == nil || *l.HashIDs == nil {
		return Request{}, errors.New("missing hash_ids")
	}
	return Request{Timestamp: *l.Timestamp, InputLength: *l.InputLength, OutputLength: *l.OutputLength,
		HashIDs: *l.HashIDs}, nil
}
