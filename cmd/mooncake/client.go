package main

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/internal/secure"
	"github.com/mooncake-go/mooncake/store/client"
	"github.com/mooncake-go/mooncake/store/cluster"
	"github.com/mooncake-go/mooncake/store/realclient"
)

// clientEnvs are the environment names of `mooncake client`'s settings:
// Mooncake's Python launcher's first, then ours.
var clientEnvs = map[string][]string{
	"master_server_address":    {"MOONCAKE_MASTER", "MC_CLIENT_MASTER"},
	"metadata_server":          {"MOONCAKE_TE_META_DATA_SERVER", "MC_CLIENT_METADATA_SERVER"},
	"protocol":                 {"MOONCAKE_PROTOCOL", "MC_CLIENT_PROTOCOL"},
	"global_segment_size":      {"MOONCAKE_GLOBAL_SEGMENT_SIZE", "MC_CLIENT_GLOBAL_SEGMENT_SIZE"},
	"local_buffer_size":        {"MOONCAKE_LOCAL_BUFFER_SIZE", "MC_CLIENT_LOCAL_BUFFER_SIZE"},
	"host":                     {"MOONCAKE_LOCAL_HOSTNAME", "MC_CLIENT_HOST"},
	"tenant_id":                {"MOONCAKE_TENANT_ID"},
	"cluster_id":               {"MC_STORE_CLUSTER_ID"},
	"enable_http_server":       {"MOONCAKE_ENABLE_CLIENT_HTTP_SERVER"},
	"http_port":                {"MOONCAKE_CLIENT_HTTP_PORT"},
	"ssd_dir":                  {"MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", "MC_CLIENT_SSD_DIR"},
	"auth_token":               {"MC_CLIENT_AUTH_TOKEN", "MC_AUTH_TOKEN"},
	"auth_token_file":          {"MC_CLIENT_AUTH_TOKEN_FILE", "MC_AUTH_TOKEN_FILE"},
	"te_secret_file":           {"MC_CLIENT_TE_SECRET_FILE", "MC_TE_SECRET_FILE"},
	"master_tls_ca_file":       {"MC_CLIENT_MASTER_TLS_CA_FILE"},
	"master_tls_cert_file":     {"MC_CLIENT_MASTER_TLS_CERT_FILE"},
	"master_tls_key_file":      {"MC_CLIENT_MASTER_TLS_KEY_FILE"},
	"master_tls_server_name":   {"MC_CLIENT_MASTER_TLS_SERVER_NAME"},
	"etcd_tls_ca_file":         {"MC_CLIENT_ETCD_TLS_CA_FILE"},
	"etcd_tls_cert_file":       {"MC_CLIENT_ETCD_TLS_CERT_FILE"},
	"etcd_tls_key_file":        {"MC_CLIENT_ETCD_TLS_KEY_FILE"},
	"etcd_tls_server_name":     {"MC_CLIENT_ETCD_TLS_SERVER_NAME"},
	"metadata_tls_ca_file":     {"MC_CLIENT_METADATA_TLS_CA_FILE"},
	"metadata_tls_cert_file":   {"MC_CLIENT_METADATA_TLS_CERT_FILE"},
	"metadata_tls_key_file":    {"MC_CLIENT_METADATA_TLS_KEY_FILE"},
	"metadata_tls_server_name": {"MC_CLIENT_METADATA_TLS_SERVER_NAME"},
}

func newClientCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "client",
		Short: "Run a real client (Mooncake's mooncake_client): a segment in the pool, shared by dummy clients on this host",
		Long: `Mounts --global_segment_size bytes into the pool of the master at
--master_server_address, as a storage node does, and serves the dummy
clients of this host: processes that call setup_dummy(mem_pool_size,
local_buffer_size, "127.0.0.1:<port>") (SGLang's standalone storage, vLLM's
standalone-store mode, the tensor-parallel ranks of one server) forward
their puts and gets to it and share its pool and transfer engine.

Dummy clients connect over a unix socket, by default the abstract name
"@mooncake_client.<port>" (--port, the official real client's 50052);
each gets its memory pool and staging buffer as shared memory with this
process, so its values never cross the socket (docs/client-modes.md).
The flags are the official mooncake_client's; --threads, --device_names and
the mmap arena flags are accepted and have no effect here.`,
		Example: `  mooncake client --master_server_address 127.0.0.1:50051 --metadata_server P2PHANDSHAKE --global_segment_size 4GB`,
		Args:    cobra.NoArgs,
		RunE:    runClient,
	}
	f := c.Flags()
	// The official mooncake_client's flags and defaults.
	f.String("host", "0.0.0.0", "local hostname: the address peers reach this client's segment at (0.0.0.0: the first non-loopback IPv4)")
	f.Int("port", realclient.DefaultPort, "real client service port: dummy clients name it in setup_dummy's server_address")
	f.String("global_segment_size", "4 GB", "size of the segment this client contributes to the pool (units are 1024-based)")
	f.String("local_buffer_size", "0", "size of the local staging buffer (0: 16 MiB)")
	f.String("master_server_address", "127.0.0.1:50051", "master address, or etcd://... under HA")
	f.String("metadata_server", "http://127.0.0.1:8080/metadata", "Transfer Engine metadata: P2PHANDSHAKE, etcd://, http://")
	f.String("protocol", "tcp", "Transfer Engine protocol (tcp)")
	f.String("device_names", "", "RDMA device names (unused: tcp)")
	f.String("tenant_id", "default", "tenant identifier: the tenant of this client and of its dummy clients")
	f.Int("threads", 1, "threads of the client service (unused: Go schedules the calls)")
	f.Bool("enable_offload", false, "offload evicted objects to an SSD tier in $MOONCAKE_OFFLOAD_FILE_STORAGE_PATH (or --ssd_dir)")
	f.Bool("start_offload_rpc_server", true, "accepted for compatibility (SSD reads go through the transfer engine)")
	f.Bool("enable_http_server", false, "serve /health and /metrics over HTTP")
	f.Int("http_port", 9300, "port of the HTTP server (0 picks one)")
	f.Uint64("mmap_arena_pool_size", 8589934592, "accepted for compatibility (unused)")
	f.Bool("use_mmap_arena_allocator", false, "accepted for compatibility (unused)")
	// Ours.
	f.String("socket", "", "unix socket for dummy clients: a path or @abstract-name (zero: @mooncake_client.<port>)")
	f.Bool("dummy_any_user", false, "accept dummy clients run by any user (default: this process's user and root only)")
	f.String("transport", "auto", "data path to peers: auto (shared memory on this host, else TCP) or tcp")
	f.String("cluster_id", client.DefaultClusterID, "HA cluster name")
	f.String("ssd_dir", "", "directory of the SSD tier of --enable_offload")
	f.String("ssd_size", "16GiB", "size of the SSD tier file")
	addTokenFlags(f, "client presents")
	addClientTLSFlags(f, "master_", "the master")
	addEtcdTLSFlags(f)
	addClientTLSFlags(f, "metadata_", "an https:// metadata server")
	f.String("te_secret_file", "", "file whose first line is the Transfer Engine's shared secret (MC_TE_SECRET sets it too)")
	addConfigFlag(f, "MOONCAKE_CONFIG_PATH")
	return c
}

