package client

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/mooncake-go/mooncake/internal/crc32c"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// ssdIndex is what the SSD tier's file holds, kept next to it (<file>.idx)
// so that a node restarted on the same directory offers the objects to the
// master instead of losing them: one record per move into the tier (key,
// offset, size, and the CRC-32C of the bytes as written), appended and
// synced before the move is reported done. A later record replaces the
// records it overlaps and an earlier one of its key. The file is rewritten
// from the live records when the tier opens and when it has grown to
// several times their number.
//
// Records are framed (u32 length, u32 CRC-32C of the payload, payload);
// a crash can only tear the last one, which is ignored.
type ssdIndex struct {
	mu      sync.Mutex
	f       *os.File
	path    string
	byOff   map[uint64]*storepb.DiskObject
	byKey   map[string]uint64
	written int // records in the file
}

var indexCRC = crc32.MakeTable(crc32.Castagnoli)

// add records d, replacing the records its bytes or its key overlap.
func (x *ssdIndex) add(d *storepb.DiskObject) {
	if off, ok := x.byKey[d.Key]; ok {
		delete(x.byOff, off)
		delete(x.byKey, d.Key)
	}
	for off, o := range x.byOff {
		if off < d.Offset+d.Size && d.Offset < off+o.Size {
			delete(x.byOff, off)
			delete(x.byKey, o.Key)
		}
	}
	x.byOff[d.Offset] = d
	x.byKey[d.Key] = d.Offset
}

// drop forgets the record at off.
func (x *ssdIndex) drop(off uint64) {
	if o, ok := x.byOff[off]; ok {
		delete(x.byOff, off)
		delete(x.byKey, o.Key)
	}
}

// objects returns the live records.
func (x *ssdIndex) objects() []*storepb.DiskObject {
	x.mu.Lock()
	defer x.mu.Unlock()
	out := make([]*storepb.DiskObject, 0, len(x.byOff))
	for _, d := range x.byOff {
		out = append(out, d)
	}
	return out
}

func frame(buf []byte, d *storepb.DiskObject) []byte {
	payload, _ := proto.Marshal(d)
	buf = binary.LittleEndian.AppendUint32(buf, uint32(len(payload)))
	buf = binary.LittleEndian.AppendUint32(buf, crc32.Checksum(payload, indexCRC))
	return append(buf, payload...)
}

func newIndex(path string) *ssdIndex {
	return &ssdIndex{path: path, byOff: map[uint64]*storepb.DiskObject{}, byKey: map[string]uint64{}}
}

// loadIndex reads path's records (none when it does not exist) up to the
// first torn one.
func loadIndex(path string) (*ssdIndex, error) {
	x := newIndex(path)
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return x, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r := bufio.NewReader(f)
	var h [8]byte
	for {
		if _, err := io.ReadFull(r, h[:]); err != nil {
			return x, nil // the end, or a torn header
		}
		n := binary.LittleEndian.Uint32(h[:4])
		if n > 1<<20 {
			return x, nil
		}
		payload := make([]byte, n)
		if _, err := io.ReadFull(r, payload); err != nil || crc32.Checksum(payload, indexCRC) != binary.LittleEndian.Uint32(h[4:]) {
			return x, nil
		}
		var d storepb.DiskObject
		if proto.Unmarshal(payload, &d) == nil {
			x.add(&d)
		}
	}
}

// rewrite replaces the file with the live records, synced, and opens it
// for appends.
func (x *ssdIndex) rewrite() error {
	tmp := x.path + ".tmp"
	var buf []byte
	for _, d := range x.byOff {
		buf = frame(buf, d)
	}
	if err := os.WriteFile(tmp, buf, 0o644); err != nil {
		return err
	}
	f, err := os.OpenFile(tmp, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return err
	}
	if err := os.Rename(tmp, x.path); err != nil {
		_ = f.Close()
		return err
	}
	// The rename is durable only with the directory: else a crash could
	// bring the old file back, without what is appended to this one.
	if err := syncDir(filepath.Dir(x.path)); err != nil {
		_ = f.Close()
		return err
	}
	if x.f != nil {
		_ = x.f.Close()
	}
	if _, err := f.Seek(0, io.SeekEnd); err != nil {
		_ = f.Close()
		return err
	}
	x.f, x.written = f, len(x.byOff)
	return nil
}

