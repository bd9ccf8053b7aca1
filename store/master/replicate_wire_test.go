package master

import (
	"bytes"
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/mooncake-go/mooncake/store/storepb"
)

func wireRecords() []*storepb.JournalRecord {
	return []*storepb.JournalRecord{
		{Op: &storepb.JournalRecord_Mount{Mount: &storepb.JournalMount{ClientId: "a", Segment: seg("1", 4096, 1<<20)}}},
		{Op: &storepb.JournalRecord_Start{Start: &storepb.JournalStart{ClientId: "a", Key: "k", Size: 100,
			Replicas: []*storepb.ReplicaLocation{{SegmentId: "1", Offset: 0, Size: 100}}}}},
		{},
		{Op: &storepb.JournalRecord_End{End: &storepb.JournalEnd{ClientId: "a", Key: "k", Checksum: 1}}},
		{Op: &storepb.JournalRecord_Drop{Drop: &storepb.JournalDrop{Key: "k"}}},
	}
}

// A batch split by framing alone gives the records protobuf decodes, and
// encodeBatch gives back a batch protobuf decodes to the same.
func TestSplitBatchMatchesProtobuf(t *testing.T) {
	for _, first := range []uint64{0, 1, 1 << 40} {
		want := &storepb.JournalBatch{FirstSeq: first, Records: wireRecords()}
		b, err := proto.Marshal(want)
		require.NoError(t, err)
		got, raw, err := splitBatch(b)
		require.NoError(t, err)
		assert.Equal(t, first, got)
		require.Len(t, raw, len(want.Records))
		for i, r := range raw {
			var rec storepb.JournalRecord
			require.NoError(t, proto.Unmarshal(r, &rec))
			assert.True(t, proto.Equal(want.Records[i], &rec), "record %d", i)
		}
		var again storepb.JournalBatch
		require.NoError(t, proto.Unmarshal(encodeBatch(first, raw), &again))
		assert.True(t, proto.Equal(want, &again))
	}
	_, raw, err := splitBatch(nil)
	require.NoError(t, err)
	assert.Empty(t, raw)
}

// Bytes that are not a batch of framed records are refused.
func TestSplitBatchRefusesMalformed(t *testing.T) {
	good, err := proto.Marshal(&storepb.JournalBatch{FirstSeq: 3, Records: wireRecords()})
	require.NoError(t, err)
	for name, b := range map[string][]byte{
		"cut short":              good[:len(good)-3],
		"record of a bad length": {0x12, 0x09, 0x0a, 0x01},
		"record not fields":      {0x12, 0x02, 0x0a, 0x05},
		"bad tag":                {0x80},
		"field 0":                {0x00, 0x01},
		"field past protobuf's":  {0x12, 0x06, 0x80, 0x80, 0x80, 0x80, 0x10, 0x00},
	} {
		_, _, err := splitBatch(b)
		assert.Error(t, err, name)
	}
	// Fields a later release may add are skipped, and, as protobuf does,
	// known ones of another wire type.
	b := append([]byte{0x18, 0x07, 0x10, 0x01, 0x0a, 0x01, 0x00}, good...)
	first, raw, err := splitBatch(b)
	require.NoError(t, err)
	assert.Equal(t, uint64(3), first)
	assert.Len(t, raw, len(wireRecords()))
}

