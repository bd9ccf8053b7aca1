package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/mooncake-go/mooncake/engine/metadata"
	"github.com/mooncake-go/mooncake/internal/secure"
	"github.com/mooncake-go/mooncake/store/master"
)

func newMasterCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "master",
		Short: "Run a Mooncake Store master (gRPC metadata service, admin HTTP with /metrics and /health)",
		Long: `Runs the store's metadata service. Flags take Mooncake's mooncake_master
names and defaults; each can also come from the environment (MC_MASTER_<FLAG>,
upper case) or a config file (--config_path, MOONCAKE_CONFIG_PATH).

With --enable_ha the master campaigns for leadership in etcd
(--etcd_endpoints) and serves only while it leads, journaling every durable
change to etcd so that a standby taking over loses no completed put. With
a warm standby (another master with the same flags) the leader answers a
put once that standby has its record, and writes etcd behind; only the
leader and that standby dying within milliseconds of each other loses the
last puts. --ha_sync_etcd makes every put wait for etcd instead; under TLS
that is the default, and --ha_tls_standby_acks (on every master) lets
standbys acknowledge over TLS; --ha_peer_server_name has the masters
verify one another for one name their certificates carry.

With --enable_kv_events the leader publishes a KV event per object key on
a ZMQ PUB socket (--kv_events_bind_endpoint) as it is stored, removed or
evicted, for cache-aware routers; docs/kv-events.md has the format.

Security is off by default, as Mooncake's master. --auth_token (or
--auth_token_file, MC_AUTH_TOKEN) makes every gRPC call and admin request
carry "authorization: Bearer <token>"; others are refused (gRPC
Unauthenticated, HTTP 401). --auth_open_probes leaves /health, /readyz
and /metrics open to probes and scrapers. --tls_cert_file and --tls_key_file serve gRPC
and the admin HTTP over TLS; --tls_client_ca_file makes it mutual.
--etcd_tls_* dial etcd over TLS under HA.

With --enable_http_metadata_server the master also serves the Transfer
Engines' HTTP metadata (GET/PUT/DELETE /metadata?key=) in this process, on
--http_metadata_server_host:--http_metadata_server_port, as Mooncake's.

Every flag of official mooncake_master is accepted: the ones without an
equivalent here log a warning naming the flag and why it has no effect
(docs/operator-flags.md has the table), so an official command line or
config file starts this master unchanged. A flag neither has still fails.`,
		Example: `  mooncake master --rpc_port 50051 --metrics_port 9003
  mooncake master --enable_http_metadata_server --http_metadata_server_port 8080
  mooncake master --enable_ha --etcd_endpoints 10.0.0.1:2379 --rpc_address 10.0.0.2
  mooncake master --enable_kv_events --kv_events_backend_id pool-a --kv_events_replay_endpoint tcp://*:5558
  MC_AUTH_TOKEN=$(cat token) mooncake master --tls_cert_file server.pem --tls_key_file server-key.pem --tls_client_ca_file ca.pem`,
		Args: cobra.NoArgs,
	}
	f := c.Flags()
	f.Int("rpc_port", 50051, "gRPC port (0 picks one)")
	f.Int("port", 50051, "deprecated alias of --rpc_port, as Mooncake's")
	_ = f.MarkDeprecated("port", "use --rpc_port")
	f.String("rpc_address", "0.0.0.0", "gRPC address; under HA also what clients are told to dial (use a reachable one)")
	f.String("rpc_interface", "", "network interface whose IPv4 address replaces --rpc_address")
	f.Bool("enable_http_metadata_server", false, "also serve the Transfer Engines' HTTP metadata (/metadata?key=) in this process")
	f.String("http_metadata_server_host", "0.0.0.0", "address of the HTTP metadata server")
	f.Int("http_metadata_server_port", 8080, "port of the HTTP metadata server (0 picks one)")
	f.Int("metrics_port", 9003, "admin HTTP port (/metrics, /health, /role, /leader, /get_all_segments, /query_key, ...); 0 picks one, -1 disables")
	f.String("metrics_host", "0.0.0.0", "admin HTTP address")
	f.Float64("eviction_ratio", master.DefaultEvictionRatio, "share of capacity one eviction round frees")
	f.Float64("eviction_high_watermark_ratio", master.DefaultEvictionHighWatermark, "usage above which eviction starts")
	f.String("client_ttl", "10", "seconds (or a duration) a silent client keeps its segments")
	f.String("default_kv_lease_ttl", "10000", "lease a read grants, milliseconds (or a duration: 5s)")
	f.String("default_kv_soft_pin_ttl", "1800000", "soft-pin lifetime, milliseconds (or a duration: 30m)")
	f.String("put_start_discard_timeout_sec", "30", "age after which another client may pre-empt an unfinished put")
	f.String("put_start_release_timeout_sec", "600", "age after which an unfinished put's space is reclaimed")
	f.String("remount_hold_sec", "10", "how long a segment that comes back (ReMountSegment) unknown to this master takes no new replicas: clients may still write there into space granted before this master restarted without a journal or expired the segment's client; 0 turns it off")
	f.String("allocation_strategy", master.StrategyRandom, "random, free_ratio_first or local_first")
	f.String("stripe_min_size", "0", "puts of at least this size (bytes, or 64MiB) are striped over --stripe_count segments unless they say otherwise; 0: never")
	f.Int("stripe_count", master.DefaultStripeCount, "pieces of a striped replica, each on its own segment (of its own host where there are enough)")
	f.Bool("enable_ha", false, "campaign for leadership in etcd and journal there")
	f.String("etcd_endpoints", "", "etcd endpoints for HA, ';' or ',' separated (also --ha_backend_connstring)")
	f.String("ha_backend_connstring", "", "alias of --etcd_endpoints, as Mooncake's")
	f.String("ha_backend_type", "etcd", "HA backend; etcd is the only one here")
	f.String("cluster_id", "mooncake_cluster", "HA cluster name (the etcd key prefix)")
	f.String("leader_ttl", "3s", "HA leader lease: how long a dead leader holds the cluster")
	f.Bool("ha_sync_etcd", false, "HA: answer a put once its journal record is in etcd, never on a standby's acknowledgement (by default a warm standby that keeps up acknowledges, and etcd is written milliseconds behind)")
	f.Bool("ha_tls_standby_acks", false, "HA with TLS: standbys acknowledge too, fetching over TLS with this master's certificate; set it on every master, whose certificates must name their addresses (or --ha_peer_server_name) and, with --tls_client_ca_file, be valid for client authentication (checked at start). Without it, under TLS every put waits for etcd")
	f.String("ha_peer_server_name", "", "HA with TLS: the name masters verify one another's certificates for, instead of each one's address (one certificate for every master, e.g. a Kubernetes Service's name); the same on every master: in a running cluster, roll it onto every master before turning --ha_tls_standby_acks on")
	f.Int("max_key_length", master.MaxKeyLen, "longest object key accepted, bytes")
	f.String("max_value_size", "1TiB", "largest value one put may store (bytes, or 1GiB, 16GB)")
	f.Int("max_batch_size", master.DefaultMaxBatch, "most keys one batch call may carry")
	f.String("max_batch_value_size", "16TiB", "most value bytes one batch put may reserve, all items together")
	f.String("max_request_size", "256MiB", "largest request accepted (gRPC or framed)")
	f.Int("max_concurrent_streams", master.DefaultMaxConcurrentStreams, "most calls in flight on one client connection (the rest wait)")
	f.Int("max_watchers", master.DefaultMaxWatchers, "most WatchObjects streams served at once")
	f.String("max_admin_body", "64KiB", "largest admin HTTP request body (larger: 413)")
	f.Int("max_connections", master.DefaultMaxConns, "most client connections (gRPC or framed) open at once")
	f.Int("max_connections_per_peer", master.DefaultMaxConnsPerPeer, "most client connections open at once from one IP address")
	addKVEventsFlags(f)
	addTenantFlags(f)  // master_tenant.go
	addPersistFlags(f) // master_persist.go
	addTokenFlags(f, "master requires")
	f.Bool("auth_open_probes", false, "with --auth_token, answer /health, /readyz and /metrics without it (every other endpoint still requires it)")
	addServerTLSFlags(f)
	addEtcdTLSFlags(f)
	addConfigFlag(f, "MOONCAKE_CONFIG_PATH")
	// Last, so that only the official flags still undefined are added.
	official := addOfficialFlags(f, officialMasterFlags, officialLoggingFlags)
	c.RunE = func(cmd *cobra.Command, _ []string) error { return runMaster(cmd, official) }
	return c
}

