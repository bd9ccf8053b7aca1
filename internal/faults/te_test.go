package faults

import (
	"bytes"
	"context"
	"fmt"
	"hash/crc32"
	"log/slog"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/internal/netlab"
	"github.com/mooncake-go/mooncake/internal/netlab/labtest"
)

// tePair is an initiator engine on the lab's local host and a target
// engine on host a, each with a buffer of size bytes, the target's filled
// with random bytes.
type tePair struct {
	lab           *netlab.Lab
	a             *netlab.Host
	init, target  *engine.Engine
	local, remote *engine.Buffer
	seg           engine.SegmentID
}

func newTEPair(t *testing.T, size int, timeout time.Duration) *tePair {
	t.Helper()
	ctx := ctxT(t, 30*time.Second)
	lab := labtest.New(t, netlab.Config{Seed: 42})
	p := &tePair{lab: lab, a: labtest.Host(t, lab, "a")}
	quiet := slog.New(slog.DiscardHandler)
	// The target's listeners are opened on a; it never dials, so its
	// goroutines may run anywhere.
	require.NoError(t, p.a.Do(func() (err error) {
		p.target, err = engine.New(ctx, engine.Config{Host: p.a.IP.String(), Transport: "tcp", Logger: quiet})
		return
	}))
	t.Cleanup(func() { _ = p.target.Close() })
	var err error
	p.init, err = engine.New(ctx, engine.Config{Host: lab.Local().IP.String(), Transport: "tcp", Timeout: timeout, Logger: quiet})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.init.Close() })
	p.remote, err = p.target.AllocateBuffer(ctx, size, "cpu:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.remote.Free() })
	fill(p.remote.Bytes(), 1)
	p.local, err = p.init.AllocateBuffer(ctx, size, "cpu:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.local.Free() })
	p.seg, err = p.init.OpenSegment(ctx, p.target.Name())
	require.NoError(t, err)
	return p
}

func fill(b []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, seed))
	for i := 0; i+8 <= len(b); i += 8 {
		v := r.Uint64()
		for k := range 8 {
			b[i+k] = byte(v >> (8 * k))
		}
	}
}

// move runs one batch of n requests of size/n bytes each (op from the
// target into the local buffer, or back) and returns every task's status
// and the time the batch took to be final.
func (p *tePair) move(ctx context.Context, op engine.Op, n, size int) ([]engine.TransferStatus, time.Duration, error) {
	b, err := p.init.AllocateBatch(n)
	if err != nil {
		return nil, 0, err
	}
	defer p.init.FreeBatch(b)
	each := size / n
	reqs := make([]engine.Request, n)
	for i := range reqs {
		off := i * each
		reqs[i] = engine.Request{Op: op, Local: p.local.Addr() + uintptr(off), Segment: p.seg,
			Remote: uint64(p.remote.Addr()) + uint64(off), Length: uint64(each)}
	}
	start := time.Now()
	if err := p.init.Submit(ctx, b, reqs); err != nil {
		return nil, 0, err
	}
	if _, err := p.init.Wait(ctx, b); err != nil {
		return nil, time.Since(start), err
	}
	took := time.Since(start)
	sts := make([]engine.TransferStatus, n)
	for i := range sts {
		if sts[i], err = p.init.TaskStatus(b, i); err != nil {
			return nil, took, err
		}
	}
	return sts, took, nil
}

