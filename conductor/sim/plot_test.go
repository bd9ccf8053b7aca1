package sim_test

import (
	"encoding/xml"
	"errors"
	"image/png"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/conductor"
	"github.com/mooncake-go/mooncake/conductor/sim"
	"github.com/mooncake-go/mooncake/internal/trace"
)

// svgTexts are the texts of the SVG document at path, which must be
// well formed.
func svgTexts(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	d := xml.NewDecoder(f)
	var texts []string
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			return texts
		}
		require.NoError(t, err)
		if el, ok := tok.(xml.StartElement); ok && el.Name.Local == "text" {
			var s string
			require.NoError(t, d.DecodeElement(&s, &el))
			texts = append(texts, s)
		}
	}
}

// Every figure comes out as a PNG and an SVG with its axes titled, units
// included; the log axes of Figs. 1 and 9 are labelled at readable
// values.
func TestPlots(t *testing.T) {
	reqs := trace.Conversation()[:1500]
	base := sim.Config{Admission: conductor.RejectNone}
	fig5, err := sim.Fig5(reqs, base)
	require.NoError(t, err)
	local, global, err := sim.Fig10(reqs, base)
	require.NoError(t, err)
	fig1, err := sim.Fig1(reqs, base)
	require.NoError(t, err)
	th := sim.Fig1Thresholds()
	capacity := sim.Capacity{Rates: []float64{1, 2}, Thresholds: th, Ratios: make([][][]float64, len(sim.Fig1Names))}
	for s := range capacity.Ratios {
		for range capacity.Rates {
			row := make([]float64, len(th))
			for i := range row {
				row[i] = 1 - 0.1*float64(s)
			}
			capacity.Ratios[s] = append(capacity.Ratios[s], row)
		}
	}
	for _, tc := range []struct {
		name string
		draw func(path string) error
		want []string
	}{
		// TTFT and TBT distributions.
		{"sim", func(p string) error { return sim.WritePlot(p, fig5[0], fig5[1]) },
			[]string{"TTFT (s)", "TBT (ms)", "requests (CDF)", "global-cache-aware", "local-cache-aware"}},
		// Mean TTFT by policy, as bars with their values.
		{"fig5", func(p string) error { return sim.PlotFig5(p, fig5) },
			[]string{"prefill scheduling policy", "mean TTFT (s)", "random"}},
		// Hit ratio against capacity: decades of tokens, written short.
		{"fig9", func(p string) error { return sim.PlotFig9(p, sim.Fig9(reqs, sim.Fig9Capacities())) },
			[]string{"cache capacity (tokens)", "hit ratio (prompt tokens reused)", "10k", "100k", "1M", "1G",
				"LRU", "3M tokens (local DRAM)"}},
		// Local against global cache.
		{"fig10", func(p string) error { return sim.PlotFig10(p, local, global) },
			[]string{"prefix cache", "local cache", "global cache", "mean prefill GPU time (s)"}},
		// Effective requests against the TBT threshold: one decade,
		// labelled at 1, 2 and 5 times its powers of ten.
		{"fig1", func(p string) error { return sim.PlotFig1(p, sim.Fig1Names, fig1, th) },
			append([]string{"TBT threshold (ms)", "effective requests", "100", "200", "500", "1000"}, sim.Fig1Names...)},
		// The capacity variant of Fig. 1.
		{"capacity", func(p string) error { return sim.PlotCapacity(p, sim.Fig1Names, capacity, 0.9) },
			[]string{"TBT threshold (ms)", "capacity relative to Mooncake", "200", "500", "Mooncake"}},
		// Replicas over simulated time.
		{"replicas", func(p string) error { return sim.PlotReplicas(p, fig5...) },
			[]string{"simulated time (s)", "replicas per block", "share of cached blocks", "random"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, tc.name+".png")
			require.NoError(t, tc.draw(path))
			f, err := os.Open(path)
			require.NoError(t, err)
			defer f.Close()
			_, err = png.Decode(f)
			require.NoError(t, err)
			texts := svgTexts(t, filepath.Join(dir, tc.name+".svg"))
			for _, s := range tc.want {
				assert.Contains(t, texts, s)
			}
		})
	}
}
