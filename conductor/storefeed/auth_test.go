package storefeed_test

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/mooncake-go/mooncake/conductor"
	"github.com/mooncake-go/mooncake/conductor/storefeed"
	"github.com/mooncake-go/mooncake/internal/secure"
	"github.com/mooncake-go/mooncake/store/master"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// warnings passes each Warn record's message and attributes to a channel.
type warnings chan string

func (w warnings) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (w warnings) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool { b.WriteString(" " + a.String()); return true })
	select {
	case w <- b.String():
	default:
	}
	return nil
}
func (w warnings) WithAttrs([]slog.Attr) slog.Handler { return w }
func (w warnings) WithGroup(string) slog.Handler      { return w }

// TestFeedAuth: a feed presents Config.Token and Config.TLS to a master
// that requires them, and gets its snapshot; without the token its watch
// is refused as Unauthenticated.
func TestFeedAuth(t *testing.T) {
	defer goleak.VerifyNone(t)
	files, err := secure.Generate(t.TempDir())
	require.NoError(t, err)
	const token = "feed-token"
	m, err := master.Start(master.ServerConfig{Listen: "127.0.0.1:0", Token: token, TLS: files.ServerTLS(),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	defer m.Close()
	require.NoError(t, m.Service().MountSegment(t.Context(), "c1", &storepb.Segment{Id: "s1", Name: "node-1", Base: 1 << 32,
		Size: 1 << 20, TransportEndpoint: "127.0.0.1:1", Protocol: "tcp"}))
	put(t, m, conductor.BlockKey("m@0", 0x11))

	run := func(cfg storefeed.Config, r *recorder) func() {
		f, err := storefeed.New(cfg, r)
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		ran := make(chan error, 1)
		go func() { ran <- f.Run(ctx) }()
		return func() {
			cancel()
			require.NoError(t, <-ran)
		}
	}
	base := storefeed.Config{Masters: []string{m.Addr()}, Retry: 10 * time.Millisecond, TLS: files.ClientTLS()}

	// Without the token: refused, and said so.
	warned := make(warnings, 1)
	cfg := base
	cfg.Logger = slog.New(warned)
	s, err := conductor.New(conductor.Config{})
	require.NoError(t, err)
	stop := run(cfg, &recorder{s: s, signal: make(chan struct{}, 1)})
	select {
	case w := <-warned:
		assert.Contains(t, w, "Unauthenticated")
		assert.Contains(t, w, "missing bearer token")
	case <-time.After(20 * time.Second):
		t.Fatal("no warning from a feed without the token")
	}
	stop()

	// With it: the snapshot.
	cfg = base
	cfg.Token, cfg.Logger = token, slog.New(slog.NewTextHandler(io.Discard, nil))
	r := &recorder{s: s, signal: make(chan struct{}, 1)}
	stop = run(cfg, r)
	assert.Equal(t, []call{{true, []uint64{0x11}}}, r.await(t, 1))
	stop()
}
