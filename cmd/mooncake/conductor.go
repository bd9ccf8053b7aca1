package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/mooncake-go/mooncake/conductor"
	"github.com/mooncake-go/mooncake/conductor/indexer"
	"github.com/mooncake-go/mooncake/conductor/kvevents"
	"github.com/mooncake-go/mooncake/conductor/router"
	"github.com/mooncake-go/mooncake/conductor/storefeed"
	"github.com/mooncake-go/mooncake/internal/secure"
)

func newConductorCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "conductor",
		Short: "Run the Conductor: a KV-cache-aware router for disaggregated prefill/decode (OpenAI API)",
		Long: `Serves the OpenAI API (/v1/completions, /v1/chat/completions) in front of
vLLM instances started with a KV connector (kv_role kv_producer on prefill,
kv_consumer on decode): each request is scheduled onto a prefill and a decode
instance, prefilled there with kv_transfer_params {do_remote_decode: true} and
max_tokens=1, then decoded with the parameters the prefill answered, and the
answer (streamed or not) comes back.

Instances come from --prefill and --decode (id=url[,cache_blocks=N]
[,engine_id=E][,bootstrap_addr=URL][,kv_events=tcp://H:P][,kv_replay=tcp://H:P];
engine_id and bootstrap_addr describe a prefill instance running vLLM's
MooncakeConnector), from the config file (the same lists, or "instances:"
with id, role, url, cache_blocks, engine_id, bootstrap_addr, kv_events,
kv_replay), or at run time from POST /v1/instances.

The prefix index follows the engines' own KV-cache events when an instance
names its publisher (kv_events: vLLM's --kv-events-config endpoint, and
kv_replay its replay_endpoint): prompts are then hashed as the engines hash
them, --block-hash vllm:sha256 (or vllm:sha256_cbor, vllm:xxhash, ...,
mooncake) with --block-size the engines' block size and --hash-seed their
PYTHONHASHSEED if set. An engine's blocks leave the index when it restarts
or stays unreachable for --kv-events-down-after. Official Mooncake's
indexer API (/register, /unregister, /query, /query_by_hash, /services) is
served too, with the publishers of --indexer-config (its JSON file, default
$CONDUCTOR_CONFIG_PATH) registered at start.

Also served: DELETE/GET /v1/instances[/{id}], POST /v1/index/query
({"tokens": [...]} or {"hashes": [...]} -> longest cached prefix per
instance), /v1/models, /metrics, /health (readiness: 503 unless a prefill and
a decode instance answer their GET /health). Every flag can come from the
environment (MC_CONDUCTOR_<FLAG>, upper case, '-' as '_') or the config file
(--config_path, MC_CONDUCTOR_CONFIG).

Open by default. --auth-token (or --auth-token-file, MC_AUTH_TOKEN) requires
"Authorization: Bearer <token>" on the instance API, the index query and the
indexer API (also on --indexer-listen), 401 without it; the OpenAI routes,
/health and /metrics stay open unless --auth-inference. The token is also
presented to the store masters of --store-master, dialed over TLS with
--store-master-tls-*. --tls-cert-file and --tls-key-file serve https (the
indexer's --indexer-listen stays plain http); --tls-client-ca-file makes it
mutual.`,
		Example: `  mooncake conductor --listen 0.0.0.0:8000 \
    --prefill p0=http://10.0.0.1:8100,cache_blocks=4096 \
    --decode d0=http://10.0.0.2:8200
  mooncake conductor --config_path conductor.yaml`,
		Args: cobra.NoArgs,
		RunE: runConductor,
	}
	f := c.Flags()
	f.String("listen", ":8000", "address of the OpenAI API, host:port (port 0 picks one)")
	f.StringArray("prefill", nil, "prefill instance id=url[,cache_blocks=N][,engine_id=E][,bootstrap_addr=URL]; repeatable")
	f.StringArray("decode", nil, "decode instance id=url; repeatable")
	f.String("prefill-timeout", router.DefaultPrefillTimeout.String(), "bound on a /tokenize or prefill call")
	f.String("decode-timeout", router.DefaultDecodeTimeout.String(), "bound on a whole decode call")
	f.String("idle-timeout", router.DefaultIdleTimeout.String(), "bound on silence in a decode stream")
	f.String("max-body", "32MiB", "largest request body accepted")
	f.String("drain-timeout", "30s", "on SIGTERM, how long requests in progress may take to finish")
	// The scheduler's settings; the defaults are the paper's (LLaMA3-70B
	// on 8xA800 nodes, 100 GB/s between them).
	f.String("policy", conductor.GlobalCacheAware.String(), "prefill choice: "+policyNames())
	f.String("admission", conductor.RejectPredicted.String(), "early rejection: predicted, current-load or none")
	f.String("ttft-slo", conductor.DefaultTTFTSLO.String(), "time-to-first-token objective admission checks")
	f.String("tbt-slo", conductor.DefaultTBTSLO.String(), "time-between-tokens objective admission checks")
	f.Int("default-output", conductor.DefaultOutput, "output tokens assumed for a request without max_tokens")
	f.String("block-bytes", strconv.Itoa(conductor.DefaultBlockBytes), "KV cache of one 512-token block, bytes (transfer times)")
	f.String("prefill-model", "", "prefill time of the served model as base,per-token[,quadratic] durations (e.g. 10.8ms,94.6us,2.1ns: the fixed cost of a pass, each new token, each unit of n^2-p^2); empty: LLaMA3-70B on 8xA800, the paper's")
	f.String("bandwidth", strconv.Itoa(conductor.DefaultBandwidth), "bytes per second a prefill instance pulls KV cache at")
	f.Int("balance-blocks", 0, "pull a prefix held elsewhere only when it is longer than the instance's own by more than this")
	f.Int("store-blocks", 0, "blocks of the store kept in the prefix index (LRU); 0: unbounded")
	f.Uint64("seed", 0, "seed of the random policy")
	f.String("store-master", "", "Mooncake Store master(s), host:port[,host:port...]: the prefix index follows the store's block keys (conductor.KeyBlock)")
	// The engines' KV events.
	f.String("block-hash", "fnv", "how prompts are hashed into blocks: fnv (512-token blocks, the traces'), vllm[:sha256|sha256_cbor|xxhash|xxhash_cbor], mooncake")
	f.Int("block-size", 0, "tokens per block, the engines' (required unless --block-hash fnv)")
	f.String("hash-seed", "", "the engines' hash seed: vLLM's PYTHONHASHSEED if set, mooncake's XXH3 seed")
	f.String("model", "", "the served model's name, the scope of the KV events in the indexer API")
	f.StringSlice("lora-modules", nil, "the engines' LoRA adapters as vLLM's --lora-modules name=path (repeat or comma-separate): a request whose model names one hashes its blocks with it")
	f.String("kv-events-down-after", kvevents.DefaultDownAfter.String(), "an engine unreachable for this long leaves the prefix index")
	f.String("indexer-config", "", "official Mooncake Conductor config (JSON, kvevent_instance) whose publishers are registered at start; default $"+indexer.ConfigEnv)
	f.String("indexer-listen", "", "also serve the indexer API alone on this address (official Mooncake's port: 13333)")
	f.String("store-kv-events", "", "a store master's KV event endpoint (mooncake master --enable_kv_events), tcp://host:port: its blocks feed the index's store holder")
	f.String("store-kv-replay", "", "that master's replay endpoint (--kv_events_replay_endpoint)")
	f.String("auth-token", "", "bearer token the instance and indexer APIs require, and the store masters are shown (env MC_AUTH_TOKEN; empty: none)")
	f.String("auth-token-file", "", "file whose first line is --auth-token (env MC_AUTH_TOKEN_FILE)")
	f.Bool("auth-inference", false, "require --auth-token on the OpenAI routes too")
	f.String("tls-cert-file", "", "PEM certificate of the conductor's HTTP server: https on (empty: plaintext)")
	f.String("tls-key-file", "", "PEM key of --tls-cert-file")
	f.String("tls-client-ca-file", "", "PEM CA bundle: clients must present a certificate it signed (mutual TLS)")
	f.String("store-master-tls-ca-file", "", "PEM CA bundle verifying the --store-master masters: TLS on")
	f.String("store-master-tls-cert-file", "", "PEM client certificate presented to the masters (mutual TLS)")
	f.String("store-master-tls-key-file", "", "PEM key of --store-master-tls-cert-file")
	addConfigFlag(f, "MC_CONDUCTOR_CONFIG")
	return c
}

