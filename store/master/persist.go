package master

import (
	"bufio"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/mooncake-go/mooncake/store/storepb"
)

// The journal on local disk, for a master without HA that keeps its
// metadata across a restart (mooncake_master --enable_snapshot with a
// local directory). Same records as the etcd journal, in a directory:
//
//	journal-<first seq, 20 digits>.log   records first.. (frames, below)
//	snap-<seq, 20 digits>.pb             the state up to seq (frames of SnapshotChunk)
//
// A frame is a little-endian u32 length, the u32 CRC-32C of the payload,
// then the payload; a journal frame's payload is the u64 sequence number
// followed by the JournalRecord. Appends are group-committed: one write and
// one fdatasync per batch, acknowledged only after the sync. A crash can
// only tear the tail of the newest journal file; replay stops at the first
// frame that is short, fails its CRC or holds no record (zeros) there, and
// the file is cut back to the last whole record (it was never
// acknowledged). A bad frame anywhere else is damage, and the master
// refuses to start on it.
//
// A snapshot is written to a temporary file, synced and renamed into
// place; the journal then starts a new file, and files whose records the
// snapshot covers are deleted, so the directory holds about two
// snapshots' worth of records at most.

// PersistConfig configures a master's state on local disk (non-HA).
type PersistConfig struct {
	// Dir holds the journal and snapshots; created if missing. Required.
	Dir string
	// SnapshotInterval is how often a snapshot is written while records
	// came in since the last. Zero: 10 minutes (Mooncake's
	// --snapshot_interval_seconds default).
	SnapshotInterval time.Duration
	// SnapshotEvery is the number of records after which a snapshot is
	// written regardless of the interval, which bounds the journal. Zero:
	// 100000, or four per object the master holds, whichever is more
	// (snapshotDue).
	SnapshotEvery int
	// Retain is how many snapshots are kept. Zero: 2 (Mooncake's
	// --snapshot_retention_count default).
	Retain int
	// Fresh discards the state found in Dir instead of restoring it
	// (mooncake_master --enable_snapshot_restore=false).
	Fresh bool
}

func (c *PersistConfig) withDefaults() {
	c.SnapshotInterval = cmp.Or(c.SnapshotInterval, 10*time.Minute)
	c.Retain = cmp.Or(c.Retain, 2)
}

// Validate names the first bad field.
func (c *PersistConfig) Validate() error {
	switch {
	case c.Dir == "":
		return errors.New("master: PersistConfig.Dir is empty")
	case c.SnapshotInterval < 0:
		return fmt.Errorf("master: PersistConfig.SnapshotInterval is negative (%v)", c.SnapshotInterval)
	case c.SnapshotEvery < 0:
		return fmt.Errorf("master: PersistConfig.SnapshotEvery is negative (%d)", c.SnapshotEvery)
	case c.Retain < 0:
		return fmt.Errorf("master: PersistConfig.Retain is negative (%d)", c.Retain)
	}
	return nil
}

// ErrDamagedJournal is the cause of a local journal or snapshot that does
// not read back: a bad frame before the tail of the newest journal file.
var ErrDamagedJournal = errors.New("master: local journal damaged")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

const (
	frameHeader  = 8
	maxFrameSize = 256 << 20
)

func journalName(seq uint64) string { return fmt.Sprintf("journal-%020d.log", seq) }
func snapName(seq uint64) string    { return fmt.Sprintf("snap-%020d.pb", seq) }

// listSeq returns the sequence numbers of the files in dir named
// prefix<seq>suffix, ascending.
func listSeq(dir, prefix, suffix string) ([]uint64, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []uint64
	for _, e := range ents {
		n := e.Name()
		if !strings.HasPrefix(n, prefix) || !strings.HasSuffix(n, suffix) {
			continue
		}
		if seq, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(n, prefix), suffix), 10, 64); err == nil {
			out = append(out, seq)
		}
	}
	slices.Sort(out)
	return out, nil
}

