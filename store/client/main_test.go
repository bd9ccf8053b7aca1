package client

import (
	"testing"

	"go.uber.org/goleak"
)

// Nothing a client, or the masters and etcd the tests start, may outlive
// the tests: every test closes what it started (t.Cleanup), so a goroutine
// left at the end is a Close that does not wait for its own.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
