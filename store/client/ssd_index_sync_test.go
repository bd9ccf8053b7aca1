package client

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/store/storepb"
)

// A rewrite of the SSD tier's index is durable once it returns: the
// directory is synced after the rename, or a crash could bring the old
// file back, without the records appended to the new one since.
func TestSSDIndexRewriteSyncsDir(t *testing.T) {
	var synced []string
	old := syncDir
	syncDir = func(dir string) error {
		synced = append(synced, dir)
		return old(dir)
	}
	t.Cleanup(func() { syncDir = old })

	dir := t.TempDir()
	x := newIndex(filepath.Join(dir, "mooncake-ssd-0.idx"))
	x.byOff[0] = &storepb.DiskObject{Key: "k", Offset: 0, Size: 4096, Checksum: 1}
	x.byKey["k"] = 0
	require.NoError(t, x.rewrite())
	defer x.close()
	assert.Equal(t, []string{dir}, synced, "the directory synced after the rename")
	got, err := loadIndex(x.path)
	require.NoError(t, err)
	assert.Len(t, got.objects(), 1)
}
