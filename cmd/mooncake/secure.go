package main

import (
	"fmt"
	"strings"

	"github.com/spf13/pflag"

	"github.com/mooncake-go/mooncake/internal/secure"
)

// Control-plane security flags. Everything is off by default, and servers
// stay wire-compatible with Mooncake's clients; a token and TLS can be
// turned on independently. Tokens are read from a file or the environment
// (MC_AUTH_TOKEN) as readily as from the command line, where every user of
// the machine could read them.

// tokenEnvs are the environment names of the token flags, after a
// command's own: one token serves every control plane of a cluster.
var tokenEnvs = map[string][]string{
	"auth_token":      {"MC_AUTH_TOKEN"},
	"auth_token_file": {"MC_AUTH_TOKEN_FILE"},
}

// withTokenEnvs adds tokenEnvs to envs, after the names it has.
func withTokenEnvs(envs map[string][]string) map[string][]string {
	out := make(map[string][]string, len(envs)+len(tokenEnvs))
	for k, v := range envs {
		out[k] = v
	}
	for k, v := range tokenEnvs {
		out[k] = append(append([]string(nil), out[k]...), v...)
	}
	return out
}

// addTokenFlags adds --auth_token and --auth_token_file; role says who
// uses the token ("requires", "presents").
func addTokenFlags(f *pflag.FlagSet, role string) {
	f.String("auth_token", "", "bearer token this "+role+" on every control-plane call (env MC_AUTH_TOKEN; empty: none)")
	f.String("auth_token_file", "", "file whose first line is --auth_token (env MC_AUTH_TOKEN_FILE)")
}

// addServerTLSFlags adds a server's TLS flags.
func addServerTLSFlags(f *pflag.FlagSet) {
	f.String("tls_cert_file", "", "PEM certificate the server presents: TLS on (empty: plaintext, as Mooncake)")
	f.String("tls_key_file", "", "PEM key of --tls_cert_file")
	f.String("tls_client_ca_file", "", "PEM CA bundle: clients must present a certificate it signed (mutual TLS)")
}

// addClientTLSFlags adds a client's TLS flags, prefix naming the server
// ("master_", "etcd_", "").
func addClientTLSFlags(f *pflag.FlagSet, prefix, server string) {
	f.String(prefix+"tls_ca_file", "", "PEM CA bundle verifying "+server+": TLS on (empty: plaintext)")
	f.String(prefix+"tls_cert_file", "", "PEM client certificate presented to "+server+" (mutual TLS)")
	f.String(prefix+"tls_key_file", "", "PEM key of --"+prefix+"tls_cert_file")
	f.String(prefix+"tls_server_name", "", "the name "+server+"'s certificate must carry (empty: the host dialed); needs --"+prefix+"tls_ca_file or a certificate")
}

// addEtcdTLSFlags adds the TLS flags of an etcd client.
func addEtcdTLSFlags(f *pflag.FlagSet) { addClientTLSFlags(f, "etcd_", "etcd") }

// readToken reads --auth_token, else --auth_token_file.
func readToken(str func(string) string) (string, error) {
	t, err := secure.ReadToken(strings.TrimSpace(str("auth_token")), str("auth_token_file"))
	if err != nil {
		return "", fmt.Errorf("--auth_token_file: %w", err)
	}
	return t, nil
}

// serverTLS reads addServerTLSFlags' flags.
func serverTLS(str func(string) string) secure.TLS {
	return secure.TLS{CertFile: str("tls_cert_file"), KeyFile: str("tls_key_file"), CAFile: str("tls_client_ca_file")}
}

// clientTLS reads addClientTLSFlags' flags of prefix.
func clientTLS(str func(string) string, prefix string) secure.TLS {
	return secure.TLS{CertFile: str(prefix + "tls_cert_file"), KeyFile: str(prefix + "tls_key_file"), CAFile: str(prefix + "tls_ca_file"),
		ServerName: str(prefix + "tls_server_name")}
}
