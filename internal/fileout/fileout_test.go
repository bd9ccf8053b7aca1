package fileout_test

import (
	"bufio"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/internal/fileout"
)

func TestWrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	require.NoError(t, os.WriteFile(path, []byte("old contents, longer"), 0o644))
	require.NoError(t, fileout.Write(path, func(w *bufio.Writer) error {
		_, err := w.WriteString("new")
		return err
	}))
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, "new", string(b))

	boom := errors.New("boom")
	require.ErrorIs(t, fileout.Write(path, func(*bufio.Writer) error { return boom }), boom)
	// path is a file: nothing can be created under it.
	require.ErrorIs(t, fileout.Write(filepath.Join(path, "not-a-dir"), func(*bufio.Writer) error { return nil }), syscall.ENOTDIR)
}
