package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/viper"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/mooncake-go/mooncake/engine/metadata"
	"github.com/mooncake-go/mooncake/internal/netlab"
	"github.com/mooncake-go/mooncake/store/chaos"
	"github.com/mooncake-go/mooncake/store/ha"
	"github.com/mooncake-go/mooncake/store/master"
)

// chaosFlags are `mooncake chaos`'s settings.
type chaosFlags struct {
	duration, opTimeout, leaseTTL, clientTTL time.Duration
	clients, keys, replicas                  int
	valueSize, segment                       string
	masters, nodes                           int
	faults, out, master, clusterID           string
	transport                                string
	forceRemoves                             float64
	seed                                     uint64
	netlab                                   bool
}

func newChaosCmd() *cobra.Command {
	var f chaosFlags
	c := &cobra.Command{
		Use:   "chaos",
		Short: "A checked soak: a mixed workload under a fault schedule, its history checked",
		Long: `Starts a store of child processes (embedded etcd, --masters masters under
HA, --nodes storage nodes), runs --clients clients doing puts, gets,
upserts and removes of --keys keys for --duration while a nemesis injects
the --faults schedule, heals the faults, reads every key once more, and
checks the history: every get read bytes some write of that key made (and
not a value an acknowledged upsert or remove had replaced before it
began), and every acknowledged write not removed by the workload nor
evicted by the master is still readable. Operations that timed out may or
may not have happened and are checked as such.

Prints the operations, the faults injected and the anomalies, writes the
history to --out (Parquet), and exits non-zero on any anomaly.

Faults: kill-node (kill -9 of a random storage node, restarted after the
hold), kill-master (kill -9 of the leading master, restarted as a
standby), lose-keys (a control: removes every object behind the
checker's back, which it must report). A schedule is a comma-separated
list of name@time[/period][+hold] or name/period[+hold].

With --netlab (root) every process runs on a host of its own, emulated in
a network namespace (internal/netlab; the command runs itself again in a
namespace of its own), the data path is TCP, and the network faults join
the schedule's choices: partition-leader (the leader isolated),
split-leader (the leader cut off from etcd and the nodes, clients still
reach it), partition-node, partition-etcd, lossy-links (5% loss and 20 ms
delay on every link).

With --master the workload runs against that store instead (no process
faults).`,
		Example: `  mooncake chaos
  mooncake chaos --duration 10m --faults kill-node/20s,kill-master@45s/60s+3s --clients 8
  mooncake chaos --netlab --duration 10m --faults partition-node/30s+5s,partition-leader@20s/60s+5s,lossy-links@45s/60s+5s,kill-master@50s/90s
  mooncake chaos --master etcd://10.0.0.1:2379 --faults none`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runChaos(cmd, f) },
	}
	fl := c.Flags()
	fl.DurationVar(&f.duration, "duration", 30*time.Second, "how long the workload runs")
	fl.IntVar(&f.clients, "clients", 4, "workload clients (each its own store client)")
	fl.IntVar(&f.keys, "keys", 64, "keys the workload touches")
	fl.StringVar(&f.valueSize, "value-size", "16KiB", "size of every value")
	fl.IntVar(&f.replicas, "replicas", 2, "replicas per write")
	fl.Float64Var(&f.forceRemoves, "force-removes", 0.25, "share of removes that are forced (remove leased objects too)")
	fl.StringVar(&f.transport, "transport", "auto", "data path of clients and nodes: auto (shared memory on this host) or tcp")
	fl.DurationVar(&f.opTimeout, "op-timeout", 5*time.Second, "deadline of one operation (past it: unknown)")
	fl.StringVar(&f.faults, "faults", "kill-node@5s,kill-master@12s,kill-node@20s", "fault schedule (none: no faults)")
	fl.Uint64Var(&f.seed, "seed", 1, "seed of the workload and of the faults' choices")
	fl.StringVar(&f.out, "out", "chaos-out/history.parquet", "Parquet file of the history (empty: none)")
	fl.IntVar(&f.masters, "masters", 2, "masters of the store started (HA)")
	fl.IntVar(&f.nodes, "nodes", 3, "storage nodes of the store started")
	fl.StringVar(&f.segment, "node-segment", "64MiB", "memory each storage node contributes")
	fl.DurationVar(&f.leaseTTL, "lease-ttl", 100*time.Millisecond, "read lease of the store started (with --master: that store's, for the checker; default 10s there)")
	fl.DurationVar(&f.clientTTL, "client-ttl", 4*time.Second, "how long the master keeps a silent node's segment")
	fl.StringVar(&f.master, "master", "", "run against this store (host:port or etcd://...) instead of starting one")
	fl.StringVar(&f.clusterID, "cluster_id", "", "HA cluster name with --master (zero: the client's default)")
	fl.BoolVar(&f.netlab, "netlab", false, "run every process on an emulated host of its own and allow the network faults (root)")
	return c
}

