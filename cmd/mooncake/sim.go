package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/mooncake-go/mooncake/conductor"
	"github.com/mooncake-go/mooncake/conductor/sim"
	"github.com/mooncake-go/mooncake/internal/trace"
)

// simFlags are the flags every `mooncake sim` command shares: the trace,
// the deployment and the outputs.
type simFlags struct {
	path        string
	outDir      string
	asJSON      bool
	cfg         sim.Config
	local       float64
	store       float64
	bandwidthGB float64
}

// config is the deployment the flags describe.
func (f *simFlags) config() sim.Config {
	cfg := f.cfg
	cfg.LocalTokens = int64(f.local)
	if cfg.LocalTokens <= 0 {
		cfg.LocalTokens = -1 // sim.Config's zero is the default, the flag's is none
	}
	cfg.StoreTokens = int64(max(f.store, 0))
	cfg.Bandwidth = f.bandwidthGB * 1e9
	return cfg
}

// load reads the trace of --trace.
func (f *simFlags) load() ([]trace.Request, error) {
	return trace.Load(f.path)
}

// outPath is a file of --out, creating the directory; "" when --out is
// empty.
func (f *simFlags) outPath(name string) (string, error) {
	if f.outDir == "" {
		return "", nil
	}
	if err := os.MkdirAll(f.outDir, 0o755); err != nil {
		return "", err
	}
	return filepath.Join(f.outDir, name), nil
}

// writeOut writes the file name of --out with write and tells out
// "label: path", and " (note)" when there is one; without --out it does
// nothing.
func (f *simFlags) writeOut(out io.Writer, name, label string, write func(path string) error, note ...string) error {
	path, err := f.outPath(name)
	if err != nil || path == "" {
		return err
	}
	if err := write(path); err != nil {
		return err
	}
	if len(note) > 0 {
		path += " (" + note[0] + ")"
	}
	fmt.Fprintf(out, "%s: %s\n", label, path)
	return nil
}

