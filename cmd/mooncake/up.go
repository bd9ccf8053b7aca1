package main

import (
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/mooncake-go/mooncake/internal/secure"
	"github.com/mooncake-go/mooncake/store/cluster"
	"github.com/mooncake-go/mooncake/store/master"
)

func newUpCmd() *cobra.Command {
	var (
		etcdAddr    string
		rpcPort     int
		metricsPort int
		dataDir     string
		nodes       int
		masters     int
		segment     string
		noHA        bool
		procs       bool
		secureOn    bool
		secureDir   string
		stripeMin   string
		stripeCount int
	)
	c := &cobra.Command{
		Use:   "up",
		Short: "Run a whole store on this machine: embedded etcd, master(s) and storage node(s)",
		Long: `Starts an embedded etcd, --masters masters (HA: one leads, the others stand
by; every durable change is journaled in etcd) and --nodes storage nodes of
--global_segment_size each, prints where everything listens, and runs until
interrupted. Clients connect with master "etcd://<etcd>" (or the master's
address with --no-ha).

--secure turns security on at once: it generates a CA, a server and a
client certificate, a random token and a Transfer Engine secret into
--secure-dir (zero: <data-dir>/secure, else a new temporary directory,
kept), prints where they are and the flags clients need; the masters then
require mutual TLS and the token, and the nodes' engines the secret (the
nodes present them all). The embedded etcd stays
plaintext on its address (loopback by default).`,
		Example: `  mooncake up
  mooncake up --nodes 2 --global_segment_size 4GiB --masters 2
  mooncake up --secure --secure-dir ./mc-secure`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			seg, err := parseSize(segment)
			if err != nil {
				return fmt.Errorf("--global_segment_size: %w", err)
			}
			minStripe, err := parseSize(stripeMin)
			if err != nil || minStripe < 0 {
				return fmt.Errorf("--stripe_min_size %q: want a size (bytes, or 64MiB)", stripeMin)
			}
			if stripeCount < 1 {
				return fmt.Errorf("--stripe_count %d: want at least 1", stripeCount)
			}
			cfg := cluster.Config{
				Dir: dataDir, Etcd: etcdAddr, Masters: masters, NoHA: noHA, Nodes: nodes, NodeSegment: seg,
				MasterListen: net.JoinHostPort("127.0.0.1", strconv.Itoa(rpcPort)),
				KVEvents:     kvEventsConfig(flagGetters(cmd.Flags())),
			}
			cfg.Service.StripeMinSize, cfg.Service.StripeCount = uint64(minStripe), stripeCount
			if metricsPort >= 0 {
				cfg.Admin = net.JoinHostPort("127.0.0.1", strconv.Itoa(metricsPort))
			}
			var sec upSecrets
			if secureOn {
				if sec, err = upSecure(secureDir, dataDir); err != nil {
					return fmt.Errorf("--secure: %w", err)
				}
				cfg.TLS, cfg.Token, cfg.Engine.Secret = sec.files, sec.token, sec.teSecret
			}
			if procs {
				self, err := os.Executable()
				if err != nil {
					return err
				}
				cfg.NodeCommand = []string{self, "node"}
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			cl, err := cluster.Start(ctx, cfg)
			if err != nil {
				// Start has stopped whatever it had started.
				return fmt.Errorf("up: %w", err)
			}
			defer cl.Close()
			out := cmd.OutOrStdout()
			if a := cl.EtcdAddr(); a != "" {
				fmt.Fprintf(out, "etcd      %s\n", a)
			}
			for i, m := range cl.Masters {
				role := "standby"
				if m.Leading() {
					role = "leader"
				}
				fmt.Fprintf(out, "master %d  rpc=%s admin=%s%s (%s)\n", i, m.Addr(), orNone(m.AdminAddr()), kvEventsAddrs(m), role)
			}
			for i, s := range cl.NodeSegments {
				fmt.Fprintf(out, "node %d    segment=%s size=%d\n", i, s, seg)
			}
			if secureOn {
				f := cfg.TLS
				fmt.Fprintf(out, "secure    ca=%s client_cert=%s client_key=%s token_file=%s te_secret_file=%s\n",
					f.CA, f.ClientCert, f.ClientKey, sec.tokenFile, sec.teSecretFile)
				fmt.Fprintf(out, "clients   --master %s --auth_token_file %s --te_secret_file %s --master_tls_ca_file %s --master_tls_cert_file %s --master_tls_key_file %s\n",
					cl.MasterURL(), sec.tokenFile, sec.teSecretFile, f.CA, f.ClientCert, f.ClientKey)
			} else {
				fmt.Fprintf(out, "clients   --master %s\n", cl.MasterURL())
			}
			fmt.Fprintln(out, "ready")
			<-ctx.Done()
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&etcdAddr, "etcd", "127.0.0.1:2379", "embedded etcd client address")
	f.IntVar(&rpcPort, "rpc_port", 50051, "first master's gRPC port (0 picks one)")
	f.IntVar(&metricsPort, "metrics_port", 9003, "first master's admin HTTP port (0 picks one, -1 none)")
	f.StringVar(&dataDir, "data-dir", "", "etcd data directory (zero: a temporary one, removed on exit)")
	f.IntVar(&nodes, "nodes", 1, "storage nodes")
	f.IntVar(&masters, "masters", 1, "masters (more than one: standbys)")
	f.StringVar(&segment, "global_segment_size", "1GiB", "memory each node contributes")
	f.BoolVar(&noHA, "no-ha", false, "one master without etcd (no journal, no failover)")
	f.BoolVar(&procs, "node-processes", false, "run nodes as child processes instead of in this one")
	f.BoolVar(&secureOn, "secure", false, "masters require mutual TLS and a token: generate both, print where they are")
	f.StringVar(&secureDir, "secure-dir", "", "where --secure writes its CA, certificates and token (zero: <data-dir>/secure, else a new temporary directory)")
	f.StringVar(&stripeMin, "stripe_min_size", "0", "puts of at least this size (bytes, or 64MiB) are striped over --stripe_count segments unless they say otherwise; 0: never")
	f.IntVar(&stripeCount, "stripe_count", master.DefaultStripeCount, "pieces of a striped replica, each on its own segment (of its own host where there are enough)")
	addKVEventsFlags(f)
	return c
}

// flagGetters reads flags by name, as kvEventsConfig wants them.
func flagGetters(f *pflag.FlagSet) (func(string) bool, func(string) string, func(string) int) {
	return func(n string) bool { v, _ := f.GetBool(n); return v },
		func(n string) string { v, _ := f.GetString(n); return v },
		func(n string) int { v, _ := f.GetInt(n); return v }
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// upSecrets are what --secure generated.
type upSecrets struct {
	files                  secure.Files
	token, tokenFile       string
	teSecret, teSecretFile string
}

// upSecure generates --secure's certificates, token and Transfer Engine
// secret into dir (zero: <dataDir>/secure, else a new temporary directory,
// kept: clients need the files after up exits as while it runs).
func upSecure(dir, dataDir string) (upSecrets, error) {
	switch {
	case dir != "":
	case dataDir != "":
		dir = filepath.Join(dataDir, "secure")
	default:
		d, err := os.MkdirTemp("", "mooncake-secure-")
		if err != nil {
			return upSecrets{}, err
		}
		dir = d
	}
	files, err := secure.Generate(dir)
	if err != nil {
		return upSecrets{}, err
	}
	sec := upSecrets{files: files, token: secure.NewToken(), tokenFile: filepath.Join(dir, "token"),
		teSecret: secure.NewToken(), teSecretFile: filepath.Join(dir, "te_secret")}
	for path, v := range map[string]string{sec.tokenFile: sec.token, sec.teSecretFile: sec.teSecret} {
		if err := os.WriteFile(path, []byte(v+"\n"), 0o600); err != nil {
			return upSecrets{}, err
		}
	}
	return sec, nil
}