// Scenario 4: the data path lossy and slow, then narrow. Every transfer
// completes with the right bytes, none hangs past its deadline, and the
// throughput falls with the link, without a cliff.
func TestDataPathDegraded(t *testing.T) {
	const size = 32 << 20
	p := newTEPair(t, size, 60*time.Second)
	cases := []struct {
		name string
		size int
		set  func()
	}{
		{"clean", size, func() {}},
		{"5% loss, 20 ms delay each way", 8 << 20, func() {
			p.lab.SetLinks([]*netlab.Host{p.lab.Local()}, []*netlab.Host{p.a}, netlab.Link{Loss: 0.05, Delay: 20 * time.Millisecond})
		}},
		{"1 Gbit/s link", size, func() { p.lab.Heal(); p.a.SetRate(1e9) }},
		{"1 Gbit/s link, 1% loss, 5 ms delay", 16 << 20, func() {
			p.lab.SetLinks([]*netlab.Host{p.lab.Local()}, []*netlab.Host{p.a}, netlab.Link{Loss: 0.01, Delay: 5 * time.Millisecond})
		}},
	}
	var figures []string
	for _, c := range cases {
		c.set()
		for _, op := range []engine.Op{engine.Read, engine.Write} {
			clear(p.local.Bytes()[:c.size])
			if op == engine.Write {
				fill(p.local.Bytes()[:c.size], 9)
			} else {
				fill(p.remote.Bytes()[:c.size], 1)
			}
			ctx := ctxT(t, 90*time.Second)
			sts, took, err := p.move(ctx, op, 16, c.size)
			require.NoError(t, err, "%s %v", c.name, op)
			for i, st := range sts {
				require.Equal(t, engine.Completed, st.Status, "%s %v task %d: %v", c.name, op, i, st.Err)
			}
			require.Equal(t, crc32.Checksum(p.remote.Bytes()[:c.size], crc32.MakeTable(crc32.Castagnoli)),
				crc32.Checksum(p.local.Bytes()[:c.size], crc32.MakeTable(crc32.Castagnoli)), "%s %v: bytes differ", c.name, op)
			mbps := float64(c.size) * 8 / took.Seconds() / 1e6
			t.Logf("%-36s %-5v %3d MiB in %v: %.0f Mbit/s", c.name, op, c.size>>20, took.Round(time.Millisecond), mbps)
			figures = append(figures, fmt.Sprintf("%s %v %.0f Mbit/s", c.name, op, mbps))
		}
	}
	record(t, row{"4. data path degraded", "TE batch of 16 requests, 8-32 MiB, read and write, TCP 4 lanes",
		"5% loss + 20 ms delay; 1 Gbit/s; 1 Gbit/s + 1% loss + 5 ms",
		"every task completed, bytes equal (CRC-32C), no hang",
		joinFigures(figures)})
}

func joinFigures(f []string) string {
	var b bytes.Buffer
	for i, s := range f {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(s)
	}
	return b.String()
}

// Scenario 5: the target partitioned while a batch is in flight. Every
// task is final within the engine's deadline (completed, or failed with
// the reason); once the link returns, the same engines transfer again with
// the right bytes, with no restart.
func TestPeerPartitionedMidBatch(t *testing.T) {
	const size = 64 << 20
	const deadline = 3 * time.Second
	p := newTEPair(t, size, deadline)
	p.a.SetRate(200e6) // 64 MiB takes ~2.7 s: the cut lands mid-batch

	ctx := ctxT(t, 60*time.Second)
	go func() {
		time.Sleep(500 * time.Millisecond)
		p.lab.Isolate(p.a)
	}()
	sts, took, err := p.move(ctx, engine.Read, 64, size)
	require.NoError(t, err)
	done, failed := 0, 0
	for i, st := range sts {
		switch st.Status {
		case engine.Completed:
			done++
			off := i * (size / 64)
			require.True(t, bytes.Equal(p.remote.Bytes()[off:off+size/64], p.local.Bytes()[off:off+size/64]), "task %d completed with wrong bytes", i)
		case engine.Failed, engine.Timeout:
			failed++
			require.Error(t, st.Err, "task %d failed without a reason", i)
		default:
			t.Fatalf("task %d not final: %v", i, st.Status)
		}
	}
	t.Logf("cut at 0.5 s: %d tasks completed, %d failed, batch final after %v", done, failed, took.Round(time.Millisecond))
	assert.Positive(t, failed, "the cut came after the batch")
	assert.Less(t, took, deadline+2*time.Second, "tasks outlived their deadline")

	p.lab.Heal()
	p.a.SetRate(0)
	fill(p.remote.Bytes(), 5)
	clear(p.local.Bytes())
	start := time.Now()
	var sts2 []engine.TransferStatus
	require.Eventually(t, func() bool {
		sts2, _, err = p.move(ctx, engine.Read, 16, size)
		if err != nil {
			return false
		}
		for _, st := range sts2 {
			if st.Status != engine.Completed {
				return false
			}
		}
		return true
	}, 30*time.Second, 100*time.Millisecond, "the engine did not recover after the link returned")
	recovered := time.Since(start)
	require.True(t, bytes.Equal(p.remote.Bytes(), p.local.Bytes()), "bytes after recovery")
	record(t, row{"5. TE peer partitioned mid-batch", "64 x 1 MiB reads at 200 Mbit/s, request deadline 3 s",
		"target isolated 0.5 s into the batch, healed after",
		"every task final within its deadline; recovery without restart, right bytes",
		fmt.Sprintf("%d completed (bytes checked), %d failed with a reason, batch final after %v; transfers again %v after healing",
			done, failed, took.Round(time.Millisecond), recovered.Round(time.Millisecond))})
}