// appendFrame appends payload's frame to buf.
func appendFrame(buf, payload []byte) []byte {
	buf = binary.LittleEndian.AppendUint32(buf, uint32(len(payload)))
	buf = binary.LittleEndian.AppendUint32(buf, crc32.Checksum(payload, castagnoli))
	return append(buf, payload...)
}

// errTorn is a frame cut short or failing its CRC.
var errTorn = errors.New("torn frame")

// readFrame reads one frame; io.EOF at a clean end, errTorn for a partial
// or corrupt one.
func readFrame(r *bufio.Reader, buf []byte) ([]byte, error) {
	var h [frameHeader]byte
	if n, err := io.ReadFull(r, h[:]); err != nil {
		if n == 0 && err == io.EOF {
			return nil, io.EOF
		}
		return nil, errTorn
	}
	size, sum := binary.LittleEndian.Uint32(h[:4]), binary.LittleEndian.Uint32(h[4:])
	if size > maxFrameSize {
		return nil, errTorn
	}
	buf = slices.Grow(buf[:0], int(size))[:size]
	if _, err := io.ReadFull(r, buf); err != nil {
		return nil, errTorn
	}
	if crc32.Checksum(buf, castagnoli) != sum {
		return nil, errTorn
	}
	return buf, nil
}

// syncDir makes renames and creations in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// loadLocal reads the newest snapshot in dir and the journal after it. It
// returns the state, the last sequence number, and the files' sequence
// numbers. A torn tail of the newest journal file is cut off (logged).
func loadLocal(dir string, log *slog.Logger) (*state, uint64, error) {
	st := newState()
	var last uint64
	snaps, err := listSeq(dir, "snap-", ".pb")
	if err != nil {
		return nil, 0, err
	}
	if len(snaps) > 0 {
		last = snaps[len(snaps)-1]
		if err := readSnapshot(filepath.Join(dir, snapName(last)), st); err != nil {
			return nil, 0, err
		}
		st.snapSeq = last
	}
	files, err := listSeq(dir, "journal-", ".log")
	if err != nil {
		return nil, 0, err
	}
	for i, first := range files {
		tail := i == len(files)-1
		if last, err = replayFile(filepath.Join(dir, journalName(first)), st, last, tail, log); err != nil {
			return nil, 0, err
		}
	}
	return st, last, nil
}

// readSnapshot loads a snapshot file into st; it was synced before it was
// renamed into place, so any bad frame is damage.
func readSnapshot(path string, st *state) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	r := bufio.NewReaderSize(f, 1<<20)
	var buf []byte
	for {
		b, err := readFrame(r, buf)
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%w: snapshot %s: %v", ErrDamagedJournal, path, err)
		}
		buf = b
		var c storepb.SnapshotChunk
		if err := proto.Unmarshal(b, &c); err != nil {
			return fmt.Errorf("%w: snapshot %s: %v", ErrDamagedJournal, path, err)
		}
		if err := st.loadChunk(&c); err != nil {
			return fmt.Errorf("%w: snapshot %s: %w", ErrDamagedJournal, path, err)
		}
	}
}

