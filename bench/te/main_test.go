package te_test

import (
	"os"
	"testing"

	"github.com/mooncake-go/mooncake/engine/device/devicetest"
)

// GPU memory in these tests is the CUDA driver test double's.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "mc-fakecuda-")
	if err != nil {
		panic(err)
	}
	if err := devicetest.Setup(dir); err != nil {
		panic(err)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
