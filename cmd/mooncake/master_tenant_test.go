package main

import (
	"context"
	"io"
	"net/http"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/store/client"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// `mooncake master --enable_multi_tenants --tenant_quota_connector_uri F`
// admits puts by the quotas in F, writes a quota set over HTTP to F, and a
// restarted master holds it.
func TestMasterTenantQuotaFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "quotas.yaml")
	require.NoError(t, os.WriteFile(file, []byte("version: 1\ntenants:\n  - tenant_id: acme\n    quota: 64KiB\n"), 0o600))
	rpc, admin := strconv.Itoa(freePort(t)), strconv.Itoa(freePort(t))
	start := func() *osexec.Cmd {
		cmd := selfCommand(t, "master", "--rpc_address", "127.0.0.1", "--rpc_port", rpc,
			"--metrics_host", "127.0.0.1", "--metrics_port", admin,
			"--enable_multi_tenants", "--tenant_quota_connector_uri", file)
		startProc(t, cmd, "master listening rpc=")
		return cmd
	}
	m := start()
	addr := "127.0.0.1:" + rpc
	node, err := client.New(context.Background(), client.Config{Master: addr, SegmentSize: 8 << 20, TenantID: "acme",
		LocalBufferSize: 8 << 20, RPCTimeout: 10 * time.Second, EngineConfig: engine.Config{Host: "127.0.0.1"}})
	require.NoError(t, err)
	defer node.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = node.Put(ctx, "k", make([]byte, 100<<10), nil)
	require.ErrorIs(t, err, storepb.ErrTenantQuotaExceeded, "100 KiB is over acme's 64 KiB from the file")
	require.NoError(t, node.Put(ctx, "k", make([]byte, 32<<10), nil))

	base := "http://127.0.0.1:" + admin + "/api/v1/tenant_quotas"
	req, err := http.NewRequest(http.MethodPut, base, strings.NewReader(`{"tenant_id": "other", "quota_bytes": 4096}`))
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
	b, err := os.ReadFile(file)
	require.NoError(t, err)
	assert.Contains(t, string(b), "tenant_id: other")

	_ = m.Process.Kill()
	_ = m.Wait()
	start()
	resp, err = http.Get(base + "?tenant_id=other")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	assert.Contains(t, string(body), `"quota_bytes":4096`, "the restarted master read the quota set over HTTP")
}
