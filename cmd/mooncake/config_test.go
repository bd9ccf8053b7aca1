package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/internal/size"
)

// nodeSettings reads `mooncake node`'s settings from args, as runNode does.
func nodeSettings(t *testing.T, args ...string) *settings {
	t.Helper()
	c := newNodeCmd()
	require.NoError(t, c.ParseFlags(args))
	s, err := newSettings(c, "MOONCAKE_CONFIG_PATH", nodeEnvs)
	require.NoError(t, err)
	return s
}

// A node's sizes mean what Mooncake means, wherever they are set: 16GB is
// 16 GiB (it was 16*10^9 when the CLI borrowed bench/te's parser).
func TestNodeSizesAreBinary(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "node.json")
	require.NoError(t, os.WriteFile(cfg, []byte(`{"local_buffer_size": "512MB"}`), 0o600))
	t.Setenv("MOONCAKE_CONFIG_PATH", "")
	t.Setenv("MOONCAKE_GLOBAL_SEGMENT_SIZE", "")
	t.Setenv("MC_NODE_GLOBAL_SEGMENT_SIZE", "")
	t.Setenv("MOONCAKE_LOCAL_BUFFER_SIZE", "")
	t.Setenv("MC_NODE_LOCAL_BUFFER_SIZE", "")
	t.Setenv("MC_NODE_SSD_SIZE", "")

	s := nodeSettings(t, "--global_segment_size", "16GB", "--ssd_size", "2tb", "--config_path", cfg)
	for key, want := range map[string]int64{
		"global_segment_size": 16 << 30,  // a flag
		"ssd_size":            2 << 40,   // lower case
		"local_buffer_size":   512 << 20, // Mooncake's config file
	} {
		got, err := s.size(key)
		require.NoError(t, err, key)
		assert.Equal(t, want, got, key)
	}

	t.Setenv("MOONCAKE_GLOBAL_SEGMENT_SIZE", "4GB") // Mooncake's launcher's variable
	got, err := nodeSettings(t).size("global_segment_size")
	require.NoError(t, err)
	assert.Equal(t, int64(4<<30), got)
}

// A bad size names the flag and the value, and is size.ErrSyntax.
func TestSizeErrorNamesFlag(t *testing.T) {
	_, err := nodeSettings(t, "--global_segment_size", "16 furlongs").size("global_segment_size")
	assert.ErrorIs(t, err, size.ErrSyntax)
	assert.ErrorContains(t, err, "--global_segment_size")
	assert.ErrorContains(t, err, `"16 furlongs"`)
}
