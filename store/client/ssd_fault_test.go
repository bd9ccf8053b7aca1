package client

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/mooncake-go/mooncake/store/master"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// Issue 13, scenario 7: the SSD tier's disk full or failing. The disks
// are real: a tmpfs of a few MiB for a full one, an ext4 file system on a
// loop device whose end is cut off under the tier's file for a failing one
// (every read and write of the file's blocks then fails with EIO, as a
// dead disk's would; device-mapper's error target would do the same but is
// missing from some kernels). Both need root; the tests skip without it.

// mountTmpfs mounts a tmpfs of size bytes for the test.
func mountTmpfs(t *testing.T, size int) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%d", size)); err != nil {
		t.Skipf("cannot mount a tmpfs here (the test needs root): %v", err)
	}
	t.Cleanup(func() { unmountFS(t, dir) })
	return dir
}

func unmountFS(t *testing.T, dir string) {
	if err := unix.Unmount(dir, 0); err != nil {
		t.Logf("unmount %s: %v; detaching it", dir, err)
		_ = unix.Unmount(dir, unix.MNT_DETACH)
	}
}

// loopDisk is an ext4 file system on a loop device over a sparse file.
type loopDisk struct {
	img, dev, dir string
}

// newLoopDisk makes and mounts a loop disk of size bytes for the test. It
// has no journal, so that cutting the device short fails data I/O only.
func newLoopDisk(t *testing.T, size int64) *loopDisk {
	t.Helper()
	for _, tool := range []string{"losetup", "mkfs.ext4"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("no %s here: %v", tool, err)
		}
	}
	tmp := t.TempDir()
	d := &loopDisk{img: filepath.Join(tmp, "disk.img"), dir: filepath.Join(tmp, "mnt")}
	require.NoError(t, os.Mkdir(d.dir, 0o755))
	require.NoError(t, os.WriteFile(d.img, nil, 0o600))
	require.NoError(t, os.Truncate(d.img, size))
	out, err := exec.Command("losetup", "--find", "--show", d.img).CombinedOutput()
	if err != nil {
		t.Skipf("no loop device here (the test needs root): %v: %s", err, out)
	}
	d.dev = strings.TrimSpace(string(out))
	t.Cleanup(func() {
		if out, err := exec.Command("losetup", "--detach", d.dev).CombinedOutput(); err != nil {
			t.Logf("losetup --detach %s: %v: %s", d.dev, err, out)
		}
	})
	out, err = exec.Command("mkfs.ext4", "-q", "-F", "-b", "4096", "-O", "^has_journal", "-E", "nodiscard", d.dev).CombinedOutput()
	require.NoError(t, err, "mkfs.ext4: %s", out)
	if err := unix.Mount(d.dev, d.dir, "ext4", 0, "errors=continue"); err != nil {
		t.Skipf("cannot mount ext4 on %s: %v", d.dev, err)
	}
	t.Cleanup(func() { unmountFS(t, d.dir) })
	return d
}

// failUnder cuts the device off before the first block of f: from then
// on every read or write of f's blocks fails with EIO.
func (d *loopDisk) failUnder(t *testing.T, f *os.File) {
	t.Helper()
	first := firstBlock(t, f)
	require.NoError(t, os.Truncate(d.img, first))
	out, err := exec.Command("losetup", "--set-capacity", d.dev).CombinedOutput()
	require.NoError(t, err, "losetup --set-capacity: %s", out)
}

