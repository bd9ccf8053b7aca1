package te_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/bench/te"
	"github.com/mooncake-go/mooncake/engine"
)

// The plan names every measurement of a run and the measuring time they
// add up to, which is what a --duration 2s run really takes.
func TestPlan(t *testing.T) {
	for _, tc := range []struct {
		name   string
		o      te.Options
		phases []string
		total  time.Duration
	}{
		// The defaults: 3 runs of ours and two TCP yardsticks, 5 s each.
		{"defaults", te.Options{}, []string{te.Ours, "loopback-tcp-4conn", "loopback-tcp-1conn"}, 45 * time.Second},
		// The case: --duration 2s is 18 s of measuring.
		{"tcp 2s", te.Options{Transport: "tcp", Duration: 2 * time.Second}, []string{te.Ours, "loopback-tcp-4conn", "loopback-tcp-1conn"},
			18 * time.Second},
		// One lane: one TCP yardstick.
		{"one lane", te.Options{Lanes: 1, Repeat: 2, Duration: time.Second}, []string{te.Ours, "loopback-tcp-1conn"}, 4 * time.Second},
		{"shm", te.Options{Transport: "shm", Repeat: 1, Duration: time.Second}, []string{te.Ours, "memcpy-1thread"}, 2 * time.Second},
		{"no yardstick", te.Options{NoYardstick: true, Duration: time.Second}, []string{te.Ours}, 3 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("MC_TCP_LANES_PER_PEER", "")
			assert.Equal(t, tc.phases, tc.o.Phases())
			assert.Equal(t, tc.total, tc.o.Planned())
			line := tc.o.PlanLine()
			assert.Contains(t, line, strings.Join(tc.phases, ", "))
			assert.Contains(t, line, "= "+tc.total.String())
		})
	}
}

// Run prints its plan before anything else and measures what it planned,
// in that order.
func TestRunFollowsItsPlan(t *testing.T) {
	o := smoke("tcp", engine.Write)
	o.Repeat, o.Duration = 2, 100*time.Millisecond
	var progress bytes.Buffer
	o.Progress = &progress
	res, err := te.Run(context.Background(), o)
	require.NoError(t, err)
	first, _, _ := strings.Cut(progress.String(), "\n")
	assert.Equal(t, o.PlanLine(), first)
	assert.Contains(t, first, "2 run(s) x 3 measurement(s) (ours, loopback-tcp-4conn, loopback-tcp-1conn) x 100ms = 600ms")
	var names []string
	for _, f := range res.Runs {
		names = append(names, f.Name)
	}
	phases := o.Phases()
	assert.Equal(t, append(phases, phases...), names)
}
