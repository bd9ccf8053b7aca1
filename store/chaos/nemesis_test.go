package chaos

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// recorder is a fault that logs its injections and heals.
type recorder struct {
	mu   sync.Mutex
	log  []string
	name string
	fail bool
}

func (r *recorder) Inject(context.Context) (string, func(context.Context) error, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.log = append(r.log, "inject "+r.name)
	if r.fail {
		return "nothing", nil, errors.New("no target")
	}
	return "did " + r.name, func(context.Context) error {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.log = append(r.log, "heal "+r.name)
		return nil
	}, nil
}

// Faults run one at a time in schedule order, each healed after its hold
// before the next; a fault that fails is recorded with its error.
func TestNemesisRun(t *testing.T) {
	a, b, c := &recorder{name: "a"}, &recorder{name: "b"}, &recorder{name: "c", fail: true}
	steps, err := ParseSchedule("a@1ms+30ms,b@2ms,c@3ms")
	require.NoError(t, err)
	h := NewHistory()
	n := &Nemesis{Faults: Faults{"a": a, "b": b, "c": c}, Steps: steps}
	n.Run(context.Background(), h, time.Second)

	f := h.Faults()
	require.Len(t, f, 3)
	assert.Equal(t, []string{"a", "b", "c"}, []string{f[0].Name, f[1].Name, f[2].Name})
	assert.Equal(t, "did a", f[0].What)
	assert.GreaterOrEqual(t, f[0].Healed-f[0].At, 30*time.Millisecond, "a held for its hold")
	assert.GreaterOrEqual(t, f[1].At, f[0].Healed, "b waited for a's heal")
	assert.Equal(t, "no target", f[2].Err)
	assert.Zero(t, f[2].Healed)
	assert.Equal(t, []string{"inject a", "heal a"}, a.log)
	assert.Equal(t, []string{"inject b", "heal b"}, b.log)
}

// A run that ends while a fault is held still heals it.
func TestNemesisHealsAtTheEnd(t *testing.T) {
	a := &recorder{name: "a"}
	h := NewHistory()
	n := &Nemesis{Faults: Faults{"a": a}, Steps: []Step{{Name: "a", At: 0, Hold: time.Hour}}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { n.Run(ctx, h, time.Hour); close(done) }()
	require.Eventually(t, func() bool { return len(h.Faults()) == 1 }, 10*time.Second, time.Millisecond)
	cancel()
	<-done
	assert.Equal(t, []string{"inject a", "heal a"}, a.log)
	assert.NotZero(t, h.Faults()[0].Healed)
}
