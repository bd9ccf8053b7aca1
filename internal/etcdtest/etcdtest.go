// Package etcdtest runs a real, embedded one-member etcd for tests: the
// engine's metadata backend, and later the store's leader election, are
// tested against it, never against a fake.
package etcdtest

import (
	"net/url"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Start runs a one-member etcd on loopback, with its data in a temporary
// directory, and returns its client address ("127.0.0.1:port"). It stops
// when the test ends.
func Start(t testing.TB) string {
	t.Helper()
	cfg := embed.NewConfig()
	cfg.Dir = t.TempDir()
	// Its shutdown logs errors about closed listeners; failures that matter
	// come through e.Err().
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	// Port 0 on both sides: the kernel picks free ports, so parallel test
	// binaries never collide. A single member never dials its own peer URL.
	u, err := url.Parse("http://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*u}, []url.URL{*u}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*u}, []url.URL{*u}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatalf("embedded etcd: %v", err)
	}
	t.Cleanup(e.Close)
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		t.Fatalf("embedded etcd failed: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("embedded etcd not ready after a minute")
	}
	if len(e.Clients) == 0 {
		t.Fatal("embedded etcd has no client listener")
	}
	return e.Clients[0].Addr().String()
}