func newSimCmd() *cobra.Command {
	sf := &simFlags{}
	var policies, admission string
	c := &cobra.Command{
		Use:   "sim",
		Short: "Simulate the Conductor on a trace: prefill policies, early rejection, the coupled baseline",
		Long: `Replays a trace (JSON Lines: timestamp, input_length, output_length,
hash_ids of 512-token blocks; the embedded conversation trace by default) as a
discrete-event simulation of --prefill and --decode instances of LLaMA3-70B on
8xA800 nodes: prefill queues, local prefix caches (LRU, --local-capacity
tokens), an optional shared store, KV-cache pulls at --bandwidth, and
continuous-batching decode, all timed by the Conductor's first-principles
models. The real Conductor scheduler routes each request on the simulated
clock, with the policy and early rejection asked for; the coupled baseline
runs prefill and decode on the same instances as vLLM does without
disaggregation (--chunk for chunked prefill).

Prints a summary per run (TTFT, TBT as the paper measures it: the mean of the
longest 10% of a request's token intervals, hit ratio, effective request
ratio, and the replicas of the prefix index's blocks: the most any block
reached and the mean of the hottest blocks at the end), or JSON with --json;
writes per-request results as Parquet, a PNG of the TTFT and TBT
distributions, the replica samples (every --replica-interval of simulated
time) as CSV and a PNG of the hot blocks' replicas over time to --out.

The subcommands regenerate the paper's figures (FAST'25 Figs. 1, 5, 9, 10).`,
		Example: `  mooncake sim
  mooncake sim --policy all --rate-scale 1.5
  mooncake sim --policy random,coupled --json --out ""
  mooncake sim fig5`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			base := sf.config()
			adm, err := conductor.ParseAdmission(admission)
			if err != nil {
				return fmt.Errorf("--admission: %w", err)
			}
			base.Admission = adm
			cfgs, err := parsePolicies(policies, base)
			if err != nil {
				return err
			}
			reqs, err := sf.load()
			if err != nil {
				return err
			}
			var results []*sim.Result
			var summaries []sim.Summary
			for _, cfg := range cfgs {
				start := time.Now()
				r, err := sim.Run(cfg, reqs)
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "%s: replayed %d requests in %v\n", cfg.Name(), len(r.Outcomes),
					time.Since(start).Round(time.Millisecond))
				results = append(results, r)
				summaries = append(summaries, r.Summary())
			}
			out := cmd.OutOrStdout()
			if sf.asJSON {
				if len(summaries) == 1 {
					return writeJSON(out, summaries[0])
				}
				return writeJSON(out, summaries)
			}
			if err := sim.WriteTable(out, summaries); err != nil {
				return err
			}
			if sf.outDir == "" {
				return nil
			}
			for _, r := range results {
				if err := sf.writeOut(out, "sim-"+r.Config.Name()+".parquet", "per-request results", r.WriteParquet); err != nil {
					return err
				}
				if err := writeReplicas(out, sf, "sim", r); err != nil {
					return err
				}
			}
			if err := sf.writeOut(out, "sim.png", "plot", func(png string) error { return sim.WritePlot(png, results...) }); err != nil {
				return err
			}
			if !slices.ContainsFunc(results, func(r *sim.Result) bool { return len(r.Replicas) > 0 }) {
				return nil
			}
			return sf.writeOut(out, "sim-replicas.png", "replicas plot", func(png string) error { return sim.PlotReplicas(png, results...) })
		},
	}
	pf := c.PersistentFlags()
	pf.StringVar(&sf.path, "trace", "", "trace JSONL (empty: the embedded conversation trace)")
	pf.StringVar(&sf.outDir, "out", "sim-out", "directory for Parquet files and PNG plots (empty: none)")
	pf.BoolVar(&sf.asJSON, "json", false, "print the summary as JSON instead of a table (and write no files)")
	pf.IntVar(&sf.cfg.Prefill, "prefill", sim.DefaultPrefill, "prefill instances (coupled: prefill+decode instances in all)")
	pf.IntVar(&sf.cfg.Decode, "decode", sim.DefaultDecode, "decode instances")
	pf.Float64Var(&sf.local, "local-capacity", sim.DefaultLocalTokens, "local prefix cache per instance, tokens (0: none)")
	pf.Float64Var(&sf.store, "store-capacity", 0, "shared store every prefill writes to, tokens (0: none)")
	pf.Float64Var(&sf.bandwidthGB, "bandwidth", conductor.DefaultBandwidth/1e9, "KV-cache pull bandwidth per instance, GB/s")
	pf.IntVar(&sf.cfg.BalanceBlocks, "balance-blocks", 0, "Algorithm 1's balancing threshold, blocks")
	pf.Float64Var(&sf.cfg.RateScale, "rate-scale", 1, "multiply the trace's arrival rate")
	pf.IntVar(&sf.cfg.MaxRequests, "max-requests", 0, "replay only the first N requests (0: all)")
	pf.IntVar(&sf.cfg.OutputTokens, "output-tokens", 0, "replace every output length (0: the trace's)")
	pf.DurationVar(&sf.cfg.TTFTSLO, "ttft-slo", conductor.DefaultTTFTSLO, "TTFT objective (admission, effective ratio)")
	pf.DurationVar(&sf.cfg.TBTSLO, "tbt-slo", conductor.DefaultTBTSLO, "TBT objective (admission, effective ratio)")
	pf.Uint64Var(&sf.cfg.Seed, "seed", 0, "seed of the random policy")
	pf.DurationVar(&sf.cfg.ReplicaInterval, "replica-interval", sim.DefaultReplicaInterval,
		"sample the replicas of the prefix index's blocks every this much simulated time, and at the end (negative: never)")
	pf.IntVar(&sf.cfg.HotBlocks, "hot-blocks", sim.DefaultHotBlocks,
		"the most requested blocks whose mean replicas the samples report")
	f := c.Flags()
	f.StringVar(&policies, "policy", conductor.GlobalCacheAware.String(),
		"comma-separated runs: "+strings.Join(simPolicyNames(), ", ")+"; all: every one")
	f.StringVar(&admission, "admission", conductor.RejectPredicted.String(),
		"early rejection of the disaggregated runs: predicted, current-load or none")
	f.IntVar(&sf.cfg.ChunkTokens, "chunk", 0, "coupled runs: chunked prefill with this token budget per iteration (0: none)")
	c.AddCommand(newSimFig5Cmd(sf), newSimFig9Cmd(sf), newSimFig10Cmd(sf), newSimFig1Cmd(sf))
	return c
}

