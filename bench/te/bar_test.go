package te

import (
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// On a terminal the progress is one bar over the whole planned measuring
// time: a measurement half done in the first of two is a quarter of it,
// and a finished measurement fills its share, whatever it took.
func TestProgressBar(t *testing.T) {
	// A file stands in for the terminal: the bar takes 80 columns.
	f, err := os.Create(filepath.Join(t.TempDir(), "tty"))
	require.NoError(t, err)
	defer f.Close()
	p := &progress{w: f, bar: newBar(f, 2*time.Second), repeat: 1, duration: time.Second, total: 2 * time.Second}
	p.draw(1, Ours, 500*time.Millisecond, 1.5)
	var moved atomic.Uint64
	p.meter(1, Ours, &moved)()
	p.stop()
	out, err := os.ReadFile(f.Name())
	require.NoError(t, err)
	draws := strings.Split(strings.TrimSuffix(string(out), "\n"), "\r")
	var quarter, half bool
	for _, d := range draws {
		quarter = quarter || strings.Contains(d, " 25% [") && strings.Contains(d, "run 1/1 ours 1.50 GB/s")
		half = half || strings.Contains(d, " 50% [")
	}
	assert.True(t, quarter, "a quarter done mid-way through the first measurement: %q", draws)
	assert.True(t, half, "half done after it: %q", draws)
}
