package main

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/mooncake-go/mooncake/bench/store"
)

func newBenchStoreCmd() *cobra.Command {
	var (
		o          store.Options
		valueSize  string
		systems    string
		topologies string
		repeat     int
		asJSON     bool
		master     string
		ha         bool
		masters    int
		syncEtcd   bool
		reserve    bool
		noAuto     bool
		cpuprofile string
		memprofile string
	)
	c := &cobra.Command{
		Use:   "store",
		Short: "Benchmark the store against Redis, the official Mooncake Store and the TCP and memcpy floors, in one run",
		Long: `Measures --op put or get of --value-size objects in batches of --batch-size
from --clients clients for --duration, on our store in each --topology (local:
clients hold the objects in their own segments; same-host: a storage node
process, shared memory; remote: a storage node process, TCP), on Redis
(redis-server, same value size, batch and concurrency; MSET/MGET) and on the
official Mooncake Store (mooncake_master and its Python client from the
wheel in .venv-official), and on two floors, what the same calls cost at best:
tcp (topology remote), a server child process holding the working set that
answers a get with one writev of the values from its memory and reads a put's
values straight into it, one loopback connection per client; and memcpy
(topology same-host), each client copying values between its memory and a
shared memory mapping of the working set. Systems take turns, --repeat times;
the table shows medians and each row's GB/s over Redis's ("x redis"), and,
where the floors ran, over theirs: read "x tcp" for remote and redis rows,
"x memcpy" for same-host and local ones. --json prints the same ratios as
x_tcp and x_memcpy. Puts always write fresh keys. Our store is started for
each run unless --master points at one.`,
		Example: `  mooncake bench store --op get --value-size 1MiB --clients 2
  mooncake bench store --op put --value-size 4KiB --batch-size 128 --systems ours --json
  mooncake bench store --op get --value-size 1MiB --systems ours,tcp,memcpy --topology same-host,remote`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			n, err := parseSize(valueSize)
			if err != nil {
				return fmt.Errorf("--value-size: %w", err)
			}
			o.ValueSize = int(n)
			if err := o.Validate(); err != nil {
				return err
			}
			self, err := os.Executable()
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			type system struct {
				name, topology string
				run            func(store.Options) (store.Result, error)
			}
			var runs []system
			for _, s := range strings.Split(systems, ",") {
				switch strings.TrimSpace(s) {
				case store.Ours, "ours":
					for _, t := range strings.Split(topologies, ",") {
						cfg := store.OursConfig{Topology: strings.TrimSpace(t), Master: master, HA: ha, Masters: masters, SyncEtcd: syncEtcd, ReservePuts: reserve, NoAutoSlots: noAuto,
							NodeCommand: []string{self, "node", "--local_buffer_size", "8MiB"}}
						runs = append(runs, system{store.Ours, cfg.Topology, func(o store.Options) (store.Result, error) {
							return store.RunOurs(ctx, o, cfg)
						}})
					}
				case store.TCP:
					cfg := store.TCPConfig{Command: append([]string{self}, benchStoreTCPServerArgs...)}
					runs = append(runs, system{store.TCP, store.Remote, func(o store.Options) (store.Result, error) {
						return store.RunTCP(ctx, o, cfg)
					}})
				case store.Memcpy:
					runs = append(runs, system{store.Memcpy, store.SameHost, func(o store.Options) (store.Result, error) {
						return store.RunMemcpy(ctx, o)
					}})
				case store.Redis:
					runs = append(runs, system{store.Redis, "", func(o store.Options) (store.Result, error) {
						return store.RunRedis(ctx, o, store.RedisConfig{})
					}})
				case store.Official:
					for _, t := range strings.Split(topologies, ",") {
						t = strings.TrimSpace(t)
						if t == store.SameHost {
							continue // the official client has no same-host path of its own
						}
						runs = append(runs, system{store.Official, t, func(o store.Options) (store.Result, error) {
							return store.RunOfficial(ctx, o, store.OfficialConfig{Topology: t})
						}})
					}
				default:
					return fmt.Errorf("--systems: %q is not one of ours, tcp, memcpy, redis, official", s)
				}
			}
			if cpuprofile != "" {
				stopProfile, err := startCPUProfile(cpuprofile)
				if err != nil {
					return err
				}
				defer stopProfile()
			}
			if memprofile != "" {
				defer func() {
					if err := writeAllocsProfile(memprofile); err != nil {
						fmt.Fprintln(cmd.ErrOrStderr(), err)
					}
				}()
			}
			results := make([][]store.Result, len(runs))
			var skipped []string
			for r := range repeat {
				for i, s := range runs {
					oo := o
					oo.KeyPrefix = fmt.Sprintf("%s%d-%d-", store.DefaultKeyPrefix, r, i)
					res, err := s.run(oo)
					if errors.Is(err, store.ErrNoRedis) || errors.Is(err, store.ErrNoOfficial) {
						skipped = append(skipped, fmt.Sprintf("%s: %v", s.name, err))
						continue
					}
					if err != nil {
						return fmt.Errorf("%s %s: %w", s.name, s.topology, err)
					}
					results[i] = append(results[i], res)
				}
			}
			var med []store.Result
			for _, rs := range results {
				if len(rs) > 0 {
					med = append(med, store.Median(rs))
				}
			}
			store.FloorRatios(med)
			out := cmd.OutOrStdout()
			if asJSON {
				return writeJSON(out, med)
			}
			for _, s := range slices.Compact(skipped) {
				fmt.Fprintln(out, "skipped", s)
			}
			return store.WriteTable(out, med, store.Redis)
		},
	}
	f := c.Flags()
	f.StringVar(&o.Op, "op", store.OpGet, "put or get")
	f.StringVar(&valueSize, "value-size", "1MiB", "bytes per object")
	f.IntVar(&o.BatchSize, "batch-size", 1, "objects per call")
	f.IntVar(&o.Clients, "clients", 1, "concurrent clients")
	f.DurationVar(&o.Duration, "duration", 5*time.Second, "measured time per run")
	f.DurationVar(&o.Warmup, "warmup", time.Second, "unmeasured time before each run")
	f.StringVar(&systems, "systems", "ours,tcp,memcpy,redis,official", "systems to run: ours, tcp, memcpy, redis, official")
	f.StringVar(&topologies, "topology", "same-host,remote", "ours: local, same-host, remote; official: local, remote")
	f.IntVar(&repeat, "repeat", 3, "runs per system; the table shows medians")
	f.BoolVar(&asJSON, "json", false, "print the medians as JSON")
	f.StringVar(&master, "master", "", "use this store for ours (host:port or etcd://...)")
	f.BoolVar(&ha, "ha", false, "start our master with the etcd journal, as mooncake up does")
	f.IntVar(&masters, "masters", 1, "our masters with --ha (more than one: standbys, which acknowledge journal records)")
	f.BoolVar(&syncEtcd, "sync-etcd", false, "with --ha: puts wait for etcd even with a standby")
	f.BoolVar(&reserve, "reserve-puts", false, "our clients put values of every length into space reserved ahead (client.Config.ReservePuts)")
	f.BoolVar(&noAuto, "no-auto-slots", false, "without --reserve-puts, every put of ours starts on the master, small values too (client.Config.NoAutoSlots)")
	f.StringVar(&cpuprofile, "cpuprofile", "", "write a CPU profile of this process (clients, and our master unless --master) over all runs here")
	f.StringVar(&memprofile, "memprofile", "", "write this process's allocations (pprof's allocs profile) at the end here")
	c.AddCommand(newBenchStoreTCPServerCmd())
	return c
}

// benchStoreTCPServerArgs select the hidden command the tcp floor's server
// child runs.
var benchStoreTCPServerArgs = []string{"bench", "store", "tcp-server"}

func newBenchStoreTCPServerCmd() *cobra.Command {
	var cfg store.TCPServerConfig
	c := &cobra.Command{
		Use:    "tcp-server",
		Short:  "Server of the benchmark's tcp floor, until stdin closes",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := childContext(cmd)
			defer stop()
			return store.ServeTCPServer(ctx, cfg, cmd.OutOrStdout())
		},
	}
	cfg.BindFlags(c.Flags())
	return c
}
