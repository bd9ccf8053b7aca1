package main

import (
	"fmt"
	"log/slog"
	"os/signal"
	"strings"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/internal/secure"
	"github.com/mooncake-go/mooncake/store/client"
	"github.com/mooncake-go/mooncake/store/cluster"
)

// nodeEnvs are the environment names of `mooncake node`'s settings:
// Mooncake's Python launcher's first, then ours.
var nodeEnvs = map[string][]string{
	"master":                   {"MOONCAKE_MASTER", "MC_NODE_MASTER"},
	"metadata_server":          {"MOONCAKE_TE_META_DATA_SERVER", "MC_NODE_METADATA_SERVER"},
	"protocol":                 {"MOONCAKE_PROTOCOL", "MC_NODE_PROTOCOL"},
	"global_segment_size":      {"MOONCAKE_GLOBAL_SEGMENT_SIZE", "MC_NODE_GLOBAL_SEGMENT_SIZE"},
	"local_buffer_size":        {"MOONCAKE_LOCAL_BUFFER_SIZE", "MC_NODE_LOCAL_BUFFER_SIZE"},
	"local_hostname":           {"MOONCAKE_LOCAL_HOSTNAME", "MC_NODE_LOCAL_HOSTNAME"},
	"cluster_id":               {"MC_STORE_CLUSTER_ID"},
	"transport":                {"MC_NODE_TRANSPORT"},
	"enable_http_server":       {"MOONCAKE_ENABLE_CLIENT_HTTP_SERVER"},
	"ssd_dir":                  {"MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", "MC_NODE_SSD_DIR"},
	"ssd_size":                 {"MC_NODE_SSD_SIZE"},
	"http_port":                {"MOONCAKE_CLIENT_HTTP_PORT"},
	"auth_token":               {"MC_NODE_AUTH_TOKEN", "MC_AUTH_TOKEN"},
	"auth_token_file":          {"MC_NODE_AUTH_TOKEN_FILE", "MC_AUTH_TOKEN_FILE"},
	"master_tls_ca_file":       {"MC_NODE_MASTER_TLS_CA_FILE"},
	"master_tls_cert_file":     {"MC_NODE_MASTER_TLS_CERT_FILE"},
	"master_tls_key_file":      {"MC_NODE_MASTER_TLS_KEY_FILE"},
	"master_tls_server_name":   {"MC_NODE_MASTER_TLS_SERVER_NAME"},
	"etcd_tls_ca_file":         {"MC_NODE_ETCD_TLS_CA_FILE"},
	"etcd_tls_cert_file":       {"MC_NODE_ETCD_TLS_CERT_FILE"},
	"etcd_tls_key_file":        {"MC_NODE_ETCD_TLS_KEY_FILE"},
	"etcd_tls_server_name":     {"MC_NODE_ETCD_TLS_SERVER_NAME"},
	"te_secret_file":           {"MC_NODE_TE_SECRET_FILE", "MC_TE_SECRET_FILE"},
	"metadata_tls_ca_file":     {"MC_NODE_METADATA_TLS_CA_FILE"},
	"metadata_tls_cert_file":   {"MC_NODE_METADATA_TLS_CERT_FILE"},
	"metadata_tls_key_file":    {"MC_NODE_METADATA_TLS_KEY_FILE"},
	"metadata_tls_server_name": {"MC_NODE_METADATA_TLS_SERVER_NAME"},
}

func newNodeCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "node",
		Short: "Run a storage node: a store client that only contributes DRAM to the pool",
		Long: `Mounts --global_segment_size bytes of memory into the pool of the master at
--master ("host:port", or "etcd://h1:2379;h2:2379" to follow the HA leader)
and serves reads and writes of its segment through the Transfer Engine until
stopped; on SIGTERM it unmounts first. Settings also come from Mooncake's
environment names (MOONCAKE_MASTER, MOONCAKE_GLOBAL_SEGMENT_SIZE, ...) or a
config file (--config_path, MOONCAKE_CONFIG_PATH) with Mooncake's keys.

To a secured master (mooncake master --auth_token, --tls_*) it presents
--auth_token (or --auth_token_file, MC_AUTH_TOKEN) and dials over TLS with
--master_tls_ca_file, and --master_tls_cert_file/--master_tls_key_file
where the master requires a client certificate; --etcd_tls_* for etcd
(an etcd:// master or metadata server). The token goes to an http(s)
metadata server too (mooncake metadata --auth_token), dialed over TLS with
--metadata_tls_*.`,
		Example: `  mooncake node --master 127.0.0.1:50051 --global_segment_size 4GiB`,
		Args:    cobra.NoArgs,
		RunE:    runNode,
	}
	f := c.Flags()
	f.String("master", "127.0.0.1:50051", "master address, or etcd://... under HA")
	f.String("metadata_server", "P2PHANDSHAKE", "Transfer Engine metadata: P2PHANDSHAKE, etcd://, http://")
	f.String("protocol", "tcp", "Transfer Engine protocol (tcp)")
	f.String("transport", "auto", "data path to peers: auto (shared memory on this host, else TCP) or tcp")
	f.String("global_segment_size", "3355443200", "bytes contributed to the pool (3.125 GiB, as Mooncake); accepts 4GiB, 16GB (units are 1024-based, as in Mooncake: 16GB = 16GiB)")
	f.String("local_buffer_size", "16MiB", "staging buffer")
	f.String("local_hostname", "", "address peers reach this node at (zero: the first non-loopback IPv4)")
	f.String("cluster_id", client.DefaultClusterID, "HA cluster name")
	f.String("ssd_dir", "", "directory of an SSD tier: evicted objects spill there and come back on a hit")
	f.String("ssd_size", "16GiB", "size of the SSD tier file (fallocated)")
	f.Bool("enable_http_server", false, "serve /health and /metrics (engine and client) over HTTP")
	f.Int("http_port", 9300, "port of the HTTP server (0 picks one)")
	addTokenFlags(f, "node presents")
	addClientTLSFlags(f, "master_", "the master")
	addEtcdTLSFlags(f)
	addClientTLSFlags(f, "metadata_", "an https:// metadata server")
	f.String("te_secret_file", "", "file whose first line is the Transfer Engine's shared secret, which every peer must know (MC_TE_SECRET sets it too)")
	addConfigFlag(f, "MOONCAKE_CONFIG_PATH")
	return c
}

func runNode(cmd *cobra.Command, _ []string) error {
	s, err := newSettings(cmd, "MOONCAKE_CONFIG_PATH", nodeEnvs)
	if err != nil {
		return err
	}
	// Mooncake's config files spell the master "master_server_address".
	if v := s.v.GetString("master_server_address"); v != "" && !cmd.Flags().Changed("master") {
		s.v.Set("master", v)
	}
	if p := s.str("protocol"); p != "tcp" {
		return fmt.Errorf("--protocol %q: only tcp is built (RDMA comes with hardware)", p)
	}
	seg, err := s.size("global_segment_size")
	if err != nil {
		return err
	}
	buf, err := s.size("local_buffer_size")
	if err != nil {
		return err
	}
	if seg <= 0 {
		return fmt.Errorf("--global_segment_size must be positive for a node")
	}
	var ssdSize int64
	if s.str("ssd_dir") != "" {
		if ssdSize, err = s.size("ssd_size"); err != nil {
			return err
		}
	}
	token, err := readToken(s.str)
	if err != nil {
		return err
	}
	teSecret, err := secure.ReadToken("", s.str("te_secret_file"))
	if err != nil {
		return fmt.Errorf("--te_secret_file: %w", err)
	}
	reg := prometheus.NewRegistry()
	cfg := client.Config{
		Token: token, MasterTLS: clientTLS(s.str, "master_"), EtcdTLS: clientTLS(s.str, "etcd_"),
		Master: s.str("master"), ClusterID: s.str("cluster_id"), SegmentSize: seg, LocalBufferSize: buf, Registerer: reg,
		SSDDir: s.str("ssd_dir"), SSDSize: ssdSize,
		EngineConfig: engine.Config{Metadata: s.str("metadata_server"), Host: s.str("local_hostname"),
			Transport: s.str("transport"), Registerer: reg,
			MetadataToken: token, MetadataTLS: metadataTLS(s.str), Secret: teSecret},
	}
	ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	c, err := client.New(ctx, cfg)
	if err != nil {
		return err
	}
	defer c.Close()
	if s.boolean("enable_http_server") {
		stopHTTP, err := serveHTTP(cmd, "node", s.str("local_hostname"), s.integer("http_port"), reg, func() any {
			return map[string]any{"status": "ok", "segment": c.SegmentName(), "segment_bytes": seg,
				"master": cfg.Master, "client_id": c.ID()}
		})
		if err != nil {
			return err
		}
		defer stopHTTP()
	}
	slog.Info("node serving", "segment", c.SegmentName(), "bytes", seg, "master", cfg.Master, "ssd", c.SSDPath())
	fmt.Fprintln(cmd.OutOrStdout(), cluster.ReadyLine(c.SegmentName()))
	<-ctx.Done()
	return nil
}

// metadataTLS is the TLS of the engine's metadata store: --etcd_tls_* for
// etcd, --metadata_tls_* for an http(s) server.
func metadataTLS(str func(string) string) secure.TLS {
	if m := str("metadata_server"); strings.HasPrefix(m, "http://") || strings.HasPrefix(m, "https://") {
		return clientTLS(str, "metadata_")
	}
	return clientTLS(str, "etcd_")
}