func policyNames() string {
	var names []string
	for _, p := range conductor.Policies() {
		names = append(names, p.String())
	}
	return strings.Join(names, ", ")
}

// schedulerConfig reads the scheduler's settings.
func schedulerConfig(s *settings) (conductor.Config, error) {
	var c conductor.Config
	var err error
	if c.Policy, err = conductor.ParsePolicy(s.str("policy")); err != nil {
		return c, fmt.Errorf("--policy: %w", err)
	}
	if c.Admission, err = conductor.ParseAdmission(s.str("admission")); err != nil {
		return c, fmt.Errorf("--admission: %w", err)
	}
	if c.TTFTSLO, err = s.duration("ttft-slo", time.Second); err != nil {
		return c, err
	}
	if c.TBTSLO, err = s.duration("tbt-slo", time.Second); err != nil {
		return c, err
	}
	if c.BlockBytes, err = s.size("block-bytes"); err != nil {
		return c, err
	}
	bw, err := s.size("bandwidth")
	if err != nil {
		return c, err
	}
	c.Bandwidth = float64(bw)
	if c.Prefill, err = prefillModel(s.str("prefill-model")); err != nil {
		return c, err
	}
	c.DefaultOutput = s.integer("default-output")
	c.BalanceBlocks = s.integer("balance-blocks")
	c.StoreBlocks = s.integer("store-blocks")
	c.Seed = s.v.GetUint64("seed")
	if s.str("block-hash") != "fnv" {
		c.BlockTokens = s.integer("block-size")
	}
	return c, c.Validate()
}

