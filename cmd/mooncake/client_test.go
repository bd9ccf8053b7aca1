package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/store/client"
	"github.com/mooncake-go/mooncake/store/master"
	"github.com/mooncake-go/mooncake/store/realclient"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// `mooncake client` with the official flags is a real client: two dummy
// clients (two TP ranks) share its pool, and when it is killed their
// calls fail at once, naming it.
func TestClientCommandServesDummies(t *testing.T) {
	m, err := master.Start(master.ServerConfig{Listen: "127.0.0.1:0"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close() })
	sock := fmt.Sprintf("@mc-client-cmd-test-%d", os.Getpid())
	cmd := selfCommand(t, "client", "--master_server_address", m.Addr(), "--metadata_server", "P2PHANDSHAKE",
		"--global_segment_size", "64 MB", "--host", "127.0.0.1", "--socket", sock)
	require.Equal(t, "client socket="+sock, startProc(t, cmd, "client socket="))

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var ranks []*realclient.Dummy
	for range 2 {
		d, err := realclient.Dial(ctx, sock, 1<<20, 1<<20)
		require.NoError(t, err)
		defer d.Close()
		ranks = append(ranks, d)
	}
	buf, err := ranks[0].Alloc(64 << 10)
	require.NoError(t, err)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	require.Equal(t, []error{nil}, ranks[0].BatchPut(ctx, []string{"rank0"}, [][]byte{buf}, nil, false))
	got, err := ranks[1].Get(ctx, "rank0")
	require.NoError(t, err)
	require.Equal(t, buf, got)

	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
	_, errs := ranks[1].BatchExist(ctx, []string{"rank0"})
	require.ErrorIs(t, errs[0], realclient.ErrGone)
	var se *storepb.Error
	require.ErrorAs(t, errs[0], &se)
	require.Equal(t, storepb.RPCFail, se.Code)
	require.True(t, strings.Contains(errs[0].Error(), sock), errs[0].Error())
}

// The official flags' defaults, and the settings a real client refuses.
func TestClientFlags(t *testing.T) {
	c := newClientCmd()
	for flag, want := range map[string]string{
		"port": "50052", "global_segment_size": "4 GB", "local_buffer_size": "0", "host": "0.0.0.0",
		"master_server_address": "127.0.0.1:50051", "metadata_server": "http://127.0.0.1:8080/metadata",
		"protocol": "tcp", "tenant_id": "default", "threads": "1", "http_port": "9300",
	} {
		require.Equal(t, want, c.Flags().Lookup(flag).DefValue, flag)
	}
	for _, tc := range []struct{ args, want string }{
		{"--protocol rdma", "only tcp"},
		{"--global_segment_size 0", "must be positive"},
		{"--enable_offload", "needs a directory"},
	} {
		c := newClientCmd()
		require.NoError(t, c.ParseFlags(strings.Fields(tc.args)))
		s, err := newSettings(c, "", clientEnvs)
		require.NoError(t, err)
		_, err = clientConfig(s, nil)
		require.ErrorContains(t, err, tc.want, tc.args)
	}
}

// --tenant_id: a real client's dummies put and see the objects of its
// tenant, which other tenants do not see.
func TestClientTenant(t *testing.T) {
	m, err := master.Start(master.ServerConfig{Listen: "127.0.0.1:0"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close() })
	sock := fmt.Sprintf("@mc-client-tenant-test-%d", os.Getpid())
	cmd := selfCommand(t, "client", "--master_server_address", m.Addr(), "--metadata_server", "P2PHANDSHAKE",
		"--global_segment_size", "32MB", "--host", "127.0.0.1", "--socket", sock, "--tenant_id", "team-a")
	startProc(t, cmd, "client socket=")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d, err := realclient.Dial(ctx, sock, 0, 1<<20)
	require.NoError(t, err)
	defer d.Close()
	require.Equal(t, []error{nil}, d.BatchPut(ctx, []string{"shared-name"}, [][]byte{[]byte("a's")}, nil, false))

	for _, tc := range []struct {
		tenant string
		sees   bool
	}{{"team-a", true}, {"", false}} {
		c, err := client.New(ctx, client.Config{Master: m.Addr(), SegmentSize: client.NoSegment, LocalBufferSize: 1 << 20,
			TenantID: tc.tenant, EngineConfig: engine.Config{Host: "127.0.0.1"}})
		require.NoError(t, err)
		ok, err := c.Exist(ctx, "shared-name")
		require.NoError(t, err)
		require.Equal(t, tc.sees, ok, "tenant %q", tc.tenant)
		require.NoError(t, c.Close())
	}
}