func runMaster(cmd *cobra.Command, official []officialFlag) error {
	envs := map[string][]string{}
	cmd.Flags().VisitAll(func(fl *pflag.Flag) {
		envs[fl.Name] = []string{"MC_MASTER_" + strings.ToUpper(fl.Name)}
	})
	s, err := newSettings(cmd, "MOONCAKE_CONFIG_PATH", withTokenEnvs(envs))
	if err != nil {
		return err
	}
	warnOfficialFlags(cmd.Flags(), official, s.v.InConfig)
	if b := s.str("ha_backend_type"); b != "etcd" {
		return fmt.Errorf("--ha_backend_type %q: etcd is the only HA backend here", b)
	}
	var cfg master.ServerConfig
	if cfg.Token, err = readToken(s.str); err != nil {
		return err
	}
	cfg.TLS, cfg.OpenProbes = serverTLS(s.str), s.boolean("auth_open_probes")
	svc := &cfg.Service
	svc.EvictionRatio = s.float("eviction_ratio")
	svc.EvictionHighWatermark = s.float("eviction_high_watermark_ratio")
	svc.Strategy = s.str("allocation_strategy")
	durs := []struct {
		key  string
		unit time.Duration
		dst  *time.Duration
	}{
		{"client_ttl", time.Second, &svc.ClientTTL},
		{"default_kv_lease_ttl", time.Millisecond, &svc.LeaseTTL},
		{"default_kv_soft_pin_ttl", time.Millisecond, &svc.SoftPinTTL},
		{"put_start_discard_timeout_sec", time.Second, &svc.PutStartDiscardTimeout},
		{"put_start_release_timeout_sec", time.Second, &svc.PutStartReleaseTimeout},
		{"remount_hold_sec", time.Second, &svc.RemountHold},
	}
	for _, d := range durs {
		if *d.dst, err = s.duration(d.key, d.unit); err != nil {
			return err
		}
	}
	switch {
	case svc.RemountHold < 0:
		return fmt.Errorf("--remount_hold_sec is negative (%v)", svc.RemountHold)
	case svc.RemountHold == 0:
		svc.RemountHold = -1 // off (zero is the Service's default)
	}
	if err := masterLimits(s, &cfg); err != nil {
		return err
	}
	if err := svc.Validate(); err != nil {
		return err
	}
	rpcAddr, err := masterRPCAddress(s)
	if err != nil {
		return err
	}
	cfg.Listen = net.JoinHostPort(rpcAddr, strconv.Itoa(masterRPCPort(cmd.Flags(), s)))
	if p := s.integer("metrics_port"); p >= 0 {
		cfg.Admin = net.JoinHostPort(s.str("metrics_host"), strconv.Itoa(p))
	}
	if s.boolean("enable_ha") {
		eps := s.str("etcd_endpoints")
		if eps == "" {
			eps = s.str("ha_backend_connstring")
		}
		list := metadata.EtcdEndpoints(eps)
		if len(list) == 0 {
			return fmt.Errorf("--enable_ha needs --etcd_endpoints")
		}
		ttl, err := s.duration("leader_ttl", time.Second)
		if err != nil {
			return err
		}
		cfg.HA = &master.HAConfig{Etcd: list, ClusterID: s.str("cluster_id"), LeaderTTL: ttl, EtcdTLS: clientTLS(s.str, "etcd_"),
			SyncEtcd: s.boolean("ha_sync_etcd"), TLSStandbyAcks: s.boolean("ha_tls_standby_acks"),
			PeerServerName: s.str("ha_peer_server_name")}
		if a := rpcAddr; a != "0.0.0.0" && a != "" {
			cfg.HA.Advertise = cfg.Listen
		}
	}
	cfg.KVEvents = kvEventsConfig(s.boolean, s.str, s.integer)
	if err := tenantConfig(s, &cfg); err != nil {
		return err
	}
	if err := persistConfig(s, &cfg); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	// The metadata server listens first: engines of the clients that the
	// master's address brings need it from their first call.
	meta, err := startMasterMetadata(ctx, s, cfg.Token, cfg.TLS)
	if err != nil {
		return err
	}
	defer meta.stop()
	m, err := master.Start(cfg)
	if err != nil {
		return err
	}
	defer m.Close()
	// Scripts and tests read the addresses from stdout.
	fmt.Fprintf(cmd.OutOrStdout(), "master listening rpc=%s admin=%s ha=%v%s%s\n", m.Addr(), m.AdminAddr(), cfg.HA != nil, kvEventsAddrs(m), meta.suffix())
	<-ctx.Done()
	slog.Info("master: shutting down")
	return nil
}

