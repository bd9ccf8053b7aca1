package secure

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// TLS names the PEM files of one side of a TLS connection. The zero value
// is no TLS.
type TLS struct {
	// CertFile and KeyFile are this side's certificate (chain) and key: a
	// server's, required for it to serve TLS; a client's, presented to a
	// server that asks (mutual TLS). Zero, on a client: none.
	CertFile, KeyFile string
	// CAFile is a PEM bundle of CA certificates. On a server it enables
	// mutual TLS: a client must present a certificate one of them signed.
	// On a client it verifies the server. Zero: none (server), the system
	// roots (client).
	CAFile string
	// ServerName, on a client, is the name the server's certificate must
	// carry. Zero: the host dialed.
	ServerName string
}

// Enabled reports whether t asks for TLS: a server with a certificate, a
// client with a CA or a certificate.
func (t TLS) Enabled() bool { return t.CertFile != "" || t.KeyFile != "" || t.CAFile != "" }

// Server is the server configuration t names; nil, nil when t is zero.
// With a CAFile it requires and verifies client certificates.
func (t TLS) Server() (*tls.Config, error) {
	if !t.Enabled() {
		return nil, nil
	}
	if t.CertFile == "" || t.KeyFile == "" {
		return nil, errors.New("secure: a TLS server needs both a certificate file and a key file")
	}
	cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("secure: TLS certificate %s, key %s: %w", t.CertFile, t.KeyFile, err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if t.CAFile != "" {
		pool, err := loadPool(t.CAFile)
		if err != nil {
			return nil, err
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// Client is the client configuration t names; nil, nil when t is zero.
// A ServerName alone is refused: it would leave TLS off.
func (t TLS) Client() (*tls.Config, error) {
	if !t.Enabled() {
		if t.ServerName != "" {
			return nil, fmt.Errorf("secure: TLS server name %q without a CA file or a certificate, which turn TLS on", t.ServerName)
		}
		return nil, nil
	}
	cfg := &tls.Config{ServerName: t.ServerName, MinVersion: tls.VersionTLS12}
	if t.CAFile != "" {
		pool, err := loadPool(t.CAFile)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = pool
	}
	if t.CertFile != "" || t.KeyFile != "" {
		if t.CertFile == "" || t.KeyFile == "" {
			return nil, errors.New("secure: a TLS client certificate needs both a certificate file and a key file")
		}
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("secure: TLS client certificate %s, key %s: %w", t.CertFile, t.KeyFile, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

func loadPool(file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("secure: CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("secure: CA file %s holds no PEM certificate", file)
	}
	return pool, nil
}

// CheckPeer reports why t's certificate cannot serve a server at host
// among peers that dial each other with t (HA masters): they verify it for
// host against t's CAFile (else the system's roots) and, where t is
// mutual (a CAFile), take it as a client certificate too, which it must
// then be valid for. Nil: it can.
func (t TLS) CheckPeer(host string) error {
	cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
	if err != nil {
		return fmt.Errorf("secure: TLS certificate %s, key %s: %w", t.CertFile, t.KeyFile, err)
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		return fmt.Errorf("secure: TLS certificate %s: %w", t.CertFile, err)
	}
	opts := x509.VerifyOptions{DNSName: host, Intermediates: x509.NewCertPool(),
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	for _, der := range cert.Certificate[1:] {
		if c, err := x509.ParseCertificate(der); err == nil {
			opts.Intermediates.AddCert(c)
		}
	}
	if t.CAFile != "" {
		if opts.Roots, err = loadPool(t.CAFile); err != nil {
			return err
		}
	}
	if _, err := leaf.Verify(opts); err != nil {
		return fmt.Errorf("secure: TLS certificate %s, as peers verify it at %s: %w", t.CertFile, host, err)
	}
	if t.CAFile == "" {
		return nil
	}
	opts.DNSName, opts.KeyUsages = "", []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	if _, err := leaf.Verify(opts); err != nil {
		return fmt.Errorf("secure: TLS certificate %s, as a client certificate, which peers requiring one (mutual TLS) verify: %w", t.CertFile, err)
	}
	return nil
}
