package trace

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestProgressBar(t *testing.T) {
	// A file stands in for the terminal: its size is unknown, so the bar
	// takes 80 columns.
	f, err := os.Create(filepath.Join(t.TempDir(), "tty"))
	require.NoError(t, err)
	defer f.Close()
	var c counters
	c.done.Store(25)
	c.blocks.Store(1000)
	c.hits.Store(300)
	c.bound.Store(400)
	c.bytes.Store(2e9)
	p := &progress{w: f, fd: int(f.Fd()), total: 100, c: &c, start: time.Now().Add(-10 * time.Second)}
	p.draw(false)
	c.done.Store(100)
	p.draw(true)
	out, err := os.ReadFile(f.Name())
	require.NoError(t, err)
	lines := strings.Split(string(out), "\r")[1:]
	require.Len(t, lines, 2)
	for i, want := range []string{"25/100  25% hit 30.0%/40.0% 2.00 GB 0.20 GB/s err 0 eta 30s",
		"100/100 100%"} {
		l := lines[i]
		assert.True(t, strings.HasPrefix(l, "["), l)
		assert.Contains(t, l, "] "+want)
		bar := l[1:strings.Index(l, "]")]
		assert.Equal(t, i == 1, strings.Count(bar, " ") == 0, "full bar at the end: %q", bar)
		assert.Len(t, strings.TrimSuffix(strings.TrimSuffix(l, "\n"), "\x1b[K"), 79, "as wide as can be without wrapping")
	}
	assert.True(t, strings.HasSuffix(lines[0], "\x1b[K"))
	assert.True(t, strings.HasSuffix(lines[1], "\x1b[K\n"), "the last line stays")
	assert.NotContains(t, lines[1], "eta")
}