// firstBlock is the lowest byte offset on the device of any extent of f
// (written or only allocated), from FS_IOC_FIEMAP.
func firstBlock(t *testing.T, f *os.File) int64 {
	t.Helper()
	const (
		fsIocFiemap = 0xC020660B // _IOWR('f', 11, struct fiemap)
		maxExtents  = 64
		extentSize  = 56 // struct fiemap_extent
	)
	// struct fiemap: start, length, flags, mapped extents, extent count,
	// reserved, then the extents.
	buf := make([]byte, 32+maxExtents*extentSize)
	le := binary.LittleEndian
	le.PutUint64(buf[8:], ^uint64(0))
	le.PutUint32(buf[24:], maxExtents)
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), fsIocFiemap, uintptr(unsafe.Pointer(&buf[0]))); e != 0 {
		t.Fatalf("FIEMAP %s: %v", f.Name(), e)
	}
	n := le.Uint32(buf[20:])
	require.Positive(t, n, "no extent of %s", f.Name())
	first := int64(-1)
	for i := range n {
		phys := int64(le.Uint64(buf[32+i*extentSize+8:]))
		if first < 0 || phys < first {
			first = phys
		}
	}
	return first
}

// slowPing is the ping interval of the clients that move objects here. A
// ping answer that misses its deadline (three intervals) loses the moves
// it carried until the master expires them (30 s), which would stall
// putThroughTier: leave room for a loaded machine.
const slowPing = 100 * time.Millisecond

func withSSDSlowPing(dir string, size int64) func(*Config) {
	return func(c *Config) { withSSD(dir, size)(c); c.PingInterval = slowPing }
}

// tcpOnly keeps a reader in the test's process off the shared-memory path
// (see TestSSDFailingDiskRemoteRead).
func tcpOnly(c *Config) { c.EngineConfig.Transport = "tcp" }

// dropTierCache writes the tier's pages to the disk and drops them from
// the page cache, so that the next touch of any of them reads the disk.
func dropTierCache(t *testing.T, c *Client) {
	t.Helper()
	if err := unix.Msync(c.ssd.mem, unix.MS_SYNC); err != nil {
		t.Logf("msync of the tier: %v", err) // a failing disk's write-back
	}
	require.NoError(t, unix.Madvise(c.ssd.mem, unix.MADV_DONTNEED))
	require.NoError(t, unix.Fadvise(int(c.ssd.f.Fd()), 0, int64(len(c.ssd.mem)), unix.FADV_DONTNEED))
}

// putThroughTier puts n objects of size bytes through node, each once the
// tier took the one before (as TestSSDSpillAndPromote), and returns how
// many lost their DRAM replica to eviction: those are only on the tier,
// and, eviction going least recently used first, they are the first ones.
// It looks at no replica list: a lookup of an object only on the tier
// would queue its promotion, a read of the tier by the node.
func putThroughTier(t *testing.T, m *master.Server, node *Client, prefix string, n, size int) (ssdOnly int) {
	t.Helper()
	ctx := ctxT(t)
	base := m.Service().Stats()
	for i := range n {
		require.NoError(t, node.Put(ctx, fmt.Sprintf("%s%d", prefix, i), value(uint64(i), size), nil))
		require.Eventually(t, func() bool {
			st := m.Service().Stats()
			return st.Offloaded+st.Spilled-base.Offloaded-base.Spilled >= uint64(i+1)
		}, 10*time.Second, 5*time.Millisecond, "offloads: %+v", m.Service().Stats())
	}
	st := m.Service().Stats()
	require.Equal(t, base.Keys+n, st.Keys, "an object was dropped: %+v", st)
	return int(st.EvictedKeys - base.EvictedKeys)
}

// mediaOf lists the media of key's replicas at the master (none when the
// key is gone).
func mediaOf(t *testing.T, m *master.Server, key string) []storepb.Medium {
	t.Helper()
	reps, _, _, _, err := m.Service().GetReplicaList(key)
	if errors.Is(err, storepb.ErrObjectNotFound) {
		return nil
	}
	require.NoError(t, err, key)
	var media []storepb.Medium
	for _, r := range reps {
		media = append(media, r.GetMemory().Medium)
	}
	return media
}

