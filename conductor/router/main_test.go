package router

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/mooncake-go/mooncake/conductor/kvevents/kvtest"
)

// Every test closes its engines, router and clients: no goroutine may
// outlive the package's tests.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, kvtest.IgnoreLeaks())
}
