package main

import (
	"context"
	"fmt"
	"hash/crc32"
	"slices"
	"time"

	"github.com/mooncake-go/mooncake/internal/netlab"
	"github.com/mooncake-go/mooncake/store/client"
)

// The stripes phase: one large object striped over the segments of
// several storage hosts, got by a reader whose link is faster than theirs
// together, so that one get can take in every storage host's link at
// once. Its yardsticks, in the same run: the same bytes in one piece on
// one of those hosts (about one link's rate), and the ideal, the size over
// the storage hosts' links together.

// stripeRun is one timed get of the stripes phase.
type stripeRun struct {
	Way     string    `json:"way"`    // striped or unstriped
	Pieces  int       `json:"pieces"` // of the replica the get read, each on a host of its own
	Repeat  int       `json:"repeat"`
	Seconds float64   `json:"seconds"` // the get, as the reader timed it
	MBps    float64   `json:"mbps"`    // 1e6 B/s of the value
	OfLinks float64   `json:"of_links"`
	PerHost []float64 `json:"per_host"` // MB each storage host's link sent the reader during the get
	// Seconds into the get at which each storage host's link had sent
	// the reader 1% and 99% of what it sent (sampled every 100 ms): pieces
	// read at once start together.
	Began   []float64 `json:"began_s"`
	Ended   []float64 `json:"ended_s"`
	CPU     cpuUse    `json:"cpu"`
	Dropped uint64    `json:"dropped"` // packets the links dropped (full queues)
}

// stripePut is how one of the phase's objects was put, and where its
// pieces went.
type stripePut struct {
	Way     string   `json:"way"`
	Seconds float64  `json:"seconds"`
	Pieces  []piece  `json:"pieces"`
	Hosts   []string `json:"hosts"` // of the pieces, in order
}

// piece is one piece of a replica as the master lists it: an ordinary
// replica is one piece.
type piece struct {
	Segment string `json:"segment"`
	Size    uint64 `json:"size"`
}

// Objects of the phase.
const (
	keyStriped   = "stripes/striped"
	keyUnstriped = "stripes/unstriped"
)

// stripeSetup is the phase's storage hosts, in order, and its reader.
type stripeSetup struct {
	hosts  []*netlab.Host
	nodes  []*proc // a storage node (a client with a segment) on each host
	reader *proc   // a client without a segment, on a host of its own
	rhost  *netlab.Host
	sums   map[string]uint32 // CRC-32C of each object put
}

// segments are the storage nodes' segment names, in host order.
func (s *stripeSetup) segments() []string {
	out := make([]string, len(s.nodes))
	for i, p := range s.nodes {
		out[i] = p.addr
	}
	return out
}

// stripePhase puts the object striped over every storage host and in one
// piece on the first, then gets each into the reader's registered memory,
// run by run, the two ways alternating.
func (c *coord) stripePhase(ctx context.Context) error {
	s, err := c.startStripes()
	if err != nil {
		return err
	}
	defer c.stopStore()
	n, segs := c.o.StripeN, s.segments()
	for _, p := range []struct {
		way, key string
		pieces   int
		on       []string
	}{{"striped", keyStriped, n, segs}, {"unstriped", keyUnstriped, 1, segs[:1]}} {
		if !slices.Contains(c.o.StripeW, p.way) {
			continue
		}
		rp, err := s.reader.call(request{Cmd: "sput", Name: p.key, ValueSize: int(c.o.StripeSz), Stripes: p.pieces, Names: p.on})
		if err != nil {
			return fmt.Errorf("put %s: %w", p.way, err)
		}
		hosts, err := checkPieces(rp.Pieces, p.pieces, c.o.StripeSz, p.on)
		if err != nil {
			return fmt.Errorf("put %s: %w", p.way, err)
		}
		s.sums[p.key] = rp.Sum
		put := stripePut{Way: p.way, Seconds: rp.Seconds, Pieces: rp.Pieces}
		for _, h := range hosts {
			put.Hosts = append(put.Hosts, s.hosts[h].Name)
		}
		c.res.StripePuts = append(c.res.StripePuts, put)
		c.logf("stripes: put %s %s in %.1f s: pieces on %v", size(c.o.StripeSz), p.way, rp.Seconds, put.Hosts)
	}
	for r := range c.o.Repeat {
		for _, way := range c.o.StripeW {
			run, err := c.stripeRun(ctx, s, way, r)
			if err != nil {
				return fmt.Errorf("get %s, run %d: %w", way, r+1, err)
			}
			c.res.Stripes = append(c.res.Stripes, run)
			c.logf("stripes: get %s (%d pieces), run %d: %.2f s, %.1f MB/s, %.2fx its links (ideal %.2f s); MB sent per host %.0f, from %.1f to %.1f s; cores busy %.2f (lab %.2f), %d packets dropped",
				way, run.Pieces, r+1, run.Seconds, run.MBps, run.OfLinks, c.stripeIdeal(run.Pieces), run.PerHost, run.Began, run.Ended, run.CPU.MachineBusy, run.CPU.Lab, run.Dropped)
		}
	}
	return nil
}

