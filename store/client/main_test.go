package client

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/mooncake-go/mooncake/engine/device/devicetest"
)

// Nothing a client, or the masters and etcd the tests start, may outlive
// the tests: every test closes what it started (t.Cleanup), so a goroutine
// left at the end is a Close that does not wait for its own.
//
// GPU memory is the CUDA driver test double's (devicetest), built for the
// run: the driver is loaded only by the tests that allocate device memory.
func TestMain(m *testing.M) {
	os.Exit(devicetest.Run(m, func() error { return goleak.Find() }))
}