// tally reads every key from c and counts right values and misses; a
// value with wrong bytes fails the test, as does an error that is neither
// a miss nor one of wantErrs.
func tally(t *testing.T, c *Client, prefix string, n, size int, wantErrs ...error) (ok, missing, failed int) {
	t.Helper()
	ctx := ctxT(t)
	for i := range n {
		key := fmt.Sprintf("%s%d", prefix, i)
		got, err := c.Get(ctx, key)
		switch {
		case err == nil:
			require.Equal(t, value(uint64(i), size), got, "%s: wrong bytes", key)
			ok++
		case errors.Is(err, storepb.ErrObjectNotFound):
			missing++
		default:
			matched := false
			for _, w := range wantErrs {
				matched = matched || errors.Is(err, w)
			}
			require.True(t, matched, "%s: %v", key, err)
			if failed == 0 {
				t.Logf("first failed read, %s: %v", key, err)
			}
			failed++
		}
	}
	return ok, missing, failed
}

// A tier larger than the free space of its disk is refused at start, with
// nothing left behind on the disk; the client serves from DRAM.
func TestSSDDiskFullAtStart(t *testing.T) {
	dir := mountTmpfs(t, 4<<20)
	m := startMaster(t, master.ServiceConfig{})
	node := newClient(t, m.Addr(), 4<<20, withSSD(dir, 8<<20))
	assert.Empty(t, node.SSDPath(), "a tier that does not fit was mounted")
	left, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Empty(t, left, "the refused tier's file stays on the disk")
	assert.Zero(t, m.Service().Stats().DiskCapacity)
	ctx := ctxT(t)
	require.NoError(t, node.Put(ctx, "k", value(1, 1<<20), nil))
	got, err := node.Get(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, value(1, 1<<20), got)
}

// A disk that fills up after the tier started does not touch the tier: its
// file is allocated in full at start, so offloads still land on the full
// disk, and the objects evicted from DRAM read back byte-exact from there;
// no move fails.
func TestSSDDiskFillsAfterStart(t *testing.T) {
	dir := mountTmpfs(t, 12<<20)
	m := startMaster(t, master.ServiceConfig{})
	node := newClient(t, m.Addr(), 4<<20, withSSDSlowPing(dir, 8<<20))
	require.NotEmpty(t, node.SSDPath())
	// Fill the rest of the disk.
	filler, err := os.Create(filepath.Join(dir, "filler"))
	require.NoError(t, err)
	chunk := make([]byte, 64<<10)
	for err == nil {
		_, err = filler.Write(chunk)
	}
	require.ErrorIs(t, err, unix.ENOSPC)
	require.NoError(t, filler.Close())

	// 5 MiB through the 4 MiB pool onto the tier of the full disk: the
	// first objects lose their DRAM replicas and are then only there.
	const n, size = 20, 256 << 10
	ssdOnly := putThroughTier(t, m, node, "f", n, size)
	ok, missing, _ := tally(t, node, "f", n, size)
	st := m.Service().Stats()
	t.Logf("disk full after start: %d of %d read back (%d only from the tier), %d lost, 0 wrong; %+v",
		ok, n, ssdOnly, missing, st)
	assert.Equal(t, n, ok, "objects on the tier of a full disk")
	assert.Positive(t, ssdOnly)
	assert.NoError(t, node.ssd.failed())
	assert.Zero(t, metricValue(node.met.moveFailures.WithLabelValues("disk")))
}