func simPolicyNames() []string {
	var names []string
	for _, p := range conductor.Policies() {
		names = append(names, p.String())
	}
	return append(names, "coupled")
}

// parsePolicies turns --policy into one configuration per run.
func parsePolicies(list string, base sim.Config) ([]sim.Config, error) {
	var out []sim.Config
	for _, name := range strings.Split(list, ",") {
		name = strings.TrimSpace(name)
		switch name {
		case "all":
			for _, p := range conductor.Policies() {
				cfg := base
				cfg.Policy = p
				out = append(out, cfg)
			}
			cfg := base
			cfg.Coupled = true
			out = append(out, cfg)
		case "coupled":
			cfg := base
			cfg.Coupled = true
			out = append(out, cfg)
		default:
			p, err := conductor.ParsePolicy(name)
			if err != nil {
				return nil, fmt.Errorf("--policy: %w (or coupled, all)", err)
			}
			cfg := base
			cfg.Policy = p
			out = append(out, cfg)
		}
	}
	return out, nil
}

// writeReplicas writes the replica samples of r, if it has any, as
// <prefix>-<run>-replicas.csv in --out, next to its Parquet file.
func writeReplicas(out io.Writer, sf *simFlags, prefix string, r *sim.Result) error {
	if len(r.Replicas) == 0 {
		return nil
	}
	return sf.writeOut(out, prefix+"-"+r.Config.Name()+"-replicas.csv", "replica samples", r.WriteReplicasCSV)
}

func newSimFig5Cmd(sf *simFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "fig5",
		Short: "Fig. 5: mean TTFT of each prefill policy (nothing rejected)",
		Long: `Replays the trace once per prefill policy (global-cache-aware, local-cache-aware,
load-balance, random) on the deployment of the flags (8 prefill and 8 decode
instances with 3M-token local caches: the paper's 16 nodes at the 1:1 ratio of
its §5.5), admitting every request so that every TTFT counts, and compares
their mean TTFT. Writes fig5.png and one Parquet file per policy to --out.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			reqs, err := sf.load()
			if err != nil {
				return err
			}
			base := sf.config()
			base.Admission = conductor.RejectNone
			start := time.Now()
			rs, err := sim.Fig5(reqs, base)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "fig5: %d replays in %v\n", len(rs), time.Since(start).Round(time.Millisecond))
			return reportRuns(cmd.OutOrStdout(), sf, "fig5", rs, sim.PlotFig5, func(w io.Writer, ss []sim.Summary) {
				g, l := ss[0].TTFTMeanS, ss[1].TTFTMeanS
				fmt.Fprintf(w, "global-cache-aware mean TTFT is %.1f%% below local-cache-aware\n", 100*(1-g/l))
			})
		},
	}
}

// reportRuns prints a figure's runs as a table (or JSON), writes their
// Parquet files and the figure's plot.
func reportRuns(out io.Writer, sf *simFlags, fig string, rs []*sim.Result,
	draw func(string, []*sim.Result) error, note func(io.Writer, []sim.Summary)) error {
	ss := make([]sim.Summary, len(rs))
	for i, r := range rs {
		ss[i] = r.Summary()
	}
	if sf.asJSON {
		return writeJSON(out, ss)
	}
	if err := sim.WriteTable(out, ss); err != nil {
		return err
	}
	if note != nil {
		note(out, ss)
	}
	if sf.outDir == "" {
		return nil
	}
	for _, r := range rs {
		if err := sf.writeOut(io.Discard, fig+"-"+r.Config.Name()+".parquet", "", r.WriteParquet); err != nil {
			return err
		}
		if err := writeReplicas(io.Discard, sf, fig, r); err != nil {
			return err
		}
	}
	return sf.writeOut(out, fig+".png", "plot", func(png string) error { return draw(png, rs) },
		"per-request results: "+filepath.Join(sf.outDir, fig)+"-*.parquet")
}

func newSimFig9Cmd(sf *simFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "fig9",
		Short: "Fig. 9: prefix-cache hit ratio vs LRU capacity, 1e4 to 1e9 tokens, and the infinite bound",
		Long: `Replays the trace's blocks, in order, through one LRU cache of each capacity
(half decades from 1e4 to 1e9 tokens) with no timing and no instances, and
prints the hit ratio (prompt tokens reused over prompt tokens) of each, the
infinite-capacity bound, and the ratio at 3M tokens (a node's DRAM) to it.
Writes fig9.png to --out.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			reqs, err := sf.load()
			if err != nil {
				return err
			}
			if n := sf.cfg.MaxRequests; n > 0 && n < len(reqs) {
				reqs = reqs[:n]
			}
			h := sim.Fig9(reqs, sim.Fig9Capacities())
			out := cmd.OutOrStdout()
			if sf.asJSON {
				return writeJSON(out, struct {
					Capacities []int64   `json:"capacity_tokens"`
					Ratios     []float64 `json:"hit_ratio"`
					Infinite   float64   `json:"infinite_hit_ratio"`
				}{h.Capacities, h.Ratios, h.Infinite})
			}
			for i, c := range h.Capacities {
				fmt.Fprintf(out, "%12d tokens  %5.1f%%\n", c, 100*h.Ratios[i])
			}
			fmt.Fprintf(out, "    infinite         %5.1f%%\n", 100*h.Infinite)
			at := h.At(sim.DefaultLocalTokens)
			fmt.Fprintf(out, "at 3M tokens: %.1f%% (%.0f%% of the bound)\n", 100*at, 100*at/h.Infinite)
			return sf.writeOut(out, "fig9.png", "plot", func(png string) error { return sim.PlotFig9(png, h) })
		},
	}
}