// rawBatch is JournalBatch's wire form with its records left as bytes.
func rawBatch(t testing.TB) protoreflect.MessageDescriptor {
	fd, err := protodesc.NewFile(&descriptorpb.FileDescriptorProto{
		Name: proto.String("rawbatch.proto"), Package: proto.String("test"), Syntax: proto.String("proto3"),
		MessageType: []*descriptorpb.DescriptorProto{{
			Name: proto.String("RawBatch"),
			Field: []*descriptorpb.FieldDescriptorProto{
				{Name: proto.String("first_seq"), Number: proto.Int32(1), JsonName: proto.String("firstSeq"),
					Type:  descriptorpb.FieldDescriptorProto_TYPE_UINT64.Enum(),
					Label: descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum()},
				{Name: proto.String("records"), Number: proto.Int32(2), JsonName: proto.String("records"),
					Type:  descriptorpb.FieldDescriptorProto_TYPE_BYTES.Enum(),
					Label: descriptorpb.FieldDescriptorProto_LABEL_REPEATED.Enum()},
			},
		}},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return fd.Messages().Get(0)
}

// splitBatch frames a batch as protobuf does: it accepts what protobuf
// decodes as a batch of byte records whose fields frame (checkFields),
// and nothing else, with the same first_seq and records; whatever
// protobuf decodes as a JournalBatch, it accepts; and encodeBatch encodes
// what protobuf decodes to the same batch.
func FuzzSplitBatch(f *testing.F) {
	md := rawBatch(f)
	b, _ := proto.Marshal(&storepb.JournalBatch{FirstSeq: 9, Records: wireRecords()})
	f.Add(b)
	f.Add([]byte{0x12, 0x03, 0x0a, 0x01, 0x00})
	f.Add([]byte{0x18, 0x07, 0x12, 0x00})
	f.Add([]byte{0x12, 0x06, 0x80, 0x80, 0x80, 0x80, 0x10, 0x00})
	f.Fuzz(func(t *testing.T, data []byte) {
		first, raw, err := splitBatch(data)
		rb := dynamicpb.NewMessage(md)
		rerr := proto.Unmarshal(data, rb)
		framed := rerr == nil
		if framed {
			recs := rb.Get(md.Fields().ByNumber(2)).List()
			for i := range recs.Len() {
				framed = framed && checkFields(recs.Get(i).Bytes()) == nil
			}
		}
		if framed != (err == nil) {
			t.Fatalf("splitBatch: %v; protobuf: %v, framed %v", err, rerr, framed)
		}
		if err == nil {
			recs := rb.Get(md.Fields().ByNumber(2)).List()
			if first != rb.Get(md.Fields().ByNumber(1)).Uint() || len(raw) != recs.Len() {
				t.Fatalf("split %d, %d records; protobuf %v", first, len(raw), rb)
			}
			for i, r := range raw {
				if !bytes.Equal(r, recs.Get(i).Bytes()) {
					t.Fatalf("record %d: % x, protobuf % x", i, r, recs.Get(i).Bytes())
				}
			}
		}
		var batch storepb.JournalBatch
		perr := proto.Unmarshal(data, &batch)
		if perr == nil && err != nil {
			t.Fatalf("protobuf decodes what splitBatch refuses: %v", err)
		}
		if err != nil || perr != nil {
			return
		}
		if first != batch.FirstSeq || len(raw) != len(batch.Records) {
			t.Fatalf("split %d, %d records; protobuf %d, %d", first, len(raw), batch.FirstSeq, len(batch.Records))
		}
		for i, r := range raw {
			var rec storepb.JournalRecord
			if err := proto.Unmarshal(r, &rec); err != nil || !proto.Equal(&rec, batch.Records[i]) {
				t.Fatalf("record %d: %v", i, err)
			}
		}
		// Unknown fields stay behind.
		want := &storepb.JournalBatch{FirstSeq: batch.FirstSeq, Records: batch.Records}
		var again storepb.JournalBatch
		if err := proto.Unmarshal(encodeBatch(first, raw), &again); err != nil || !proto.Equal(&again, want) {
			t.Fatalf("encodeBatch: %v", err)
		}
	})
}

// A tail is decoded up to the first record that does not decode: the
// records after it could not be written to etcd but after a gap.
func TestDecodeTailStopsAtARecordThatDoesNotDecode(t *testing.T) {
	var raw [][]byte
	for _, rec := range wireRecords()[:3] {
		b, err := proto.Marshal(rec)
		require.NoError(t, err)
		raw = append(raw, b)
	}
	bad := []byte{0x0a, 0x02, 0xff, 0xfe} // a mount whose bytes are no fields
	var probe storepb.JournalRecord
	require.Error(t, proto.Unmarshal(bad, &probe))
	require.NoError(t, checkFields(bad), "frames")
	got := decodeTail(40, append(append(raw[:2:2], bad), raw[2]), slog.New(slog.DiscardHandler))
	require.Len(t, got, 2)
	for i, rec := range wireRecords()[:2] {
		assert.True(t, proto.Equal(rec, got[40+uint64(i)]), "record %d", i)
	}
	assert.Len(t, decodeTail(40, raw, slog.New(slog.DiscardHandler)), 3)
}

// The fetches of a stretch share one deadline, which leaves each at least
// least and at most most, and ends with its parent.
func TestSharedDeadline(t *testing.T) {
	parent, cancel := context.WithCancel(context.Background())
	d := sharedDeadline{parent: parent}
	defer d.stop()
	const least, most = time.Hour, 2 * time.Hour
	now := time.Now()
	first := d.get(now, least, most)
	if until, ok := first.Deadline(); !ok || !until.Equal(now.Add(most)) {
		t.Fatalf("deadline %v (set %v), want %v", until, ok, now.Add(most))
	}
	if d.get(now.Add(most-least), least, most) != first {
		t.Fatal("a fetch with least left got a context of its own")
	}
	later := now.Add(most - least + time.Second)
	second := d.get(later, least, most)
	if second == first {
		t.Fatal("a fetch with less than least left got the old deadline")
	}
	if first.Err() == nil {
		t.Fatal("the context replaced was not cancelled")
	}
	if until, _ := second.Deadline(); !until.Equal(later.Add(most)) {
		t.Fatalf("the new deadline is %v, want %v", until, later.Add(most))
	}
	cancel()
	if second.Err() == nil {
		t.Fatal("the shared context outlived its parent")
	}
}
