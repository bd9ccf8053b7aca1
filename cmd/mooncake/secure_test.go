package main

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/internal/secure"
	"github.com/mooncake-go/mooncake/store/client"
	"github.com/mooncake-go/mooncake/store/cluster"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// TestMasterNodeSecurityFlags: `mooncake master` with its token from
// MC_AUTH_TOKEN and mutual TLS from flags refuses callers without them,
// on gRPC and admin HTTP; so does `mooncake metadata` with its token from
// a file; `mooncake node` with --auth_token_file and the --master_tls_*
// and --metadata_tls_* flags mounts its segment, and one without the
// token, or without the metadata server's TLS, fails saying why.
func TestMasterNodeSecurityFlags(t *testing.T) {
	dir := t.TempDir()
	files, err := secure.Generate(dir)
	require.NoError(t, err)
	const token = "cmd-test-token"
	tokenFile := filepath.Join(dir, "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte(token+"\n"), 0o600))

	m := selfCommand(t, "master", "--rpc_address", "127.0.0.1", "--rpc_port", "0",
		"--metrics_host", "127.0.0.1", "--metrics_port", "0",
		"--tls_cert_file", files.ServerCert, "--tls_key_file", files.ServerKey, "--tls_client_ca_file", files.CA)
	m.Env = append(m.Env, "MC_AUTH_TOKEN="+token)
	line := startProc(t, m, "master listening")
	rpc, admin := field(line, "rpc="), field(line, "admin=")

	tc, err := files.ClientTLS().Client()
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tt := range []struct {
		name  string
		token string
		want  codes.Code
	}{
		// The certificate alone: refused.
		{"no token", "", codes.Unauthenticated},
		{"token", token, codes.OK},
	} {
		opts := []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(tc))}
		if tt.token != "" {
			opts = append(opts, grpc.WithPerRPCCredentials(secure.PerRPC(tt.token)))
		}
		conn, err := grpc.NewClient(rpc, opts...)
		require.NoError(t, err)
		_, err = storepb.NewMasterClient(conn).Ping(ctx, &storepb.PingRequest{ClientId: "x"})
		assert.Equal(t, tt.want, status.Code(err), "%s: %v", tt.name, err)
		_ = conn.Close()
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tc}}
	resp, err := hc.Get("https://" + admin + "/health")
	require.NoError(t, err)
	_ = resp.Body.Close()
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, "admin /health without the token")

	md := selfCommand(t, "metadata", "--port", "0", "--auth_token_file", tokenFile,
		"--tls_cert_file", files.ServerCert, "--tls_key_file", files.ServerKey, "--tls_client_ca_file", files.CA)
	mdURL := startProc(t, md, "https://")
	resp, err = hc.Get(mdURL + "?key=x")
	require.NoError(t, err)
	_ = resp.Body.Close()
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, "metadata without the token")

	nodeArgs := []string{"node", "--master", rpc, "--metadata_server", mdURL, "--global_segment_size", "16MiB", "--local_buffer_size", "1MiB",
		"--local_hostname", "127.0.0.1",
		"--master_tls_ca_file", files.CA, "--master_tls_cert_file", files.ClientCert, "--master_tls_key_file", files.ClientKey,
		"--metadata_tls_ca_file", files.CA, "--metadata_tls_cert_file", files.ClientCert, "--metadata_tls_key_file", files.ClientKey}
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		// No token: the metadata server (first) refuses it.
		{"no token", nil, "missing bearer token"},
		// No CA for the metadata server: its certificate is unknown.
		{"no metadata TLS", []string{"--auth_token_file", tokenFile, "--metadata_tls_ca_file", ""}, "certificate"},
	} {
		// Bounded: a node let in would serve until stopped.
		bare := selfCommand(t, append(slices.Clone(nodeArgs), tt.args...)...)
		bare.Stderr = nil
		timer := time.AfterFunc(20*time.Second, func() { _ = bare.Process.Kill() })
		out, err := bare.CombinedOutput()
		timer.Stop()
		require.Error(t, err, "%s: the node ran: %s", tt.name, out)
		assert.Contains(t, string(out), tt.want, tt.name)
	}

	startProc(t, selfCommand(t, append(nodeArgs, "--auth_token_file", tokenFile)...), cluster.ReadyLine(""))
}

