//go:build !linux

package master

import "time"

// threadCPU is not measured here: benchmarks report 0 cpu-ns/op.
func threadCPU() time.Duration { return 0 }