func newSimFig10Cmd(sf *simFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "fig10",
		Short: "Fig. 10: 10 prefill instances with 3M-token caches, local vs global cache",
		Long: `Replays the trace on 10 prefill instances with a 3M-token local cache each and
every output cut to one token (to isolate prefill), nothing rejected: once
reusing only an instance's own cache (local-cache-aware), once pulling from
the others' (global-cache-aware). Prints the hit ratio and the mean prefill
GPU time of both; writes fig10.png and the Parquet files to --out.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			reqs, err := sf.load()
			if err != nil {
				return err
			}
			local, global, err := sim.Fig10(reqs, sf.config())
			if err != nil {
				return err
			}
			return reportRuns(cmd.OutOrStdout(), sf, "fig10", []*sim.Result{local, global},
				func(path string, rs []*sim.Result) error { return sim.PlotFig10(path, rs[0], rs[1]) },
				func(w io.Writer, ss []sim.Summary) {
					fmt.Fprintf(w, "global vs local: hit ratio %.2fx, prefill GPU time %.2fx\n",
						ss[1].CacheHitRatio/ss[0].CacheHitRatio, ss[1].PrefillTimeMeanS/ss[0].PrefillTimeMeanS)
				})
		},
	}
}

func newSimFig1Cmd(sf *simFlags) *cobra.Command {
	var (
		capacity bool
		rates    []float64
		target   float64
	)
	c := &cobra.Command{
		Use:   "fig1",
		Short: "Fig. 1: effective request ratio vs TBT threshold, Mooncake vs the coupled baseline",
		Long: `Replays the trace on Mooncake (global-cache-aware with prediction-based early
rejection, --prefill + --decode disaggregated instances) and on as many coupled
instances as vLLM runs them: plain, with prefix caching (in the HBM left for
the KV cache), and with chunked prefill (512-token budget). Prints, per
system, the share of requests that met the TTFT SLO and each TBT threshold
from 100 ms to 1 s; writes fig1.png and the Parquet files to --out. Pick the
load with --rate-scale (bench/README.md explains the choice of 1.5).

With --capacity, measures what the paper's Fig. 1 plots instead: every system
at every load of --rates, and per TBT threshold the highest load up to which
at least --target of the requests were effective, relative to Mooncake's;
writes fig1-capacity.png.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			reqs, err := sf.load()
			if err != nil {
				return err
			}
			if capacity {
				return runCapacity(cmd, sf, reqs, rates, target)
			}
			rs, err := sim.Fig1(reqs, sf.config())
			if err != nil {
				return err
			}
			th := sim.Fig1Thresholds()
			out := cmd.OutOrStdout()
			if sf.asJSON {
				type series struct {
					Name    string      `json:"name"`
					Summary sim.Summary `json:"summary"`
					Ratios  []float64   `json:"effective_request_ratio"`
				}
				var v struct {
					Thresholds []float64 `json:"tbt_threshold_ms"`
					Series     []series  `json:"series"`
				}
				for _, t := range th {
					v.Thresholds = append(v.Thresholds, float64(t)/1e6)
				}
				for i, r := range rs {
					s := series{Name: sim.Fig1Names[i], Summary: r.Summary()}
					for _, t := range th {
						s.Ratios = append(s.Ratios, r.Effective(r.Config.TTFTSLO, t))
					}
					v.Series = append(v.Series, s)
				}
				return writeJSON(out, v)
			}
			fmt.Fprintf(out, "%-28s", "TBT threshold (ms)")
			marks := []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 300 * time.Millisecond,
				500 * time.Millisecond, time.Second}
			for _, t := range marks {
				fmt.Fprintf(out, "%8d", t.Milliseconds())
			}
			fmt.Fprintln(out)
			for i, r := range rs {
				fmt.Fprintf(out, "%-28s", sim.Fig1Names[i])
				for _, t := range marks {
					fmt.Fprintf(out, "%7.1f%%", 100*r.Effective(r.Config.TTFTSLO, t))
				}
				fmt.Fprintln(out)
			}
			return reportRuns(out, sf, "fig1", rs, func(path string, rs []*sim.Result) error {
				return sim.PlotFig1(path, sim.Fig1Names, rs, th)
			}, nil)
		},
	}
	f := c.Flags()
	f.BoolVar(&capacity, "capacity", false, "sweep the load and report each system's capacity (the paper's Fig. 1 metric)")
	f.Float64SliceVar(&rates, "rates", []float64{0.25, 0.5, 0.75, 1, 1.25, 1.5, 1.75, 2, 2.5, 3, 3.5, 4},
		"with --capacity: the loads (rate scales) swept, increasing")
	f.Float64Var(&target, "target", 0.9, "with --capacity: the share of effective requests a load must keep")
	return c
}

