package conductor_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/conductor"
)

func TestIndexLongest(t *testing.T) {
	x := conductor.NewIndex()
	for _, h := range []string{"a", "b", "c", "d"} {
		require.NoError(t, x.AddHolder(h, 0))
	}
	x.Insert("a", []uint64{1, 2, 3})
	x.Insert("b", []uint64{1, 2})
	x.Insert("c", []uint64{5})
	// d has block 2 but not block 1: a chained hash is useless without
	// its prefix, so d has no prefix.
	x.Insert("d", []uint64{2, 3})
	for _, tc := range []struct {
		name   string
		blocks []uint64
		want   map[string]int
	}{
		// Each holder's leading run; holders without the first block absent.
		{"longer than all", []uint64{1, 2, 3, 4}, map[string]int{"a": 3, "b": 2}},
		// A prompt wholly held.
		{"exact", []uint64{1, 2}, map[string]int{"a": 2, "b": 2}},
		// Nothing held.
		{"miss", []uint64{9, 1}, map[string]int{}},
		// An empty prompt has no prefix.
		{"empty", nil, map[string]int{}},
		// Another holder's only block.
		{"c", []uint64{5, 6}, map[string]int{"c": 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, x.Longest(tc.blocks))
			for _, h := range []string{"a", "b", "c", "d"} {
				assert.Equal(t, tc.want[h], x.Prefix(h, tc.blocks), h)
			}
		})
	}
	assert.Equal(t, 3, x.Holders(2), "a, b and d")
	assert.Equal(t, 0, x.Holders(42))
	assert.Equal(t, 4, x.Blocks())
	assert.Zero(t, x.Prefix("nobody", []uint64{1}))
}

func TestIndexLRU(t *testing.T) {
	for _, tc := range []struct {
		name    string
		ops     [][]uint64 // Insert calls, in order
		have    []uint64
		evicted []uint64
	}{
		// A prompt's tail goes before its head: the head is touched last.
		{"tail first", [][]uint64{{1, 2, 3}, {4}}, []uint64{1, 2, 4}, []uint64{3}},
		// Touching a block saves it: 3 is used again, so 2 goes.
		{"touch", [][]uint64{{1, 2, 3}, {3}, {9}}, []uint64{1, 3, 9}, []uint64{2}},
		// A prompt longer than the cache keeps its leading blocks.
		{"too long", [][]uint64{{1, 2, 3, 4, 5}}, []uint64{1, 2, 3}, []uint64{4, 5}},
		// Inserting what is there changes nothing but the order.
		{"again", [][]uint64{{1, 2, 3}, {1, 2, 3}}, []uint64{1, 2, 3}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := conductor.NewIndex()
			require.NoError(t, x.AddHolder("h", 3))
			for _, op := range tc.ops {
				x.Insert("h", op)
			}
			for _, k := range tc.have {
				assert.True(t, x.Has("h", k), "has %d", k)
				assert.Equal(t, 1, x.Holders(k))
			}
			for _, k := range tc.evicted {
				assert.False(t, x.Has("h", k), "evicted %d", k)
				assert.Zero(t, x.Holders(k), "gone from the index")
			}
			assert.Equal(t, len(tc.have), x.Len("h"))
			assert.Equal(t, len(tc.have), x.Blocks())
		})
	}
}

func TestIndexHolders(t *testing.T) {
	x := conductor.NewIndex()
	require.NoError(t, x.AddHolder("a", 0))
	require.ErrorIs(t, x.AddHolder("a", 0), conductor.ErrDuplicate)
	require.ErrorIs(t, x.AddHolder("neg", -1), conductor.ErrInvalid)

	// Unknown holders are ignored.
	x.Insert("nobody", []uint64{1})
	x.Delete("nobody", []uint64{1})
	assert.Zero(t, x.Blocks())
	assert.False(t, x.RemoveHolder("nobody"))

	// More holders than an entry carries inline: 200 holders, holder i
	// has blocks 0..i.
	names := []string{"a"}
	for i := 1; i < 200; i++ {
		names = append(names, fmt.Sprint("h", i))
		require.NoError(t, x.AddHolder(names[i], 0))
	}
	prompt := make([]uint64, 200)
	for i := range prompt {
		prompt[i] = uint64(i)
	}
	for i, n := range names {
		x.Insert(n, prompt[:i+1])
	}
	got := x.Longest(prompt)
	for i, n := range names {
		require.Equal(t, i+1, got[n], n)
	}
	assert.Equal(t, 200, x.Holders(0))

	// Delete takes blocks out; a removed holder takes all of its own, and
	// its slot, reused, starts empty.
	x.Delete("h199", []uint64{5, 1000})
	assert.Equal(t, 5, x.Prefix("h199", prompt))
	assert.True(t, x.RemoveHolder("h150"))
	assert.Equal(t, 199, x.Holders(0))
	_, ok := x.Longest(prompt)["h150"]
	assert.False(t, ok)
	require.NoError(t, x.AddHolder("new", 0))
	assert.Zero(t, x.Prefix("new", prompt))
	_, ok = x.Longest(prompt)["new"]
	assert.False(t, ok, "a reused slot inherits nothing")
	for _, n := range names {
		x.RemoveHolder(n)
	}
	assert.Zero(t, x.Blocks(), "no holder, no block")
}

