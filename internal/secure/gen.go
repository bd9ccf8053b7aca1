package secure

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Files are the PEM files Generate writes.
type Files struct {
	CA                    string // the CA's certificate: servers' client CA, clients' CA
	ServerCert, ServerKey string
	ClientCert, ClientKey string
}

// ServerTLS is the server side of f, mutual.
func (f Files) ServerTLS() TLS {
	return TLS{CertFile: f.ServerCert, KeyFile: f.ServerKey, CAFile: f.CA}
}

// ClientTLS is the client side of f, with the client certificate.
func (f Files) ClientTLS() TLS {
	return TLS{CertFile: f.ClientCert, KeyFile: f.ClientKey, CAFile: f.CA}
}

// Generate writes into dir a new self-signed CA and a server and a client
// certificate it signed, valid for a year: the server's for hosts (names
// or IP addresses) and localhost, 127.0.0.1 and ::1. The keys are written
// readable by the owner only. It is meant for tests and for a cluster
// that has no PKI of its own (`mooncake up --secure`); the CA's key is not
// kept, so the set cannot grow: generate another.
func Generate(dir string, hosts ...string) (Files, error) {
	return generate(dir, true, hosts)
}

// GenerateFor is Generate with a server certificate for hosts alone, not
// the loopback names: for peers that verify one another by a name of
// their own (HA masters with HAConfig.PeerServerName).
func GenerateFor(dir string, hosts ...string) (Files, error) {
	return generate(dir, false, hosts)
}

func generate(dir string, loopback bool, hosts []string) (Files, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Files{}, fmt.Errorf("secure: %w", err)
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Files{}, fmt.Errorf("secure: CA key: %w", err)
	}
	now := time.Now().Add(-time.Minute) // a clock a little behind still accepts it
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "mooncake-go CA"},
		NotBefore:             now,
		NotAfter:              now.Add(365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return Files{}, fmt.Errorf("secure: CA certificate: %w", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return Files{}, fmt.Errorf("secure: CA certificate: %w", err)
	}
	f := Files{
		CA:         filepath.Join(dir, "ca.pem"),
		ServerCert: filepath.Join(dir, "server.pem"), ServerKey: filepath.Join(dir, "server-key.pem"),
		ClientCert: filepath.Join(dir, "client.pem"), ClientKey: filepath.Join(dir, "client-key.pem"),
	}
	if err := writePEM(f.CA, "CERTIFICATE", caDER, 0o644); err != nil {
		return Files{}, err
	}
	// A server's certificate is also its client certificate toward the
	// other servers (an HA master's standby fetching from its leader).
	server := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "mooncake-go server"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	if loopback {
		server.DNSNames = []string{"localhost"}
		server.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			server.IPAddresses = append(server.IPAddresses, ip)
		} else if h != "" {
			server.DNSNames = append(server.DNSNames, h)
		}
	}
	client := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "mooncake-go client"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	for _, leaf := range []struct {
		tmpl      *x509.Certificate
		cert, key string
	}{{server, f.ServerCert, f.ServerKey}, {client, f.ClientCert, f.ClientKey}} {
		leaf.tmpl.SerialNumber, leaf.tmpl.NotBefore, leaf.tmpl.NotAfter = serial(), now, ca.NotAfter
		leaf.tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return Files{}, fmt.Errorf("secure: key: %w", err)
		}
		der, err := x509.CreateCertificate(rand.Reader, leaf.tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return Files{}, fmt.Errorf("secure: certificate %s: %w", leaf.cert, err)
		}
		keyDER, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			return Files{}, fmt.Errorf("secure: key %s: %w", leaf.key, err)
		}
		if err := writePEM(leaf.cert, "CERTIFICATE", der, 0o644); err != nil {
			return Files{}, err
		}
		if err := writePEM(leaf.key, "PRIVATE KEY", keyDER, 0o600); err != nil {
			return Files{}, err
		}
	}
	return f, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}

func writePEM(path, typ string, der []byte, mode os.FileMode) error {
	b := pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
	if err := os.WriteFile(path, b, mode); err != nil {
		return fmt.Errorf("secure: %w", err)
	}
	return nil
}
