// Package labtest runs tests on a netlab.Lab: TestMain moves the package's
// tests into a network namespace of their own, and New gives a test a Lab
// that closes when it ends.
package labtest

import (
	"fmt"
	"os"
	"testing"

	"github.com/mooncake-go/mooncake/internal/netlab"
)

// EnvRequire, set to 1, turns the skip of a test that cannot have a Lab
// (not root, no TUN device) into a failure: make test sets it as root, so
// that the network-fault tests cannot pass by not running.
const EnvRequire = "MC_NETLAB_REQUIRE"

// Main runs the package's tests, in a new network namespace when a Lab can
// be built here, and exits with their status. Call it from TestMain.
//
// The tests run in a child process, this test binary with the same flags,
// in a namespace of its own: the Lab's local host takes its address there,
// and loopback works as usual.
func Main(m *testing.M) { os.Exit(Run(m)) }

// Run is Main without the exit: it returns the tests' status, for a
// TestMain with work to do after them. That work runs in both processes;
// only the child ran the tests.
func Run(m *testing.M) int {
	if netlab.InOwnNamespace() {
		if err := netlab.UpLoopback(); err != nil {
			fmt.Fprintln(os.Stderr, "labtest:", err)
			return 2
		}
		return m.Run()
	}
	if netlab.Available() != nil {
		return m.Run() // New skips (or fails, under EnvRequire)
	}
	code, err := netlab.Reexec()
	if err != nil {
		fmt.Fprintln(os.Stderr, "labtest:", err)
	}
	return code
}

// New returns a Lab for t, closed when t ends. It skips t where no Lab can
// be built (and fails it under EnvRequire), and fails t outside Main's
// namespace, where the local host would touch the machine's network.
func New(t testing.TB, cfg netlab.Config) *netlab.Lab {
	t.Helper()
	if err := netlab.Available(); err != nil {
		if os.Getenv(EnvRequire) == "1" {
			t.Fatalf("%v (and %s=1)", err, EnvRequire)
		}
		t.Skip(err)
	}
	if !netlab.InOwnNamespace() {
		t.Fatal("labtest: call labtest.Main from TestMain")
	}
	l, err := netlab.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// Host adds a host to l, failing t if it cannot.
func Host(t testing.TB, l *netlab.Lab, name string) *netlab.Host {
	t.Helper()
	h, err := l.Host(name)
	if err != nil {
		t.Fatal(err)
	}
	return h
}
