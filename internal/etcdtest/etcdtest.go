// Package etcdtest runs a real, embedded one-member etcd for tests: the
// engine's metadata backend and the store's leader election and journal are
// tested against it, never against a fake.
package etcdtest

import (
	"testing"

	"github.com/mooncake-go/mooncake/internal/embedetcd"
)

// Start runs a one-member etcd on loopback, with its data in a temporary
// directory, and returns its client address ("127.0.0.1:port"). It stops
// when the test ends.
func Start(t testing.TB) string {
	t.Helper()
	e, err := embedetcd.Start(t.TempDir(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e.Addr()
}