// runCapacity is `sim fig1 --capacity`.
func runCapacity(cmd *cobra.Command, sf *simFlags, reqs []trace.Request, rates []float64, target float64) error {
	if len(rates) == 0 || !slices.IsSorted(rates) || rates[0] <= 0 {
		return fmt.Errorf("--rates %v: want positive loads in increasing order", rates)
	}
	if target <= 0 || target > 1 {
		return fmt.Errorf("--target %g: want a share in (0, 1]", target)
	}
	th := sim.Fig1Thresholds()
	start := time.Now()
	c, err := sim.Fig1Capacity(reqs, sf.config(), rates, th, runtime.GOMAXPROCS(0))
	if err != nil {
		return err
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "fig1: %d replays in %v\n", len(rates)*len(sim.Fig1Names),
		time.Since(start).Round(time.Millisecond))
	marks := []int{0, 2, 4, 8, len(th) - 1} // 100, 200, 300, 500 ms, 1 s
	out := cmd.OutOrStdout()
	if sf.asJSON {
		type series struct {
			Name     string    `json:"name"`
			Capacity []float64 `json:"capacity_rate_scale"`
		}
		var v struct {
			Target     float64   `json:"target"`
			Thresholds []float64 `json:"tbt_threshold_ms"`
			Series     []series  `json:"series"`
		}
		v.Target = target
		for _, t := range th {
			v.Thresholds = append(v.Thresholds, float64(t)/1e6)
		}
		for s, name := range sim.Fig1Names {
			se := series{Name: name}
			for t := range th {
				se.Capacity = append(se.Capacity, c.At(s, t, target))
			}
			v.Series = append(v.Series, se)
		}
		return writeJSON(out, v)
	}
	fmt.Fprintf(out, "highest load (x the trace's rate) with >= %.0f%% effective requests\n%-28s", 100*target,
		"TBT threshold (ms)")
	for _, t := range marks {
		fmt.Fprintf(out, "%8d", th[t].Milliseconds())
	}
	fmt.Fprintln(out)
	for s, name := range sim.Fig1Names {
		fmt.Fprintf(out, "%-28s", name)
		for _, t := range marks {
			fmt.Fprintf(out, "%8.2f", c.At(s, t, target))
		}
		fmt.Fprintln(out)
	}
	return sf.writeOut(out, "fig1-capacity.png", "plot", func(png string) error {
		return sim.PlotCapacity(png, sim.Fig1Names, c, target)
	})
}
