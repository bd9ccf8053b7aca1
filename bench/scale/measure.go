package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/mooncake-go/mooncake/internal/embedetcd"
	"github.com/mooncake-go/mooncake/internal/netlab"
)

// results is what a run measured: the raw runs and their medians.
type results struct {
	Options options     `json:"options"`
	Cores   int         `json:"cores"` // of the machine
	Store   []storeRun  `json:"store,omitempty"`
	P2P     []p2pRun    `json:"p2p,omitempty"`
	Master  []masterRun `json:"master,omitempty"`
	// The stripes phase: how its two objects were put, and its gets.
	StripePuts []stripePut `json:"stripe_puts,omitempty"`
	Stripes    []stripeRun `json:"stripes,omitempty"`
	Summary    []row       `json:"summary"`
}

// storeRun is one timed window of the store benchmark.
type storeRun struct {
	Op      string    `json:"op"`
	Hosts   int       `json:"hosts"`
	Repeat  int       `json:"repeat"`
	MBps    float64   `json:"mbps"`     // aggregate, 1e6 B/s of values
	PerHost []float64 `json:"per_host"` // each client's MB/s
	CPU     cpuUse    `json:"cpu"`
	Dropped uint64    `json:"dropped"` // packets the links dropped (full queues), whole run
}

// p2pRun is one fan-out of the object to every receiver.
type p2pRun struct {
	Way     string    `json:"way"` // swarm or seed-only
	Repeat  int       `json:"repeat"`
	Seconds float64   `json:"seconds"`  // first start to last finish
	PerHost []float64 `json:"per_host"` // each receiver's own time
	Dropped uint64    `json:"dropped"`  // packets the links dropped (full queues)
	// From the object's record: seconds until every shard had left the
	// seed once (had a replica), and until a quarter, half, three
	// quarters and all of the (receiver, shard) pairs were published.
	Seeded float64 `json:"seeded_s"`
	// The bytes the seed's link sent, in copies of the object.
	SeedCopies float64    `json:"seed_copies"`
	Quarters   [4]float64 `json:"quarters_s"`
	// Link use over the run, from the lab's counters, in bins of Bin
	// seconds: the seed's uplink, and the receivers' downlinks and
	// uplinks on average, each as a fraction of the link rate.
	Bin      float64   `json:"bin_s"`
	SeedUp   []float64 `json:"seed_up"`
	RecvDown []float64 `json:"recv_down"`
	RecvUp   []float64 `json:"recv_up"`
}

// masterRun is one timed window of the master benchmark.
type masterRun struct {
	Op         string  `json:"op"` // exists or replicas
	Clients    int     `json:"clients"`
	Batch      int     `json:"batch"`
	Repeat     int     `json:"repeat"`
	CallsPerS  float64 `json:"calls_per_s"`
	KeysPerS   float64 `json:"keys_per_s"`
	CPUPerCall float64 `json:"master_cpu_us_per_call"`
	MasterCPU  float64 `json:"master_cores"` // the master's CPU time over the window's
	CPU        cpuUse  `json:"cpu"`
	Profile    string  `json:"profile,omitempty"` // go tool pprof -top of the master
}

// cpuUse is where the machine's CPU went during a timed window, to show
// whether the cores, not the links, set the figure.
type cpuUse struct {
	MachineBusy float64 `json:"machine_busy"` // cores busy, every process of the machine
	Lab         float64 `json:"lab"`          // cores used by this run's processes (switch and workers)
}

// measure runs the phases of o on lab and logs progress to log.
func measure(ctx context.Context, lab *netlab.Lab, o options, out string, log io.Writer) (*results, error) {
	c := &coord{lab: lab, o: o, out: out, log: log, res: &results{Options: o, Cores: numCPU()}}
	defer c.close()
	err := c.run(ctx)
	c.res.Summary = summarise(c.res)
	return c.res, err
}

