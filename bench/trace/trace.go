package trace

import (
	"io"

	itrace "github.com/mooncake-go/mooncake/internal/trace"
)

// The trace format and its reader live in internal/trace, shared with the
// Conductor's simulator; these names keep this package's API.

// BlockTokens is the number of tokens behind one hash id of the trace.
const BlockTokens = itrace.BlockTokens

// RealBlockBytes is the KV cache of one 512-token block of LLaMA3-70B in
// fp16: 512 tokens x 80 layers x 2 (K and V) x 8 KV heads x 128 dims x
// 2 bytes = 167,772,160 bytes = 160 MiB. The replay scales it down
// (Options.BlockBytes) so that the trace fits one machine's memory.
const RealBlockBytes = BlockTokens * 80 * 2 * 8 * 128 * 2

// Request is one line of the trace: a conversation turn that reaches the
// prefill with InputLength tokens and decodes OutputLength more.
type Request = itrace.Request

// ErrSyntax is wrapped by every error of ReadTrace about a bad line; the
// message goes on with the line number and what is wrong with it.
var ErrSyntax = itrace.ErrSyntax

// ConversationLines is the number of requests in the embedded trace.
const ConversationLines = itrace.ConversationLines

// Conversation returns the conversation trace of the Mooncake paper
// (FAST'25): 12,031 requests over about an hour. The calls share the
// HashIDs, which must not be modified.
func Conversation() []Request { return itrace.Conversation() }

// Load reads the trace at path, or the embedded conversation trace when
// path is empty.
func Load(path string) ([]Request, error) { return itrace.Load(path) }

// ReadTrace reads a trace in JSON Lines, one Request per line; blank lines
// are skipped and unknown fields ignored. A bad line ends the read with an
// error that wraps ErrSyntax and names the line (counted from 1).
func ReadTrace(r io.Reader) ([]Request, error) { return itrace.ReadTrace(r) }
