package faults

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/internal/netlab"
	"github.com/mooncake-go/mooncake/store/client"
	"github.com/mooncake-go/mooncake/store/master"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// envPutter runs this test binary as a client process that puts one
// object and prints the outcome: "put ok" or "put failed: ...". Its other
// settings come from MC_PUTTER_* variables.
const envPutter = "MC_FAULTS_PUTTER"

func putter() int {
	size, _ := strconv.Atoi(os.Getenv("MC_PUTTER_SIZE"))
	timeout, _ := time.ParseDuration(os.Getenv("MC_PUTTER_TIMEOUT"))
	key := os.Getenv("MC_PUTTER_KEY")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := client.New(ctx, client.Config{Master: os.Getenv("MC_PUTTER_MASTER"), SegmentSize: client.NoSegment,
		RPCTimeout: 60 * time.Second,
		EngineConfig: engine.Config{Host: os.Getenv("MC_PUTTER_HOST"), Transport: "tcp", Timeout: timeout,
			Logger: slog.New(slog.DiscardHandler)}})
	if err != nil {
		fmt.Println("put failed: client:", err)
		return 1
	}
	defer c.Close()
	if err := c.Put(ctx, key, value(key, 0, size), nil); err != nil {
		fmt.Println("put failed:", err)
	} else {
		fmt.Println("put ok")
	}
	// A client lives on after a failed put (an inference worker does):
	// what its sockets still hold is not discarded by its exit.
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 0
}

// Scenario 3: a client cut off in the middle of a put. The object is never
// readable half-written; the master reclaims its space after
// put_start_release_timeout; other clients go on, and the space is reused
// by them; when the writer's link returns, nothing it still had in flight
// lands in that space (the objects written there read back intact), and
// the key reads as absent or as the whole value, never as anything else.
func TestClientCutOffMidPut(t *testing.T) {
	const (
		seg     = 48 << 20
		size    = 32 << 20
		timeout = 2 * time.Second // the writer's transfer deadline
		release = 4 * time.Second // put_start_release_timeout, above it
	)
	lab := labtestNew(t)
	m := localMaster(t, lab, master.ServiceConfig{PutStartDiscardTimeout: time.Second, PutStartReleaseTimeout: release})
	a, w := labtestHost(t, lab, "a"), labtestHost(t, lab, "writer")
	node(t, a, m.Addr(), seg)
	c := storeClient(t, lab, m.Addr(), 10*time.Second)
	ctx := ctxT(t, 3*time.Minute)
	w.SetRate(50e6) // 32 MiB takes ~5.4 s: the cut lands mid-put

	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), envPutter+"=1", "MC_PUTTER_MASTER="+m.Addr(), "MC_PUTTER_HOST="+w.IP.String(),
		"MC_PUTTER_KEY=big", fmt.Sprintf("MC_PUTTER_SIZE=%d", size), "MC_PUTTER_TIMEOUT="+timeout.String())
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe() // the writer lives until the test ends
	require.NoError(t, err)
	t.Cleanup(func() { _ = stdin.Close() })
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, w.Start(cmd))
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	outcome := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "put ") {
				outcome <- sc.Text()
				return
			}
		}
		outcome <- "exited without an outcome"
	}()

	waitFor(t, "the writer's PutStart", 30*time.Second, func() bool { return m.Service().Stats().Used >= size })
	// Cut it once a few MiB of the value are on their way, well before the
	// ~5.4 s the whole takes.
	waitFor(t, "the writer's first MiB", 30*time.Second, func() bool { return lab.Stats(w, a).Bytes > 1<<20 })
	lab.Isolate(w)
	cut := time.Now()
	select {
	case res := <-outcome:
		t.Fatalf("the put ended before the cut: %s", res)
	default:
	}

	// Half-written is never readable, however long the cut lasts.
	for time.Since(cut) < release+2*time.Second && m.Service().Stats().Released == 0 {
		_, err := c.Get(ctx, "big")
		require.ErrorIs(t, err, storepb.ErrObjectNotFound, "the object read while half-written")
		time.Sleep(100 * time.Millisecond)
	}
	waitFor(t, "the space reclaimed", 3*release, func() bool {
		st := m.Service().Stats()
		return st.Released > 0 && st.Used == 0
	})
	reclaimed := time.Since(cut)

	// Other clients go on, in the reclaimed space.
	keys := make([]string, 40)
	vals := make([][]byte, len(keys))
	for i := range keys {
		keys[i] = fmt.Sprintf("other%02d", i)
		vals[i] = value(keys[i], 0, 1<<20)
	}
	for i, err := range c.BatchPut(ctx, keys, vals, nil) {
		require.NoError(t, err, "%s: another client's put failed", keys[i])
	}

	lab.Heal()
	var res string
	select {
	case res = <-outcome:
	case <-time.After(90 * time.Second):
		t.Fatal("the writer did not finish 90 s after its link returned")
	}
	// Whatever the writer's sockets still held goes out now: wait until
	// its link to the node has been quiet for 2 s.
	waitQuiet(t, lab, w, a, 2*time.Second, 60*time.Second)
	for i, k := range keys {
		got, err := c.Get(ctx, k)
		require.NoError(t, err, "%s after the writer came back", k)
		require.True(t, bytes.Equal(vals[i], got), "%s: overwritten by the cut-off writer's late bytes", k)
	}
	got, err := c.Get(ctx, "big")
	if err == nil {
		assert.True(t, bytes.Equal(value("big", 0, size), got), "the object reads, but not as written")
		assert.Equal(t, "put ok", res, "the object reads though its put failed")
	} else {
		require.ErrorIs(t, err, storepb.ErrObjectNotFound)
		assert.NotEqual(t, "put ok", res, "the put succeeded but the object is gone")
	}
	record(t, row{"3. client cut off mid-put", "32 MiB put at 50 Mbit/s; another client's puts and gets",
		"the writer isolated once 1 MiB of the put is through, healed after the release timeout (4 s; writer's transfer deadline 2 s)",
		"never readable half-written; space reclaimed; other clients unaffected; no late bytes land in reused space",
		fmt.Sprintf("never readable while cut; space reclaimed %v after the cut; 40 x 1 MiB put into it and read back intact after the writer returned; writer's outcome: %q",
			reclaimed.Round(time.Millisecond), res)})
}

// waitQuiet waits until no packet has gone from one host to another for
// the given time.
func waitQuiet(t *testing.T, lab *netlab.Lab, from, to *netlab.Host, quiet, within time.Duration) {
	t.Helper()
	start := time.Now()
	last, since := lab.Stats(from, to).Packets, time.Now()
	for time.Since(since) < quiet {
		if time.Since(start) > within {
			t.Fatalf("%s still sends to %s after %v", from, to, within)
		}
		time.Sleep(100 * time.Millisecond)
		if n := lab.Stats(from, to).Packets; n != last {
			last, since = n, time.Now()
		}
	}
}
