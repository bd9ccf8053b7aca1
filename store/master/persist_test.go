package master

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/mooncake-go/mooncake/store/storepb"
)

// startLocal starts a master without HA whose state lives in dir.
func startLocal(t *testing.T, dir string, every int) *Server {
	t.Helper()
	s, err := Start(ServerConfig{Listen: "127.0.0.1:0", Persist: &PersistConfig{Dir: dir, SnapshotEvery: every}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// fill mounts a segment and puts n objects through svc, removing every
// fifth. (No SSD tier: its moves in flight are not durable, and would
// show in the segments' use.)
func fill(t *testing.T, svc *Service, from, n int) {
	t.Helper()
	if from == 0 {
		require.NoError(t, svc.MountSegment(t.Context(), "a", seg("1", 1<<20, 4<<20)))
	}
	for i := from; i < from+n; i++ {
		key := fmt.Sprintf("k%d", i)
		put(t, svc, "a", key, 1024, nil)
		if i%5 == 4 {
			require.NoError(t, svc.Remove(t.Context(), key, true))
		}
	}
}

// A master without HA restarted on its directory serves the objects whose
// puts it acknowledged, at the same places, with or without snapshots in
// between; snapshots keep the journal bounded.
func TestLocalPersistRestart(t *testing.T) {
	for _, tc := range []struct {
		name  string
		every int // records per snapshot
	}{
		{"journal only", 1 << 30},
		{"snapshots and journal", 50}, // several snapshots, records after the last
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			m := startLocal(t, dir, tc.every)
			fill(t, m.Service(), 0, 300)
			if tc.every < 300 {
				require.Eventually(t, func() bool { return m.SnapshotSeq() > 0 }, 10*time.Second, 10*time.Millisecond)
				fill(t, m.Service(), 300, 20) // after the snapshot
			}
			want := view(m.Service())
			require.NoError(t, m.Close())
			if tc.every < 300 {
				logs, err := listSeq(dir, "journal-", ".log")
				require.NoError(t, err)
				assert.LessOrEqual(t, len(logs), 3, "journal files: snapshots compact the journal")
			}

			m2 := startLocal(t, dir, tc.every)
			assert.Equal(t, want, view(m2.Service()))
			_, _, sum, n, err := m2.Service().GetReplicaList("k3")
			require.NoError(t, err)
			assert.Equal(t, uint32(7), sum)
			assert.Equal(t, uint64(1024), n)
			// The restored master goes on journaling: a third start sees
			// what the second one was told.
			put(t, m2.Service(), "a", "after-restart", 10, nil)
			want = view(m2.Service())
			require.NoError(t, m2.Close())
			assert.Equal(t, want, view(startLocal(t, dir, tc.every).Service()))
		})
	}
}

// A crash can tear the record being written: the restart drops it (it was
// never acknowledged), keeps every record before it, cuts the file back,
// and appends after it cleanly. Damage anywhere else stops the start.
func TestLocalJournalTornTail(t *testing.T) {
	dir := t.TempDir()
	m := startLocal(t, dir, 1<<30)
	fill(t, m.Service(), 0, 10)
	want := view(m.Service())
	put(t, m.Service(), "a", "torn", 1024, nil)
	require.NoError(t, m.Close())

	logs, err := listSeq(dir, "journal-", ".log")
	require.NoError(t, err)
	last := filepath.Join(dir, journalName(logs[len(logs)-1]))
	data, err := os.ReadFile(last)
	require.NoError(t, err)
	// Cut the last record (torn's PutEnd) in the middle of its bytes.
	require.NoError(t, os.WriteFile(last, data[:len(data)-5], 0o644))

	var logged bytes.Buffer
	st, _, err := loadLocal(dir, slog.New(slog.NewTextHandler(&logged, nil)))
	require.NoError(t, err)
	assert.Contains(t, logged.String(), "torn record")
	require.Contains(t, st.objects, "torn")
	assert.NotNil(t, st.objects["torn"].Pending, "the start is whole, its end was torn")
	assert.Empty(t, st.objects["torn"].Replicas)

	m2 := startLocal(t, dir, 1<<30)
	_, _, _, _, err = m2.Service().GetReplicaList("torn")
	assert.ErrorIs(t, err, storepb.ErrObjectNotFound, "a put whose end was torn is not served")
	// Every object but torn is as it was; torn's start holds its space.
	assert.Subset(t, view(m2.Service()), want[:len(want)-1])
	put(t, m2.Service(), "a", "next", 1024, nil)
	want = view(m2.Service())
	require.NoError(t, m2.Close())
	assert.Equal(t, want, view(startLocal(t, dir, 1<<30).Service()))

	// A bad byte in an older file is damage, not a torn tail.
	logs, err = listSeq(dir, "journal-", ".log")
	require.NoError(t, err)
	require.Greater(t, len(logs), 1)
	first := filepath.Join(dir, journalName(logs[0]))
	data, err = os.ReadFile(first)
	require.NoError(t, err)
	data[20] ^= 0xff
	require.NoError(t, os.WriteFile(first, data, 0o644))
	_, err = Start(ServerConfig{Listen: "127.0.0.1:0", Persist: &PersistConfig{Dir: dir}})
	assert.ErrorIs(t, err, ErrDamagedJournal)
}

// A snapshot whose frames are whole but whose chunk does not hold up (a
// segment without its id) is damage: the master refuses to start on it,
// with the file named, instead of restoring it or panicking.
func TestLocalPersistDamagedSnapshotChunk(t *testing.T) {
	dir := t.TempDir()
	payload, err := proto.Marshal(&storepb.SnapshotChunk{Segments: []*storepb.JournalMount{{ClientId: "a"}}})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, snapName(7)), appendFrame(nil, payload), 0o644))
	_, err = Start(ServerConfig{Listen: "127.0.0.1:0", Persist: &PersistConfig{Dir: dir}})
	require.ErrorIs(t, err, ErrDamagedJournal)
	assert.ErrorIs(t, err, ErrBadRecord)
	assert.Contains(t, err.Error(), snapName(7))
}