// replayFile applies the records of one journal file after last and
// returns the new last. In the newest file (tail) a torn frame ends the
// journal: the file is cut back to the last whole record.
func replayFile(path string, st *state, last uint64, tail bool, log *slog.Logger) (uint64, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	r := bufio.NewReaderSize(f, 1<<20)
	var (
		buf  []byte
		good int64 // offset just past the last whole frame
	)
	for {
		b, err := readFrame(r, buf)
		if err == io.EOF {
			return last, nil
		}
		if err == nil && len(b) < 8 {
			// No room for a sequence number: zeros past what reached
			// the disk (a file's size can be durable before its data)
			// read as empty frames with a matching CRC.
			err = errTorn
		}
		if err != nil {
			if !tail {
				return 0, fmt.Errorf("%w: %s at offset %d: %v", ErrDamagedJournal, path, good, err)
			}
			// Never acknowledged: the writer died in the middle of it.
			log.Warn("master: local journal ends with a torn record; dropped (it was never acknowledged)",
				"file", path, "offset", good, "last_seq", last)
			if err := f.Truncate(good); err != nil {
				return 0, fmt.Errorf("master: cut the torn tail of %s: %w", path, err)
			}
			return last, f.Sync()
		}
		buf = b
		good += int64(frameHeader + len(b))
		seq := binary.LittleEndian.Uint64(b)
		if seq <= last {
			continue // in the snapshot already
		}
		if seq != last+1 {
			return 0, fmt.Errorf("%w: %s: record %d after %d", ErrDamagedJournal, path, seq, last)
		}
		var rec storepb.JournalRecord
		if err := proto.Unmarshal(b[8:], &rec); err != nil {
			return 0, fmt.Errorf("%w: %s: record %d: %v", ErrDamagedJournal, path, seq, err)
		}
		if err := st.apply(&rec); err != nil {
			return 0, fmt.Errorf("master: local journal record %d: %w", seq, err)
		}
		last = seq
	}
}

// fileJournal is the journal of a master without HA: appends queue in
// memory, one writer goroutine writes them in order to the current file
// and syncs it (group commit), then runs their callbacks and wakes the
// waiters.
type fileJournal struct {
	dir string
	log *slog.Logger

	journalQueue

	retain int // snapshots kept

	// The file appends go to, the files' first seqs (ascending) and the
	// last seq written: the writer's, and compact's, under fmu.
	fmu     sync.Mutex
	f       *os.File
	files   []uint64
	written uint64
}

var _ journal = (*fileJournal)(nil)

// openFileJournal continues the journal in dir after record last, in a
// new file (a torn older one is never appended to).
func openFileJournal(dir string, last, snap uint64, retain int, log *slog.Logger) (*fileJournal, error) {
	files, err := listSeq(dir, "journal-", ".log")
	if err != nil {
		return nil, err
	}
	j := &fileJournal{dir: dir, log: log, retain: retain, files: files, written: last}
	j.initQueue(last, snap)
	if err := j.startFile(last + 1); err != nil {
		return nil, err
	}
	go j.run()
	return j, nil
}

// startFile makes journal-<first>.log the file appends go to. fmu is held
// or the writer is not running.
func (j *fileJournal) startFile(first uint64) error {
	name := filepath.Join(j.dir, journalName(first))
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("master: local journal: %w", err)
	}
	if err := syncDir(j.dir); err != nil {
		_ = f.Close()
		return fmt.Errorf("master: local journal: sync %s: %w", j.dir, err)
	}
	if j.f != nil {
		_ = j.f.Close()
	}
	j.f = f
	if len(j.files) == 0 || j.files[len(j.files)-1] != first {
		j.files = append(j.files, first)
	}
	return nil
}

// close stops the writer once the records queued are written; those that
// cannot be fail their waiters.
func (j *fileJournal) close() {
	j.mu.Lock()
	j.closed = true
	j.cond.Broadcast()
	j.mu.Unlock()
	j.signal()
	<-j.done
	j.fmu.Lock()
	if j.f != nil {
		_ = j.f.Close()
		j.f = nil
	}
	j.fmu.Unlock()
}

