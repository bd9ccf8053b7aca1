// Command mooncake is the one CLI of mooncake-go: the store's master and
// storage nodes, the all-in-one store (up), the HTTP metadata server, and
// the Conductor and its simulator (conductor, sim), and the benchmarks
// (trace replay, store, transfer engine).
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"runtime/pprof"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/viper"
)

func main() {
	if err := newRoot().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "mooncake:", err)
		os.Exit(1)
	}
}

func newRoot() *cobra.Command {
	stopProfile := func() {}
	root := &cobra.Command{
		Use:           "mooncake",
		Short:         "Mooncake in Go: KV-cache transfer engine, store and scheduler",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			if err := setupLogging(viper.GetString("log-level")); err != nil {
				return err
			}
			var err error
			stopProfile, err = startProfile(cmd)
			return err
		},
		PersistentPostRun: func(*cobra.Command, []string) { stopProfile() },
	}
	root.PersistentFlags().String("log-level", "info", "log level: debug, info, warn, error (env MC_LOG_LEVEL)")
	root.PersistentFlags().String("cpuprofile", "", "write a CPU profile of this process to the file")
	root.PersistentFlags().MarkHidden("cpuprofile")
	root.PersistentFlags().String("memprofile", "", "write an allocation profile of this process to the file when it ends")
	root.PersistentFlags().MarkHidden("memprofile")
	viper.BindPFlag("log-level", root.PersistentFlags().Lookup("log-level"))
	viper.BindEnv("log-level", "MC_LOG_LEVEL")
	root.AddCommand(newMetadataCmd(), newMasterCmd(), newNodeCmd(), newClientCmd(), newUpCmd(), newBenchCmd(), newConductorCmd(), newIndexerCmd(), newSimCmd(), newChaosCmd())
	return root
}

func setupLogging(level string) error {
	var l slog.Level
	if err := l.UnmarshalText([]byte(strings.ToLower(level))); err != nil {
		return fmt.Errorf("--log-level %q: %w", level, err)
	}
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: l})))
	return nil
}

// startProfile starts the CPU profile --cpuprofile asks for and returns
// what stops it and writes the allocation profile --memprofile asks for
// (the root's PersistentPostRun). A command with a --cpuprofile of its own
// (bench te: it also profiles its target) handles that flag itself.
func startProfile(cmd *cobra.Command) (stop func(), err error) {
	stopCPU := func() {}
	if path, _ := cmd.Flags().GetString("cpuprofile"); path != "" && cmd.LocalNonPersistentFlags().Lookup("cpuprofile") == nil {
		if stopCPU, err = startCPUProfile(path); err != nil {
			return nil, err
		}
	}
	mem, _ := cmd.Flags().GetString("memprofile")
	return func() {
		stopCPU()
		if mem != "" {
			if err := writeAllocProfile(mem); err != nil {
				slog.Error("--memprofile", "err", err)
			}
		}
	}, nil
}

// writeAllocProfile writes the allocations since the process started
// (as of a collection run first: the profile stops at the last one).
func writeAllocProfile(path string) error {
	runtime.GC()
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	return errors.Join(pprof.Lookup("allocs").WriteTo(f, 0), f.Close())
}

func newBenchCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "bench",
		Short: "Benchmarks that compare against a yardstick measured in the same run",
	}
	c.AddCommand(newBenchTECmd(), newBenchTraceCmd(), newBenchStoreCmd())
	return c
}

// writeJSON writes v as indented JSON, the --json output of every command.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
