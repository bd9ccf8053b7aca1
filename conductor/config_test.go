package conductor_test

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/conductor"
)

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cfg   conductor.Config
		field string // named in the error; "" for a valid config
	}{
		// The zero value is Mooncake's defaults.
		{"zero", conductor.Config{}, ""},
		// Every policy and admission is valid.
		{"local", conductor.Config{Policy: conductor.LocalCacheAware, Admission: conductor.RejectNone}, ""},
		// Out-of-range enums.
		{"policy", conductor.Config{Policy: 9}, "Config.Policy"},
		{"admission", conductor.Config{Admission: 9}, "Config.Admission"},
		// Negative durations and counts.
		{"ttft", conductor.Config{TTFTSLO: -time.Second}, "Config.TTFTSLO"},
		{"tbt", conductor.Config{TBTSLO: -time.Second}, "Config.TBTSLO"},
		{"block bytes", conductor.Config{BlockBytes: -1}, "Config.BlockBytes"},
		{"balance", conductor.Config{BalanceBlocks: -1}, "Config.BalanceBlocks"},
		{"store", conductor.Config{StoreBlocks: -1}, "Config.StoreBlocks"},
		{"output", conductor.Config{DefaultOutput: -1}, "Config.DefaultOutput"},
		// Rates and coefficients must be finite and non-negative.
		{"bandwidth", conductor.Config{Bandwidth: math.Inf(1)}, "Config.Bandwidth"},
		{"bandwidth nan", conductor.Config{Bandwidth: math.NaN()}, "Config.Bandwidth"},
		{"prefill", conductor.Config{Prefill: conductor.PrefillModel{Linear: -1}}, "Config.Prefill.Linear"},
		{"decode", conductor.Config{Decode: conductor.DecodeModel{PerKVToken: math.NaN()}}, "Config.Decode.PerKVToken"},
		{"kv tokens", conductor.Config{Decode: conductor.DecodeModel{KVTokens: -5}}, "Config.Decode.KVTokens"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			_, nerr := conductor.New(tc.cfg)
			if tc.field == "" {
				require.NoError(t, err)
				require.NoError(t, nerr)
				return
			}
			require.ErrorIs(t, err, conductor.ErrInvalid)
			assert.Contains(t, err.Error(), tc.field+":")
			require.ErrorIs(t, nerr, conductor.ErrInvalid, "New validates")
		})
	}
}

func TestParseNames(t *testing.T) {
	for _, p := range conductor.Policies() {
		got, err := conductor.ParsePolicy(p.String())
		require.NoError(t, err)
		assert.Equal(t, p, got)
	}
	_, err := conductor.ParsePolicy("fastest")
	require.ErrorIs(t, err, conductor.ErrInvalid)
	assert.Contains(t, err.Error(), "global-cache-aware")
	for _, a := range []conductor.Admission{conductor.RejectPredicted, conductor.RejectCurrentLoad, conductor.RejectNone} {
		got, err := conductor.ParseAdmission(a.String())
		require.NoError(t, err)
		assert.Equal(t, a, got)
	}
	_, err = conductor.ParseAdmission("maybe")
	require.ErrorIs(t, err, conductor.ErrInvalid)
	assert.Equal(t, "Policy(9)", conductor.Policy(9).String())
}

func TestDefaultModels(t *testing.T) {
	// LLaMA3-70B on 8xA800, from Table 1 of the paper and the A800's data
	// sheet: the coefficients are the formulas, not fitted numbers.
	const G = 8 * 312e12 / 2 // half of the peak
	pm := conductor.DefaultPrefill
	assert.InEpsilon(t, 80*22*8192*8192/G, pm.Linear, 1e-12)
	assert.InEpsilon(t, 80*4*8192/G, pm.Quadratic, 1e-12)
	assert.InEpsilon(t, 141.2e9/(0.8*8*2.039e12), pm.Base, 1e-12)
	assert.Equal(t, int64(512*327680), int64(conductor.DefaultBlockBytes), "160 MiB per block")

	// Prefill: reuse cuts the time, all of it but the fixed cost.
	assert.Equal(t, pm.Time(0, 0), pm.Time(8192, 8192))
	assert.InDelta(t, 1.45, pm.Time(12000, 0).Seconds(), 0.01)
	assert.Less(t, pm.Time(12000, 6000), pm.Time(12000, 0))
	assert.Equal(t, pm.Time(100, 100), pm.Time(100, 500), "a prefix longer than the prompt is the prompt")
	// Attention makes it superlinear: twice the tokens, more than twice
	// the time.
	assert.Greater(t, pm.Time(64000, 0), 2*pm.Time(32000, 0))

	dm := conductor.DefaultDecode
	assert.Zero(t, dm.TBT(0, 0), "no batch, no iteration")
	// Memory-bound: a small batch costs the weights and its KV cache.
	assert.InDelta(t, (dm.Base+dm.Weights+12000*dm.PerKVToken)*1e3, dm.TBT(1, 12000).Seconds()*1e3, 1e-3)
	// Past the knee the GEMMs dominate the weights.
	knee := int(dm.Weights/dm.PerSeq) + 1
	assert.Greater(t, dm.TBT(2*knee, 0), dm.TBT(knee, 0))
	assert.Equal(t, dm.TBT(1, 0), dm.TBT(knee-1, 0), "below the knee the batch is free")
	assert.InDelta(t, 1.33e6, float64(dm.KVTokens), 0.01e6)
}

func TestTransferTime(t *testing.T) {
	// 160 MiB at 100 GB/s.
	assert.InDelta(t, 1.678, conductor.Config{}.TransferTime(1).Seconds()*1e3, 0.001)
	assert.Equal(t, 2*time.Second, conductor.Config{BlockBytes: 1e9, Bandwidth: 1e9}.TransferTime(2))
}
