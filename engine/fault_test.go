package engine_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/engine"
	tr "github.com/mooncake-go/mooncake/engine/transport"
)

// startTarget runs this test binary as a target process serving a 64 MiB
// buffer over the given transport and returns its info and process.
func startTarget(t *testing.T, transport, secret string) (targetInfo, *os.Process) {
	info, tp := startTargetIO(t, transport, secret)
	return info, tp.proc
}

// targetProc is a running target with its command pipes.
type targetProc struct {
	proc *os.Process
	in   io.Writer
	out  *bufio.Reader
}

// command sends one stdin command to the target and returns its answer.
func (tp *targetProc) command(t *testing.T, cmd string) string {
	t.Helper()
	_, err := io.WriteString(tp.in, cmd+"\n")
	require.NoError(t, err)
	line, err := tp.out.ReadString('\n')
	require.NoError(t, err)
	return strings.TrimSpace(line)
}

func startTargetIO(t *testing.T, transport, secret string) (targetInfo, *targetProc) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "MC_TEST_TARGET="+transport, "MC_TEST_SECRET="+secret)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		stdin.Close()
		cmd.Process.Signal(syscall.SIGCONT)
		cmd.Process.Kill()
		cmd.Wait()
	})
	out := bufio.NewReader(stdout)
	line, err := out.ReadBytes('\n')
	require.NoError(t, err, "target process did not start")
	var info targetInfo
	require.NoError(t, json.Unmarshal(line, &info))
	return info, &targetProc{proc: cmd.Process, in: stdin, out: out}
}

func TestTargetKilledMidBatch(t *testing.T) {
	for _, transport := range []string{"tcp", "auto"} {
		t.Run(transport, func(t *testing.T) {
			info, proc := startTarget(t, transport, "")
			init := newEngine(t, engine.Config{Transport: transport})
			const block, n = 4 << 20, 256 // 1 GiB in flight through a 64 MiB window
			src := anonMem(t, block)
			require.NoError(t, init.RegisterMemory(context.Background(), addr(src), block, "", true))
			seg, err := init.OpenSegment(context.Background(), info.Name)
			require.NoError(t, err)
			reqs := make([]engine.Request, n)
			for i := range reqs {
				reqs[i] = engine.Request{Op: engine.Write, Local: addr(src), Segment: seg,
					Remote: info.Addr + uint64(i%16)*block, Length: block}
			}
			b, err := init.AllocateBatch(n)
			require.NoError(t, err)
			deadline := time.Now().Add(10 * time.Second)
			require.NoError(t, init.Submit(context.Background(), b, reqs, engine.WithDeadline(deadline)))
			require.NoError(t, proc.Kill())

			ctx, cancel := context.WithDeadline(context.Background(), deadline.Add(2*time.Second))
			defer cancel()
			st, err := init.Wait(ctx, b)
			require.NoError(t, err, "tasks still pending after their deadline")
			require.Contains(t, []engine.Status{engine.Failed, engine.Timeout, engine.Completed}, st.Status)
			failed := 0
			for i := range n {
				ts, err := init.TaskStatus(b, i)
				require.NoError(t, err)
				require.True(t, ts.Status.Done())
				if ts.Status != engine.Completed {
					failed++
					require.True(t, errors.Is(ts.Err, tr.ErrPeer) || errors.Is(ts.Err, tr.ErrTimeout),
						"a killed peer fails a task as a peer error or a timeout: %v", ts.Err)
				}
			}
			t.Logf("%d of %d tasks failed after the kill; batch %v (%v)", failed, n, st.Status, st.Err)
			require.NoError(t, init.FreeBatch(b))

			// Whatever raced the kill, nothing succeeds once the target is
			// gone: once it has exited (a kill takes a moment to land, and
			// shared-memory copies can finish the whole batch before it).
			_, err = proc.Wait()
			require.NoError(t, err)
			st = transfer(t, init, reqs[:4])
			require.Contains(t, []engine.Status{engine.Failed, engine.Timeout}, st.Status)
		})
	}
}

func TestStoppedTargetTimesOut(t *testing.T) {
	info, proc := startTarget(t, "tcp", "")
	init := newEngine(t, engine.Config{Transport: "tcp"})
	src := anonMem(t, 1<<20)
	require.NoError(t, init.RegisterMemory(context.Background(), addr(src), 1<<20, "", true))
	seg, err := init.OpenSegment(context.Background(), info.Name)
	require.NoError(t, err)
	require.NoError(t, proc.Signal(syscall.SIGSTOP))

	b, err := init.AllocateBatch(64)
	require.NoError(t, err)
	reqs := make([]engine.Request, 64)
	for i := range reqs {
		reqs[i] = engine.Request{Op: engine.Read, Local: addr(src), Segment: seg, Remote: info.Addr, Length: 1 << 20}
	}
	start := time.Now()
	require.NoError(t, init.Submit(context.Background(), b, reqs, engine.WithDeadline(start.Add(time.Second))))
	// A busy batch cannot be freed.
	require.ErrorIs(t, init.FreeBatch(b), engine.ErrBatchBusy)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := init.Wait(ctx, b)
	require.NoError(t, err)
	require.Equal(t, engine.Timeout, st.Status, "%v", st.Err)
	require.Less(t, time.Since(start), 5*time.Second)
	require.NoError(t, init.FreeBatch(b))
}

func TestSharedSecret(t *testing.T) {
	for _, tc := range []struct {
		name         string
		target, init string
		ok           bool
	}{
		{"same secret", "s3cret", "s3cret", true},
		{"wrong secret", "s3cret", "guess", false},
		{"initiator without secret", "s3cret", "", false},
		{"target without secret", "", "s3cret", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			info, _ := startTarget(t, "tcp", tc.target)
			init := newEngine(t, engine.Config{Transport: "tcp", Secret: tc.init})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err := init.OpenSegment(ctx, info.Name)
			if !tc.ok {
				// Whichever side lacks the secret, the handshake fails as a
				// socket error (a side without one reads the challenge as a
				// malformed frame, or is hung up on).
				require.ErrorIs(t, err, engine.ErrSocket)
				require.ErrorIs(t, init.Probe(ctx, info.Name), engine.ErrSocket)
				return
			}
			require.NoError(t, err)
			require.NoError(t, init.Probe(ctx, info.Name))
		})
	}
}

// TestSecretGuardsDataPort checks the data port on its own: an engine that
// found the descriptor through a metadata store but lacks the secret cannot
// move a byte.
func TestSecretGuardsDataPort(t *testing.T) {
	store := "memory://" + t.Name()
	target := newEngine(t, engine.Config{Transport: "tcp", Metadata: store, LocalServerName: "target", Secret: "k"})
	dst := anonMem(t, 4096)
	require.NoError(t, target.RegisterMemory(context.Background(), addr(dst), 4096, "", true))
	init := newEngine(t, engine.Config{Transport: "tcp", Metadata: store, LocalServerName: "init"})
	src := anonMem(t, 4096)
	src[0] = 1
	require.NoError(t, init.RegisterMemory(context.Background(), addr(src), 4096, "", true))
	seg, err := init.OpenSegment(context.Background(), "target")
	require.NoError(t, err)
	st := transfer(t, init, []engine.Request{{Op: engine.Write, Local: addr(src), Segment: seg, Remote: uint64(addr(dst)), Length: 4096}})
	require.Equal(t, engine.Failed, st.Status)
	require.Equal(t, byte(0), dst[0])
}
