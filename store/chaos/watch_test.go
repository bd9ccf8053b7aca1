package chaos

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/store/client"
	"github.com/mooncake-go/mooncake/store/master"
)

// The watcher records the evictions of a real master (a pool too small
// for what is put), not its removals, and notes a watch that ended.
func TestWatcherRecordsEvictions(t *testing.T) {
	m, err := master.Start(master.ServerConfig{Listen: "127.0.0.1:0"})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.New(ctx, client.Config{Master: m.Addr(), SegmentSize: 1 << 20, LocalBufferSize: 1 << 20,
		EngineConfig: engine.Config{Host: "127.0.0.1"}})
	require.NoError(t, err)
	defer c.Close()

	h := NewHistory()
	w := newWatcher(h, func(context.Context) (string, error) { return m.Addr(), nil })
	wctx, stop := context.WithCancel(ctx)
	var done sync.WaitGroup
	done.Go(func() { w.run(wctx) })
	defer func() { stop(); done.Wait() }()

	// The watch is open once it sees a key put now.
	first := w.await("first")
	require.NoError(t, c.Put(ctx, "first", []byte("x"), nil))
	<-first
	require.NoError(t, c.Remove(ctx, "first", true))
	for i := range 200 {
		// 200 x 16 KiB in a 1 MiB pool: the master evicts.
		require.NoError(t, c.Put(ctx, fmt.Sprintf("k%03d", i), make([]byte, 16<<10), nil))
	}
	last := w.await("last")
	require.NoError(t, c.Put(ctx, "last", []byte("x"), nil))
	<-last
	ev := h.Evictions()
	require.NotEmpty(t, ev)
	for _, e := range ev {
		assert.True(t, strings.HasPrefix(e.Key, "k"), "%s: the removal is no eviction", e.Key)
	}

	// The master goes: the watch ends, and says so.
	require.NoError(t, m.Close())
	require.Eventually(t, func() bool { return len(h.Notes()) > 0 }, 10*time.Second, 10*time.Millisecond)
	assert.Contains(t, h.Notes()[0], "the eviction watch of master "+m.Addr()+" ended")
}

// A key readable when a watch ended and missing from the next snapshot
// went unseen; the history keeps it and the report names it beside a lost
// write of that key.
func TestWatcherResync(t *testing.T) {
	h := NewHistory()
	w := newWatcher(h, nil)
	w.resync(map[string]bool{"a": true, "b": true}, ms(10)) // the first snapshot
	assert.Empty(t, h.Vanished())
	w.lostAt = ms(20)
	w.resync(map[string]bool{"b": true, "c": true}, ms(30))
	assert.Equal(t, []Vanished{{Key: "a", From: ms(20), To: ms(30)}}, h.Vanished())

	lost := Anomaly{Kind: LostWrite, Key: "a", Get: read(1, 0, 0, 40, 50), Write: &Op{Kind: Put, Invoke: ms(5), Complete: ms(8)}}
	assert.Equal(t, " (the key went while no watch was open, 20ms..30ms: evicted unseen, or lost)", vanishedNote(lost, h.Vanished()))
	lost.Write.Invoke = ms(35) // written after: the gap says nothing about it
	assert.Empty(t, vanishedNote(lost, h.Vanished()))
}
