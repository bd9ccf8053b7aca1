package client

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/internal/framerpc"
	"github.com/mooncake-go/mooncake/internal/secure"
	"github.com/mooncake-go/mooncake/store/master"
)

// The client's calls to a plaintext master go as frames
// (internal/framerpc) on its gRPC port, through the master's token check;
// Config.MasterGRPC keeps them on gRPC. Either way puts and gets work.
func TestMasterCallsAsFrames(t *testing.T) {
	const token = "frames-token"
	m, err := master.Start(master.ServerConfig{Listen: "127.0.0.1:0", Token: token})
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close() })
	dial := func(t *testing.T, token string, grpcOnly bool) (*Client, error) {
		return dialFor(t, m.Addr(), func(c *Config) { c.Token, c.MasterGRPC = token, grpcOnly })
	}
	_, err = dial(t, "", false)
	require.Error(t, err, "a framed call without the token was served")
	assert.Contains(t, err.Error(), "missing bearer token")
	_, err = dial(t, "other", false)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "wrong bearer token")

	for _, grpcOnly := range []bool{false, true} {
		c, err := dial(t, token, grpcOnly)
		require.NoError(t, err)
		frames := putGetFrames(t, c, 7)
		if grpcOnly {
			assert.Nil(t, frames, "Config.MasterGRPC sent frames")
			continue
		}
		require.NotNil(t, frames)
		assert.True(t, frames.Framed(), "the master did not answer the frames' preface")
		assert.Positive(t, frames.Calls(), "no call went as a frame")
	}
}

// dialFor is a client of the master at addr, without a segment of its
// own, as opt makes it; closed at the test's end.
func dialFor(t *testing.T, addr string, opt func(*Config)) (*Client, error) {
	cfg := Config{Master: addr, SegmentSize: 1 << 20, LocalBufferSize: 1 << 20,
		EngineConfig: engine.Config{Host: "127.0.0.1"}, RPCTimeout: 2 * time.Second}
	opt(&cfg)
	c, err := New(context.Background(), cfg)
	if err == nil {
		t.Cleanup(func() { _ = c.Close() })
	}
	return c, err
}

// putGetFrames puts and gets back a value seeded by seed through c and
// returns the frames of c's connection to the master (nil: gRPC alone).
func putGetFrames(t *testing.T, c *Client, seed uint64) *framerpc.Conn {
	ctx := ctxT(t)
	v := value(seed, 4096)
	require.NoError(t, c.Put(ctx, "k", v, nil))
	got, err := c.Get(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, v, got)
	c.master.mu.Lock()
	defer c.master.mu.Unlock()
	return c.master.frames
}

// Under mutual TLS the client's calls go as frames inside TLS; a client
// without a certificate gets nothing, over frames or gRPC.
func TestMasterCallsAsFramesOverTLS(t *testing.T) {
	files, err := secure.Generate(t.TempDir())
	require.NoError(t, err)
	m, err := master.Start(master.ServerConfig{Listen: "127.0.0.1:0", TLS: files.ServerTLS()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close() })
	dial := func(tlsCfg secure.TLS) (*Client, error) {
		return dialFor(t, m.Addr(), func(c *Config) { c.MasterTLS = tlsCfg })
	}
	_, err = dial(secure.TLS{CAFile: files.CA})
	require.Error(t, err, "a client without a certificate was served")

	c, err := dial(files.ClientTLS())
	require.NoError(t, err)
	frames := putGetFrames(t, c, 8)
	require.NotNil(t, frames)
	assert.True(t, frames.Framed(), "the TLS master did not answer the frames' preface")
	assert.Positive(t, frames.Calls(), "no call went as a frame")
}