// naiveLRU is the obvious model of one holder: a slice, most recent first.
type naiveLRU struct {
	cap    int
	blocks []uint64
}

func (l *naiveLRU) insert(bs []uint64) {
	for i := len(bs) - 1; i >= 0; i-- {
		if j := slices.Index(l.blocks, bs[i]); j >= 0 {
			l.blocks = slices.Delete(l.blocks, j, j+1)
		}
		l.blocks = slices.Insert(l.blocks, 0, bs[i])
		if l.cap > 0 && len(l.blocks) > l.cap {
			l.blocks = l.blocks[:l.cap]
		}
	}
}

func (l *naiveLRU) prefix(bs []uint64) int {
	for i, b := range bs {
		if !slices.Contains(l.blocks, b) {
			return i
		}
	}
	return len(bs)
}

// TestIndexMatchesModel drives the index and the naive model with the same
// random operations and compares every answer.
func TestIndexMatchesModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	x := conductor.NewIndex()
	model := map[string]*naiveLRU{}
	for i := range 6 {
		name := fmt.Sprint("h", i)
		model[name] = &naiveLRU{cap: []int{0, 4, 8, 16, 30, 60}[i]}
		require.NoError(t, x.AddHolder(name, model[name].cap))
	}
	// Prompts share prefixes: a tree of 3 children per block, 6 deep.
	prompt := func() []uint64 {
		n := 1 + rng.IntN(6)
		bs := make([]uint64, n)
		var h uint64 = 1
		for i := range bs {
			h = h*3 + uint64(rng.IntN(3))
			bs[i] = h
		}
		return bs
	}
	for step := range 5000 {
		h := fmt.Sprint("h", rng.IntN(6))
		bs := prompt()
		switch rng.IntN(4) {
		case 0:
			x.Delete(h, bs[len(bs)-1:])
			m := model[h]
			if j := slices.Index(m.blocks, bs[len(bs)-1]); j >= 0 {
				m.blocks = slices.Delete(m.blocks, j, j+1)
			}
		default:
			x.Insert(h, bs)
			model[h].insert(bs)
		}
		q := prompt()
		got := x.Longest(q)
		for name, m := range model {
			require.Equal(t, m.prefix(q), got[name], "step %d holder %s", step, name)
			require.Equal(t, len(m.blocks), x.Len(name), "step %d holder %s", step, name)
		}
	}
}

// lruModel is the obvious prefix cache: per holder, its blocks most
// recent first.
type lruModel map[string][]uint64

func (m lruModel) insert(h string, capacity int, blocks []uint64) {
	for i := len(blocks) - 1; i >= 0; i-- {
		l := slices.DeleteFunc(m[h], func(k uint64) bool { return k == blocks[i] })
		l = append([]uint64{blocks[i]}, l...)
		if capacity > 0 && len(l) > capacity {
			l = l[:capacity]
		}
		m[h] = l
	}
}

func (m lruModel) longest(blocks []uint64) map[string]int {
	out := map[string]int{}
	for h, l := range m {
		n := 0
		for n < len(blocks) && slices.Contains(l, blocks[n]) {
			n++
		}
		if n > 0 {
			out[h] = n
		}
	}
	return out
}

// randomPrompt is a chained-looking prompt: one of a few shared heads,
// then fewer than tail blocks below blocks, no block twice in a row.
func randomPrompt(rng *rand.Rand, tail, blocks int) []uint64 {
	p := []uint64{uint64(rng.IntN(3))}
	for range rng.IntN(tail) {
		p = append(p, uint64(rng.IntN(blocks)))
	}
	return slices.Compact(p)
}

func TestIndexAgainstModel(t *testing.T) {
	// Random inserts, deletes and holder churn over few blocks and small
	// capacities, checked against the obvious model after every step.
	rng := rand.New(rand.NewPCG(1, 2))
	names := []string{"a", "b", "c", "d", "e"}
	capacity := map[string]int{"a": 3, "b": 5, "c": 0, "d": 1, "e": 8}
	x, m := conductor.NewIndex(), lruModel{}
	for _, h := range names {
		require.NoError(t, x.AddHolder(h, capacity[h]))
		m[h] = nil
	}
	prompt := func() []uint64 { return randomPrompt(rng, 6, 12) }
	for step := range 5000 {
		h := names[rng.IntN(len(names))]
		p := prompt()
		switch op := rng.IntN(10); {
		case op < 6:
			x.Insert(h, p)
			m.insert(h, capacity[h], p)
		case op < 9:
			x.Delete(h, p)
			m[h] = slices.DeleteFunc(m[h], func(k uint64) bool { return slices.Contains(p, k) })
		default:
			require.True(t, x.RemoveHolder(h))
			require.NoError(t, x.AddHolder(h, capacity[h]))
			m[h] = nil
		}
		q := prompt()
		require.Equal(t, m.longest(q), x.Longest(q), "step %d", step)
		all := map[uint64]int{}
		for _, n := range names {
			require.Equal(t, len(m[n]), x.Len(n), "step %d %s", step, n)
			for _, k := range m[n] {
				require.True(t, x.Has(n, k))
				all[k]++
			}
		}
		require.Equal(t, len(all), x.Blocks(), "step %d", step)
		for k, n := range all {
			require.Equal(t, n, x.Holders(k), "step %d block %d", step, k)
		}
	}
}
