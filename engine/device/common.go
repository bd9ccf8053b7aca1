package device

import (
	"errors"
	"fmt"
	"strings"
)

// The declarations here need no cgo: device.go reaches the driver through
// cgo, nocgo.go stands in for it in a CGO_ENABLED=0 build (the static
// binary of the container image), where no driver can be loaded.

// ErrNoDriver: the CUDA driver could not be loaded (a host without a GPU,
// or MC_CUDA_DRIVER=none).
var ErrNoDriver = errors.New("device: CUDA driver not available")

// ErrNoDevice: the GPU named does not exist.
var ErrNoDevice = errors.New("device: no such GPU")

// Error is a failed driver call.
type Error struct {
	Call string // the driver call, e.g. "cuMemcpy"
	Code int    // its CUresult
	Msg  string // the driver's description
}

func (e *Error) Error() string {
	return fmt.Sprintf("device: %s: %s (CUDA error %d)", e.Call, e.Msg, e.Code)
}

// IPCHandle is a device allocation as another process on this host opens
// it (cuIpcGetMemHandle).
type IPCHandle [64]byte

// Location is a memory location as Mooncake names them: "cuda:N" is GPU N;
// anything else ("cpu:N", "*", "") is host memory, or unknown.
type Location struct {
	Device int  // the GPU, when Cuda
	Cuda   bool // a "cuda:N" location
}

// ParseLocation parses a registration's location.
func ParseLocation(loc string) (Location, error) {
	rest, ok := strings.CutPrefix(loc, "cuda:")
	if !ok {
		return Location{}, nil
	}
	var n int
	if _, err := fmt.Sscanf(rest, "%d", &n); err != nil || n < 0 || fmt.Sprint(n) != rest {
		return Location{}, fmt.Errorf("device: location %q: want cuda:<ordinal>", loc)
	}
	return Location{Device: n, Cuda: true}, nil
}
