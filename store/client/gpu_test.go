package client

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/engine/device"
	"github.com/mooncake-go/mooncake/engine/device/devicetest"
	"github.com/mooncake-go/mooncake/engine/transport"
	"github.com/mooncake-go/mooncake/store/master"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// GPU memory here is the CUDA driver test double's (TestMain builds it):
// host memory the CPU cannot touch, since any load or store through a
// device pointer faults and kills the test binary. So every test below
// fails on a client that copies or checksums a device buffer with the
// CPU, and passes only when those bytes move through the engine or the
// driver.

func gpuDriver(t testing.TB) *device.Driver {
	t.Helper()
	d, err := devicetest.Driver()
	require.NoError(t, err)
	return d
}

// gpuBuf is n bytes of memory on GPU dev, freed with the test.
func gpuBuf(t testing.TB, dev, n int) []byte {
	t.Helper()
	devicetest.RequireGPUs(t, dev+1)
	d := gpuDriver(t)
	p, err := d.AllocDevice(dev, uint64(n))
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.FreeDevice(dev, p) })
	return transport.Bytes(p, uint64(n))
}

// gpuDev is the GPU holding b.
func gpuDev(t testing.TB, b []byte) int {
	t.Helper()
	dev, on, err := gpuDriver(t).Locate(engine.AddrOf(b))
	require.NoError(t, err)
	require.True(t, on, "%#x is not GPU memory", engine.AddrOf(b))
	return dev
}

// toGPU copies src into the GPU memory dst with the driver.
func toGPU(t testing.TB, dst, src []byte) {
	t.Helper()
	require.NoError(t, gpuDriver(t).Copy(gpuDev(t, dst), engine.AddrOf(dst), engine.AddrOf(src), uint64(len(src))))
}

// fromGPU copies the GPU memory b out with the driver.
func fromGPU(t testing.TB, b []byte) []byte {
	t.Helper()
	out := make([]byte, len(b))
	require.NoError(t, gpuDriver(t).Copy(gpuDev(t, b), engine.AddrOf(out), engine.AddrOf(b), uint64(len(b))))
	return out
}

// gpuRegistered is gpuBuf registered with c.
func gpuRegistered(t testing.TB, c *Client, dev, n int) []byte {
	t.Helper()
	b := gpuBuf(t, dev, n)
	require.NoError(t, c.RegisterBuffer(b))
	t.Cleanup(func() { _ = c.UnregisterBuffer(b) })
	return b
}

// masterSum is the checksum the master keeps for key.
func masterSum(t testing.TB, m *master.Server, key string) uint32 {
	t.Helper()
	_, _, sum, _, err := m.Service().GetReplicaList(key)
	require.NoError(t, err)
	return sum
}

// gpuStore is a master with two clients holding segments on one host (a
// reads its own replicas with local copies, b reaches a's through the
// same-host path) and a client without a segment that reaches both over
// TCP only.
type gpuStore struct {
	m       *master.Server
	a, b, p *Client
}

func newGPUStore(t *testing.T, opts ...func(*Config)) *gpuStore {
	m := startMaster(t, master.ServiceConfig{})
	return &gpuStore{
		m: m,
		a: newClient(t, m.Addr(), 64<<20, opts...),
		b: newClient(t, m.Addr(), 64<<20, opts...),
		p: newClient(t, m.Addr(), NoSegment, append(opts, func(c *Config) { c.EngineConfig.Transport = "tcp" })...),
	}
}

func (s *gpuStore) clients() map[string]*Client {
	return map[string]*Client{"a": s.a, "b": s.b, "tcp": s.p}
}

