package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/internal/netlab"
	"github.com/mooncake-go/mooncake/internal/netlab/labtest"
)

func TestMain(m *testing.M) {
	if os.Getenv(envWorker) != "" {
		os.Exit(workerMain()) // this test binary, started on a host
	}
	labtest.Main(m)
}

// TestSmoke runs every phase in a tiny configuration: it checks that the
// benchmark runs and writes its files, never how fast anything was (the
// P2P phase does check the bytes every receiver got).
func TestSmoke(t *testing.T) {
	lab := labtest.New(t, netlab.Config{Seed: 1})
	o := options{Hosts: []int{1, 2}, Rate: 200e6, Value: 64 << 10, Batch: 2, Conc: 1, GetKeys: 4,
		Segment: 64 << 20, Warmup: 50 * time.Millisecond, Duration: 200 * time.Millisecond, Repeat: 1,
		Phases: []string{"store", "master", "p2p"}, P2PSize: 1 << 20, P2PShard: 256 << 10, P2PRecv: 2, P2PRuns: 1,
		P2PWays: []string{"swarm", "seed-only"},
		MetaCli: 2, MetaB: 4, MetaKeys: 16, MetaDur: 200 * time.Millisecond}
	require.NoError(t, o.validate())
	out := filepath.Join(t.TempDir(), "scale")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := measure(ctx, lab, o, out, t.Output())
	require.NoError(t, err)
	require.Len(t, res.Store, 4) // put and get at 1 and 2 hosts
	require.Len(t, res.P2P, 2)   // swarm and seed-only
	require.Len(t, res.Master, 2)
	for _, r := range res.Store {
		require.Len(t, r.PerHost, r.Hosts)
	}
	for _, r := range res.P2P {
		require.Len(t, r.PerHost, o.P2PRecv)
		require.Positive(t, r.Seconds)
	}
	require.NoError(t, save(res, out))
	for _, ext := range []string{".json", ".parquet", ".png"} {
		st, err := os.Stat(out + ext)
		require.NoError(t, err)
		require.Positive(t, st.Size(), ext)
	}
}

func TestMedian(t *testing.T) {
	require.Equal(t, 2.0, median([]float64{3, 1, 2}))
	require.Equal(t, 2.5, median([]float64{4, 1, 2, 3}))
	require.Equal(t, 0.0, median(nil))
}

// TestSummary: efficiency is the aggregate over hosts times the one-host
// median, and the P2P ratio is seed-only's time over the way's.
func TestSummary(t *testing.T) {
	res := &results{Options: options{Hosts: []int{1, 2}, Rate: 80e6, P2PSize: 10e6, P2PRecv: 8},
		Store: []storeRun{
			{Op: "get", Hosts: 1, MBps: 10}, {Op: "get", Hosts: 1, MBps: 9}, {Op: "get", Hosts: 1, MBps: 11},
			{Op: "get", Hosts: 2, MBps: 18},
		},
		P2P: []p2pRun{{Way: "swarm", Seconds: 2}, {Way: "seed-only", Seconds: 8}}}
	rows := summarise(res)
	require.Len(t, rows, 4)
	require.Equal(t, row{Phase: "store", Op: "get", Hosts: 1, Runs: 3, Median: 10, Min: 9, Max: 11, Unit: "MB/s", Ideal: 10, Ratio: 1}, rows[0])
	require.InDelta(t, 0.9, rows[1].Ratio, 1e-9)
	require.Equal(t, "seed-only", rows[2].Op)
	require.InDelta(t, 1.0, rows[2].Ratio, 1e-9)
	require.InDelta(t, 4.0, rows[3].Ratio, 1e-9)
	require.InDelta(t, 1.0, rows[3].Ideal, 1e-9)
}

