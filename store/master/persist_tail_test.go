package master

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A crash in the middle of an append can leave the journal file longer
// than what reached the disk, the rest zeros (the size made durable before
// the data: XFS, ext4 without data=ordered). Zeros read as frames of no
// bytes whose CRC matches; at the tail of the newest file they are the torn
// append, never acknowledged, and the restart goes on without them.
func TestLocalJournalZeroTail(t *testing.T) {
	dir := t.TempDir()
	m := startLocal(t, dir, 1<<30)
	fill(t, m.Service(), 0, 10)
	want := view(m.Service())
	require.NoError(t, m.Close())

	logs, err := listSeq(dir, "journal-", ".log")
	require.NoError(t, err)
	last := filepath.Join(dir, journalName(logs[len(logs)-1]))
	f, err := os.OpenFile(last, os.O_WRONLY|os.O_APPEND, 0)
	require.NoError(t, err)
	_, err = f.Write(make([]byte, 4096))
	require.NoError(t, err)
	require.NoError(t, f.Close())

	m2, err := Start(ServerConfig{Listen: "127.0.0.1:0", Persist: &PersistConfig{Dir: dir}})
	require.NoError(t, err, "a zero-filled tail is a torn append, not damage")
	t.Cleanup(func() { _ = m2.Close() })
	assert.Equal(t, want, view(m2.Service()))
	put(t, m2.Service(), "a", "next", 1024, nil)
	want = view(m2.Service())
	require.NoError(t, m2.Close())
	assert.Equal(t, want, view(startLocal(t, dir, 1<<30).Service()))
}