// run writes queued records, a batch at a time: one write, one sync.
func (j *fileJournal) run() {
	defer close(j.done)
	var buf []byte
	for {
		j.mu.Lock()
		batch, closed, failed := j.queue, j.closed, j.err != nil
		j.queue = nil
		first := j.committed + 1
		j.mu.Unlock()
		if failed || (closed && len(batch) == 0) {
			if closed {
				j.fail(errors.New("master: local journal closed"))
			}
			return
		}
		if len(batch) == 0 {
			<-j.wake
			continue
		}
		buf = buf[:0]
		var err error
		for i, e := range batch {
			payload := binary.LittleEndian.AppendUint64(nil, first+uint64(i))
			if payload, err = (proto.MarshalOptions{}).MarshalAppend(payload, e.rec); err != nil {
				break
			}
			buf = appendFrame(buf, payload)
		}
		if err == nil {
			j.fmu.Lock()
			if _, err = j.f.Write(buf); err == nil {
				err = j.f.Sync()
			}
			if err == nil {
				j.written = first + uint64(len(batch)) - 1
			}
			j.fmu.Unlock()
		}
		if err != nil {
			// The records may be half on disk; none is acknowledged, and
			// the master stops serving (Server.persistLoop).
			j.fail(fmt.Errorf("master: local journal write: %w", err))
			return
		}
		j.commit(first, batch)
	}
}

// writeSnapshot writes the state of svc, starts a new journal file and
// deletes the files the snapshot makes redundant. It returns the
// snapshot's sequence number.
func (j *fileJournal) writeSnapshot(ctx context.Context, svc *Service) (uint64, error) {
	chunks, seq := svc.snapshot(snapChunkObjs)
	if err := j.wait(ctx, seq); err != nil {
		return 0, err
	}
	j.mu.Lock()
	j.sinceSnap = int(j.committed - seq)
	j.mu.Unlock()
	tmp, err := os.CreateTemp(j.dir, "snap-*.tmp")
	if err != nil {
		return 0, fmt.Errorf("master: snapshot: %w", err)
	}
	defer os.Remove(tmp.Name()) // a no-op once renamed
	w := bufio.NewWriterSize(tmp, 1<<20)
	var buf []byte
	for _, c := range chunks {
		data, err := proto.Marshal(c)
		if err != nil {
			_ = tmp.Close()
			return 0, err
		}
		buf = appendFrame(buf[:0], data)
		if _, err := w.Write(buf); err != nil {
			_ = tmp.Close()
			return 0, fmt.Errorf("master: snapshot: %w", err)
		}
	}
	err = w.Flush()
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), filepath.Join(j.dir, snapName(seq)))
	}
	if err == nil {
		err = syncDir(j.dir)
	}
	if err != nil {
		return 0, fmt.Errorf("master: snapshot %d: %w", seq, err)
	}
	return seq, j.compact(seq)
}

// compact starts a new journal file and deletes the files wholly covered
// by snapshot seq, and snapshots past the retained ones. The journal
// files before the oldest retained snapshot go with it.
func (j *fileJournal) compact(seq uint64) error {
	j.fmu.Lock()
	defer j.fmu.Unlock()
	// The writer holds fmu from its write to its sync: the new file's
	// first record is the one after the last written.
	if err := j.startFile(j.written + 1); err != nil {
		return err
	}
	// Records in files before the newest file that starts at or before
	// seq+1 are all in the snapshot.
	keep := 0
	for i, first := range j.files {
		if first <= seq+1 {
			keep = i
		}
	}
	for _, first := range j.files[:keep] {
		if err := os.Remove(filepath.Join(j.dir, journalName(first))); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	j.files = j.files[keep:]
	snaps, err := listSeq(j.dir, "snap-", ".pb")
	if err != nil {
		return err
	}
	for len(snaps) > max(1, j.retain) {
		if err := os.Remove(filepath.Join(j.dir, snapName(snaps[0]))); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		snaps = snaps[1:]
	}
	return syncDir(j.dir)
}

// openLocal builds the service of a master without HA from the state in
// cfg.Dir and opens its journal there.
func openLocal(cfg PersistConfig, svcCfg ServiceConfig, log *slog.Logger) (*Service, *fileJournal, error) {
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, nil, fmt.Errorf("master: persistence directory: %w", err)
	}
	if cfg.Fresh {
		if err := clearLocal(cfg.Dir); err != nil {
			return nil, nil, err
		}
	}
	start := time.Now()
	st, last, err := loadLocal(cfg.Dir, log)
	if err != nil {
		return nil, nil, err
	}
	svc, err := NewService(svcCfg)
	if err != nil {
		return nil, nil, err
	}
	if err := svc.restore(st); err != nil {
		return nil, nil, err
	}
	j, err := openFileJournal(cfg.Dir, last, st.snapSeq, cfg.Retain, log)
	if err != nil {
		return nil, nil, err
	}
	svc.j = j
	stats := svc.Stats()
	log.Info("master: state restored from disk", "dir", cfg.Dir, "records", last, "snapshot", st.snapSeq,
		"objects", stats.Keys, "segments", stats.Segments, "load", time.Since(start).Round(time.Millisecond))
	return svc, j, nil
}

