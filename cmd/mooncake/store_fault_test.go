package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/internal/etcdtest"
	"github.com/mooncake-go/mooncake/store/client"
	"github.com/mooncake-go/mooncake/store/ha"
	"github.com/mooncake-go/mooncake/store/master"
)

// selfCommand is the command line that runs this test binary as mooncake.
func selfCommand(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), envRunAsCLI+"=1")
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

// startProc starts cmd and waits for a stdout line starting with prefix,
// which it returns.
func startProc(t *testing.T, cmd *exec.Cmd, prefix string) string {
	t.Helper()
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), prefix) {
				line <- sc.Text()
				break
			}
		}
		close(line) // found, or the process closed its stdout (exited)
		_, _ = io.Copy(io.Discard, out)
	}()
	select {
	case l, ok := <-line:
		if !ok {
			t.Fatalf("%v: exited before printing a %q line", cmd.Args, prefix)
		}
		return l
	case <-time.After(60 * time.Second):
		t.Fatalf("%v: no %q line after 60s", cmd.Args, prefix)
		return ""
	}
}

func payload(key string, n int) []byte {
	var seed uint64
	for _, c := range key {
		seed = seed*131 + uint64(c)
	}
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(seed, 7))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func pureClient(t *testing.T, masterURL string) *client.Client {
	t.Helper()
	c, err := client.New(context.Background(), client.Config{Master: masterURL, SegmentSize: client.NoSegment,
		LocalBufferSize: 32 << 20, RPCTimeout: 10 * time.Second,
		EngineConfig: engine.Config{Host: "127.0.0.1", Timeout: 3 * time.Second}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// With two replicas, kill -9 one of two storage node processes during a
// mixed put/get load: no get ever returns wrong bytes, every object put
// before the kill stays readable, the dead node's segment leaves the pool
// within the client TTL, and no replica on it is handed out afterwards.
func TestNodeKilledDuringLoad(t *testing.T) {
	m, err := master.Start(master.ServerConfig{Listen: "127.0.0.1:0",
		Service: master.ServiceConfig{ClientTTL: 2 * time.Second}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close() })
	var nodes []*exec.Cmd
	var segs []string
	for range 2 {
		cmd := selfCommand(t, "node", "--master", m.Addr(), "--global_segment_size", "128MiB",
			"--local_hostname", "127.0.0.1", "--transport", "tcp")
		line := startProc(t, cmd, "node ready segment=")
		nodes, segs = append(nodes, cmd), append(segs, strings.TrimPrefix(line, "node ready segment="))
	}
	c := pureClient(t, m.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// At most maxObjects acknowledged, 75 MiB of each 128 MiB segment: none
	// is evicted, which would take objects put before the kill (a fast
	// machine filled 64 MiB segments within the second before it).
	const size, maxObjects = 16 << 10, 4800
	var (
		mu      sync.Mutex
		acked   []string
		wrong   []string
		stop    = make(chan struct{})
		wg      sync.WaitGroup
		killed  = make(chan struct{})
		putsErr int
		// putsAfter: puts tried after the kill.
		putsAfter int
	)
	before := map[string]bool{}
	for g := range 4 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 1))
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("g%d-%d", g, i)
				mu.Lock()
				full := len(acked) >= maxObjects
				mu.Unlock()
				err := errors.New("not put")
				if !full {
					err = c.Put(ctx, key, payload(key, size), &client.ReplicateConfig{Replicas: 2})
				}
				mu.Lock()
				if err == nil {
					acked = append(acked, key)
					select {
					case <-killed:
					default:
						before[key] = true
					}
				} else if !full {
					putsErr++
				}
				select {
				case <-killed:
					if !full {
						putsAfter++
					}
				default:
				}
				pick := ""
				if len(acked) > 0 {
					pick = acked[r.IntN(len(acked))]
				}
				mu.Unlock()
				if pick == "" {
					continue
				}
				got, err := c.Get(ctx, pick)
				if err == nil && !bytes.Equal(got, payload(pick, size)) {
					mu.Lock()
					wrong = append(wrong, pick)
					mu.Unlock()
				}
			}
		})
	}
	// The kill comes half way through the puts, however fast they go.
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(acked) >= maxObjects/2
	}, time.Minute, time.Millisecond, "the puts before the kill")
	require.NoError(t, nodes[0].Process.Signal(syscall.SIGKILL))
	close(killed)
	time.Sleep(3 * time.Second) // past the client TTL: the master forgets the node
	close(stop)
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	require.Empty(t, wrong, "gets returned wrong bytes")
	require.NotEmpty(t, before)
	require.Positive(t, len(acked)-len(before)+putsAfter, "no put ran after the kill")
	t.Logf("%d puts acknowledged (%d before the kill), %d failed", len(acked), len(before), putsErr)
	deadline := time.Now().Add(5 * time.Second)
	for m.Service().Stats().Segments != 1 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	require.Equal(t, 1, m.Service().Stats().Segments, "the dead node's segment left the pool")
	keys := make([]string, 0, len(before))
	for k := range before {
		keys = append(keys, k)
	}
	vals, errs := c.BatchGet(ctx, keys)
	for i, k := range keys {
		require.NoError(t, errs[i], "%s was put with 2 replicas before the kill", k)
		require.True(t, bytes.Equal(payload(k, size), vals[i]), k)
		reps, _, _, _, err := m.Service().GetReplicaList(k)
		require.NoError(t, err)
		for _, r := range reps {
			assert.NotEqual(t, segs[0], r.GetMemory().SegmentName, "%s: replica on the dead node handed out", k)
		}
	}
	// Objects acknowledged after the kill were written to the survivor.
	for _, k := range acked {
		if !before[k] {
			got, err := c.Get(ctx, k)
			require.NoError(t, err, k)
			require.True(t, bytes.Equal(payload(k, size), got), k)
		}
	}
}