// stripeIdeal is the get's lower bound from pieces hosts' links: the size
// over their rates summed.
func (c *coord) stripeIdeal(pieces int) float64 {
	return float64(c.o.StripeSz) * 8 / (float64(pieces) * float64(c.o.Rate))
}

// startStripes starts a master and the phase's hosts. Each storage node's
// segment holds its piece and some slack; the first node's also holds the
// unstriped object.
func (c *coord) startStripes() (*stripeSetup, error) {
	n, total := c.o.StripeN, c.o.StripeSz
	mh, err := c.lab.Host("master")
	if err != nil {
		return nil, err
	}
	// A get holds the object's lease while it reads, and one that
	// outlives it fails; the engine fails a request (a piece's whole
	// write or read) that outlives its deadline. Both are four times what
	// the unstriped object takes at the link's rate.
	slow := max(30*time.Second, time.Duration(4*float64(total)*8/float64(c.o.Rate)*float64(time.Second)))
	c.master, err = startWorker(mh, workerArgs{Role: roleMaster, IP: mh.IP.String(), LeaseTTL: slow})
	if err != nil {
		return nil, err
	}
	// Half a piece of slack keeps the pool at 80% full once both objects
	// are in, under the master's eviction watermark (90%).
	piece := (total + int64(n) - 1) / int64(n)
	slack := max(piece/2, 4<<20)
	mib := func(b int64) int64 { return (b + 1<<20 - 1) >> 20 << 20 }
	s := &stripeSetup{sums: map[string]uint32{}}
	for i := range n {
		h, err := c.lab.Host(fmt.Sprintf("s%d", i+1))
		if err != nil {
			return nil, err
		}
		h.SetRate(c.o.Rate)
		seg := mib(piece + slack)
		if i == 0 {
			seg = mib(piece + total + slack)
		}
		p, err := startWorker(h, workerArgs{Role: roleStore, IP: h.IP.String(), Master: c.master.addr,
			Segment: seg, Buffer: 1 << 20, Lanes: c.o.Lanes, Timeout: slow, Slice: c.o.Slice})
		if err != nil {
			return nil, err
		}
		c.stores = append(c.stores, p)
		s.hosts, s.nodes = append(s.hosts, h), append(s.nodes, p)
	}
	s.rhost, err = c.lab.Host("reader")
	if err != nil {
		return nil, err
	}
	rr := c.readerRate()
	s.rhost.SetRate(rr)
	s.reader, err = startWorker(s.rhost, workerArgs{Role: roleStore, IP: s.rhost.IP.String(), Master: c.master.addr,
		Segment: client.NoSegment, Buffer: total, Lanes: c.o.Lanes, Timeout: slow, Slice: c.o.Slice})
	if err != nil {
		return nil, err
	}
	c.stores = append(c.stores, s.reader)
	c.logf("stripes: master on %s, %d storage hosts on links of %s, a reader on %s", mh, n, rate(c.o.Rate), rate(rr))
	return s, nil
}

// readerRate is the reader's link: -reader-rate, by default a quarter
// more than the storage hosts' together, so that it is not the
// bottleneck yet is a link (a queue, drops) like theirs.
func (c *coord) readerRate() int64 {
	if c.o.ReaderR >= 0 {
		return c.o.ReaderR
	}
	return int64(c.o.StripeN) * c.o.Rate * 5 / 4
}

