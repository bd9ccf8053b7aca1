package master

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

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

// Whatever splitBatch accepts, protobuf frames the same way: as many
// records, each the bytes protobuf decodes at that place; and whatever
// protobuf decodes, splitBatch accepts.
func FuzzSplitBatch(f *testing.F) {
	b, _ := proto.Marshal(&storepb.JournalBatch{FirstSeq: 9, Records: wireRecords()})
	f.Add(b)
	f.Add([]byte{0x12, 0x03, 0x0a, 0x01, 0x00})
	f.Add([]byte{0x18, 0x07, 0x12, 0x00})
	f.Fuzz(func(t *testing.T, data []byte) {
		first, raw, err := splitBatch(data)
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
