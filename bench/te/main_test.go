package te_test

import (
	"os"
	"testing"

	"github.com/mooncake-go/mooncake/engine/device/devicetest"
)

// GPU memory in these tests is the CUDA driver test double's.
func TestMain(m *testing.M) {
	os.Exit(devicetest.Run(m))
}