// TestGPUPutFromGetInto: values put from GPU memory, registered or not,
// into replicas in the writer's own segment (the engine's local copy),
// on the same host and over TCP, read back into GPU memory, registered or
// not, by every kind of reader, and as host bytes; the master keeps the
// checksum of the value's bytes.
func TestGPUPutFromGetInto(t *testing.T) {
	s := newGPUStore(t)
	ctx := ctxT(t)
	const most = 5<<20 + 7 // more than a staging piece (2 MiB here)
	dsts := map[*Client][]byte{}
	for _, c := range s.clients() {
		dsts[c] = gpuRegistered(t, c, 1, most)
	}
	srcs := map[*Client][]byte{s.a: gpuRegistered(t, s.a, 0, most), s.p: gpuRegistered(t, s.p, 0, most)}
	loose := gpuBuf(t, 1, most) // registered with no client: staged by the driver

	cases := []struct {
		name   string
		writer *Client
		rc     func() *ReplicateConfig
	}{
		// The writer's own segment: the engine copies it locally.
		{"local", s.a, func() *ReplicateConfig { return &ReplicateConfig{PreferredSegments: []string{s.a.SegmentName()}} }},
		// Another client on this host.
		{"same-host", s.a, func() *ReplicateConfig { return &ReplicateConfig{PreferredSegments: []string{s.b.SegmentName()}} }},
		// TCP to a segment elsewhere.
		{"tcp", s.p, func() *ReplicateConfig { return &ReplicateConfig{PreferredSegments: []string{s.a.SegmentName()}} }},
		// Two replicas, one of them local.
		{"two", s.a, func() *ReplicateConfig { return &ReplicateConfig{Replicas: 2} }},
	}
	seed := uint64(100)
	for _, tc := range cases {
		for _, n := range []int{1, 4099, most} {
			for _, registered := range []bool{true, false} {
				seed++
				key := fmt.Sprintf("%s-%d-%v", tc.name, n, registered)
				want := value(seed, n)
				src := srcs[tc.writer][:n]
				var err error
				if registered {
					toGPU(t, src, want)
					err = tc.writer.PutFrom(ctx, key, src, tc.rc())
				} else {
					toGPU(t, loose[:n], want)
					// PutFrom refuses memory that is not registered; Put
					// stages it.
					assert.Equal(t, storepb.InvalidParams, codeOf(tc.writer.PutFrom(ctx, key, loose[:n], tc.rc())))
					err = tc.writer.Put(ctx, key, loose[:n], tc.rc())
				}
				require.NoError(t, err, key)
				require.Equal(t, checksum(want), masterSum(t, s.m, key), "%s: checksum", key)
				for name, c := range s.clients() {
					dst := dsts[c][:n]
					if !registered {
						dst = loose[:n]
					}
					got, err := c.GetInto(ctx, key, dst)
					require.NoError(t, err, "%s reads %s", name, key)
					require.Equal(t, n, got)
					require.True(t, bytes.Equal(want, fromGPU(t, dst)), "%s reads %s into GPU memory: bytes differ", name, key)
					host, err := c.Get(ctx, key)
					require.NoError(t, err, "%s reads %s", name, key)
					require.True(t, bytes.Equal(want, host), "%s reads %s: bytes differ", name, key)
				}
			}
		}
	}
}