// field is the value of "name=value" in a space-separated line.
func field(line, name string) string {
	for w := range strings.FieldsSeq(line) {
		if v, ok := strings.CutPrefix(w, name); ok {
			return v
		}
	}
	return ""
}

// TestConductorTokenFlags: `mooncake conductor --auth-token-file` requires
// the token on the instance API and leaves /health and the OpenAI routes
// open; --auth-inference (here from the environment) closes those too.
func TestConductorTokenFlags(t *testing.T) {
	tokenFile := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte("cond-token\n"), 0o600))
	for _, tt := range []struct {
		name       string
		env        []string
		modelsOpen bool
	}{
		{"admin only", nil, true},
		{"inference too", []string{"MC_CONDUCTOR_AUTH_INFERENCE=true"}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cmd := selfCommand(t, "conductor", "--listen", "127.0.0.1:0", "--auth-token-file", tokenFile)
			cmd.Env = append(cmd.Env, tt.env...)
			url := field(startProc(t, cmd, "conductor listening "), "http://")
			get := func(path, token string) int {
				req, err := http.NewRequest(http.MethodGet, "http://"+url+path, nil)
				require.NoError(t, err)
				if token != "" {
					req.Header.Set("Authorization", "Bearer "+token)
				}
				resp, err := http.DefaultClient.Do(req)
				require.NoError(t, err)
				_ = resp.Body.Close()
				return resp.StatusCode
			}
			assert.Equal(t, http.StatusUnauthorized, get("/v1/instances", ""))
			assert.Equal(t, http.StatusUnauthorized, get("/v1/instances", "other"))
			assert.Equal(t, http.StatusOK, get("/v1/instances", "cond-token"))
			assert.NotEqual(t, http.StatusUnauthorized, get("/health", ""))
			assert.Equal(t, tt.modelsOpen, get("/v1/models", "") != http.StatusUnauthorized)
		})
	}
}

// TestUpSecure: `mooncake up --secure` writes a CA, certificates, a token
// and a Transfer Engine secret, its node processes present them, a client
// without them is refused (by the master, or by the node's engine for the
// secret), and one with the printed files stores and reads.
func TestUpSecure(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "sec")
	cmd := selfCommand(t, "up", "--etcd", "127.0.0.1:0", "--rpc_port", "0", "--metrics_port", "0",
		"--global_segment_size", "16MiB", "--node-processes", "--secure", "--secure-dir", dir)
	line := startProc(t, cmd, "clients   --master ")
	words := strings.Fields(line) // "clients --master URL --auth_token_file ..."
	url := words[slices.Index(words, "--master")+1]
	token, err := secure.ReadToken("", filepath.Join(dir, "token"))
	require.NoError(t, err)
	assert.Len(t, token, 64)
	teSecret, err := secure.ReadToken("", filepath.Join(dir, "te_secret"))
	require.NoError(t, err)
	files := secure.Files{CA: filepath.Join(dir, "ca.pem"),
		ClientCert: filepath.Join(dir, "client.pem"), ClientKey: filepath.Join(dir, "client-key.pem")}

	for _, tt := range []struct {
		name     string
		tls      secure.TLS
		token    string
		teSecret string
		want     string // in New's error, or in Put's with putFails; "": it works
		putFails bool
	}{
		{"plaintext", secure.TLS{}, token, teSecret, "deadline exceeded", false},
		{"no token", files.ClientTLS(), "", teSecret, "missing bearer token", false},
		// The master lets it in; the node's engine does not.
		{"no TE secret", files.ClientTLS(), token, "", "", true},
		{"all", files.ClientTLS(), token, teSecret, "", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := client.Config{Master: url, SegmentSize: client.NoSegment, LocalBufferSize: 1 << 20,
				RPCTimeout: 3 * time.Second, MasterTLS: tt.tls, Token: tt.token,
				EngineConfig: engine.Config{Host: "127.0.0.1", Secret: tt.teSecret, Timeout: 3 * time.Second}}
			c, err := client.New(context.Background(), cfg)
			if tt.want != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.want)
				return
			}
			require.NoError(t, err)
			defer c.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			k := "k-" + tt.name
			err = c.Put(ctx, k, []byte("secure"), nil)
			if tt.putFails {
				require.Error(t, err, "a put reached a node whose engine requires a secret without it")
				return
			}
			// The node process presented its credentials: its segment
			// takes the put.
			require.NoError(t, err)
			got, err := c.Get(ctx, k)
			require.NoError(t, err)
			assert.Equal(t, "secure", string(got))
		})
	}
	stopOnSIGTERM(t, cmd, "up")
}