// Kill -9 the leading master process during a put load: a standby serves
// within 5 s (the leader's etcd lease runs out), and every object whose put
// completed before the kill reads back byte-exact.
func TestLeaderKilledDuringLoad(t *testing.T) {
	etcd := etcdtest.Start(t)
	procs := map[string]*exec.Cmd{}
	for range 2 {
		cmd := selfCommand(t, "master", "--enable_ha", "--etcd_endpoints", etcd, "--rpc_address", "127.0.0.1",
			"--rpc_port", "0", "--metrics_port", "-1", "--cluster_id", "kill")
		line := startProc(t, cmd, "master listening rpc=")
		addr := strings.Fields(strings.TrimPrefix(line, "master listening rpc="))[0]
		procs[addr] = cmd
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd}, DialTimeout: 5 * time.Second})
	require.NoError(t, err)
	defer cli.Close()
	var leader string
	require.Eventually(t, func() bool {
		leader, _, err = ha.Leader(context.Background(), cli, "kill")
		return err == nil
	}, 20*time.Second, 20*time.Millisecond)
	require.Contains(t, procs, leader)

	url := "etcd://" + etcd
	node, err := client.New(context.Background(), client.Config{Master: url, ClusterID: "kill", SegmentSize: 128 << 20,
		LocalBufferSize: 16 << 20, EngineConfig: engine.Config{Host: "127.0.0.1"}})
	require.NoError(t, err)
	defer node.Close()
	c, err := client.New(context.Background(), client.Config{Master: url, ClusterID: "kill", SegmentSize: 128 << 20,
		LocalBufferSize: 16 << 20, EngineConfig: engine.Config{Host: "127.0.0.1"}})
	require.NoError(t, err)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	const size = 8 << 10
	var (
		mu         sync.Mutex
		acked      []string
		killAt     time.Time
		firstAfter time.Time
		wg         sync.WaitGroup
		stop       = make(chan struct{})
	)
	for g := range 3 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("L%d-%d", g, i)
				if err := c.Put(ctx, key, payload(key, size), &client.ReplicateConfig{Replicas: 2}); err == nil {
					mu.Lock()
					acked = append(acked, key)
					if !killAt.IsZero() && firstAfter.IsZero() {
						firstAfter = time.Now()
					}
					mu.Unlock()
				}
			}
		})
	}
	time.Sleep(time.Second)
	mu.Lock()
	killAt = time.Now()
	ackedBefore := len(acked)
	mu.Unlock()
	require.NoError(t, procs[leader].Process.Signal(syscall.SIGKILL))
	require.Eventually(t, func() bool {
		l, _, err := ha.Leader(context.Background(), cli, "kill")
		return err == nil && l != leader
	}, 10*time.Second, 10*time.Millisecond)
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	require.False(t, firstAfter.IsZero(), "no put succeeded after the kill")
	gap := firstAfter.Sub(killAt)
	t.Logf("%d puts before the kill, %d in all; first put served by the new leader %v after the kill", ackedBefore, len(acked), gap)
	assert.Less(t, gap, 5*time.Second)
	vals, errs := node.BatchGet(ctx, acked)
	for i, k := range acked {
		require.NoError(t, errs[i], k)
		require.True(t, bytes.Equal(payload(k, size), vals[i]), k)
	}
}

// A node started with a config file and Mooncake's environment names.
func TestNodeConfigSources(t *testing.T) {
	m, err := master.Start(master.ServerConfig{Listen: "127.0.0.1:0"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close() })
	dir := t.TempDir()
	conf := dir + "/node.json"
	require.NoError(t, os.WriteFile(conf, []byte(fmt.Sprintf(
		`{"master_server_address": %q, "global_segment_size": "32MB", "local_hostname": "127.0.0.1"}`, m.Addr())), 0o600))
	cmd := selfCommand(t, "node")
	// HTTP port 0: the node picks one and says which (a port chosen here
	// could be taken before the node binds it).
	cmd.Env = append(cmd.Env, "MOONCAKE_CONFIG_PATH="+conf, "MOONCAKE_LOCAL_BUFFER_SIZE=4MiB",
		"MOONCAKE_OFFLOAD_FILE_STORAGE_PATH="+dir, "MC_NODE_SSD_SIZE=8MiB",
		"MOONCAKE_ENABLE_CLIENT_HTTP_SERVER=true", "MOONCAKE_CLIENT_HTTP_PORT=0")
	httpAddr := strings.TrimPrefix(startProc(t, cmd, "node http addr=127.0.0.1:"), "node http addr=")
	st := m.Service().Stats()
	assert.Equal(t, uint64(32<<20), st.Capacity, "32MB in the config file: Mooncake's units are 1024-based")
	assert.Equal(t, uint64(8<<20), st.DiskCapacity, "the SSD tier from MOONCAKE_OFFLOAD_FILE_STORAGE_PATH")
	// Its HTTP server: health and the engine's metrics.
	for path, want := range map[string]string{"/health": `"status":"ok"`, "/metrics": "mooncake_transfer_read_bytes 0"} {
		resp, err := http.Get("http://" + httpAddr + path)
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(t, 200, resp.StatusCode, path)
		assert.Contains(t, string(body), want, path)
	}

	bad := selfCommand(t, "node", "--master", m.Addr(), "--global_segment_size", "lots")
	bad.Stderr = nil
	out, err := bad.CombinedOutput()
	require.Error(t, err)
	assert.Contains(t, string(out), "global_segment_size")
	var ee *exec.ExitError
	require.True(t, errors.As(err, &ee))
}
