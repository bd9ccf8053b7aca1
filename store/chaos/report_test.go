package chaos

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The report counts operations by kind and result, lists the faults with
// how soon a write was served after each, and lists the anomalies.
func TestReport(t *testing.T) {
	h := NewHistory()
	ops := []Op{
		w(Put, 0, 1, 0, 10, OK),
		w(Upsert, 1, 2, 100, 140, Unknown), // invoked after the fault, not acknowledged
		w(Upsert, 0, 3, 110, 150, OK),      // the first acknowledged: 50ms after
		w(Upsert, 1, 4, 120, 130, Fail),
		read(1, 0, 0, 200, 210),
	}
	ops[3].Err = "store: NO_AVAILABLE_HANDLE: no segment has 100 bytes"
	ops[1].Err = "store: RPC_TIMEOUT: context deadline exceeded"
	for _, o := range ops {
		h.Add(o)
	}
	i := h.AddFault(FaultEvent{At: ms(100), Name: "kill-node", What: "kill -9 node 1"})
	h.Healed(i, nil)
	anomalies := Check(h.Ops(), nil, CheckConfig{})
	require.Len(t, anomalies, 1)

	var b strings.Builder
	require.NoError(t, Report(&b, h, anomalies))
	out := b.String()
	assert.Contains(t, out, "operations: 5 in 210ms\n")
	assert.Regexp(t, `(?m)^ +upsert +1 +1 +1 +0 +0 *$`, out)
	assert.Contains(t, out, "      1 upsert: store: NO_AVAILABLE_HANDLE: no segment has\n")
	assert.Contains(t, out, "kill -9 node 1; healed at")
	assert.Contains(t, out, "; first write acknowledged 50ms after\n")
	assert.Contains(t, out, "anomalies: 1 lost-write=1\n")
	assert.Contains(t, out, "  lost-write key=k get#4 (client 1, 200ms..210ms) upsert#2 w1#3")
}