// TestGPUBatchUpsertAndParts: the batch forms vLLM's store connector
// uses on a GPU host (batch_put_from, batch_get_into and their
// multi-buffer forms, one part per layer), upsert from GPU memory, and
// parts mixing GPU and host memory.
func TestGPUBatchUpsertAndParts(t *testing.T) {
	s := newGPUStore(t)
	ctx := ctxT(t)
	const n = 300 << 10
	for _, w := range []*Client{s.a, s.p} {
		t.Run(w.SegmentName(), func(t *testing.T) {
			mustRemoveAll(t, s.a)
			src := gpuRegistered(t, w, 0, 3*n)
			keys := []string{"b0", "b1", "b2"}
			want := value(7, 3*n)
			toGPU(t, src, want)
			vals := [][]byte{src[:n], src[n : 2*n], src[2*n:]}
			for i, err := range w.BatchPutFrom(ctx, keys, vals, &ReplicateConfig{Replicas: 2}) {
				require.NoError(t, err, keys[i])
			}
			for _, r := range s.clients() {
				dst := gpuRegistered(t, r, 1, 3*n)
				ns, errs := r.BatchGetInto(ctx, keys, [][]byte{dst[:n], dst[n : 2*n], dst[2*n:]})
				for i := range keys {
					require.NoError(t, errs[i], keys[i])
					require.Equal(t, n, ns[i])
				}
				require.True(t, bytes.Equal(want, fromGPU(t, dst)), "batch read: bytes differ")
			}

			// Upsert from GPU memory replaces the value.
			next := value(8, n)
			toGPU(t, src[:n], next)
			require.NoError(t, w.Upsert(ctx, "b0", src[:n], nil))
			require.Equal(t, checksum(next), masterSum(t, s.m, "b0"))
			// (The writer: the others may read the old value within the
			// leases they hold.)
			got, err := w.Get(ctx, "b0")
			require.NoError(t, err)
			require.True(t, bytes.Equal(next, got), "upserted value differs")

			// A value of four layers: two on GPU 0, one in registered host
			// memory, one on GPU 1, of unequal sizes.
			g0, g1 := gpuRegistered(t, w, 0, 2*n), gpuRegistered(t, w, 1, n)
			hostMem := make([]byte, n)
			require.NoError(t, w.RegisterBuffer(hostMem))
			t.Cleanup(func() { _ = w.UnregisterBuffer(hostMem) })
			layers := [][]byte{g0[:n-3], hostMem[:n/2], g0[n : 2*n], g1[:7]}
			var whole []byte
			for i, l := range layers {
				v := value(uint64(20+i), len(l))
				if i == 1 {
					copy(l, v)
				} else {
					toGPU(t, l, v)
				}
				whole = append(whole, v...)
			}
			for i, err := range w.BatchPutFromParts(ctx, []string{"layers"}, [][][]byte{layers}, nil) {
				require.NoError(t, err, i)
			}
			require.Equal(t, checksum(whole), masterSum(t, s.m, "layers"))
			for name, r := range s.clients() {
				got, err := r.Get(ctx, "layers")
				require.NoError(t, err, name)
				require.True(t, bytes.Equal(whole, got), "%s: whole value differs", name)
				// Read back into GPU parts cut differently.
				dst := gpuRegistered(t, r, 0, len(whole))
				parts := [][]byte{dst[:1000], dst[1000 : 1000+n], dst[1000+n:]}
				ns, errs := r.BatchGetIntoParts(ctx, []string{"layers"}, [][][]byte{parts})
				require.NoError(t, errs[0], name)
				require.Equal(t, len(whole), ns[0])
				require.True(t, bytes.Equal(whole, fromGPU(t, dst)), "%s: parts differ", name)
			}
		})
	}
}

// TestGPURangesAndPutSessions: ranged reads into GPU memory and a put
// session written layer by layer from GPU memory (registered and not),
// whose checksum the transfers took.
func TestGPURangesAndPutSessions(t *testing.T) {
	s := newGPUStore(t)
	ctx := ctxT(t)
	const n = 1 << 20
	for _, w := range []*Client{s.a, s.p} {
		key := "session-" + w.SegmentName()
		want := value(31, n)
		reg := gpuRegistered(t, w, 0, n/2)
		loose := gpuBuf(t, 1, n/2)
		toGPU(t, reg, want[:n/2])
		toGPU(t, loose, want[n/2:])
		for _, err := range w.StartPutSession(ctx, []string{key}, []uint64{n}, &ReplicateConfig{Replicas: 2}) {
			require.NoError(t, err)
		}
		// The second half first, in two layers, then the first.
		ranges := [][]PutRange{{{Dst: n / 2, Src: loose[:n/4]}, {Dst: 3 * n / 4, Src: loose[n/4:]}}, {{Dst: 0, Src: reg}}}
		for _, rs := range ranges {
			ns, errs := w.BatchPutRanges(ctx, []string{key}, [][]PutRange{rs})
			require.NoError(t, errs[0])
			require.NotZero(t, ns[0])
		}
		for _, err := range w.EndPutSession(ctx, []string{key}) {
			require.NoError(t, err)
		}
		require.Equal(t, checksum(want), masterSum(t, s.m, key), "session checksum")

		for name, r := range s.clients() {
			got, err := r.Get(ctx, key)
			require.NoError(t, err, name)
			require.True(t, bytes.Equal(want, got), "%s: value differs", name)
			dreg, dloose := gpuRegistered(t, r, 1, 4096), gpuBuf(t, 0, 5000)
			ns, errs := r.BatchGetRanges(ctx, []string{key}, [][]Range{{{Src: 10, Dst: dreg}, {Src: n - 5000, Dst: dloose}}})
			require.NoError(t, errs[0], name)
			require.Equal(t, 4096+5000, ns[0])
			require.True(t, bytes.Equal(want[10:10+4096], fromGPU(t, dreg)), "%s: registered range differs", name)
			require.True(t, bytes.Equal(want[n-5000:], fromGPU(t, dloose)), "%s: staged range differs", name)
		}
	}
}