func runChaos(cmd *cobra.Command, f chaosFlags) error {
	var lab *netlab.Lab
	if f.netlab {
		if f.master != "" {
			return errors.New("--netlab starts its own store: not with --master")
		}
		if !netlab.InOwnNamespace() {
			if err := netlab.Available(); err != nil {
				return fmt.Errorf("--netlab: %w", err)
			}
			code, err := netlab.Reexec()
			if err != nil {
				return err
			}
			os.Exit(code) // the child printed the report
		}
		if err := netlab.UpLoopback(); err != nil {
			return err
		}
		var err error
		if lab, err = netlab.New(netlab.Config{Seed: f.seed}); err != nil {
			return err
		}
		defer lab.Close()
		f.transport = "tcp" // shared memory would bypass the emulated links
		if !cmd.Flags().Changed("faults") {
			f.faults = "partition-node@4s+3s,partition-leader@10s+3s,lossy-links@16s+2s,kill-node@22s"
		}
	}
	if f.master != "" {
		if !cmd.Flags().Changed("faults") {
			f.faults = "none" // no processes of its own to kill
		}
		if !cmd.Flags().Changed("lease-ttl") {
			f.leaseTTL = master.DefaultLeaseTTL // what a master runs with unless told
		}
	}
	steps, err := chaos.ParseSchedule(f.faults)
	if err != nil {
		return err
	}
	valueSize, err := parseSize(f.valueSize)
	if err != nil {
		return fmt.Errorf("--value-size: %w", err)
	}
	segment, err := parseSize(f.segment)
	if err != nil {
		return fmt.Errorf("--node-segment: %w", err)
	}
	ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	cfg := chaos.Config{Master: f.master, ClusterID: f.clusterID, Duration: f.duration, Clients: f.clients, Keys: f.keys,
		ValueSize: int(valueSize), Replicas: f.replicas, OpTimeout: f.opTimeout, Seed: f.seed, Steps: steps,
		Transport: f.transport, ForceRemoves: f.forceRemoves}
	out := cmd.OutOrStdout()
	if f.master == "" {
		self, err := os.Executable()
		if err != nil {
			return err
		}
		procs, err := chaos.StartProcs(ctx, chaos.ProcsConfig{Command: []string{self}, Masters: f.masters, Nodes: f.nodes,
			NodeSegment: segment, Seed: f.seed, LogLevel: viper.GetString("log-level"), NodeArgs: []string{"--transport", f.transport}, Lab: lab,
			MasterArgs: []string{"--default_kv_lease_ttl", f.leaseTTL.String(), "--client_ttl", f.clientTTL.String()}})
		if err != nil {
			return err
		}
		defer procs.Close()
		cfg.Master, cfg.ClusterID, cfg.Leader, cfg.Faults = procs.MasterURL(), procs.ClusterID(), procs.Leader, procs.Faults()
		if lab != nil {
			cfg.Host = lab.Local().IP.String()
		}
		fmt.Fprintf(out, "store: %d masters, %d nodes of %s; clients --master %s --cluster_id %s\n",
			f.masters, f.nodes, f.segment, cfg.Master, cfg.ClusterID)
	} else {
		leader, closeLeader, err := leaderOf(f.master, f.clusterID)
		if err != nil {
			return err
		}
		defer closeLeader()
		cfg.Leader = leader
	}
	fmt.Fprintf(out, "workload: %d clients, %d keys, %d-byte values, %d replicas, %v, seed %d; faults: %s\n",
		f.clients, f.keys, valueSize, f.replicas, f.duration, f.seed, scheduleString(steps))
	h, runErr := chaos.Run(ctx, cfg)
	if h == nil {
		return runErr
	}
	// Interrupted, the history so far is still worth a report.
	anomalies := chaos.Check(h.Ops(), h.Evictions(), chaos.CheckConfig{StaleWindow: f.leaseTTL * 3 / 4})
	if err := chaos.Report(out, h, anomalies); err != nil {
		return err
	}
	if f.out != "" {
		if err := os.MkdirAll(filepath.Dir(f.out), 0o755); err != nil {
			return err
		}
		if err := h.WriteParquet(f.out); err != nil {
			return fmt.Errorf("--out: %w", err)
		}
		fmt.Fprintf(out, "history: %s\n", f.out)
	}
	if len(anomalies) > 0 {
		return fmt.Errorf("chaos: %d anomalies", len(anomalies))
	}
	return runErr
}

func scheduleString(steps []chaos.Step) string {
	if len(steps) == 0 {
		return "none"
	}
	s := make([]string, len(steps))
	for i, st := range steps {
		s[i] = st.String()
	}
	return strings.Join(s, ",")
}

// leaderOf finds the leading master of the store at master (an address,
// or etcd://... under HA) for the eviction watch.
func leaderOf(master, clusterID string) (func(context.Context) (string, error), func(), error) {
	eps, ok := strings.CutPrefix(master, "etcd://")
	if !ok {
		return func(context.Context) (string, error) { return master, nil }, func() {}, nil
	}
	if clusterID == "" {
		clusterID = os.Getenv("MC_STORE_CLUSTER_ID")
	}
	if clusterID == "" {
		clusterID = "mooncake_cluster"
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: metadata.EtcdEndpoints(eps), DialTimeout: 5 * time.Second})
	if err != nil {
		return nil, nil, fmt.Errorf("--master %s: %w", master, err)
	}
	return func(ctx context.Context) (string, error) {
		addr, _, err := ha.Leader(ctx, cli, clusterID)
		return addr, err
	}, func() { _ = cli.Close() }, nil
}