// stripeRun gets one of the objects into the reader's memory, timed, and
// checks the replica it read and the bytes it got.
func (c *coord) stripeRun(_ context.Context, s *stripeSetup, way string, r int) (stripeRun, error) {
	key, want, on := keyStriped, c.o.StripeN, s.segments()
	if way == "unstriped" {
		key, want, on = keyUnstriped, 1, on[:1]
	}
	// The replica list the get is about to read, and the reader's memory
	// cleared so that the bytes checked after are the get's.
	rp, err := s.reader.call(request{Cmd: "sclear", Name: key, ValueSize: int(c.o.StripeSz)})
	if err != nil {
		return stripeRun{}, err
	}
	if _, err := checkPieces(rp.Pieces, want, c.o.StripeSz, on); err != nil {
		return stripeRun{}, err
	}
	sent := func() []uint64 {
		out := make([]uint64, len(s.hosts))
		for i, h := range s.hosts {
			out[i] = c.lab.Stats(h, s.rhost).Bytes
		}
		return out
	}
	drop0, sent0 := c.dropped(), sent()
	stop := c.meter()
	done := make(chan struct{})
	trace := c.traceSent(sent, done)
	rp, err = s.reader.call(request{Cmd: "sget", Name: key, ValueSize: int(c.o.StripeSz)})
	cpu := stop()
	close(done)
	tr := <-trace
	if err != nil {
		return stripeRun{}, err
	}
	run := stripeRun{Way: way, Pieces: want, Repeat: r, Seconds: rp.Seconds, CPU: cpu, Dropped: c.dropped() - drop0}
	run.Began, run.Ended = tr.when(0.01), tr.when(0.99)
	var crossed uint64
	for i, b := range sent() {
		run.PerHost = append(run.PerHost, float64(b-sent0[i])/1e6)
		crossed += b - sent0[i]
	}
	if crossed < uint64(c.o.StripeSz) {
		return stripeRun{}, fmt.Errorf("the get moved %d bytes but the storage hosts' links sent the reader only %d", c.o.StripeSz, crossed)
	}
	sum, err := s.reader.call(request{Cmd: "ssum", ValueSize: int(c.o.StripeSz)})
	if err != nil {
		return stripeRun{}, err
	}
	if sum.Sum != s.sums[key] {
		return stripeRun{}, fmt.Errorf("got bytes with CRC %08x, the value put had %08x", sum.Sum, s.sums[key])
	}
	if rp.Seconds > 0 {
		run.MBps = float64(c.o.StripeSz) / rp.Seconds / 1e6
		run.OfLinks = run.MBps / (float64(want) * float64(c.o.Rate) / 8 / 1e6)
	}
	return run, nil
}

// sentTrace is what each storage host's link had sent, sampled.
type sentTrace struct {
	at   []float64  // seconds since the first sample
	sent [][]uint64 // per sample, per host, since the first sample
}

// traceSent samples sent every 100 ms until done closes.
func (c *coord) traceSent(sent func() []uint64, done <-chan struct{}) <-chan sentTrace {
	out := make(chan sentTrace, 1)
	go func() {
		var tr sentTrace
		t0, s0 := time.Now(), sent()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for end := false; !end; {
			select {
			case <-done:
				end = true
			case <-tick.C:
			}
			now := sent()
			for i := range now {
				now[i] -= s0[i]
			}
			tr.at, tr.sent = append(tr.at, time.Since(t0).Seconds()), append(tr.sent, now)
		}
		out <- tr
	}()
	return out
}

// when is, for each host, the first sample at which it had sent frac of
// what it sent in all; 0 for a host that sent less than a megabyte (no
// piece, only the store's heartbeats and answers).
func (tr sentTrace) when(frac float64) []float64 {
	if len(tr.sent) == 0 {
		return nil
	}
	last := tr.sent[len(tr.sent)-1]
	out := make([]float64, len(last))
	for h, total := range last {
		for i, s := range tr.sent {
			if total >= 1e6 && float64(s[h]) >= frac*float64(total) {
				out[h] = tr.at[i]
				break
			}
		}
	}
	return out
}