// TestGPUDriverFailure: a driver copy that fails mid-put fails the put,
// and the object never becomes readable (a retry then writes it whole);
// one that fails mid-get fails the get rather than returning its bytes.
func TestGPUDriverFailure(t *testing.T) {
	devicetest.RequireDouble(t)
	s := newGPUStore(t, func(c *Config) { c.LeaseCache = NoLeaseCache })
	ctx := ctxT(t)
	const n = 5 << 20
	gpuDriver(t)
	t.Cleanup(func() { _ = devicetest.Reset() })
	cases := []struct {
		name       string
		c          *Client
		registered bool
		seg        *Client // where the replica goes
		nth        int     // which cuMemcpy of the put or get fails
	}{
		// The engine stages the slices over TCP.
		{"tcp", s.p, true, s.a, 2},
		// The engine's own copy to a local replica.
		{"local", s.a, true, s.a, 1},
		// Over the same-host path, which stages device slices.
		{"same-host", s.b, true, s.a, 3},
		// The client's staging copies (two of them for 5 MiB).
		{"staged", s.p, false, s.a, 2},
		{"staged-local", s.a, false, s.a, 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var buf []byte
			if tc.registered {
				buf = gpuRegistered(t, tc.c, 0, n)
			} else {
				buf = gpuBuf(t, 0, n)
			}
			want := value(uint64(len(tc.name)), n)
			toGPU(t, buf, want)
			rc := &ReplicateConfig{PreferredSegments: []string{tc.seg.SegmentName()}}
			key := "fail-" + tc.name

			require.NoError(t, devicetest.Reset())
			require.NoError(t, devicetest.Fail("cuMemcpy", tc.nth, 0))
			err := tc.c.Put(ctx, key, buf, rc)
			require.Error(t, err, "put with a failing driver copy")
			calls, cerr := devicetest.Calls("cuMemcpy")
			require.NoError(t, cerr)
			require.GreaterOrEqual(t, calls, tc.nth, "the armed failure was reached")
			for name, r := range s.clients() {
				_, err := r.Get(ctx, key)
				require.Equal(t, storepb.ObjectNotFound, codeOf(err), "%s reads a failed put", name)
			}
			require.NoError(t, devicetest.Reset())
			require.NoError(t, tc.c.Put(ctx, key, buf, rc), "put again")
			got, err := s.b.Get(ctx, key)
			require.NoError(t, err)
			require.True(t, bytes.Equal(want, got), "value put again differs")

			// A failing copy mid-get: an error, and the bytes in place are
			// not taken for the value.
			toGPU(t, buf, make([]byte, n))
			require.NoError(t, devicetest.Fail("cuMemcpy", tc.nth, 0))
			_, err = tc.c.GetInto(ctx, key, buf)
			require.Error(t, err, "get with a failing driver copy")
			require.NoError(t, devicetest.Reset())
			got2, err := tc.c.GetInto(ctx, key, buf)
			require.NoError(t, err)
			require.Equal(t, n, got2)
			require.True(t, bytes.Equal(want, fromGPU(t, buf)), "value read again differs")
			mustRemoveAll(t, s.a)
		})
	}
}
