package trace

import "github.com/mooncake-go/mooncake/internal/table"

// columns are WriteParquet's, in order. Each is a field of RequestResult in
// snake case; times are in nanoseconds but timestamp_ms, the trace's, in
// milliseconds; err is empty for a request without error.
var columns = table.Table[RequestResult]{
	table.Int64("index", func(r *RequestResult) int64 { return int64(r.Index) }),
	table.Int64("timestamp_ms", func(r *RequestResult) int64 { return r.Timestamp }),
	table.Int64("start_ns", func(r *RequestResult) int64 { return int64(r.Start) }),
	table.Int64("lag_ns", func(r *RequestResult) int64 { return int64(r.Lag) }),
	table.Int32("input_blocks", func(r *RequestResult) int { return r.InputBlocks }),
	table.Int32("exist_blocks", func(r *RequestResult) int { return r.ExistBlocks }),
	table.Int32("hit_blocks", func(r *RequestResult) int { return r.HitBlocks }),
	table.Int32("infinite_hit_blocks", func(r *RequestResult) int { return r.InfiniteHitBlocks }),
	table.Int32("put_blocks", func(r *RequestResult) int { return r.PutBlocks }),
	table.Int64("bytes_read", func(r *RequestResult) int64 { return r.BytesRead }),
	table.Int64("bytes_written", func(r *RequestResult) int64 { return r.BytesWritten }),
	table.Int64("exist_latency_ns", func(r *RequestResult) int64 { return int64(r.ExistLatency) }),
	table.Int64("get_latency_ns", func(r *RequestResult) int64 { return int64(r.GetLatency) }),
	table.Int64("put_latency_ns", func(r *RequestResult) int64 { return int64(r.PutLatency) }),
	table.Bool("exist_failed", func(r *RequestResult) bool { return r.ExistFailed }),
	table.Int32("failed_gets", func(r *RequestResult) int { return r.FailedGets }),
	table.Int32("failed_puts", func(r *RequestResult) int { return r.FailedPuts }),
	table.Int32("corrupt", func(r *RequestResult) int { return r.Corrupt }),
	table.String("err", func(r *RequestResult) string { return r.Err }),
}

// ParquetColumns returns the column names of WriteParquet's file, in order.
func ParquetColumns() []string { return columns.Names() }

// WriteParquet writes rs to a new Parquet file at path, one row per
// request, zstd-compressed, with the columns ParquetColumns.
func WriteParquet(path string, rs []RequestResult) error { return columns.WriteParquet(path, rs) }