// checkPieces says whether a replica is what the phase asked for: want
// pieces covering size bytes, each in one of the segments on (each on a
// storage host of its own), no two in one. It returns each piece's index
// in on. A run whose object was not striped as asked would measure
// something else than it says.
func checkPieces(ps []piece, want int, size int64, on []string) ([]int, error) {
	if len(ps) != want {
		return nil, fmt.Errorf("the replica is in %d pieces %v, want %d (striping not done?)", len(ps), ps, want)
	}
	var hosts []int
	var total uint64
	for _, p := range ps {
		h := -1
		for i, s := range on {
			if s == p.Segment {
				h = i
			}
		}
		switch {
		case h < 0:
			return nil, fmt.Errorf("a piece is in segment %s, not one of the storage hosts' %v", p.Segment, on)
		case p.Size == 0:
			return nil, fmt.Errorf("an empty piece in %s", p.Segment)
		}
		for _, o := range hosts {
			if o == h {
				return nil, fmt.Errorf("two pieces in segment %s: pieces %v are not on %d distinct hosts", p.Segment, ps, want)
			}
		}
		hosts = append(hosts, h)
		total += p.Size
	}
	if total != uint64(size) {
		return nil, fmt.Errorf("the pieces %v hold %d bytes, the object %d", ps, total, size)
	}
	return hosts, nil
}

// The reader's side: a store worker without a segment whose registered
// memory holds the value it puts and the value it gets.

// stripeValue fills v with bytes of key's own, so that the two objects of
// the phase differ and a get of the wrong one fails its check.
func stripeValue(v []byte, key string) {
	seed := byte(crc32.ChecksumIEEE([]byte(key)))
	for i := range v {
		v[i] = byte(i*11+i>>14) ^ seed
	}
}

// stripeDo answers the stripes phase's commands.
func (w *storeWorker) stripeDo(ctx context.Context, req request) (reply, error) {
	if req.ValueSize <= 0 || req.ValueSize > len(w.mem) {
		return reply{}, fmt.Errorf("a value of %d bytes in %d bytes of registered memory", req.ValueSize, len(w.mem))
	}
	v := w.mem[:req.ValueSize]
	switch req.Cmd {
	case "sput":
		stripeValue(v, req.Name)
		sum := crc32.Checksum(v, castagnoli)
		// Hard pinned: the objects are got again and again, never evicted.
		rc := &client.ReplicateConfig{Replicas: 1, Stripes: req.Stripes, PreferredSegments: req.Names, HardPin: true}
		start := time.Now()
		if err := w.c.Put(ctx, req.Name, v, rc); err != nil {
			return reply{}, err
		}
		secs := time.Since(start).Seconds()
		ps, err := w.pieces(ctx, req.Name)
		return reply{Sum: sum, Seconds: secs, Pieces: ps}, err
	case "sclear":
		clear(v)
		ps, err := w.pieces(ctx, req.Name)
		return reply{Pieces: ps}, err
	case "sget":
		start := time.Now()
		n, err := w.c.GetInto(ctx, req.Name, v)
		secs := time.Since(start).Seconds()
		if err == nil && n != len(v) {
			err = fmt.Errorf("%s: got %d bytes, want %d", req.Name, n, len(v))
		}
		return reply{Seconds: secs}, err
	case "ssum":
		return reply{Sum: crc32.Checksum(v, castagnoli)}, nil
	}
	return reply{}, fmt.Errorf("unknown command")
}

// pieces lists key's one replica as the master gives it to a get.
func (w *storeWorker) pieces(ctx context.Context, key string) ([]piece, error) {
	reps, errs := w.c.BatchReplicas(ctx, []string{key})
	if errs[0] != nil {
		return nil, errs[0]
	}
	if len(reps[0]) != 1 {
		return nil, fmt.Errorf("%s has %d replicas, want 1", key, len(reps[0]))
	}
	m := reps[0][0].GetMemory()
	if m == nil {
		return nil, fmt.Errorf("%s: not a memory replica: %v", key, reps[0][0])
	}
	if len(m.Stripes) == 0 {
		return []piece{{Segment: m.SegmentName, Size: m.Size}}, nil
	}
	out := make([]piece, len(m.Stripes))
	for i, p := range m.Stripes {
		out[i] = piece{Segment: p.SegmentName, Size: p.Size}
	}
	return out, nil
}
