package master

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/mooncake-go/mooncake/internal/etcdtest"
	"github.com/mooncake-go/mooncake/store/ha"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// A standby that wins with the service it prepared ahead admits by the
// tenant quotas the shared store holds when it wins, not those it read
// when it prepared (the leader changed them since, with no journal
// record a follower would see).
func TestWarmStandbyReloadsQuotas(t *testing.T) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcdtest.Start(t)}, DialTimeout: 5 * time.Second})
	require.NoError(t, err)
	defer cli.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	path := filepath.Join(t.TempDir(), "quotas.yaml")
	require.NoError(t, os.WriteFile(path, []byte("version: 1\ntenants:\n  - tenant_id: a\n    quota: 1MiB\n"), 0o644))
	leaderQuotas, err := NewTenantQuotas(FileQuotaStore{Path: path})
	require.NoError(t, err)
	standbyQuotas, err := NewTenantQuotas(FileQuotaStore{Path: path})
	require.NoError(t, err)

	// The leader's term writes a record; the standby follows and prepares.
	l, err := ha.Campaign(ctx, cli, "q", "leader:1", 0)
	require.NoError(t, err)
	j := newEtcdJournal(cli, "q", l.Term(), 0, 0, false)
	last := j.append(&storepb.JournalRecord{Op: &storepb.JournalRecord_Mount{Mount: &storepb.JournalMount{
		ClientId: "c", Segment: seg("1", 1<<30, 1<<20)}}}, nil)
	require.NoError(t, j.wait(ctx, last))
	cfg := ServiceConfig{Tenants: standbyQuotas}
	f := startFollower(cli, "q", cfg, fetchConfig{}, &tailStore{}, slog.New(slog.DiscardHandler))
	for {
		f.mu.Lock()
		ready := f.prepared != nil && f.preparedAt == last
		f.mu.Unlock()
		if ready {
			break
		}
		require.NoError(t, ctx.Err(), "the follower never prepared")
		time.Sleep(10 * time.Millisecond)
	}

	// The leader changes a's quota, then dies; the standby takes over.
	require.NoError(t, leaderQuotas.Set("a", 4096))
	j.close()
	require.NoError(t, l.Resign(ctx))
	l2, err := ha.Campaign(ctx, cli, "q", "standby:1", 0)
	require.NoError(t, err)
	s := &Server{cfg: ServerConfig{HA: &HAConfig{ClusterID: "q"}, Service: cfg}, etcd: cli}
	svc, _, _, warm, err := s.takeOver(ctx, l2.Term(), f, "")
	require.NoError(t, err)
	require.True(t, warm)
	q, ok := svc.cfg.Tenants.Quota("a")
	require.True(t, ok)
	assert.Equal(t, uint64(4096), q, "the quota in force is the store's at the takeover")
}