// TestPutsMustCrossLinks: a put window that overfills its target's
// segment fails the run rather than measuring puts the master placed on
// another segment (the putting host's own, where no link is crossed).
func TestPutsMustCrossLinks(t *testing.T) {
	lab := labtest.New(t, netlab.Config{Seed: 1})
	o := options{Hosts: []int{1}, Rate: 1e9, Value: 256 << 10, Batch: 4, Conc: 2, GetKeys: 4,
		Segment: 2 << 20, Warmup: 50 * time.Millisecond, Duration: 500 * time.Millisecond, Repeat: 1,
		Phases: []string{"store"}, P2PSize: 1, P2PShard: 1, P2PRecv: 1, P2PRuns: 1,
		MetaCli: 1, MetaB: 1, MetaKeys: 1, MetaDur: time.Second}
	// Segments of eight values, filled far faster than the master evicts:
	// puts spill onto the putting host's own segment (as they did at
	// 1 Gbit/s with the 256 MiB segments this benchmark once had).
	require.NoError(t, o.validate())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := measure(ctx, lab, o, filepath.Join(t.TempDir(), "scale"), t.Output())
	require.ErrorContains(t, err, "segment full?")
}

// TestStripesSmoke runs the stripes phase at a tiny size: the object must
// be striped over every storage host (the phase fails otherwise) and
// every get must return the bytes put. Never timed.
func TestStripesSmoke(t *testing.T) {
	lab := labtest.New(t, netlab.Config{Seed: 1})
	o := options{Hosts: []int{1}, Rate: 200e6, Value: 1, Batch: 1, Conc: 1, GetKeys: 1, Repeat: 2,
		Phases: []string{"stripes"}, P2PSize: 1, P2PShard: 1, P2PRecv: 1, P2PRuns: 1,
		MetaCli: 1, MetaB: 1, MetaKeys: 1, StripeN: 3, StripeW: []string{"striped", "unstriped"}, StripeSz: 3<<20 + 5}
	require.NoError(t, o.validate())
	out := filepath.Join(t.TempDir(), "scale")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := measure(ctx, lab, o, out, t.Output())
	require.NoError(t, err)
	require.Len(t, res.StripePuts, 2)
	require.Len(t, res.StripePuts[0].Hosts, o.StripeN)
	require.Len(t, res.Stripes, 4) // striped and unstriped, twice
	for _, r := range res.Stripes {
		require.Positive(t, r.MBps)
		if r.Way == "striped" {
			require.Equal(t, o.StripeN, r.Pieces)
			// Every storage host's link carried its piece to the reader.
			for i, mb := range r.PerHost {
				require.Greater(t, mb, float64(o.StripeSz)/float64(o.StripeN)/1e6*0.99, "host %d", i+1)
			}
		}
	}
	require.Len(t, stripeRows(res), 3)
	require.NoError(t, save(res, out))
}

// TestCheckPieces: a replica the stripes phase did not ask for fails the
// run: too few pieces, two on one host, one elsewhere, or bytes missing.
func TestCheckPieces(t *testing.T) {
	on := []string{"a", "b", "c"}
	hosts, err := checkPieces([]piece{{"b", 4}, {"a", 4}, {"c", 2}}, 3, 10, on)
	require.NoError(t, err)
	require.Equal(t, []int{1, 0, 2}, hosts)
	for _, ps := range [][]piece{
		{{"a", 10}},                    // not striped
		{{"a", 4}, {"a", 4}, {"c", 2}}, // two pieces on one host
		{{"a", 4}, {"b", 4}, {"d", 2}}, // a piece off the storage hosts
		{{"a", 4}, {"b", 4}, {"c", 1}}, // short
		{{"a", 5}, {"b", 5}, {"c", 0}}, // an empty piece
	} {
		_, err := checkPieces(ps, 3, 10, on)
		require.Error(t, err, "%v", ps)
	}
}

// TestSentTraceWhen: a host's start and end are the first samples at which
// it had sent 1% and 99% of its total; a host that sent no piece has none.
func TestSentTraceWhen(t *testing.T) {
	tr := sentTrace{at: []float64{0.1, 0.2, 0.3, 0.4},
		sent: [][]uint64{{0, 0, 10}, {5e6, 0, 20}, {9e6, 1e6, 30}, {10e6, 10e6, 40}}}
	require.Equal(t, []float64{0.2, 0.3, 0}, tr.when(0.01))
	require.Equal(t, []float64{0.4, 0.4, 0}, tr.when(0.99))
	require.Nil(t, sentTrace{}.when(0.5))
}