// clientConfig reads the store client's configuration from s.
func clientConfig(s *settings, reg prometheus.Registerer) (client.Config, error) {
	if p := s.str("protocol"); p != "tcp" {
		return client.Config{}, fmt.Errorf("--protocol %q: only tcp is built (RDMA comes with hardware)", p)
	}
	seg, err := s.size("global_segment_size")
	if err != nil {
		return client.Config{}, err
	}
	if seg <= 0 {
		return client.Config{}, fmt.Errorf("--global_segment_size must be positive: a real client contributes the pool its dummies use")
	}
	buf, err := s.size("local_buffer_size")
	if err != nil {
		return client.Config{}, err
	}
	if buf == 0 {
		buf = 16 << 20 // the official default of 0 is no buffer; ours stages Go-memory values
	}
	// The dummies of this client act in its tenant, as the official ones do.
	cfg := client.Config{Master: s.str("master_server_address"), ClusterID: s.str("cluster_id"),
		SegmentSize: seg, LocalBufferSize: buf, Registerer: reg, TenantID: s.str("tenant_id")}
	if s.boolean("enable_offload") {
		if cfg.SSDDir = s.str("ssd_dir"); cfg.SSDDir == "" {
			return client.Config{}, fmt.Errorf("--enable_offload needs a directory: MOONCAKE_OFFLOAD_FILE_STORAGE_PATH or --ssd_dir")
		}
		if cfg.SSDSize, err = s.size("ssd_size"); err != nil {
			return client.Config{}, err
		}
	}
	if cfg.Token, err = readToken(s.str); err != nil {
		return client.Config{}, err
	}
	cfg.MasterTLS, cfg.EtcdTLS = clientTLS(s.str, "master_"), clientTLS(s.str, "etcd_")
	secret, err := secure.ReadToken("", s.str("te_secret_file"))
	if err != nil {
		return client.Config{}, fmt.Errorf("--te_secret_file: %w", err)
	}
	host := s.str("host")
	if host == "0.0.0.0" {
		host = "" // the engine picks the address peers reach
	}
	cfg.EngineConfig = engine.Config{Metadata: s.str("metadata_server"), Host: host, Transport: s.str("transport"),
		Registerer: reg, MetadataToken: cfg.Token, MetadataTLS: metadataTLS(s.str), Secret: secret}
	return cfg, nil
}

func runClient(cmd *cobra.Command, _ []string) error {
	s, err := newSettings(cmd, "MOONCAKE_CONFIG_PATH", clientEnvs)
	if err != nil {
		return err
	}
	sock := s.str("socket")
	if sock == "" {
		if sock, err = realclient.SocketFor(strconv.Itoa(s.integer("port"))); err != nil {
			return fmt.Errorf("--port: %w", err)
		}
	}
	reg := prometheus.NewRegistry()
	cfg, err := clientConfig(s, reg)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	c, err := client.New(ctx, cfg)
	if err != nil {
		return err
	}
	defer c.Close()
	srv, err := realclient.Listen(realclient.Config{Store: c, Socket: sock, AnyUser: s.boolean("dummy_any_user")})
	if err != nil {
		return err
	}
	defer srv.Close() // before the store client: sessions end first
	if s.boolean("enable_http_server") {
		stopHTTP, err := serveHTTP(cmd, "client", s.str("host"), s.integer("http_port"), reg, func() any {
			return map[string]any{"status": "ok", "segment": c.SegmentName(), "segment_bytes": cfg.SegmentSize,
				"master": cfg.Master, "client_id": c.ID(), "dummy_clients": srv.Sessions(), "socket": srv.Addr()}
		})
		if err != nil {
			return err
		}
		defer stopHTTP()
	}
	slog.Info("real client serving", "segment", c.SegmentName(), "bytes", cfg.SegmentSize, "master", cfg.Master, "socket", srv.Addr())
	fmt.Fprintln(cmd.OutOrStdout(), "client socket="+srv.Addr())
	fmt.Fprintln(cmd.OutOrStdout(), cluster.ReadyLine(c.SegmentName()))
	<-ctx.Done()
	return nil
}

// serveHTTP serves a node's or a real client's /metrics and /health
// (health() as JSON) on host:port (--http_port) until the returned func
// runs, and prints "<role> http addr=ADDR" on stdout for whoever started
// it with port 0.
func serveHTTP(cmd *cobra.Command, role, host string, port int, reg *prometheus.Registry, health func() any) (func(), error) {
	if host == "0.0.0.0" {
		host = ""
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/health", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(health())
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	slog.Info(role+" HTTP server", "addr", ln.Addr().String())
	fmt.Fprintln(cmd.OutOrStdout(), role+" http addr="+ln.Addr().String())
	return func() { _ = srv.Close() }, nil
}