// clearLocal removes the journal and snapshots in dir.
func clearLocal(dir string) error {
	for _, p := range []struct{ prefix, suffix string }{{"journal-", ".log"}, {"snap-", ".pb"}} {
		seqs, err := listSeq(dir, p.prefix, p.suffix)
		if err != nil {
			return err
		}
		for _, seq := range seqs {
			if err := os.Remove(filepath.Join(dir, fmt.Sprintf("%s%020d%s", p.prefix, seq, p.suffix))); err != nil {
				return err
			}
		}
	}
	return nil
}

// persistLoop writes snapshots of a master without HA: when snapshotDue,
// or every SnapshotInterval when records came in.
// A journal that failed is logged once; the master goes on serving reads,
// and writes fail (their records cannot be made durable).
func (s *Server) persistLoop(ctx context.Context, svc *Service, j *fileJournal) {
	cfg := *s.cfg.Persist
	tick := time.NewTicker(min(time.Second, cfg.SnapshotInterval))
	defer tick.Stop()
	lastSnap := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if err := j.failure(); err != nil {
			s.log.Error("master: local journal failed; writes fail until a restart", "dir", cfg.Dir, "err", err)
			return
		}
		n := j.pendingSnapshot()
		if n == 0 || (!snapshotDue(n, cfg.SnapshotEvery, svc) && time.Since(lastSnap) < cfg.SnapshotInterval) {
			continue
		}
		start := time.Now()
		seq, err := j.writeSnapshot(ctx, svc)
		s.metrics.snapshotWritten(start, err)
		if err != nil {
			if ctx.Err() == nil {
				s.log.Warn("master: snapshot failed; retrying", "dir", cfg.Dir, "err", err)
			}
			continue
		}
		lastSnap = time.Now()
		s.snapSeq.Store(seq)
		s.log.Info("master: snapshot written", "dir", cfg.Dir, "seq", seq)
	}
}

// defaultSnapshotEvery is the fewest records between snapshots when
// SnapshotEvery is zero, and snapshotRecordsPerEntry how many records per
// entry of the state (object or put in flight) they wait for at least.
const (
	defaultSnapshotEvery    = 100000
	snapshotRecordsPerEntry = 4
)

// snapshotDue reports whether n records since the last snapshot call for
// the next: every records when set, else defaultSnapshotEvery and no
// sooner than snapshotRecordsPerEntry records per entry svc holds. A
// snapshot writes every entry, so a pool of many small objects written
// fast would otherwise spend much of a core on snapshots (131k objects of
// 4 KiB put at ~60k/s with a standby: one a second, 14% of the leader's
// process's CPU); bounded so, a snapshot costs a quarter of an entry's
// encoding per record, and a leader that loads the journal from scratch
// replays at most four records per entry of the snapshot it loads.
func snapshotDue(n, every int, svc *Service) bool {
	if every > 0 {
		return n >= every
	}
	return n >= defaultSnapshotEvery && n >= snapshotRecordsPerEntry*svc.entries()
}