// A disk that fails under objects on the tier (reads give EIO): the node's
// own read of one gets an error naming the tier instead of killing the
// process with SIGBUS, and retires the tier at once: the master drops its
// replicas, so objects only there are gone (not found) and none is served
// wrong; objects in DRAM and new puts are unaffected.
func TestSSDFailingDiskReads(t *testing.T) {
	disk := newLoopDisk(t, 64<<20)
	m := startMaster(t, master.ServiceConfig{})
	node := newClient(t, m.Addr(), 4<<20, withSSDSlowPing(disk.dir, 16<<20))
	reader := newClient(t, m.Addr(), NoSegment, tcpOnly) // see TestSSDFailingDiskRemoteRead
	require.NotEmpty(t, node.SSDPath())
	const n, size = 40, 256 << 10 // 10 MiB through a 4 MiB pool
	ssdOnly := putThroughTier(t, m, node, "r", n, size)
	require.Positive(t, ssdOnly, "no object only on the tier: %+v", m.Service().Stats())
	dropTierCache(t, node)
	disk.failUnder(t, node.ssd.f)
	_, err := node.ssd.f.ReadAt(make([]byte, 4096), 0)
	require.ErrorIs(t, err, unix.EIO, "the cut-off disk still reads")

	// r0 went to the tier first and was evicted from DRAM first.
	ctx := ctxT(t)
	_, err = node.Get(ctx, "r0")
	require.ErrorIs(t, err, errSSD, "a read of a failing tier")
	assert.Equal(t, storepb.TransferFail, codeOf(err))
	t.Logf("the node's read of r0: %v", err)
	require.Error(t, node.ssd.failed(), "the tier is still in use")
	// Unmounted by this read, or by the heartbeat's promotion of r0 if
	// that touched the tier first (then still on its way).
	assert.Eventually(t, func() bool { return m.Service().Stats().DiskCapacity == 0 }, 10*time.Second, 5*time.Millisecond,
		"the failed tier is still mounted")
	for i := range n {
		key := fmt.Sprintf("r%d", i)
		assert.NotContains(t, mediaOf(t, m, key), storepb.Medium_MEDIUM_DISK, "%s still claims an SSD copy", key)
	}
	assert.Equal(t, 1.0, metricValue(node.met.ssdFailed))

	ok, missing, _ := tally(t, reader, "r", n, size)
	ok2, missing2, _ := tally(t, node, "r", n, size)
	assert.Equal(t, ok, ok2)
	assert.Equal(t, missing, missing2)
	t.Logf("disk failing (reads): %d of %d objects only on the tier lost, %d read back, 0 wrong; %+v",
		missing, ssdOnly, ok, m.Service().Stats())
	// r0's lookup queued its promotion, which may have pushed a DRAM
	// replica or two out for room (their objects had a copy on the tier
	// then): those go too.
	assert.GreaterOrEqual(t, missing, ssdOnly, "objects only on the failed tier")
	assert.Equal(t, n, ok+missing)

	// The DRAM tier carries on. (The reads above leased what they read,
	// which a full pool cannot evict for a while: make room first.)
	removed, err := node.RemoveByRegex(ctx, "^r", true)
	require.NoError(t, err)
	require.Equal(t, ok, removed)
	for i := range 8 {
		key := fmt.Sprintf("after%d", i)
		require.NoError(t, node.Put(ctx, key, value(uint64(100+i), size), nil))
		got, err := reader.Get(ctx, fmt.Sprintf("after%d", i))
		require.NoError(t, err)
		require.Equal(t, value(uint64(100+i), size), got)
	}
	// A heartbeat's remount (the master restarted, say) leaves it out.
	require.NoError(t, node.remount(ctx, true))
	assert.Zero(t, m.Service().Stats().DiskCapacity)
}