// masterRPCPort is --rpc_port, or the deprecated --port where only it is
// given (as Mooncake's, whose --rpc_port 0 defers to --port).
func masterRPCPort(fs *pflag.FlagSet, s *settings) int {
	if fs.Changed("port") && !fs.Changed("rpc_port") {
		return s.integer("port")
	}
	return s.integer("rpc_port")
}

// masterRPCAddress is --rpc_address, or the IPv4 address of
// --rpc_interface where one is named (it wins, as Mooncake's).
func masterRPCAddress(s *settings) (string, error) {
	name := s.str("rpc_interface")
	if name == "" {
		return s.str("rpc_address"), nil
	}
	ifc, err := net.InterfaceByName(name)
	if err != nil {
		return "", fmt.Errorf("--rpc_interface %q: %w", name, err)
	}
	addrs, err := ifc.Addrs()
	if err != nil {
		return "", fmt.Errorf("--rpc_interface %q: %w", name, err)
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil {
			return ipn.IP.String(), nil
		}
	}
	return "", fmt.Errorf("--rpc_interface %q has no IPv4 address", name)
}

// masterMetadata is the HTTP metadata server a master runs in-process
// with --enable_http_metadata_server.
type masterMetadata struct {
	url  string // "" when not enabled
	stop func()
}

