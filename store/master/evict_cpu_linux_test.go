//go:build linux

package master

import (
	"syscall"
	"time"
)

// threadCPU is the CPU time of the calling thread (lock the goroutine to
// it): on a shared machine, what a benchmark's own work costs, without the
// time other processes took the core.
func threadCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(1 /* RUSAGE_THREAD */, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