// A peer reading an object from a failing tier gets a failed transfer
// (the node's server cannot send a page it cannot read: its socket write
// fails with EFAULT), never wrong bytes, and the node lives on. The peer
// cannot tell the node, but each such read queues a promotion, which the
// node copies from the tier: that read fails the tier, which is retired.
// The peer is another process in production; here it shares the node's
// process, so it is kept on TCP (the shared-memory path would copy within
// the process, where a page that cannot be read in faults).
//
// Objects lost can be more than those only on the tier when it failed:
// the promotions reserve DRAM, and to stay under its watermark the master
// evicts DRAM replicas of objects that have a copy on the tier.
func TestSSDFailingDiskRemoteRead(t *testing.T) {
	disk := newLoopDisk(t, 64<<20)
	m := startMaster(t, master.ServiceConfig{})
	node := newClient(t, m.Addr(), 4<<20, withSSDSlowPing(disk.dir, 16<<20))
	reader := newClient(t, m.Addr(), NoSegment, tcpOnly)
	const n, size = 40, 256 << 10
	ssdOnly := putThroughTier(t, m, node, "p", n, size)
	require.Positive(t, ssdOnly)
	dropTierCache(t, node)
	disk.failUnder(t, node.ssd.f)
	_, err := node.ssd.f.ReadAt(make([]byte, 4096), 0)
	require.ErrorIs(t, err, unix.EIO, "the cut-off disk still reads")

	ok, missing, failed := tally(t, reader, "p", n, size, storepb.ErrTransferFail)
	assert.GreaterOrEqual(t, missing+failed, ssdOnly, "objects only on the failing tier")
	assert.Equal(t, n, ok+missing+failed)
	require.Eventually(t, func() bool { return m.Service().Stats().DiskCapacity == 0 }, 20*time.Second, 5*time.Millisecond,
		"the failing tier is still mounted")
	require.Error(t, node.ssd.failed())
	ok2, missing2, failed2 := tally(t, reader, "p", n, size)
	t.Logf("disk failing (peer reads): %d of %d only on the tier; first pass %d read back, %d missing, %d failed transfers; "+
		"once the tier is retired %d read back, %d lost, %d failed; 0 wrong; %+v",
		ssdOnly, n, ok, missing, failed, ok2, missing2, failed2, m.Service().Stats())

	// The node serves on. (The reads leased what they found, and the
	// promotions hold DRAM until the node reports them: make room.)
	ctx := ctxT(t)
	_, err = node.RemoveByRegex(ctx, "^p", true)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return node.Put(ctx, "alive", value(7, size), nil) == nil },
		10*time.Second, 10*time.Millisecond, "no put lands on the node")
	got, err := reader.Get(ctx, "alive")
	require.NoError(t, err)
	require.Equal(t, value(7, size), got)
}

// A disk that fails before the tier's bytes reach it (write-back gives
// EIO): the move is not reported done, so the master never lists an SSD
// copy the disk does not hold (the pages would read back as zeros once
// the kernel drops them); the tier is retired and evictions degrade to
// drops.
func TestSSDFailingDiskWrites(t *testing.T) {
	disk := newLoopDisk(t, 64<<20)
	m := startMaster(t, master.ServiceConfig{})
	node := newClient(t, m.Addr(), 4<<20, withSSDSlowPing(disk.dir, 16<<20))
	reader := newClient(t, m.Addr(), NoSegment, tcpOnly)
	disk.failUnder(t, node.ssd.f)

	const n, size = 40, 256 << 10
	ctx := ctxT(t)
	require.NoError(t, node.Put(ctx, "w0", value(0, size), nil))
	// Its offload ends one way or the other.
	require.Eventually(t, func() bool { return node.ssd.failed() != nil || m.Service().Stats().Offloaded > 0 },
		10*time.Second, 5*time.Millisecond)
	for i := 1; i < n; i++ {
		require.NoError(t, node.Put(ctx, fmt.Sprintf("w%d", i), value(uint64(i), size), nil))
	}
	assert.Error(t, node.ssd.failed(), "the offload into a failing disk went unnoticed")
	assert.Eventually(t, func() bool { return m.Service().Stats().DiskCapacity == 0 }, 10*time.Second, 5*time.Millisecond,
		"the failed tier is still mounted")
	assert.Eventually(t, func() bool { return metricValue(node.met.moveFailures.WithLabelValues("disk")) >= 1 },
		10*time.Second, 5*time.Millisecond, "the failed offload is not counted")
	st := m.Service().Stats()
	assert.Zero(t, st.Offloaded+st.Spilled, "moves onto a failing disk reported done")
	dropTierCache(t, node) // what the tier seemed to hold is gone from memory too
	ok, missing, _ := tally(t, reader, "w", n, size)
	t.Logf("disk failing (writes): %d read back, %d evicted, 0 wrong; move failures %v; %+v", ok, missing,
		metricValue(node.met.moveFailures.WithLabelValues("disk")), m.Service().Stats())
	assert.Positive(t, ok)
}