// suffix is the startup line's part naming the metadata URL.
func (m masterMetadata) suffix() string {
	if m.url == "" {
		return ""
	}
	return " metadata=" + m.url
}

// startMasterMetadata serves the HTTP metadata API when the flags ask for
// it, with the master's token and TLS (open when the master is), until ctx
// ends or stop is called.
func startMasterMetadata(ctx context.Context, s *settings, token string, tlsCfg secure.TLS) (masterMetadata, error) {
	if !s.boolean("enable_http_metadata_server") {
		return masterMetadata{stop: func() {}}, nil
	}
	tc, err := tlsCfg.Server()
	if err != nil {
		return masterMetadata{}, err
	}
	addr := net.JoinHostPort(s.str("http_metadata_server_host"), strconv.Itoa(s.integer("http_metadata_server_port")))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return masterMetadata{}, fmt.Errorf("--http_metadata_server_port: %w", err)
	}
	scheme := "http"
	if tc != nil {
		scheme = "https"
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- metadata.NewServer(metadata.ServerToken(token), metadata.ServerTLS(tc)).Serve(ctx, ln) }()
	url := fmt.Sprintf("%s://%s/metadata", scheme, ln.Addr())
	slog.Info("master: HTTP metadata server listening", "url", url)
	return masterMetadata{url: url, stop: func() {
		cancel()
		if err := <-done; err != nil {
			slog.Warn("master: HTTP metadata server", "err", err)
		}
	}}, nil
}

