package faults

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mooncake-go/mooncake/internal/netlab"
	"github.com/mooncake-go/mooncake/internal/netlab/labtest"
	"github.com/mooncake-go/mooncake/store/storepb"
)

func TestMain(m *testing.M) {
	if os.Getenv(envPutter) != "" {
		os.Exit(putter())
	}
	code := labtest.Run(m)
	if binPath != "" {
		_ = os.RemoveAll(filepath.Dir(binPath)) // the mooncake built for the run
	}
	if path := os.Getenv("MC_FAULT_TABLE"); path != "" && len(rows) > 0 {
		if err := os.WriteFile(path, []byte(table()), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "fault table:", err)
			code = max(code, 1)
		}
	}
	os.Exit(code)
}

// row is one line of the fault table.
type row struct {
	Scenario, Load, Fault, Expectation, Measured string
}

var (
	rowsMu sync.Mutex
	rows   []row
)

// record adds t's row to the table, once t has passed.
func record(t *testing.T, r row) {
	t.Helper()
	t.Logf("%s | %s", r.Fault, r.Measured)
	t.Cleanup(func() {
		if t.Failed() {
			r.Measured = "FAILED: " + r.Measured
		}
		rowsMu.Lock()
		rows = append(rows, r)
		rowsMu.Unlock()
	})
}

// table is docs/faults.md: what the scenarios are, then their rows with
// the figures of this run.
func table() string {
	var b strings.Builder
	b.WriteString(tableHead)
	b.WriteString("| scenario | load | fault | expectation | measured |\n|---|---|---|---|---|\n")
	slices.SortFunc(rows, func(x, y row) int { return strings.Compare(x.Scenario, y.Scenario) })
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", r.Scenario, r.Load, r.Fault, r.Expectation, r.Measured)
	}
	b.WriteString(tableFoot)
	return b.String()
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func labtestNew(t *testing.T) *netlab.Lab { return labtest.New(t, netlab.Config{Seed: 42}) }

func labtestHost(t *testing.T, l *netlab.Lab, name string) *netlab.Host {
	return labtest.Host(t, l, name)
}

func storepbErrNotFound() error { return storepb.ErrObjectNotFound }
