package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestMetadataCommand(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	root := newRoot()
	root.SetArgs([]string{"metadata", "--host", "127.0.0.1", "--port", "0"})
	root.SetOut(pw)
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx); pw.Close() }()

	url, err := bufio.NewReader(pr).ReadString('\n')
	require.NoError(t, err)
	url = strings.TrimSpace(url)
	require.True(t, strings.HasPrefix(url, "http://127.0.0.1:"), url)
	go io.Copy(io.Discard, pr)

	base := strings.TrimSuffix(url, "/metadata")
	resp, err := http.Get(base + "/health")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	req, _ := http.NewRequest(http.MethodPut, url+"?key=mooncake/ram/x", strings.NewReader(`{"name":"x"}`))
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	resp, err = http.Get(url + "?key=mooncake/ram/x")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, `{"name":"x"}`, string(body))

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("metadata server did not stop")
	}
}
