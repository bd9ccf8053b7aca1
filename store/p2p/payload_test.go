package p2p

import (
	"errors"
	"testing"
)

func validPayload() *payload {
	return &payload{
		Name: "ckpt/a", Size: 300, SizeList: []uint64{100, 200}, MaxShardSize: 128,
		Shards: []shard{
			{Size: 100, Gold: []location{{"10.0.0.1:15001", 0x7f0000000000}}},
			{Size: 128, Gold: []location{{"10.0.0.1:15001", 0x7f0000100000}}, ReplicaList: []location{{"10.0.0.2:15001", 0x7e0000000000}}},
			{Size: 72, ReplicaList: []location{{"10.0.0.3:15001", 1 << 63}}},
		},
	}
}

func TestDecodePayload(t *testing.T) {
	cases := []struct {
		name string
		edit func(p *payload)
		ok   bool
	}{
		{"valid", func(*payload) {}, true},
		// Every inconsistency a receiver would trip over.
		{"no name", func(p *payload) { p.Name = "" }, false},
		{"size off by one", func(p *payload) { p.Size++ }, false},
		{"size_list short", func(p *payload) { p.SizeList[1]-- }, false},
		{"zero in size_list", func(p *payload) { p.SizeList = []uint64{0, 100, 200} }, false},
		{"no shards", func(p *payload) { p.Shards = nil }, false},
		{"zero shard", func(p *payload) { p.Shards = append(p.Shards, shard{}) }, false},
		{"shard over max", func(p *payload) { p.MaxShardSize = 100 }, false},
		{"zero max", func(p *payload) { p.MaxShardSize = 0 }, false},
		{"nameless location", func(p *payload) { p.Shards[0].Gold[0].SegmentName = "" }, false},
		{"overflowing shards", func(p *payload) {
			p.MaxShardSize = 1 << 63
			p.Shards = []shard{{Size: 1 << 63}, {Size: 1 << 63}, {Size: 300}}
		}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := validPayload()
			tc.edit(p)
			got, err := decodePayload([]byte(p.encode()))
			if (err == nil) != tc.ok {
				t.Fatalf("decode = %v, want ok %v", err, tc.ok)
			}
			if err != nil && !errors.Is(err, ErrMetadata) {
				t.Fatalf("decode = %v, want ErrMetadata", err)
			}
			if err == nil && got.encode() != p.encode() {
				t.Fatalf("round trip:\n%s\n%s", got.encode(), p.encode())
			}
		})
	}
}

// FuzzPayload feeds the decoder of etcd records arbitrary bytes: it never
// panics, and what it accepts is consistent and survives a round trip.
func FuzzPayload(f *testing.F) {
	f.Add([]byte(validPayload().encode()))
	f.Add([]byte(`{"name":"x","size":1,"size_list":[1],"max_shard_size":1,"shards":[{"size":1,"gold":null,"replica_list":null}]}`))
	f.Add([]byte(`{"name":"x","size":18446744073709551615,"size_list":[18446744073709551615],"max_shard_size":1,"shards":[]}`))
	f.Add([]byte(`{"shards":[{"size":-1}]}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := decodePayload(b)
		if err != nil {
			return
		}
		if err := p.validate(); err != nil {
			t.Fatalf("accepted an invalid payload: %v", err)
		}
		var sum uint64
		for _, s := range p.Shards {
			sum += s.Size
		}
		if sum != p.Size {
			t.Fatalf("shards sum to %d, size %d", sum, p.Size)
		}
		q, err := decodePayload([]byte(p.encode()))
		if err != nil {
			t.Fatalf("re-decode: %v", err)
		}
		if q.encode() != p.encode() {
			t.Fatalf("round trip differs:\n%s\n%s", p.encode(), q.encode())
		}
	})
}