// coord is the coordinator: it owns the lab's hosts and workers.
type coord struct {
	lab *netlab.Lab
	o   options
	out string
	log io.Writer
	res *results

	hosts   []*netlab.Host // h1..hN: storage nodes, clients and P2P receivers
	seed    *netlab.Host
	master  *proc
	stores  []*proc
	peers   []*proc // P2P: the seed, then the receivers
	etcd    *embedetcd.Etcd
	etcdCli *clientv3.Client
}

func (c *coord) logf(format string, args ...any) {
	fmt.Fprintf(c.log, "%s scale: %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

func (c *coord) close() {
	for _, p := range append(append(c.peers, c.stores...), c.master) {
		if p != nil {
			p.close()
		}
	}
	if c.etcdCli != nil {
		_ = c.etcdCli.Close()
	}
	if c.etcd != nil {
		c.etcd.Close()
	}
}

// storeHosts is how many hosts the store phases need: one host's figure
// needs a neighbour.
func (c *coord) storeHosts() int { return max(slices.Max(c.o.Hosts), 2) }

func (c *coord) run(ctx context.Context) error {
	n := 0
	if c.o.has("store") || c.o.has("master") {
		n = c.storeHosts()
	}
	if c.o.has("p2p") {
		n = max(n, c.o.P2PRecv)
	}
	for i := range n {
		h, err := c.lab.Host(fmt.Sprintf("h%d", i+1))
		if err != nil {
			return err
		}
		h.SetRate(c.o.Rate)
		c.hosts = append(c.hosts, h)
	}
	if c.o.has("store") || c.o.has("master") {
		if err := c.startStore(); err != nil {
			return err
		}
	}
	if c.o.has("store") {
		if err := c.storePhase(ctx); err != nil {
			return fmt.Errorf("store: %w", err)
		}
	}
	if c.o.has("master") {
		if err := c.masterPhase(ctx); err != nil {
			return fmt.Errorf("master: %w", err)
		}
	}
	// The store's processes go before the P2P phase: their heartbeats
	// would queue behind its bytes on the same links.
	c.stopStore()
	if c.o.has("p2p") {
		if err := c.p2pPhase(ctx); err != nil {
			return fmt.Errorf("p2p: %w", err)
		}
	}
	// Last, on hosts and with a master of its own: no other segment for
	// the master to place pieces in, no other store traffic.
	if c.o.has("stripes") {
		if err := c.stripePhase(ctx); err != nil {
			return fmt.Errorf("stripes: %w", err)
		}
	}
	return nil
}

// startStore starts the master on a host of its own, its link not
// limited (it carries only metadata), and a storage node with its client
// on every store host.
func (c *coord) startStore() error {
	mh, err := c.lab.Host("master")
	if err != nil {
		return err
	}
	c.master, err = startWorker(mh, workerArgs{Role: roleMaster, IP: mh.IP.String()})
	if err != nil {
		return err
	}
	buf := int64(max(c.o.Conc*c.o.Batch*c.o.Value, 64<<10*c.o.MetaB))
	seg := c.o.Segment
	if seg == 0 {
		// What a put window sends a node at line rate, and half again:
		// the store is cleared after every run.
		window := time.Second + c.o.Warmup + c.o.Duration
		seg = max(256<<20, int64(float64(c.o.Rate)/8*window.Seconds()*1.5)>>20<<20)
	}
	c.stores = make([]*proc, c.storeHosts())
	for i := range c.stores {
		h := c.hosts[i]
		c.stores[i], err = startWorker(h, workerArgs{Role: roleStore, IP: h.IP.String(), Master: c.master.addr,
			Segment: seg, Buffer: buf, Lanes: c.o.Lanes})
		if err != nil {
			return err
		}
	}
	c.logf("master on %s, %d storage nodes with clients (segments of %s), links %s each way", mh, len(c.stores), size(seg), rate(c.o.Rate))
	return nil
}

func (c *coord) stopStore() {
	for _, p := range append(c.stores, c.master) {
		if p != nil {
			p.close()
		}
	}
	c.stores, c.master = nil, nil
}

// dropped is the packets every link of the lab has dropped so far.
func (c *coord) dropped() uint64 {
	hosts := c.lab.Hosts()
	var n uint64
	for _, a := range hosts {
		for _, b := range hosts {
			if a != b {
				n += c.lab.Stats(a, b).Dropped
			}
		}
	}
	return n
}

// sent is the bytes h's link has delivered to the other hosts so far.
func (c *coord) sent(h *netlab.Host) uint64 {
	var n uint64
	for _, o := range c.lab.Hosts() {
		if o != h {
			n += c.lab.Stats(h, o).Bytes
		}
	}
	return n
}

// received is the bytes the other hosts' links have delivered to h so far.
func (c *coord) received(h *netlab.Host) uint64 {
	var n uint64
	for _, o := range c.lab.Hosts() {
		if o != h {
			n += c.lab.Stats(o, h).Bytes
		}
	}
	return n
}

func rate(bps int64) string {
	if bps <= 0 {
		return "unlimited"
	}
	return fmt.Sprintf("%g Mbit/s", float64(bps)/1e6)
}

// window is a timed window starting after a second (for the requests to
// reach every worker) and the warm-up.
func (c *coord) window(d time.Duration) (begin, end time.Time) {
	begin = time.Now().Add(time.Second + c.o.Warmup)
	return begin, begin.Add(d)
}

// storePhase measures puts and gets at each host count, repeat by
// repeat, so that the machine's noise spreads over every point.
func (c *coord) storePhase(ctx context.Context) error {
	for r := range c.o.Repeat {
		for _, n := range c.o.Hosts {
			for _, op := range []string{"put", "get"} {
				run, err := c.storeRun(ctx, op, n, r)
				if err != nil {
					return fmt.Errorf("%s at %d hosts: %w", op, n, err)
				}
				c.res.Store = append(c.res.Store, run)
				c.logf("store %s, %d hosts, run %d: %.1f MB/s (per host %.1f), cores busy %.2f (lab %.2f), %d packets dropped",
					op, n, r+1, run.MBps, run.MBps/float64(n), run.CPU.MachineBusy, run.CPU.Lab, run.Dropped)
			}
		}
	}
	return nil
}

func (c *coord) storeRun(_ context.Context, op string, n, r int) (storeRun, error) {
	active := c.stores[:n]
	m := max(n, 2)
	prefix := func(i int) string { return fmt.Sprintf("%s/n%d/r%d/c%d", op, n, r, i) }
	target := func(i int) string { return c.stores[(i+1)%m].addr }
	defer func() { _, _ = c.stores[0].call(request{Cmd: "clear"}) }()
	if op == "get" {
		if _, err := callAll(active, func(i int) request {
			return request{Cmd: "preload", Prefix: prefix(i), Target: target(i), Keys: c.o.GetKeys,
				ValueSize: c.o.Value, Batch: c.o.Batch}
		}); err != nil {
			return storeRun{}, err
		}
	}
	// What crosses the links between each client and its target, the
	// way the values go.
	crossed := func() (n uint64) {
		for i := range active {
			from, to := c.hosts[i], c.hosts[(i+1)%m]
			if op == "get" {
				from, to = to, from
			}
			n += c.lab.Stats(from, to).Bytes
		}
		return n
	}
	begin, end := c.window(c.o.Duration)
	cpu := c.sample(begin, end)
	drop0, crossed0 := c.dropped(), crossed()
	reps, err := callAll(active, func(i int) request {
		return request{Cmd: "run", Op: op, Prefix: prefix(i), Target: target(i), Keys: c.o.GetKeys,
			ValueSize: c.o.Value, Batch: c.o.Batch, Conc: c.o.Conc, Begin: begin.UnixNano(), End: end.UnixNano()}
	})
	if err != nil {
		return storeRun{}, err
	}
	run := storeRun{Op: op, Hosts: n, Repeat: r, CPU: <-cpu, Dropped: c.dropped() - drop0}
	// Values that moved without crossing a link were put on the putting
	// host: the master places a put elsewhere when the preferred segment
	// is full, and a figure with those bytes in it measures memcpy.
	var moved int64
	for _, rp := range reps {
		moved += int64(rp.Total) * int64(c.o.Value)
	}
	if links := crossed() - crossed0; uint64(moved) > links {
		return storeRun{}, fmt.Errorf("%s MB of values moved but only %s MB crossed the links: puts placed off their target (segment full? raise -segment)",
			strconv.FormatFloat(float64(moved)/1e6, 'f', 1, 64), strconv.FormatFloat(float64(links)/1e6, 'f', 1, 64))
	}
	for _, rp := range reps {
		mbps := rp.Bytes / c.o.Duration.Seconds() / 1e6
		run.PerHost = append(run.PerHost, mbps)
		run.MBps += mbps
	}
	return run, nil
}

// masterPhase loads the master from clients spread over every store host.
func (c *coord) masterPhase(ctx context.Context) error {
	const size = 4 << 10 // the objects are only named; their size does not matter
	hosts := c.stores
	if _, err := callAll(hosts, func(i int) request {
		return request{Cmd: "preload", Prefix: fmt.Sprintf("meta/c%d", i), Target: hosts[(i+1)%len(hosts)].addr,
			Keys: c.o.MetaKeys / len(hosts), ValueSize: size, Batch: c.o.MetaB}
	}); err != nil {
		return err
	}
	defer func() { _, _ = c.stores[0].call(request{Cmd: "clear"}) }()
	for r := range c.o.Repeat {
		for _, op := range []string{"exists", "replicas"} {
			run, err := c.masterRun(op, r, r == c.o.Repeat-1)
			if err != nil {
				return fmt.Errorf("%s: %w", op, err)
			}
			c.res.Master = append(c.res.Master, run)
			c.logf("master %s, %d clients x %d keys, run %d: %.0f calls/s, %.1f us master CPU per call, master %.2f cores, machine %.2f",
				op, run.Clients, run.Batch, r+1, run.CallsPerS, run.CPUPerCall, run.MasterCPU, run.CPU.MachineBusy)
		}
	}
	return nil
}

// masterRun is one window of op; profile takes a CPU profile of the
// master over it.
func (c *coord) masterRun(op string, r int, profile bool) (masterRun, error) {
	hosts := c.stores
	per := make([]int, len(hosts)) // clients per host
	for i := range c.o.MetaCli {
		per[i%len(hosts)]++
	}
	begin, end := c.window(c.o.MetaDur)
	cpu := c.sample(begin, end)
	mcpu := make(chan [2]int64, 1)
	prof := c.out + ".master-" + op + ".pprof"
	go func() {
		time.Sleep(time.Until(begin))
		cmd := "cpu"
		if profile {
			cmd = "profile"
		}
		a, _ := c.master.call(request{Cmd: cmd, Name: prof})
		time.Sleep(time.Until(end))
		if profile {
			cmd = "unprofile"
		}
		b, _ := c.master.call(request{Cmd: cmd})
		mcpu <- [2]int64{a.CPUNs, b.CPUNs}
	}()
	reps, err := callAll(hosts, func(i int) request {
		return request{Cmd: "meta", Op: op, Prefix: fmt.Sprintf("meta/c%d", i), Keys: c.o.MetaKeys / len(hosts),
			Batch: c.o.MetaB, Conc: per[i], Begin: begin.UnixNano(), End: end.UnixNano()}
	})
	m := <-mcpu
	if err != nil {
		return masterRun{}, err
	}
	run := masterRun{Op: op, Clients: c.o.MetaCli, Batch: c.o.MetaB, Repeat: r, CPU: <-cpu}
	var calls, keys float64
	for _, rp := range reps {
		calls += rp.Calls
		keys += rp.Keys
	}
	secs := c.o.MetaDur.Seconds()
	run.CallsPerS, run.KeysPerS = calls/secs, keys/secs
	run.MasterCPU = float64(m[1]-m[0]) / 1e9 / secs
	if calls > 0 {
		run.CPUPerCall = float64(m[1]-m[0]) / 1e3 / calls
	}
	if profile {
		run.Profile = pprofTop(prof)
	}
	return run, nil
}

// pprofTop is the head of go tool pprof -top of a profile, or why not.
func pprofTop(path string) string {
	out, err := exec.Command("go", "tool", "pprof", "-top", "-nodecount=25", path).CombinedOutput()
	if err != nil {
		return fmt.Sprintf("go tool pprof %s: %v: %s", path, err, out)
	}
	return string(out)
}

// p2pPhase fans an object out from a seed to every receiver, swarming
// and from the seed alone, run by run.
func (c *coord) p2pPhase(ctx context.Context) error {
	dir, err := os.MkdirTemp("", "mcgo-scale-etcd-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	// etcd is on the lab's local host, whose link is not limited: only
	// object records cross it.
	c.etcd, err = embedetcd.Start(dir, c.lab.Local().Addr(0), embedetcd.NoFsync())
	if err != nil {
		return err
	}
	c.etcdCli, err = clientv3.New(clientv3.Config{Endpoints: []string{c.etcd.Addr()}, DialTimeout: 10 * time.Second})
	if err != nil {
		return err
	}
	c.seed, err = c.lab.Host("seed")
	if err != nil {
		return err
	}
	c.seed.SetRate(c.o.Rate)
	for _, h := range append([]*netlab.Host{c.seed}, c.hosts[:c.o.P2PRecv]...) {
		p, err := startWorker(h, workerArgs{Role: roleP2P, IP: h.IP.String(), Etcd: c.etcd.Addr(),
			Buffer: c.o.P2PSize, Parallel: c.o.P2PPar, Lanes: c.o.Lanes, Trace: c.o.P2PTrace})
		if err != nil {
			return err
		}
		c.peers = append(c.peers, p)
	}
	c.logf("p2p: %s object in %s shards, seed %s, %d receivers", size(c.o.P2PSize), size(int64(c.o.P2PShard)), c.seed, c.o.P2PRecv)
	for r := range c.o.P2PRuns {
		for _, way := range c.o.P2PWays {
			run, err := c.p2pRun(way, r)
			if err != nil {
				return fmt.Errorf("%s: %w", way, err)
			}
			c.res.P2P = append(c.res.P2P, run)
			c.logf("p2p %s, run %d: %.2f s (ideal %.2f s), %d packets dropped, seed sent %.2f copies; every shard out of the seed at %.2f s, quarters of the copies at %.2f %.2f %.2f %.2f s",
				way, r+1, run.Seconds, c.ideal(), run.Dropped, run.SeedCopies, run.Seeded, run.Quarters[0], run.Quarters[1], run.Quarters[2], run.Quarters[3])
			c.logf("p2p %s, run %d, link use per %.1f s (tenths of the rate; + full): seed up %s, receivers down %s, up %s",
				way, r+1, run.Bin, tenths(run.SeedUp), tenths(run.RecvDown), tenths(run.RecvUp))
		}
	}
	return nil
}

// ideal is the fan-out's lower bound: every receiver takes in the whole
// object through its link.
func (c *coord) ideal() float64 { return float64(c.o.P2PSize) * 8 / float64(c.o.Rate) }

func (c *coord) p2pRun(way string, r int) (p2pRun, error) {
	seed, recv := c.peers[0], c.peers[1:]
	name := func(i int) string {
		if way == "swarm" {
			return fmt.Sprintf("swarm/%d", r)
		}
		return fmt.Sprintf("solo/%d/%d", r, i)
	}
	var names []string
	for i := range recv {
		if n := name(i); !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	s, err := seed.call(request{Cmd: "seed", Names: names, Shard: c.o.P2PShard})
	if err != nil {
		return p2pRun{}, err
	}
	defer func() { _, _ = seed.call(request{Cmd: "unseed", Names: names}) }()
	drop0, sent0 := c.dropped(), c.sent(c.seed)
	land := &landing{start: time.Now(), shards: int((c.o.P2PSize + int64(c.o.P2PShard) - 1) / int64(c.o.P2PShard)),
		seen: map[[2]string]bool{}, first: map[string]bool{}}
	wctx, stop := context.WithCancel(context.Background())
	watched := make(chan struct{})
	var followed sync.WaitGroup
	if way == "swarm" && c.etcdCli != nil {
		followed.Go(func() { land.follow(wctx, c.etcdCli, name(0), watched) })
		<-watched
	}
	land.start = time.Now()
	use := c.linkUse(wctx, land.start)
	reps, err := callAll(recv, func(i int) request { return request{Cmd: "fetch", Name: name(i)} })
	stop()
	followed.Wait()
	u := <-use
	if err != nil {
		return p2pRun{}, err
	}
	if _, err := callAll(recv, func(i int) request { return request{Cmd: "drop", Name: name(i)} }); err != nil {
		return p2pRun{}, err
	}
	run := p2pRun{Way: way, Repeat: r, Dropped: c.dropped() - drop0,
		SeedCopies: float64(c.sent(c.seed)-sent0) / float64(c.o.P2PSize)}
	run.Bin, run.SeedUp, run.RecvDown, run.RecvUp = useBin.Seconds(), u.seedUp, u.recvDown, u.recvUp
	first, last := reps[0].StartNs, reps[0].EndNs
	for i, rp := range reps {
		if rp.Sum != s.Sum {
			return p2pRun{}, fmt.Errorf("%s: receiver %d got bytes with CRC %08x, the seed's are %08x", way, i, rp.Sum, s.Sum)
		}
		first, last = min(first, rp.StartNs), max(last, rp.EndNs)
		run.PerHost = append(run.PerHost, rp.Seconds)
	}
	run.Seconds = float64(last-first) / 1e9
	if n := len(land.out); n > 0 {
		run.Seeded = land.seeded
		for q := range run.Quarters {
			run.Quarters[q] = land.out[max(0, (q+1)*n/4-1)]
		}
	}
	return run, nil
}

// useBin is the width of the bins of a P2P run's link use.
const useBin = 500 * time.Millisecond

// linkUse is the use of the P2P hosts' links over time, each a fraction
// of the rate per bin.
type linkUse struct{ seedUp, recvDown, recvUp []float64 }

// linkUse samples the lab's counters every useBin from start until ctx
// ends, then sends what the P2P hosts' links carried.
func (c *coord) linkUse(ctx context.Context, start time.Time) <-chan linkUse {
	out := make(chan linkUse, 1)
	recv := c.hosts[:c.o.P2PRecv]
	received := func() (n uint64) {
		for _, h := range recv {
			n += c.received(h)
		}
		return n
	}
	sent := func() (n uint64) {
		for _, h := range recv {
			n += c.sent(h)
		}
		return n
	}
	go func() {
		var u linkUse
		full := float64(c.o.Rate) / 8 * useBin.Seconds()
		seed0, down0, up0 := c.sent(c.seed), received(), sent()
		t := time.NewTicker(useBin)
		defer t.Stop()
		for done := false; !done; {
			select {
			case <-ctx.Done():
				done = true
			case <-t.C:
			}
			seed1, down1, up1 := c.sent(c.seed), received(), sent()
			n := float64(len(recv))
			u.seedUp = append(u.seedUp, float64(seed1-seed0)/full)
			u.recvDown = append(u.recvDown, float64(down1-down0)/full/n)
			u.recvUp = append(u.recvUp, float64(up1-up0)/full/n)
			seed0, down0, up0 = seed1, down1, up1
		}
		out <- u
	}()
	return out
}

// tenths writes fractions as one digit each, in tenths (rounded down), +
// for 0.95 and more.
func tenths(fs []float64) string {
	var b strings.Builder
	for _, f := range fs {
		switch {
		case f >= 0.95:
			b.WriteByte('+')
		default:
			b.WriteByte('0' + byte(max(0, min(9, int(f*10)))))
		}
	}
	return b.String()
}

func size(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}

// sample measures the CPU used between begin and end, sent once end has
// passed.
func (c *coord) sample(begin, end time.Time) <-chan cpuUse {
	out := make(chan cpuUse, 1)
	go func() {
		time.Sleep(time.Until(begin))
		stop := c.meter()
		time.Sleep(time.Until(end))
		out <- stop()
	}()
	return out
}

// meter starts measuring the CPU used; the function it returns says how
// much was used since.
func (c *coord) meter() func() cpuUse {
	pids := []int{os.Getpid()}
	for _, p := range append(append([]*proc{c.master}, c.stores...), c.peers...) {
		if p != nil {
			pids = append(pids, p.pid())
		}
	}
	m0, l0, t0 := machineBusy(), procsCPU(pids), time.Now()
	return func() cpuUse {
		m1, l1, t1 := machineBusy(), procsCPU(pids), time.Now()
		secs := t1.Sub(t0).Seconds()
		return cpuUse{MachineBusy: (m1 - m0) / secs, Lab: (l1 - l0) / secs}
	}
}

// clockTick is USER_HZ, the unit of /proc's CPU times (100 on Linux).
const clockTick = 100

// machineBusy is the seconds every CPU of the machine spent not idle.
func machineBusy() float64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal ...
	var busy float64
	for i, v := range f[1:] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		if i >= 8 { // guest times are already in user
			break
		}
		x, _ := strconv.ParseFloat(v, 64)
		busy += x
	}
	return busy / clockTick
}

// procsCPU is the user and system seconds of the processes.
func procsCPU(pids []int) float64 {
	var s float64
	for _, pid := range pids {
		b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
		if err != nil {
			continue
		}
		// Fields after the command's closing parenthesis: utime and stime
		// are the 12th and 13th.
		_, rest, _ := strings.Cut(string(b), ") ")
		f := strings.Fields(rest)
		if len(f) > 12 {
			u, _ := strconv.ParseFloat(f[11], 64)
			st, _ := strconv.ParseFloat(f[12], 64)
			s += (u + st) / clockTick
		}
	}
	return s
}

// landing follows the P2P record of an object in etcd from a receiver's
// point of view: it timestamps every (receiver, shard) pair as it is
// published, so a run says whether its time went to getting every shard
// out of the seed or to the exchange after.
type landing struct {
	start  time.Time
	shards int
	seen   map[[2]string]bool // (shard, segment)
	first  map[string]bool    // shards with a replica
	out    []float64          // seconds at which each pair was published
	seeded float64            // seconds at which every shard had a replica
}

type p2pRecord struct {
	Shards []struct {
		ReplicaList []struct {
			SegmentName string `json:"segment_name"`
		} `json:"replica_list"`
	} `json:"shards"`
}

// follow watches the object's key until ctx ends.
func (l *landing) follow(ctx context.Context, cli *clientv3.Client, name string, ready chan<- struct{}) {
	wc := cli.Watch(ctx, "mooncake/checkpoint/"+name)
	close(ready)
	for resp := range wc {
		for _, ev := range resp.Events {
			var r p2pRecord
			if json.Unmarshal(ev.Kv.Value, &r) != nil {
				continue
			}
			t := time.Since(l.start).Seconds()
			for i, sh := range r.Shards {
				for _, loc := range sh.ReplicaList {
					k := [2]string{strconv.Itoa(i), loc.SegmentName}
					if !l.seen[k] {
						l.seen[k] = true
						l.out = append(l.out, t)
					}
				}
				if len(sh.ReplicaList) > 0 && !l.first[strconv.Itoa(i)] {
					l.first[strconv.Itoa(i)] = true
					if len(l.first) == l.shards {
						l.seeded = t
					}
				}
			}
		}
	}
}
