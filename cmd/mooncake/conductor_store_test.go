package main

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/conductor"
	"github.com/mooncake-go/mooncake/store/master"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// `mooncake conductor --store-master` follows the store: a block key put
// in the store shows up as the store's prefix in the index query API, and
// goes when the key is removed.
func TestConductorStoreMaster(t *testing.T) {
	m, err := master.Start(master.ServerConfig{Listen: "127.0.0.1:0",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	defer m.Close()
	svc := m.Service()
	require.NoError(t, svc.MountSegment(t.Context(), "c1", &storepb.Segment{Id: "s1", Name: "node-1", Base: 1 << 32,
		Size: 1 << 20, TransportEndpoint: "127.0.0.1:1", Protocol: "tcp"}))
	blocks := conductor.HashTokens(make([]int, 2*conductor.BlockTokens))
	for _, h := range blocks {
		key := conductor.BlockKey("llama@0", h)
		_, err := svc.PutStart(t.Context(), "c1", key, 64, nil)
		require.NoError(t, err)
		require.NoError(t, svc.PutEnd(t.Context(), "c1", key, 0))
	}

	cmd := selfCommand(t, "conductor", "--listen", "127.0.0.1:0", "--store-master", m.Addr())
	line := startProc(t, cmd, "conductor listening ")
	base := strings.Fields(strings.TrimPrefix(line, "conductor listening "))[0]
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	// storePrefix polls the index until the store's prefix of blocks is
	// want: the feed is another process's goroutine.
	storePrefix := func(want int) {
		t.Helper()
		body := fmt.Sprintf(`{"hashes":[%d,%d]}`, blocks[0], blocks[1])
		var got struct {
			PrefixBlocks map[string]int `json:"prefix_blocks"`
		}
		for deadline := time.Now().Add(20 * time.Second); ; {
			resp, err := client.Post(base+"/v1/index/query", "application/json", strings.NewReader(body))
			require.NoError(t, err)
			err = json.NewDecoder(resp.Body).Decode(&got)
			resp.Body.Close()
			require.NoError(t, err)
			if got.PrefixBlocks[conductor.StoreHolder] == want {
				return
			}
			require.True(t, time.Now().Before(deadline), "store prefix %v, want %d", got.PrefixBlocks, want)
			time.Sleep(20 * time.Millisecond)
		}
	}
	storePrefix(2)
	require.NoError(t, svc.Remove(t.Context(), conductor.BlockKey("llama@0", blocks[1]), true))
	storePrefix(1)
}
