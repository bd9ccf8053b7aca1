package trace

import (
	"os"
	"path/filepath"
	"regexp"
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
	p := &progress{w: f, bar: newBar(f, 100), total: 100, c: &c, start: time.Now().Add(-10 * time.Second)}
	p.draw(false)
	c.done.Store(100)
	p.draw(true)
	out, err := os.ReadFile(f.Name())
	require.NoError(t, err)
	s := string(out)
	require.True(t, strings.HasSuffix(s, "\n"), "the last line stays: %q", s)
	// Every redraw starts at the line's start and clears what is left of
	// it; the last one is the final state.
	draws := strings.Split(strings.TrimSuffix(s, "\n"), "\r")[1:]
	require.NotEmpty(t, draws)
	stats := "hit 30.0%/40.0% 2.00 GB 0.20 GB/s err 0"
	var mid string
	for _, d := range draws {
		assert.True(t, strings.HasSuffix(d, "\x1b[0K"), "%q", d)
		line := strings.TrimSuffix(d, "\x1b[0K")
		assert.LessOrEqual(t, len(line), 80, "no wider than the terminal: %q", line)
		if strings.Contains(line, "(25/100") {
			mid = line
		}
	}
	// Mid-way: the bar a quarter full, the count, time spent and left,
	// and the replay's figures with their rate.
	require.NotEmpty(t, mid, "a draw at 25 of 100: %q", draws)
	assert.Regexp(t, regexp.MustCompile(`^ +25% \[=+>?\.+\] \(25/100\) \[\d+s:\d+s\] `+
		regexp.QuoteMeta(stats)+`$`), mid)
	// At the end: full, with no time left.
	final := strings.TrimSuffix(draws[len(draws)-1], "\x1b[0K")
	assert.Regexp(t, regexp.MustCompile(`^ *100% \[=+\] \(100/100\) `+regexp.QuoteMeta(stats)+`$`), final)
	assert.NotContains(t, final, ".]", "no empty part")
}

func TestProgressPlain(t *testing.T) {
	// A writer that is no terminal gets plain lines, no bar, whatever its
	// size.
	f, err := os.Create(filepath.Join(t.TempDir(), "log"))
	require.NoError(t, err)
	defer f.Close()
	var c counters
	p := startProgress(f, time.Hour, 10, &c, time.Now())
	assert.Nil(t, p.bar)
	c.done.Store(10)
	p.stop()
	out, err := os.ReadFile(f.Name())
	require.NoError(t, err)
	assert.Equal(t, "trace: 10/10 requests (100%), hit 0.0% (bound 0.0%), 0.00 GB, 0.00 GB/s, 0 with errors, 0s\n",
		string(out))
}
