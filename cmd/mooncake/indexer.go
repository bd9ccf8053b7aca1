package main

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/mooncake-go/mooncake/conductor/indexer"
	"github.com/mooncake-go/mooncake/conductor/kvevents"
	"github.com/mooncake-go/mooncake/internal/secure"
)

func newIndexerCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "indexer",
		Short: "Run the KV-cache indexer alone: official Mooncake's Conductor indexer API over the engines' KV events",
		Long: `Follows the KV-cache events of vLLM, SGLang and Mooncake master publishers
(ZeroMQ, msgpack) and answers, per engine instance, how long a prefix of a
prompt is cached, on which medium and DP rank: official Mooncake's Conductor
indexer (mooncake_conductor), with its HTTP API (POST /register, /unregister,
/query, /query_by_hash; GET /services), JSON or msgpack, and its config file
($CONDUCTOR_CONFIG_PATH, default ~/.mooncake/conductor_config.json:
http_server_port, kvevent_instance) and log level ($CONDUCTOR_LOG_LEVEL). Also
/metrics and /health.

'mooncake conductor' serves the same API beside its router, and routes on it.

Open by default, as official Mooncake's. --auth-token (or --auth-token-file,
MC_AUTH_TOKEN) requires "Authorization: Bearer <token>" on every route but
/health and /metrics (401 without it).`,
		Example: `  CONDUCTOR_CONFIG_PATH=/etc/mooncake/conductor_config.json mooncake indexer
  mooncake indexer --listen 127.0.0.1:13333`,
		Args: cobra.NoArgs,
		RunE: runIndexer,
	}
	f := c.Flags()
	f.String("config", "", "the config file (default $"+indexer.ConfigEnv+", else ~/.mooncake/conductor_config.json)")
	f.String("listen", "", "address of the API, host:port (default :http_server_port of the config, 13333)")
	f.Duration("down-after", kvevents.DefaultDownAfter, "a publisher unreachable for this long leaves the index")
	f.String("auth-token", "", "bearer token the API requires but on /health and /metrics (env MC_AUTH_TOKEN; empty: none)")
	f.String("auth-token-file", "", "file whose first line is --auth-token (env MC_AUTH_TOKEN_FILE)")
	return c
}

func runIndexer(cmd *cobra.Command, _ []string) error {
	// Official Mooncake's CONDUCTOR_LOG_LEVEL, unless --log-level or
	// MC_LOG_LEVEL chose; an invalid value means INFO, as there.
	if lv := os.Getenv("CONDUCTOR_LOG_LEVEL"); lv != "" && !cmd.Flags().Changed("log-level") && os.Getenv("MC_LOG_LEVEL") == "" {
		if setupLogging(lv) != nil {
			_ = setupLogging("info")
		}
	}
	path, _ := cmd.Flags().GetString("config")
	if path == "" {
		path = indexer.DefaultConfigPath()
	}
	fc, err := indexer.LoadConfig(path)
	if err != nil {
		return err
	}
	addr, _ := cmd.Flags().GetString("listen")
	if addr == "" {
		addr = ":" + strconv.Itoa(fc.HTTPPort)
	}
	down, _ := cmd.Flags().GetDuration("down-after")
	idx := indexer.New(indexer.Config{DownAfter: down})
	defer idx.Close()
	if err := idx.RegisterAll(fc); err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), idx.Collector())
	ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	tok, _ := cmd.Flags().GetString("auth-token")
	tokFile, _ := cmd.Flags().GetString("auth-token-file")
	token, err := secure.ReadToken(cmp.Or(strings.TrimSpace(tok), os.Getenv("MC_AUTH_TOKEN")), cmp.Or(tokFile, os.Getenv("MC_AUTH_TOKEN_FILE")))
	if err != nil {
		return fmt.Errorf("--auth-token-file: %w", err)
	}
	stopSrv, err := serveIndexer(cmd, addr, idx, reg, token)
	if err != nil {
		return err
	}
	defer stopSrv()
	<-ctx.Done()
	return nil
}

// registerIndexerConfig registers the publishers of the official config
// file at path (default $CONDUCTOR_CONFIG_PATH, when set).
func registerIndexerConfig(path string, idx *indexer.Indexer) error {
	if path == "" {
		if path = os.Getenv(indexer.ConfigEnv); path == "" {
			return nil
		}
	}
	fc, err := indexer.LoadConfig(path)
	if err != nil {
		return fmt.Errorf("--indexer-config: %w", err)
	}
	if err := idx.RegisterAll(fc); err != nil {
		return fmt.Errorf("--indexer-config %s: %w", path, err)
	}
	return nil
}

// serveIndexer serves idx's API, /metrics of reg and /health on addr, and
// prints the address on stdout; the function stops the server.
func serveIndexer(cmd *cobra.Command, addr string, idx *indexer.Indexer, reg *prometheus.Registry, token string) (func(), error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("indexer: listen %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	idx.Routes(mux)
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/health", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"status":"ok","publishers":%d}`+"\n", len(idx.Registrations()))
	})
	// With a token, all but the probes require it (the conductor's).
	probe := func(r *http.Request) bool { return r.URL.Path == "/health" || r.URL.Path == "/metrics" }
	srv := &http.Server{Handler: secure.RequireHTTP(token, probe, mux), ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintf(cmd.ErrOrStderr(), "indexer: %v\n", err)
		}
	}()
	// Scripts and tests read the address from stdout.
	fmt.Fprintf(cmd.OutOrStdout(), "indexer listening http://%s publishers=%d\n", ln.Addr(), len(idx.Registrations()))
	return func() {
		_ = srv.Close()
		<-done
	}, nil
}
