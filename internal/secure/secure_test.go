package secure

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCheck(t *testing.T) {
	tests := []struct {
		name, header, want string
	}{
		{"right", "Bearer tok", ""},
		// Schemes are case-insensitive.
		{"lower-case scheme", "bearer tok", ""},
		{"none", "", msgMissing},
		{"empty token", "Bearer ", msgMissing},
		{"another scheme", "Basic dG9rOg==", msgMissing},
		{"wrong", "Bearer tik", msgWrong},
		// A prefix of the token is not the token.
		{"prefix", "Bearer to", msgWrong},
		{"longer", "Bearer toke", msgWrong},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, check(tt.header, "tok"))
		})
	}
}

func TestReadToken(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "token")
	require.NoError(t, os.WriteFile(file, []byte("  from-file \nignored\n"), 0o600))
	empty := filepath.Join(dir, "empty")
	require.NoError(t, os.WriteFile(empty, nil, 0o600))

	got, err := ReadToken("flag", file)
	require.NoError(t, err)
	assert.Equal(t, "flag", got, "the token itself wins over the file")
	got, err = ReadToken("", file)
	require.NoError(t, err)
	assert.Equal(t, "from-file", got)
	_, err = ReadToken("", empty)
	assert.ErrorContains(t, err, "is empty")
	_, err = ReadToken("", filepath.Join(dir, "missing"))
	assert.ErrorContains(t, err, "token file")
	got, err = ReadToken("", "")
	require.NoError(t, err)
	assert.Empty(t, got)
}

func TestGenerate(t *testing.T) {
	f, err := Generate(t.TempDir(), "node1", "10.0.0.1")
	require.NoError(t, err)
	srv, err := f.ServerTLS().Server()
	require.NoError(t, err)
	require.NotNil(t, srv.ClientCAs, "mutual TLS")
	cli, err := f.ClientTLS().Client()
	require.NoError(t, err)
	require.Len(t, cli.Certificates, 1)
	leaf := srv.Certificates[0].Leaf
	assert.Contains(t, leaf.DNSNames, "node1")
	assert.Len(t, leaf.IPAddresses, 3)
	st, err := os.Stat(f.ServerKey)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm(), "keys are the owner's")
}
