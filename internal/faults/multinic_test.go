package faults

import (
	"bytes"
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/internal/netlab"
	"github.com/mooncake-go/mooncake/internal/netlab/labtest"
)

// nicRate is the rate of each of the target's two links: low enough that
// the links, not the two cores running switch and engines, are the limit.
const nicRate = 200e6

// nicPair is a target engine on host b, which has two links (b and its
// second NIC b2, each rate-limited to nicRate), and an initiator on the
// lab's local host, whose own link is not limited. one is a second target
// engine on b that publishes b's first address only: the one-link
// yardstick.
type nicPair struct {
	lab           *netlab.Lab
	b, b2         *netlab.Host
	init          *engine.Engine
	target, one   *engine.Engine
	local, remote *engine.Buffer
	seg, oneSeg   engine.SegmentID
	oneRemote     *engine.Buffer
}

func newNICPair(tb testing.TB, size int, timeout time.Duration) *nicPair {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	lab := labtest.New(tb, netlab.Config{Seed: 42})
	p := &nicPair{lab: lab, b: labtest.Host(tb, lab, "b")}
	var err error
	p.b2, err = lab.AddLink(p.b, "b-nic2")
	require.NoError(tb, err)
	p.b.SetRate(nicRate)
	p.b2.SetRate(nicRate)
	quiet := slog.New(slog.DiscardHandler)
	// The targets' listeners are opened on b; they never dial.
	require.NoError(tb, p.b.Do(func() (err error) {
		if p.target, err = engine.New(ctx, engine.Config{Host: p.b.IP.String(), ExtraHosts: []string{p.b2.IP.String()},
			Transport: "tcp", Logger: quiet}); err != nil {
			return err
		}
		p.one, err = engine.New(ctx, engine.Config{Host: p.b.IP.String(), Transport: "tcp", Logger: quiet})
		return err
	}))
	tb.Cleanup(func() { _ = p.target.Close(); _ = p.one.Close() })
	p.init, err = engine.New(ctx, engine.Config{Host: lab.Local().IP.String(), Transport: "tcp", Timeout: timeout, Logger: quiet})
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = p.init.Close() })
	alloc := func(e *engine.Engine) *engine.Buffer {
		b, err := e.AllocateBuffer(ctx, size, "cpu:0")
		require.NoError(tb, err)
		tb.Cleanup(func() { _ = b.Free() })
		return b
	}
	p.remote, p.oneRemote, p.local = alloc(p.target), alloc(p.one), alloc(p.init)
	fill(p.remote.Bytes(), 1)
	fill(p.oneRemote.Bytes(), 1)
	// Close the engines before the buffers are freed: a buffer's Free
	// waits for the requests serving it, which a cut link holds until the
	// server gives up on them.
	tb.Cleanup(func() { _ = p.init.Close(); _ = p.target.Close(); _ = p.one.Close() })
	p.seg, err = p.init.OpenSegment(ctx, p.target.Name())
	require.NoError(tb, err)
	p.oneSeg, err = p.init.OpenSegment(ctx, p.one.Name())
	require.NoError(tb, err)
	return p
}

