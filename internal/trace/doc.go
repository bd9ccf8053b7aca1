// Package trace reads the request traces of the Mooncake paper (FAST'25):
// JSON Lines, one request per line, with an arrival time in milliseconds,
// the prompt and output lengths in tokens, and the prompt's blocks of 512
// tokens as chained hash ids.
//
// The conversation trace (12,031 requests over an hour) is embedded:
// Conversation returns it parsed. Load reads a file of the same format, or
// the embedded trace for an empty path; ReadTrace reads any reader. A
// malformed line ends the read with an error that wraps ErrSyntax and says
// which line (counted from 1) and what is wrong with it:
//
//	reqs, err := trace.Load("my_trace.jsonl")
//	// trace: malformed line 7: negative input_length -3
//
// The hash ids are chained, as prefix caching keys blocks: block i's id
// stands for tokens 0..512(i+1), so two requests share block i only if
// they share blocks 0..i, and a cache can serve a request only a leading
// run of its blocks. The trace replay of bench/trace and the Conductor's
// simulator (conductor/sim) both read traces through this package.
package trace
