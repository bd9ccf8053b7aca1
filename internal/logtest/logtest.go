// Package logtest captures the process's default logger for a test.
package logtest

import (
	"bytes"
	"log"
	"log/slog"
	"sync"
	"testing"
)

// Buffer is what the default logger wrote while captured; safe for use by
// the goroutines that log.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Capture sends slog's default logger, as text, to the Buffer it returns
// until t ends. The log package's output and flags are restored with it:
// slog.SetDefault routes the log package to the new handler, and setting
// the old default back leaves that route in place.
func Capture(t testing.TB) *Buffer {
	t.Helper()
	b := &Buffer{}
	old, out, flags := slog.Default(), log.Writer(), log.Flags()
	slog.SetDefault(slog.New(slog.NewTextHandler(b, nil)))
	t.Cleanup(func() {
		slog.SetDefault(old)
		log.SetOutput(out)
		log.SetFlags(flags)
	})
	return b
}