// Fresh starts empty and discards the directory's state.
func TestLocalPersistFresh(t *testing.T) {
	dir := t.TempDir()
	m := startLocal(t, dir, 1<<30)
	fill(t, m.Service(), 0, 5)
	require.NoError(t, m.Close())
	m2, err := Start(ServerConfig{Listen: "127.0.0.1:0", Persist: &PersistConfig{Dir: dir, Fresh: true}})
	require.NoError(t, err)
	defer m2.Close()
	assert.Zero(t, m2.Service().Stats().Keys)
}

// A snapshot is due every SnapshotEvery records when set; by default every
// 100000, and no sooner than four records per entry the master holds.
func TestSnapshotDue(t *testing.T) {
	s, _ := newTestService(t, ServiceConfig{})
	assert.True(t, snapshotDue(50, 50, s))
	assert.False(t, snapshotDue(49, 50, s))
	assert.False(t, snapshotDue(defaultSnapshotEvery-1, 0, s))
	assert.True(t, snapshotDue(defaultSnapshotEvery, 0, s))

	const n = defaultSnapshotEvery/snapshotRecordsPerEntry + 1000
	require.NoError(t, s.MountSegment(t.Context(), "a", seg("1", 1<<20, 64<<20)))
	for i := range n {
		put(t, s, "a", fmt.Sprintf("k%d", i), 64, nil)
	}
	require.Equal(t, n, s.entries())
	assert.False(t, snapshotDue(defaultSnapshotEvery, 0, s), "under four records per object")
	assert.True(t, snapshotDue(snapshotRecordsPerEntry*n, 0, s))
	assert.True(t, snapshotDue(50, 50, s), "a set SnapshotEvery is taken as it is")
}

// A master without HA restarted on its directory goes on with the drain
// job it was running, its counts and its segment's DRAINING as they were,
// from a snapshot and the records after it.
func TestLocalPersistDrainJob(t *testing.T) {
	dir := t.TempDir()
	m := startLocal(t, dir, 20)
	svc := m.Service()
	for _, c := range []string{"1", "2"} {
		require.NoError(t, svc.MountSegment(t.Context(), "c"+c, seg(c, uint64(c[0]-'0')<<24, 1<<20)))
	}
	for i := range 30 {
		put(t, svc, "c1", fmt.Sprint("k", i), 4096, &storepb.ReplicateConfig{PreferredSegments: []string{"node-1"}})
	}
	id, err := svc.startDrain(t.Context(), []string{"node-1"}, nil, 1)
	require.NoError(t, err)
	moveOne(t, svc, true)
	created := svc.j.last()
	// A snapshot that holds the job, then a record after it.
	require.Eventually(t, func() bool { return m.SnapshotSeq() >= created }, 10*time.Second, 10*time.Millisecond)
	moveOne(t, svc, true)
	require.NoError(t, m.Close())

	m2 := startLocal(t, dir, 20)
	got := jobOf(t, m2.Service(), id)
	assert.Equal(t, "RUNNING", got.StatusName)
	assert.Equal(t, 2, got.Succeeded)
	assert.Equal(t, uint64(2*4096), got.MigratedByte)
	assert.Equal(t, "DRAINING", segStatus(t, m2.Service(), "node-1"))
}
