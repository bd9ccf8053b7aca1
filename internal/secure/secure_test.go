package secure

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

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

// A certificate serves peers that dial each other when it is signed by
// the CA they trust, names the host they dial and, under mutual TLS, is
// valid for client authentication.
func TestCheckPeer(t *testing.T) {
	dir := t.TempDir()
	f, err := Generate(dir, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	for _, host := range []string{"127.0.0.1", "localhost", "node-a"} {
		if err := f.ServerTLS().CheckPeer(host); err != nil {
			t.Errorf("%s: %v", host, err)
		}
	}
	if err := f.ServerTLS().CheckPeer("10.9.9.9"); err == nil {
		t.Error("a certificate for another host passed")
	}
	// GenerateFor's certificate names its hosts alone.
	named, err := GenerateFor(t.TempDir(), "masters.test")
	if err != nil {
		t.Fatal(err)
	}
	if err := named.ServerTLS().CheckPeer("masters.test"); err != nil {
		t.Errorf("masters.test: %v", err)
	}
	for _, host := range []string{"127.0.0.1", "localhost"} {
		if err := named.ServerTLS().CheckPeer(host); err == nil {
			t.Errorf("GenerateFor's certificate passed for %s", host)
		}
	}
	// A server's certificate valid for server authentication alone.
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "server only"},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	cert, keyFile := filepath.Join(dir, "so.pem"), filepath.Join(dir, "so-key.pem")
	if err := writePEM(cert, "CERTIFICATE", der, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := writePEM(keyFile, "PRIVATE KEY", keyDER, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := (TLS{CertFile: cert, KeyFile: keyFile, CAFile: f.CA}).CheckPeer("127.0.0.1"); err == nil {
		t.Error("under mutual TLS, a certificate without client authentication passed")
	}
	// Not signed by a CA the peers trust (the system's roots, without a CAFile).
	if err := (TLS{CertFile: cert, KeyFile: keyFile}).CheckPeer("127.0.0.1"); err == nil {
		t.Error("a certificate no root the peers use signed passed")
	}
	// The client certificate of f, signed by its CA: names no host.
	if err := (TLS{CertFile: f.ClientCert, KeyFile: f.ClientKey, CAFile: f.CA}).CheckPeer("127.0.0.1"); err == nil {
		t.Error("a certificate naming no host passed")
	}
}

// A client's server name alone would leave TLS off: refused.
func TestClientServerNameNeedsTLS(t *testing.T) {
	if _, err := (TLS{ServerName: "masters.test"}).Client(); err == nil {
		t.Error("a server name alone gave a plaintext client")
	}
	if c, err := (TLS{}).Client(); c != nil || err != nil {
		t.Errorf("zero: %v, %v", c, err)
	}
}