// masterLimits reads the --max_* flags into cfg; a zero takes the
// master's default.
func masterLimits(s *settings, cfg *master.ServerConfig) error {
	svc := &cfg.Service
	svc.MaxKeyLen = s.integer("max_key_length")
	svc.MaxBatch = s.integer("max_batch_size")
	svc.MaxWatchers = s.integer("max_watchers")
	cfg.MaxConns = s.integer("max_connections")
	cfg.MaxConnsPerPeer = s.integer("max_connections_per_peer")
	streams := s.integer("max_concurrent_streams")
	if streams < 0 {
		return fmt.Errorf("--max_concurrent_streams %d is negative", streams)
	}
	cfg.MaxConcurrentStreams = uint32(streams)
	svc.StripeCount = s.integer("stripe_count")
	if svc.StripeCount < 1 {
		return fmt.Errorf("--stripe_count %d: want at least 1", svc.StripeCount)
	}
	var value, batch, request, stripeMin int64
	sizes := []struct {
		key string
		dst *int64
	}{
		{"max_value_size", &value}, {"max_batch_value_size", &batch},
		{"max_request_size", &request}, {"max_admin_body", &cfg.MaxAdminBody},
		{"stripe_min_size", &stripeMin},
	}
	for _, sz := range sizes {
		n, err := s.size(sz.key)
		if err != nil {
			return err
		}
		if n < 0 {
			return fmt.Errorf("--%s %d is negative", sz.key, n)
		}
		*sz.dst = n
	}
	svc.MaxValueLen, svc.MaxBatchValueBytes, svc.StripeMinSize = uint64(value), uint64(batch), uint64(stripeMin)
	cfg.MaxRecvMsgSize = int(request)
	return nil
}

// addKVEventsFlags adds official mooncake_master's KV events flags.
func addKVEventsFlags(f *pflag.FlagSet) {
	f.Bool("enable_kv_events", false, "publish KV events (stored, removed) over ZMQ while leading")
	f.String("kv_events_bind_endpoint", master.DefaultKVEventsBind, "ZMQ PUB endpoint of the KV events (port 0 picks one)")
	f.String("kv_events_replay_endpoint", "", "ZMQ ROUTER endpoint answering replay requests from the last 10000 messages (empty: none)")
	f.String("kv_events_backend_id", "", "backend_id of the events, the cache owner (empty: the master's address)")
	f.String("kv_events_model_name", "", "model_name of the events")
	f.Int("kv_events_block_size", 0, "block_size of the events, in tokens (0: unknown)")
	f.String("kv_events_topic", "", "ZMQ topic (first frame) of the messages")
	f.Int("kv_events_max_subscribers", master.DefaultKVEventsMaxSubscribers, "most connections the KV events PUB (and replay) socket serves at once")
}

// kvEventsConfig is the KV events configuration the flags ask for, nil
// without --enable_kv_events; the getters read the flags.
func kvEventsConfig(boolean func(string) bool, str func(string) string, integer func(string) int) *master.KVEventsConfig {
	if !boolean("enable_kv_events") {
		return nil
	}
	return &master.KVEventsConfig{
		Bind:      str("kv_events_bind_endpoint"),
		Replay:    str("kv_events_replay_endpoint"),
		BackendID: str("kv_events_backend_id"),
		ModelName: str("kv_events_model_name"),
		BlockSize: integer("kv_events_block_size"),
		Topic:     str("kv_events_topic"),

		MaxSubscribers: integer("kv_events_max_subscribers"),
	}
}

// kvEventsAddrs is the startup line's suffix naming m's KV events
// endpoints, their ports resolved ("" without KV events).
func kvEventsAddrs(m *master.Server) string {
	if m.KVEventsAddr() == "" {
		return ""
	}
	return fmt.Sprintf(" kv_events=%s kv_events_replay=%s", m.KVEventsAddr(), orNone(m.KVEventsReplayAddr()))
}