// syncDir makes the renames in dir durable (a variable: a test sees it
// called).
var syncDir = func(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	return errors.Join(d.Sync(), d.Close())
}

// record appends ds and syncs the file: the moves are reported done only
// after it returns.
func (x *ssdIndex) record(ds []*storepb.DiskObject) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	var buf []byte
	for _, d := range ds {
		x.add(d)
		buf = frame(buf, d)
	}
	if x.written+len(ds) > 4*len(x.byOff)+4096 {
		return x.rewrite()
	}
	if _, err := x.f.Write(buf); err != nil {
		return err
	}
	x.written += len(ds)
	return x.f.Sync()
}

func (x *ssdIndex) close() {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.f != nil {
		_ = x.f.Close()
		x.f = nil
	}
}

// verify drops the records whose bytes in f no longer match their
// checksum (or cannot be read), logging each, and returns how many it
// kept.
func (x *ssdIndex) verify(f *os.File, size int64, log *slog.Logger) int {
	x.mu.Lock()
	defer x.mu.Unlock()
	buf := make([]byte, 1<<20)
	for off, d := range x.byOff {
		if d.Offset+d.Size > uint64(size) {
			log.Warn("store: SSD object outside the tier file; dropped", "key", d.Key, "offset", d.Offset, "size", d.Size)
			x.drop(off)
			continue
		}
		var sum uint32
		var err error
		for n := uint64(0); n < d.Size && err == nil; n += uint64(len(buf)) {
			m := min(uint64(len(buf)), d.Size-n)
			if _, err = f.ReadAt(buf[:m], int64(d.Offset+n)); err == nil {
				sum = crc32c.Update(sum, buf[:m])
			}
		}
		switch {
		case err != nil:
			log.Warn("store: SSD object unreadable; dropped, not served", "key", d.Key, "path", f.Name(), "offset", d.Offset, "err", err)
			x.drop(off)
		case nonZero(sum) != d.Checksum:
			log.Warn("store: SSD object damaged (checksum mismatch); dropped, not served", "key", d.Key, "path", f.Name(),
				"offset", d.Offset, "size", d.Size)
			x.drop(off)
		}
	}
	return len(x.byOff)
}

// mountSSD mounts the tier with the objects its index holds (Tier's
// MountDisk), again (told to) or for the first time, and forgets those the
// master did not take. A master without the Tier service gets a plain
// mount.
func (c *Client) mountSSD(ctx context.Context, again bool) error {
	t := c.ssd
	objs := t.index.objects()
	var taken []bool
	err := c.master.call(ctx, func(ctx context.Context, rpc storepb.MasterClient) error {
		c.master.mu.Lock()
		conn := c.master.cc // the frames where the client uses them: one connection
		c.master.mu.Unlock()
		if conn == nil {
			return status.Error(codes.Unavailable, "client: no master connection")
		}
		r, err := storepb.NewTierClient(conn).MountDisk(ctx, &storepb.MountDiskRequest{ClientId: c.id, Segment: t.seg, Objects: objs, Again: again})
		if status.Code(err) == codes.Unimplemented {
			r, err := rpc.MountSegment(ctx, &storepb.MountSegmentRequest{ClientId: c.id, Segment: t.seg})
			if err != nil {
				return err
			}
			taken = make([]bool, len(objs))
			return r.AsError()
		}
		if err != nil {
			return err
		}
		taken = r.Taken
		return r.Result.AsError()
	})
	if err != nil {
		return fmt.Errorf("mount SSD tier %s: %w", t.f.Name(), err)
	}
	t.index.mu.Lock()
	defer t.index.mu.Unlock()
	kept := 0
	for i, d := range objs {
		if i < len(taken) && taken[i] {
			kept++
			continue
		}
		if cur := t.index.byOff[d.Offset]; cur == d {
			t.index.drop(d.Offset)
		}
	}
	if len(objs) > 0 {
		c.log.Info("store: SSD tier mounted with the objects its file holds", "path", t.f.Name(),
			"offered", len(objs), "taken", kept)
	}
	if kept < len(objs) {
		if err := t.index.rewrite(); err != nil {
			c.log.Warn("store: rewrite of the SSD tier's index", "path", t.index.path, "err", err)
		}
	}
	return nil
}
