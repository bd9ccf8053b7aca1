package chaos

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ms is a history time.
func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

// w is a write of key k by client c, value (c+1, seq), from a to b ms.
func w(kind Kind, c int, seq uint64, a, b int, r Result) Op {
	return Op{Client: c, Kind: kind, Key: "k", Value: ValueID{Writer: uint32(c + 1), Seq: seq}, Size: 100,
		Invoke: ms(a), Complete: ms(b), Result: r}
}

// read is a get by client c from a to b ms that read write (writer, seq);
// seq 0: found nothing.
func read(c int, writer uint32, seq uint64, a, b int) Op {
	o := Op{Client: c, Kind: Get, Key: "k", Invoke: ms(a), Complete: ms(b), Result: OK}
	if seq > 0 {
		o.Value, o.Size = ValueID{Writer: writer, Seq: seq}, 100
	}
	return o
}

func rm(c int, a, b int, r Result) Op {
	return Op{Client: c, Kind: Remove, Key: "k", Invoke: ms(a), Complete: ms(b), Result: r}
}

func TestCheck(t *testing.T) {
	cases := []struct {
		name      string
		ops       []Op
		evictions []Eviction
		window    time.Duration
		want      []AnomalyKind // one per anomaly, in order
	}{
		// The value of an acknowledged put, read after it.
		{"read of an acknowledged put", []Op{w(Put, 0, 1, 0, 10, OK), read(1, 1, 1, 20, 30)}, nil, 0, nil},
		// Bytes that are no value (Err says why) or name no write.
		{"bytes that decode to nothing", []Op{w(Put, 0, 1, 0, 10, OK),
			{Client: 1, Kind: Get, Key: "k", Size: 100, Invoke: ms(20), Complete: ms(30), Result: OK, Err: "checksum 1, trailer says 2"}},
			nil, 0, []AnomalyKind{WrongBytes}},
		{"a value no write of the key made", []Op{w(Put, 0, 1, 0, 10, OK), read(1, 9, 9, 20, 30)}, nil, 0, []AnomalyKind{WrongBytes}},
		{"the value of a write that certainly failed", []Op{w(Upsert, 0, 1, 0, 10, Fail), read(1, 1, 1, 20, 30)},
			nil, 0, []AnomalyKind{FailedWriteRead}},
		{"the value of a write that began after the get ended", []Op{read(1, 1, 1, 0, 10), w(Put, 0, 1, 20, 30, OK)},
			nil, 0, []AnomalyKind{FutureRead}},
		// A timed-out write may have happened: its value may be read, even
		// long after it "ended".
		{"the value of an unknown write", []Op{w(Upsert, 0, 1, 0, 10, Unknown), read(1, 1, 1, 500, 510)}, nil, 0, nil},
		// ...and it may have landed after a later acknowledged upsert.
		{"an unknown write landing late", []Op{w(Upsert, 0, 1, 0, 10, Unknown), w(Upsert, 1, 2, 20, 30, OK),
			read(1, 1, 1, 40, 50)}, nil, 0, nil},
		// The acknowledged upsert completed before the get began.
		{"stale read after an acknowledged upsert", []Op{w(Put, 0, 1, 0, 10, OK), w(Upsert, 0, 2, 20, 30, OK),
			read(0, 1, 1, 40, 50)}, nil, 0, []AnomalyKind{StaleRead}},
		{"stale read after an acknowledged remove", []Op{w(Put, 0, 1, 0, 10, OK), rm(0, 20, 30, OK),
			read(0, 1, 1, 40, 50)}, nil, 0, []AnomalyKind{StaleRead}},
		// A get concurrent with the upsert may see either value.
		{"old value during an upsert", []Op{w(Put, 0, 1, 0, 10, OK), w(Upsert, 0, 2, 20, 40, OK),
			read(1, 1, 1, 30, 50)}, nil, 0, nil},
		// Another client's lease cache may lag by the window; its own
		// writes it sees at once.
		{"another client's upsert within the window", []Op{w(Put, 0, 1, 0, 10, OK), w(Upsert, 0, 2, 20, 30, OK),
			read(1, 1, 1, 40, 50)}, nil, ms(100), nil},
		{"another client's upsert past the window", []Op{w(Put, 0, 1, 0, 10, OK), w(Upsert, 0, 2, 20, 30, OK),
			read(1, 1, 1, 140, 150)}, nil, ms(100), []AnomalyKind{StaleRead}},
		{"its own upsert, window or not", []Op{w(Put, 0, 1, 0, 10, OK), w(Upsert, 1, 2, 20, 30, OK),
			read(1, 1, 1, 40, 50)}, nil, ms(100), []AnomalyKind{StaleRead}},
		// Unknown upserts and removes may not have happened: the old value
		// stays a right answer.
		{"old value after an unknown upsert", []Op{w(Put, 0, 1, 0, 10, OK), w(Upsert, 0, 2, 20, 30, Unknown),
			read(0, 1, 1, 40, 50)}, nil, 0, nil},
		{"old value after an unknown remove", []Op{w(Put, 0, 1, 0, 10, OK), rm(0, 20, 30, Unknown),
			read(0, 1, 1, 40, 50)}, nil, 0, nil},
		// Puts are write-once: a put of an existing key does not replace it.
		{"old value after a second put", []Op{w(Put, 0, 1, 0, 10, OK), w(Put, 1, 2, 20, 30, OK),
			read(0, 1, 1, 40, 50)}, nil, 0, nil},
		// Nothing found after an acknowledged write.
		{"lost acknowledged put", []Op{w(Put, 0, 1, 0, 10, OK), read(1, 0, 0, 20, 30)}, nil, 0, []AnomalyKind{LostWrite}},
		{"lost acknowledged upsert, at the final read", []Op{w(Put, 0, 1, 0, 10, OK), w(Upsert, 1, 2, 20, 30, OK),
			{Client: 2, Kind: Get, Key: "k", Invoke: ms(100), Complete: ms(110), Result: OK, Final: true}},
			nil, 0, []AnomalyKind{LostWrite}},
		{"removed", []Op{w(Put, 0, 1, 0, 10, OK), rm(1, 20, 30, OK), read(1, 0, 0, 40, 50)}, nil, 0, nil},
		{"maybe removed", []Op{w(Put, 0, 1, 0, 10, OK), rm(1, 20, 30, Unknown), read(1, 0, 0, 400, 500)}, nil, 0, nil},
		{"a remove that failed for certain", []Op{w(Put, 0, 1, 0, 10, OK), rm(1, 20, 30, Fail), read(1, 0, 0, 40, 50)},
			nil, 0, []AnomalyKind{LostWrite}},
		// A remove that ended before the write began took an older value.
		{"removed before the write", []Op{rm(1, 0, 5, OK), w(Put, 0, 1, 10, 20, OK), read(1, 0, 0, 40, 50)},
			nil, 0, []AnomalyKind{LostWrite}},
		{"evicted", []Op{w(Put, 0, 1, 0, 10, OK), read(1, 0, 0, 40, 50)}, []Eviction{{At: ms(60), Key: "k"}}, 0, nil},
		{"evicted before the write", []Op{w(Put, 0, 1, 10, 20, OK), read(1, 0, 0, 40, 50)}, []Eviction{{At: ms(5), Key: "k"}},
			0, []AnomalyKind{LostWrite}},
		{"another key evicted", []Op{w(Put, 0, 1, 0, 10, OK), read(1, 0, 0, 40, 50)}, []Eviction{{At: ms(60), Key: "j"}},
			0, []AnomalyKind{LostWrite}},
		// A put that met another write in flight succeeded without
		// writing; that write then failed: nothing was left.
		{"acknowledged put beside a failed one", []Op{w(Put, 1, 1, 0, 20, Unknown), w(Put, 0, 1, 5, 10, OK),
			read(0, 0, 0, 40, 50)}, nil, 0, nil},
		// ...or had not ended when the get looked.
		{"acknowledged put beside a slow one", []Op{w(Put, 1, 1, 0, 60, OK), w(Put, 0, 1, 5, 10, OK),
			read(0, 0, 0, 40, 50)}, nil, 0, nil},
		{"acknowledged upsert beside a failed write", []Op{w(Put, 1, 1, 0, 20, Unknown), w(Upsert, 0, 1, 5, 10, OK),
			read(0, 0, 0, 40, 50)}, nil, 0, []AnomalyKind{LostWrite}},
		{"acknowledged put beside one that ended", []Op{w(Put, 1, 1, 0, 30, OK), w(Put, 0, 1, 5, 10, OK),
			read(0, 0, 0, 40, 50)}, nil, 0, []AnomalyKind{LostWrite}},
		// Nothing found before any write, or with only unknown writes.
		{"nothing written yet", []Op{read(1, 0, 0, 0, 10), w(Put, 0, 1, 20, 30, OK)}, nil, 0, nil},
		{"only an unknown write", []Op{w(Put, 0, 1, 0, 10, Unknown), read(1, 0, 0, 20, 30)}, nil, 0, nil},
		// Gets that failed say nothing.
		{"failed get", []Op{w(Put, 0, 1, 0, 10, OK), {Client: 1, Kind: Get, Key: "k", Invoke: ms(20), Complete: ms(30), Result: Fail}},
			nil, 0, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for i := range tc.ops {
				tc.ops[i].Index = i
			}
			got := Check(tc.ops, tc.evictions, CheckConfig{StaleWindow: tc.window})
			var kinds []AnomalyKind
			for _, a := range got {
				kinds = append(kinds, a.Kind)
				assert.Equal(t, "k", a.Key)
				assert.NotEmpty(t, a.String())
			}
			assert.Equal(t, tc.want, kinds, "%v", got)
		})
	}
}

// An anomaly names the operations that show it.
func TestAnomalyNamesOps(t *testing.T) {
	ops := []Op{w(Put, 0, 1, 0, 10, OK), w(Upsert, 1, 2, 20, 30, OK), read(0, 1, 1, 40, 50)}
	for i := range ops {
		ops[i].Index = i
	}
	got := Check(ops, nil, CheckConfig{})
	require.Len(t, got, 1)
	a := got[0]
	assert.Equal(t, StaleRead, a.Kind)
	assert.Equal(t, 2, a.Get.Index)
	require.NotNil(t, a.Write)
	require.NotNil(t, a.By)
	assert.Equal(t, 0, a.Write.Index)
	assert.Equal(t, 1, a.By.Index)
	assert.Equal(t, "stale-read key=k get#2 (client 0, 40ms..50ms) put#0 w1#1 (client 0, 0s..10ms, ok) replaced by upsert#1 w2#2 (client 1, 20ms..30ms, ok)", a.String())
}
