package client

import (
	"fmt"
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
	dir, err := os.MkdirTemp("", "mc-fakecuda-")
	if err != nil {
		panic(err)
	}
	if err := devicetest.Setup(dir); err != nil {
		panic(err)
	}
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.RemoveAll(dir)
	os.Exit(code)
}
