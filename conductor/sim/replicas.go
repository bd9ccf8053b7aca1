package sim

import (
	"bufio"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/mooncake-go/mooncake/conductor"
	"github.com/mooncake-go/mooncake/internal/fileout"
)

// Defaults of the replica sampling (Config.ReplicaInterval,
// Config.HotBlocks).
const (
	DefaultReplicaInterval = time.Minute
	DefaultHotBlocks       = 100
)

// ReplicaSample is the replica distribution of the scheduler's prefix
// index at one moment of a replay: how many prefill instances' caches
// hold each block (the store is not counted). Cache load balancing shows
// in it: a request routed away from its prefix's holders makes the
// chosen instance pull the prefix and keep it, so hot blocks gain
// replicas.
type ReplicaSample struct {
	// At is the simulated time of the sample: a multiple of
	// Config.ReplicaInterval, or the end of the replay for the last one.
	At time.Duration
	// Blocks[n] is the number of blocks exactly n prefill instances hold;
	// Blocks[0] those that only the store holds
	// (conductor.Scheduler.ReplicaHistogram).
	Blocks []int
	// Max is the most replicas any block has: len(Blocks)-1.
	Max int
	// HotBlocks is the number of hot blocks: the blocks requested most
	// often so far (ties: the first requested), at most Config.HotBlocks.
	HotBlocks int
	// HotMean is the mean number of replicas of the hot blocks, those no
	// cache holds any more counting zero.
	HotMean float64
}

// Held is the number of blocks at least one prefill instance holds.
func (s ReplicaSample) Held() int {
	n := 0
	for _, b := range s.Blocks[min(1, len(s.Blocks)):] {
		n += b
	}
	return n
}

// replicaSampler takes the ReplicaSamples of a disaggregated replay: it
// counts the requests of every block as they arrive, densely numbered in
// order of first request so that ties break deterministically.
type replicaSampler struct {
	sched    *conductor.Scheduler
	interval time.Duration // <= 0: no sampling
	next     time.Duration // time of the next periodic sample
	hot      int
	ids      map[uint64]int32
	keys     []uint64 // by id
	counts   []uint32 // by id
	hist     []int    // scratch for ReplicaHistogram
	heap     []int32  // scratch: the hot ids, the coldest first
	samples  []ReplicaSample
}

func newReplicaSampler(cfg Config, sched *conductor.Scheduler) *replicaSampler {
	r := &replicaSampler{sched: sched, interval: cfg.ReplicaInterval, next: cfg.ReplicaInterval,
		hot: cfg.HotBlocks}
	if r.interval > 0 {
		r.ids = make(map[uint64]int32)
	}
	return r
}

// access counts a request for blocks.
func (r *replicaSampler) access(blocks []uint64) {
	if r.interval <= 0 {
		return
	}
	for _, k := range blocks {
		id, ok := r.ids[k]
		if !ok {
			id = int32(len(r.keys))
			r.ids[k] = id
			r.keys = append(r.keys, k)
			r.counts = append(r.counts, 0)
		}
		r.counts[id]++
	}
}

// until takes the periodic samples due up to now, before what happens at
// now: the state at each multiple of the interval.
func (r *replicaSampler) until(now time.Duration) {
	for r.interval > 0 && r.next <= now {
		r.sample(r.next)
		r.next += r.interval
	}
}

// end takes the last sample, at the end of the replay.
func (r *replicaSampler) end(now time.Duration) {
	if r.interval > 0 {
		r.sample(now)
	}
}

func (r *replicaSampler) sample(at time.Duration) {
	r.hist = r.sched.ReplicaHistogram(r.hist)
	s := ReplicaSample{At: at, Blocks: slices.Clone(r.hist), Max: len(r.hist) - 1}
	hot := r.hottest()
	if len(hot) > 0 {
		sum := 0
		for _, id := range hot {
			sum += r.sched.Replicas(r.keys[id])
		}
		s.HotBlocks, s.HotMean = len(hot), float64(sum)/float64(len(hot))
	}
	r.samples = append(r.samples, s)
}

// colder orders ids by hotness: fewer requests, or as many first
// requested later.
func (r *replicaSampler) colder(a, b int32) bool {
	if r.counts[a] != r.counts[b] {
		return r.counts[a] < r.counts[b]
	}
	return a > b
}

// hottest returns the ids of the r.hot most requested blocks, in no
// particular order: one pass over the blocks with a min-heap of the
// hottest so far.
func (r *replicaSampler) hottest() []int32 {
	h := r.heap[:0]
	down := func(i int) {
		for {
			l, m := 2*i+1, i
			if l < len(h) && r.colder(h[l], h[m]) {
				m = l
			}
			if l+1 < len(h) && r.colder(h[l+1], h[m]) {
				m = l + 1
			}
			if m == i {
				return
			}
			h[i], h[m] = h[m], h[i]
			i = m
		}
	}
	for id := range int32(len(r.counts)) {
		if len(h) < r.hot {
			h = append(h, id)
			for i := len(h) - 1; i > 0; {
				p := (i - 1) / 2
				if !r.colder(h[i], h[p]) {
					break
				}
				h[i], h[p] = h[p], h[i]
				i = p
			}
			continue
		}
		if len(h) > 0 && r.colder(h[0], id) {
			h[0] = id
			down(0)
		}
	}
	r.heap = h
	return h
}

// ReplicasMax is the most replicas any block had in any sample; 0 without
// samples.
func (r *Result) ReplicasMax() int {
	m := 0
	for _, s := range r.Replicas {
		m = max(m, s.Max)
	}
	return m
}

// HotReplicasMean is the mean replicas of the hot blocks averaged over
// the samples (ReplicaSample.HotMean, every sample weighing the same);
// 0 without samples.
func (r *Result) HotReplicasMean() float64 {
	if len(r.Replicas) == 0 {
		return 0
	}
	sum := 0.0
	for _, s := range r.Replicas {
		sum += s.HotMean
	}
	return sum / float64(len(r.Replicas))
}

// ReplicaColumns returns the header of WriteReplicasCSV's file for
// samples whose Max is at most maxReplicas.
func ReplicaColumns(maxReplicas int) []string {
	cols := []string{"time_s", "blocks_held", "max_replicas", "hot_blocks", "hot_replicas_mean", "store_only"}
	for n := 1; n <= maxReplicas; n++ {
		cols = append(cols, "replicas_"+strconv.Itoa(n))
	}
	return cols
}

// WriteReplicasCSV writes the replica samples to a new CSV file at path,
// one row per sample in time order: the time in seconds, the blocks some
// prefill instance holds, the most replicas of a block, the hot blocks and
// their mean replicas, the blocks only the store holds, then replicas_n,
// the blocks n instances hold, for n up to the run's ReplicasMax
// (ReplicaColumns).
func (r *Result) WriteReplicasCSV(path string) error {
	return fileout.Write(path, func(w *bufio.Writer) error {
		m := r.ReplicasMax()
		w.WriteString(strings.Join(ReplicaColumns(m), ",") + "\n")
		for _, s := range r.Replicas {
			fmt.Fprintf(w, "%s,%d,%d,%d,%s,%d", strconv.FormatFloat(s.At.Seconds(), 'f', -1, 64), s.Held(), s.Max,
				s.HotBlocks, strconv.FormatFloat(s.HotMean, 'f', -1, 64), s.Blocks[0])
			for n := 1; n <= m; n++ {
				v := 0
				if n < len(s.Blocks) {
					v = s.Blocks[n]
				}
				fmt.Fprintf(w, ",%d", v)
			}
			w.WriteByte('\n')
		}
		return nil
	})
}