// newScheduler builds the scheduling core `mooncake conductor` routes
// with; the router registers the instances with it.
func newScheduler(s *settings) (router.Scheduler, error) {
	c, err := schedulerConfig(s)
	if err != nil {
		return nil, err
	}
	return conductor.New(c)
}

func runConductor(cmd *cobra.Command, _ []string) error {
	envs := map[string][]string{}
	cmd.Flags().VisitAll(func(fl *pflag.Flag) {
		envs[fl.Name] = []string{"MC_CONDUCTOR_" + strings.ToUpper(strings.ReplaceAll(fl.Name, "-", "_"))}
	})
	envs["auth-token"] = append(envs["auth-token"], "MC_AUTH_TOKEN")
	envs["auth-token-file"] = append(envs["auth-token-file"], "MC_AUTH_TOKEN_FILE")
	s, err := newSettings(cmd, "MC_CONDUCTOR_CONFIG", envs)
	if err != nil {
		return err
	}
	cfg, err := conductorConfig(s)
	if err != nil {
		return err
	}
	if cfg.Token, err = secure.ReadToken(strings.TrimSpace(s.str("auth-token")), s.str("auth-token-file")); err != nil {
		return fmt.Errorf("--auth-token-file: %w", err)
	}
	cfg.TokenOnInference = s.boolean("auth-inference")
	drain, err := s.duration("drain-timeout", time.Second)
	if err != nil {
		return err
	}
	sched, err := newScheduler(s)
	if err != nil {
		return err
	}
	down, err := s.duration("kv-events-down-after", time.Second)
	if err != nil {
		return err
	}
	icfg := indexer.Config{DownAfter: down}
	if m, ok := sched.(indexer.Mirror); ok {
		icfg.Mirror = m
	}
	idx := indexer.New(icfg)
	defer idx.Close()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), idx.Collector())
	cfg.Scheduler, cfg.Registry, cfg.Indexer = sched, reg, idx
	r, err := router.New(cfg)
	if err != nil {
		return err
	}
	defer r.Close()
	if err := registerIndexerConfig(s.str("indexer-config"), idx); err != nil {
		return err
	}
	if ep := s.str("store-kv-events"); ep != "" {
		size := s.integer("block-size")
		if s.str("block-hash") == "fnv" {
			size = conductor.BlockTokens
		}
		err := idx.Register(indexer.Registration{Endpoint: ep, Replay: s.str("store-kv-replay"), Type: indexer.TypeMooncake,
			Model: s.str("model"), Instance: conductor.StoreHolder, BlockSize: size})
		if err != nil {
			return fmt.Errorf("--store-kv-events: %w", err)
		}
	}
	if addr := s.str("indexer-listen"); addr != "" {
		stopIdx, err := serveIndexer(cmd, addr, idx, reg, cfg.Token)
		if err != nil {
			return err
		}
		defer stopIdx()
	}

	tc, err := secure.TLS{CertFile: s.str("tls-cert-file"), KeyFile: s.str("tls-key-file"),
		CAFile: s.str("tls-client-ca-file")}.Server()
	if err != nil {
		return fmt.Errorf("--tls-cert-file: %w", err)
	}
	ln, err := net.Listen("tcp", s.str("listen"))
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	scheme := "http"
	if tc != nil {
		ln, scheme = tls.NewListener(ln, tc), "https"
	}
	srv := &http.Server{Handler: r, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	var np, nd int
	for _, in := range r.Instances() {
		if in.Role == router.RolePrefill {
			np++
		} else {
			nd++
		}
	}
	// Scripts and tests read the address from stdout.
	fmt.Fprintf(cmd.OutOrStdout(), "conductor listening %s://%s prefill=%d decode=%d\n", scheme, ln.Addr(), np, nd)

	ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	fed, err := followStore(ctx, s, sched, cfg.Token)
	if err != nil {
		return err
	}
	defer func() {
		stop()
		<-fed
	}()
	select {
	case err := <-served:
		return fmt.Errorf("conductor: %w", err)
	case <-ctx.Done():
	}
	slog.Info("conductor: shutting down", "drain", drain)
	sctx, cancel := context.WithTimeout(context.Background(), drain)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		// Streams still running past the drain bound are cut; their
		// clients see the connection close.
		slog.Warn("conductor: requests cut at shutdown", "err", err)
		_ = srv.Close()
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// followStore feeds the scheduler's prefix index from the store masters of
// --store-master, if any, until ctx ends; the channel is closed then.
func followStore(ctx context.Context, s *settings, sched router.Scheduler, token string) (<-chan struct{}, error) {
	done := make(chan struct{})
	var masters []string
	for _, m := range strings.Split(s.str("store-master"), ",") {
		if m = strings.TrimSpace(m); m != "" {
			masters = append(masters, m)
		}
	}
	if len(masters) == 0 {
		close(done)
		return done, nil
	}
	sink, ok := sched.(storefeed.Sink)
	if !ok {
		return nil, errors.New("--store-master: the scheduler takes no store events")
	}
	tlsFiles := secure.TLS{CAFile: s.str("store-master-tls-ca-file"),
		CertFile: s.str("store-master-tls-cert-file"), KeyFile: s.str("store-master-tls-key-file")}
	f, err := storefeed.New(storefeed.Config{Masters: masters, TLS: tlsFiles, Token: token}, sink)
	if err != nil {
		return nil, fmt.Errorf("--store-master: %w", err)
	}
	go func() {
		defer close(done)
		if err := f.Run(ctx); err != nil {
			slog.Error("conductor: store feed stopped", "err", err)
		}
	}()
	slog.Info("conductor: following the store", "masters", masters)
	return done, nil
}

// conductorConfig reads the router's settings and instances.
func conductorConfig(s *settings) (router.Config, error) {
	var cfg router.Config
	durs := []struct {
		key string
		dst *time.Duration
	}{{"prefill-timeout", &cfg.PrefillTimeout}, {"decode-timeout", &cfg.DecodeTimeout}, {"idle-timeout", &cfg.IdleTimeout}}
	for _, d := range durs {
		var err error
		if *d.dst, err = s.duration(d.key, time.Second); err != nil {
			return cfg, err
		}
	}
	var err error
	if cfg.MaxBodyBytes, err = s.size("max-body"); err != nil {
		return cfg, err
	}
	cfg.BlockHash, cfg.BlockSize, cfg.HashSeed, cfg.Model = s.str("block-hash"), s.integer("block-size"), s.str("hash-seed"), s.str("model")
	if cfg.LoRAModules, err = loraModules(s.v.GetStringSlice("lora-modules")); err != nil {
		return cfg, err
	}
	for _, role := range []string{router.RolePrefill, router.RoleDecode} {
		for _, spec := range s.v.GetStringSlice(role) {
			in, err := router.ParseInstance(role, spec)
			if err != nil {
				return cfg, fmt.Errorf("--%s: %w", role, err)
			}
			cfg.Instances = append(cfg.Instances, in)
		}
	}
	// The config file may also list instances as objects.
	var listed []struct {
		ID          string `mapstructure:"id"`
		Role        string `mapstructure:"role"`
		URL         string `mapstructure:"url"`
		CacheBlocks int    `mapstructure:"cache_blocks"`
		EngineID    string `mapstructure:"engine_id"`
		Bootstrap   string `mapstructure:"bootstrap_addr"`
		KVEvents    string `mapstructure:"kv_events"`
		KVReplay    string `mapstructure:"kv_replay"`
	}
	if err := s.v.UnmarshalKey("instances", &listed); err != nil {
		return cfg, fmt.Errorf("config instances: %w", err)
	}
	for _, l := range listed {
		cfg.Instances = append(cfg.Instances, router.Instance{ID: l.ID, Role: l.Role, URL: strings.TrimRight(l.URL, "/"),
			CacheBlocks: l.CacheBlocks, EngineID: l.EngineID, Bootstrap: strings.TrimRight(l.Bootstrap, "/"),
			KVEvents: l.KVEvents, KVReplay: l.KVReplay})
	}
	// router.New validates the whole, once the scheduler is in.
	return cfg, nil
}

// prefillModel reads --prefill-model: base,per-token[,quadratic] as
// durations; "" is the zero model (the scheduler's default).
func prefillModel(v string) (conductor.PrefillModel, error) {
	var m conductor.PrefillModel
	if v == "" {
		return m, nil
	}
	parts := strings.Split(v, ",")
	if len(parts) < 2 || len(parts) > 3 {
		return m, fmt.Errorf("--prefill-model %q: want base,per-token[,quadratic]", v)
	}
	dst := []*float64{&m.Base, &m.Linear, &m.Quadratic}
	for i, p := range parts {
		d, err := time.ParseDuration(strings.TrimSpace(p))
		if err != nil || d < 0 {
			return m, fmt.Errorf("--prefill-model %q: %q is not a non-negative duration", v, p)
		}
		*dst[i] = d.Seconds()
	}
	if m.Base == 0 && m.Linear == 0 && m.Quadratic == 0 {
		return m, fmt.Errorf("--prefill-model %q: all zero", v)
	}
	return m, nil
}

// loraModules reads --lora-modules items, name=path each, as vLLM's flag.
func loraModules(items []string) (map[string]string, error) {
	if len(items) == 0 {
		return nil, nil
	}
	m := make(map[string]string, len(items))
	for _, it := range items {
		name, path, ok := strings.Cut(it, "=")
		if !ok || name == "" || path == "" {
			return nil, fmt.Errorf("--lora-modules %q: want name=path", it)
		}
		if _, dup := m[name]; dup {
			return nil, fmt.Errorf("--lora-modules: %s given twice", name)
		}
		m[name] = path
	}
	return m, nil
}