// TestIndexerTokenFlags: `mooncake indexer` with MC_AUTH_TOKEN requires
// it on its API and leaves /health open.
func TestIndexerTokenFlags(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "conductor_config.json")
	require.NoError(t, os.WriteFile(cfg, []byte(`{"http_server_port": 13333, "kvevent_instance": {}}`), 0o600))
	cmd := selfCommand(t, "indexer", "--config", cfg, "--listen", "127.0.0.1:0")
	cmd.Env = append(cmd.Env, "MC_AUTH_TOKEN=idx-token")
	base := strings.Fields(strings.TrimPrefix(startProc(t, cmd, "indexer listening "), "indexer listening "))[0]
	get := func(path, token string) int {
		req, err := http.NewRequest(http.MethodGet, base+path, nil)
		require.NoError(t, err)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	assert.Equal(t, http.StatusUnauthorized, get("/services", ""))
	assert.Equal(t, http.StatusUnauthorized, get("/services", "other"))
	assert.Equal(t, http.StatusOK, get("/services", "idx-token"))
	assert.Equal(t, http.StatusOK, get("/health", ""))
}

// TestConductorTLSFlags: `mooncake conductor` with --tls-* serves https
// with mutual TLS: a client without a certificate is refused at the
// handshake, one with it is answered.
func TestConductorTLSFlags(t *testing.T) {
	files, err := secure.Generate(t.TempDir())
	require.NoError(t, err)
	cmd := selfCommand(t, "conductor", "--listen", "127.0.0.1:0",
		"--tls-cert-file", files.ServerCert, "--tls-key-file", files.ServerKey, "--tls-client-ca-file", files.CA)
	addr := field(startProc(t, cmd, "conductor listening "), "https://")
	require.NotEmpty(t, addr)
	client := func(s secure.TLS) *http.Client {
		tc, err := s.Client()
		require.NoError(t, err)
		return &http.Client{Transport: &http.Transport{TLSClientConfig: tc}}
	}
	noCert := files.ClientTLS()
	noCert.CertFile, noCert.KeyFile = "", ""
	_, err = client(noCert).Get("https://" + addr + "/v1/instances")
	require.Error(t, err, "a client without a certificate was answered")
	// The server's alert, or the reset after it, whichever the client reads first.
	assert.Regexp(t, "certificate required|connection reset|broken pipe|EOF", err.Error())
	resp, err := client(files.ClientTLS()).Get("https://" + addr + "/v1/instances")
	require.NoError(t, err)
	_ = resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
}

// --master_tls_server_name: a node verifies a master whose certificate
// names no address it dials (one name for every master, e.g. a Service's)
// for that name; without it the node refuses the master.
func TestNodeMasterTLSServerName(t *testing.T) {
	files, err := secure.GenerateFor(t.TempDir(), "masters.mooncake.test")
	require.NoError(t, err)
	m := selfCommand(t, "master", "--rpc_address", "127.0.0.1", "--rpc_port", "0",
		"--metrics_host", "127.0.0.1", "--metrics_port", "0",
		"--tls_cert_file", files.ServerCert, "--tls_key_file", files.ServerKey)
	rpc := field(startProc(t, m, "master listening"), "rpc=")
	nodeArgs := []string{"node", "--master", rpc, "--global_segment_size", "16MiB", "--local_buffer_size", "1MiB",
		"--local_hostname", "127.0.0.1", "--master_tls_ca_file", files.CA}

	bare := selfCommand(t, nodeArgs...)
	bare.Stderr = nil
	// It names the cause at once: a certificate it refuses is refused again
	// on every try (it used to retry its mount to the RPC deadline, 30 s).
	timer := time.AfterFunc(90*time.Second, func() { _ = bare.Process.Kill() })
	began := time.Now()
	out, err := bare.CombinedOutput()
	took := time.Since(began)
	timer.Stop()
	require.Error(t, err, "the node took a certificate for another name: %s", out)
	assert.Contains(t, string(out), "certificate for 127.0.0.1")
	assert.Less(t, took, 20*time.Second, "the node retried a certificate it refuses: %s", out)

	startProc(t, selfCommand(t, append(nodeArgs, "--master_tls_server_name", "masters.mooncake.test")...), cluster.ReadyLine(""))
}
