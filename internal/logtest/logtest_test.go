package logtest

import (
	"bytes"
	"log"
	"log/slog"
	"strings"
	"testing"
)

// While captured, slog and the log package write to the Buffer; afterwards
// both write where they did before, and not to the Buffer.
func TestCaptureRestores(t *testing.T) {
	var before bytes.Buffer
	out, flags := log.Writer(), log.Flags()
	log.SetOutput(&before)
	t.Cleanup(func() { log.SetOutput(out); log.SetFlags(flags) })

	var b *Buffer
	t.Run("captured", func(t *testing.T) {
		b = Capture(t)
		slog.Info("from slog")
		log.Print("from log")
	})
	if s := b.String(); !strings.Contains(s, "from slog") || !strings.Contains(s, "from log") {
		t.Fatalf("captured %q", s)
	}
	slog.Info("after slog")
	log.Print("after log")
	if s := b.String(); strings.Contains(s, "after") {
		t.Fatalf("still captured after the test: %q", s)
	}
	if s := before.String(); !strings.Contains(s, "after slog") || !strings.Contains(s, "after log") {
		t.Fatalf("the log package's output not restored: %q", s)
	}
}