// Bytes flipped on the disk under one object are caught by its checksum,
// for the node and for a peer alike; the objects beside it read right.
func TestSSDFlippedBytesCaught(t *testing.T) {
	m := startMaster(t, master.ServiceConfig{})
	node := newClient(t, m.Addr(), 4<<20, withSSDSlowPing(t.TempDir(), 64<<20))
	reader := newClient(t, m.Addr(), NoSegment)
	const n, size = 40, 256 << 10
	ssdOnly := putThroughTier(t, m, node, "x", n, size)
	require.GreaterOrEqual(t, ssdOnly, 2)
	// x0 is only on the tier; find it there by its bytes (a lookup at
	// the master would queue its promotion to DRAM).
	off := int64(bytes.Index(node.ssd.mem, value(0, size)))
	require.GreaterOrEqual(t, off, int64(0), "x0 is not on the tier")
	f, err := os.OpenFile(node.SSDPath(), os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteAt([]byte("garbage on the disk"), off+1000)
	require.NoError(t, err)
	require.NoError(t, f.Close())

	ctx := ctxT(t)
	for _, c := range []*Client{node, reader} {
		_, err := c.Get(ctx, "x0")
		require.ErrorIs(t, err, storepb.ErrChecksumMismatch)
		got, err := c.Get(ctx, "x1")
		require.NoError(t, err)
		require.Equal(t, value(1, size), got)
	}
}

// metricValue is the value of a counter or gauge (NaN if it has none).
func metricValue(m prometheus.Metric) float64 {
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		return math.NaN()
	}
	if d.Counter != nil {
		return d.Counter.GetValue()
	}
	return d.Gauge.GetValue()
}

// A tier's owner with no DRAM of its own promotes to a peer's DRAM through
// the engine, whose socket write of a page that cannot be read in fails
// (EFAULT): the failed move is told from a network one by reading the
// file, and the tier is retired all the same.
func TestSSDFailingDiskPromotionToPeer(t *testing.T) {
	disk := newLoopDisk(t, 64<<20)
	m := startMaster(t, master.ServiceConfig{})
	dram := newClient(t, m.Addr(), 4<<20, tcpOnly, func(c *Config) { c.PingInterval = slowPing })
	// The engine's write stalls until its deadline (the peer waits for a
	// payload that never comes): keep that short.
	node := newClient(t, m.Addr(), NoSegment, withSSDSlowPing(disk.dir, 16<<20), tcpOnly,
		func(c *Config) { c.EngineConfig.Timeout = 2 * time.Second })
	require.NotEmpty(t, node.SSDPath())
	const n, size = 40, 256 << 10
	ssdOnly := putThroughTier(t, m, dram, "q", n, size)
	require.Positive(t, ssdOnly)
	dropTierCache(t, node)
	disk.failUnder(t, node.ssd.f)

	// A lookup of q0, only on the tier, queues its promotion to dram's
	// segment, copied by node (the tier's owner).
	_, err := dram.Get(ctxT(t), "q0")
	require.Error(t, err)
	require.Eventually(t, func() bool { return m.Service().Stats().DiskCapacity == 0 }, 20*time.Second, 5*time.Millisecond,
		"the failing tier is still mounted")
	require.ErrorIs(t, node.ssd.failed(), unix.EIO)
	// The move is counted once reported, after the tier was unmounted.
	require.Eventually(t, func() bool { return metricValue(node.met.moveFailures.WithLabelValues("dram")) >= 1 },
		10*time.Second, 5*time.Millisecond, "the failed promotion is not counted")
	ok, missing, _ := tally(t, dram, "q", n, size)
	t.Logf("disk failing (promotion to a peer): %d read back, %d lost, 0 wrong; %v; %+v",
		ok, missing, node.ssd.failed(), m.Service().Stats())
}
