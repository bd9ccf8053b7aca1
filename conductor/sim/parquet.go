package sim

import "github.com/mooncake-go/mooncake/internal/table"

// columns are WriteParquet's, in order: Outcome's fields in snake case,
// times in nanoseconds, instances and reject_reason empty where they do
// not apply.
var columns = table.Table[Outcome]{
	table.Int64("index", func(o *Outcome) int64 { return int64(o.Index) }),
	table.Int64("arrival_ns", func(o *Outcome) int64 { return int64(o.Arrival) }),
	table.Int32("input_tokens", func(o *Outcome) int { return o.InputTokens }),
	table.Int32("output_tokens", func(o *Outcome) int { return o.OutputTokens }),
	table.String("prefill_instance", func(o *Outcome) string { return o.Prefill }),
	table.String("decode_instance", func(o *Outcome) string { return o.Decode }),
	table.Bool("rejected", func(o *Outcome) bool { return o.Rejected }),
	table.String("reject_reason", func(o *Outcome) string { return o.Reason }),
	table.Int32("hit_tokens", func(o *Outcome) int { return o.HitTokens }),
	table.Int32("pulled_tokens", func(o *Outcome) int { return o.PulledTokens }),
	table.Int64("ttft_ns", func(o *Outcome) int64 { return int64(o.TTFT) }),
	table.Int64("tbt_ns", func(o *Outcome) int64 { return int64(o.TBT) }),
	table.Int64("prefill_ns", func(o *Outcome) int64 { return int64(o.PrefillTime) }),
	table.Int64("finish_ns", func(o *Outcome) int64 { return int64(o.Finish) }),
}

// ParquetColumns returns the column names of WriteParquet's file, in order.
func ParquetColumns() []string { return columns.Names() }

// WriteParquet writes the outcomes to a new Parquet file at path, one row
// per request in trace order, zstd-compressed.
func (r *Result) WriteParquet(path string) error { return columns.WriteParquet(path, r.Outcomes) }