// move runs one batch of n requests covering size bytes of seg (op from
// remote into the local buffer, or back) and returns each task's status
// and the time until the batch was final.
func (p *nicPair) move(ctx context.Context, seg engine.SegmentID, remote *engine.Buffer, op engine.Op, n, size int) ([]engine.TransferStatus, time.Duration, error) {
	b, err := p.init.AllocateBatch(n)
	if err != nil {
		return nil, 0, err
	}
	defer p.init.FreeBatch(b)
	each := size / n
	reqs := make([]engine.Request, n)
	for i := range reqs {
		off := i * each
		reqs[i] = engine.Request{Op: op, Local: p.local.Addr() + uintptr(off), Segment: seg,
			Remote: uint64(remote.Addr()) + uint64(off), Length: uint64(each)}
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

// carried is what the links of b delivered so far, both ways, between b
// (first link, second link) and the local host.
func (p *nicPair) carried() (first, second uint64) {
	l := p.lab.Local()
	return p.lab.Stats(p.b, l).Bytes + p.lab.Stats(l, p.b).Bytes, p.lab.Stats(p.b2, l).Bytes + p.lab.Stats(l, p.b2).Bytes
}

// prepare fills the source side of a size-byte move and clears the other.
func (p *nicPair) prepare(op engine.Op, remote *engine.Buffer, size int, seed uint64) {
	if op == engine.Write {
		fill(p.local.Bytes()[:size], seed)
		clear(remote.Bytes()[:size])
	} else {
		fill(remote.Bytes()[:size], seed)
		clear(p.local.Bytes()[:size])
	}
}

func requireCompleted(t *testing.T, what string, sts []engine.TransferStatus, local, remote []byte) {
	t.Helper()
	for i, st := range sts {
		require.Equal(t, engine.Completed, st.Status, "%s: task %d: %v", what, i, st.Err)
	}
	require.True(t, bytes.Equal(local, remote), "%s: bytes differ", what)
}

// TestMultiNICSpreads: a target with two links publishes both; one batch
// to it, read and write, moves the right bytes over both links, each
// carrying a fair share.
func TestMultiNICSpreads(t *testing.T) {
	const size = 16 << 20
	p := newNICPair(t, size, 60*time.Second)
	for _, op := range []engine.Op{engine.Read, engine.Write} {
		p.prepare(op, p.remote, size, uint64(op)+3)
		first0, second0 := p.carried()
		sts, took, err := p.move(ctxT(t, 60*time.Second), p.seg, p.remote, op, 16, size)
		require.NoError(t, err)
		requireCompleted(t, op.String(), sts, p.local.Bytes()[:size], p.remote.Bytes()[:size])
		first, second := p.carried()
		first, second = first-first0, second-second0
		t.Logf("%v %d MiB in %v: %d MiB over the first link, %d MiB over the second", op, size>>20,
			took.Round(time.Millisecond), first>>20, second>>20)
		require.Greater(t, first, uint64(size/4), "%v: the first link carried too little", op)
		require.Greater(t, second, uint64(size/4), "%v: the second link carried too little", op)
	}
}

// TestMultiNICLinkCut: one of the target's links is cut while a batch is
// on the wire; the slices it held move to the other link and every task
// completes with the right bytes, within its deadline.
func TestMultiNICLinkCut(t *testing.T) {
	const size = 32 << 20 // ~0.7 s over both links, 1.4 s over one
	const deadline = 20 * time.Second
	for _, op := range []engine.Op{engine.Read, engine.Write} {
		// A pair each: after a cut, lanes stay on the link left.
		t.Run(op.String(), func(t *testing.T) { cutOne(t, op, size, deadline) })
	}
}

func cutOne(t *testing.T, op engine.Op, size int, deadline time.Duration) {
	p := newNICPair(t, size, deadline)
	p.prepare(op, p.remote, size, uint64(op)+5)
	cut := make(chan uint64, 1)
	ctx := ctxT(t, 60*time.Second)
	go func() {
		// Cut once the second link has carried an eighth of the batch:
		// it has slices in flight then.
		for ctx.Err() == nil {
			if _, second := p.carried(); second > uint64(size/8) {
				p.lab.Partition([]*netlab.Host{p.lab.Local()}, []*netlab.Host{p.b2})
				first, _ := p.carried()
				cut <- first
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	sts, took, err := p.move(ctx, p.seg, p.remote, op, 16, size)
	require.NoError(t, err)
	var firstAtCut uint64
	select {
	case firstAtCut = <-cut:
	default:
		t.Fatal("the batch ended before the cut")
	}
	requireCompleted(t, op.String(), sts, p.local.Bytes()[:size], p.remote.Bytes()[:size])
	require.Less(t, took, deadline, "took longer than the deadline")
	first, _ := p.carried()
	t.Logf("%v %d MiB, second link cut mid-batch: completed in %v, %d MiB over the first link after the cut",
		op, size>>20, took.Round(time.Millisecond), (first-firstAtCut)>>20)
	require.Greater(t, first-firstAtCut, uint64(size/8), "the first link did not take over")
}

// TestMultiNICAllCut: with both of the target's links cut mid-batch,
// every task fails with a reason, well before its deadline (paths found
// down, retries used up), and none is left pending.
func TestMultiNICAllCut(t *testing.T) {
	const size = 32 << 20
	const deadline = 30 * time.Second
	p := newNICPair(t, size, deadline)
	p.prepare(engine.Read, p.remote, size, 7)
	ctx := ctxT(t, 60*time.Second)
	go func() {
		for ctx.Err() == nil {
			if first, second := p.carried(); first+second > size/4 {
				p.lab.Isolate(p.b)
				p.lab.Isolate(p.b2)
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	sts, took, err := p.move(ctx, p.seg, p.remote, engine.Read, 16, size)
	require.NoError(t, err)
	failed := 0
	for i, st := range sts {
		switch st.Status {
		case engine.Completed:
		case engine.Failed, engine.Timeout:
			failed++
			require.Error(t, st.Err, "task %d failed without a reason", i)
			if failed == 1 {
				t.Logf("task %d: %v: %v", i, st.Status, st.Err)
			}
			msg := st.Err.Error()
			require.True(t, strings.Contains(msg, "down") || strings.Contains(msg, "dial"), "task %d: unclear reason: %v", i, st.Err)
		default:
			t.Fatalf("task %d not final: %v", i, st.Status)
		}
	}
	require.Positive(t, failed, "the cut came after the batch")
	require.Less(t, took, 12*time.Second, "tasks waited for their deadline: paths down went unnoticed")
	t.Logf("both links cut: %d of %d tasks failed, batch final after %v", failed, len(sts), took.Round(time.Millisecond))
}

// BenchmarkMultiNIC reads 32 MiB from the two-link target and from the
// one-link yardstick on the same host, in turn, and reports each rate and
// their ratio (the median of the iterations' ratios): with two links of
// nicRate it should approach 2.
func BenchmarkMultiNIC(b *testing.B) {
	const size = 32 << 20
	p := newNICPair(b, size, 60*time.Second)
	ctx := context.Background()
	var ratios, two, one []float64
	for b.Loop() {
		var rates [2]float64
		for k, c := range []struct {
			seg    engine.SegmentID
			remote *engine.Buffer
		}{{p.seg, p.remote}, {p.oneSeg, p.oneRemote}} {
			sts, took, err := p.move(ctx, c.seg, c.remote, engine.Read, 16, size)
			require.NoError(b, err)
			for i, st := range sts {
				require.Equal(b, engine.Completed, st.Status, "task %d: %v", i, st.Err)
			}
			rates[k] = float64(size) * 8 / took.Seconds() / 1e6
		}
		two, one, ratios = append(two, rates[0]), append(one, rates[1]), append(ratios, rates[0]/rates[1])
	}
	b.ReportMetric(median(two), "Mbit/s-2links")
	b.ReportMetric(median(one), "Mbit/s-1link")
	b.ReportMetric(median(ratios), "x-ratio")
	b.ReportMetric(nicRate/1e6, "Mbit/s-linkrate")
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
