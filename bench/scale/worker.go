package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/internal/netlab"
	"github.com/mooncake-go/mooncake/store/client"
	"github.com/mooncake-go/mooncake/store/master"
	"github.com/mooncake-go/mooncake/store/p2p"
)

// A worker is this program again, started on an emulated host: it runs
// one role there (a master, a storage node with its client, or a P2P
// store node) and answers the coordinator's requests, one JSON line in
// and one JSON line out each. Its sockets are the host's since the whole
// process is in the host's namespace.

// envWorker holds a worker's arguments (JSON); its presence makes the
// program a worker.
const envWorker = "MC_SCALE_WORKER"

// Worker roles.
const (
	roleMaster = "master"
	roleStore  = "store"
	roleP2P    = "p2p"
)

// workerArgs configures a worker.
type workerArgs struct {
	Role     string `json:"role"`
	IP       string `json:"ip"`                 // the host's address
	Master   string `json:"master,omitempty"`   // store: the master's address
	Segment  int64  `json:"segment,omitempty"`  // store: the node's segment
	Buffer   int64  `json:"buffer,omitempty"`   // store: registered value memory; p2p: the object's size
	Etcd     string `json:"etcd,omitempty"`     // p2p: the metadata
	Parallel int    `json:"parallel,omitempty"` // p2p: shards in flight per receiver
	Lanes    int    `json:"lanes,omitempty"`    // the engine's TCP connections per peer
	Trace    bool   `json:"trace,omitempty"`    // p2p: log every shard read to standard error
	// master: how long a replica list protects an object (0: the
	// master's default): a get that outlives it fails.
	LeaseTTL time.Duration `json:"lease_ttl,omitempty"`
	// store: the engine's deadline for each request (0: 30 s).
	Timeout time.Duration `json:"timeout,omitempty"`
	Slice   uint64        `json:"slice,omitempty"` // store: the engine's SliceSize (0: its default)
}

// request is one thing the coordinator asks a worker to do.
type request struct {
	Cmd string `json:"cmd"`

	// store: run, preload, meta
	Op        string   `json:"op,omitempty"`     // put or get; exists or replicas for meta
	Prefix    string   `json:"prefix,omitempty"` // of the keys
	Target    string   `json:"target,omitempty"` // the segment puts go to
	Keys      int      `json:"keys,omitempty"`   // preload's count; get's and meta's working set
	ValueSize int      `json:"value_size,omitempty"`
	Batch     int      `json:"batch,omitempty"`
	Conc      int      `json:"conc,omitempty"` // calls in flight (meta: clients)
	Begin     int64    `json:"begin,omitempty"`
	End       int64    `json:"end,omitempty"` // the timed window, Unix ns
	Names     []string `json:"names,omitempty"`
	Name      string   `json:"name,omitempty"`
	Shard     uint64   `json:"shard,omitempty"`
	Stripes   int      `json:"stripes,omitempty"` // sput: pieces per replica
}

// reply is a worker's answer; Err set means the request failed.
type reply struct {
	Err     string  `json:"err,omitempty"`
	Addr    string  `json:"addr,omitempty"`  // master: its address; store and p2p: the node's segment
	Calls   float64 `json:"calls,omitempty"` // in the window, see window
	Bytes   float64 `json:"bytes,omitempty"`
	Keys    float64 `json:"keys,omitempty"`
	Total   int     `json:"total,omitempty"` // objects of every call of the run, in the window or not
	StartNs int64   `json:"start_ns,omitempty"`
	EndNs   int64   `json:"end_ns,omitempty"`
	CPUNs   int64   `json:"cpu_ns,omitempty"`
	Sum     uint32  `json:"sum,omitempty"`
	Seconds float64 `json:"seconds,omitempty"`
	Pieces  []piece `json:"pieces,omitempty"` // stripes: the replica's pieces
}

// workerMain runs a worker until its standard input closes.
func workerMain() int {
	var a workerArgs
	if err := json.Unmarshal([]byte(os.Getenv(envWorker)), &a); err != nil {
		fmt.Fprintln(os.Stderr, "scale worker: args:", err)
		return 2
	}
	ctx := context.Background()
	var (
		h   handler
		err error
	)
	switch a.Role {
	case roleMaster:
		h, err = newMasterWorker(a)
	case roleStore:
		h, err = newStoreWorker(ctx, a)
	case roleP2P:
		h, err = newP2PWorker(ctx, a)
	default:
		err = fmt.Errorf("role %q", a.Role)
	}
	out := json.NewEncoder(os.Stdout)
	if err != nil {
		_ = out.Encode(reply{Err: fmt.Sprintf("%s on %s: %v", a.Role, a.IP, err)})
		return 1
	}
	defer h.close()
	_ = out.Encode(reply{Addr: h.addr()})
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	for in.Scan() {
		var req request
		r := reply{}
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			r.Err = err.Error()
		} else if r, err = h.do(ctx, req); err != nil {
			r.Err = fmt.Sprintf("%s on %s: %s: %v", a.Role, a.IP, req.Cmd, err)
		}
		if err := out.Encode(r); err != nil {
			return 1
		}
	}
	return 0
}

type handler interface {
	addr() string
	do(ctx context.Context, req request) (reply, error)
	close()
}

// cpuTime is this process's user and system time.
func cpuTime() int64 {
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

var quiet = slog.New(slog.DiscardHandler)

// masterWorker is the store's master, alone in its process so that its
// CPU time is its own.
type masterWorker struct {
	m    *master.Server
	prof *os.File
}

func newMasterWorker(a workerArgs) (*masterWorker, error) {
	m, err := master.Start(master.ServerConfig{Listen: a.IP + ":0", Logger: quiet,
		Service: master.ServiceConfig{LeaseTTL: a.LeaseTTL}})
	if err != nil {
		return nil, err
	}
	return &masterWorker{m: m}, nil
}

func (w *masterWorker) addr() string { return w.m.Addr() }
func (w *masterWorker) close()       { _ = w.m.Close() }

func (w *masterWorker) do(_ context.Context, req request) (reply, error) {
	switch req.Cmd {
	case "cpu":
		return reply{CPUNs: cpuTime()}, nil
	case "profile":
		if w.prof != nil {
			return reply{}, errors.New("a profile is running")
		}
		f, err := os.Create(req.Name)
		if err != nil {
			return reply{}, err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			_ = f.Close()
			return reply{}, err
		}
		w.prof = f
		return reply{CPUNs: cpuTime()}, nil
	case "unprofile":
		if w.prof == nil {
			return reply{}, errors.New("no profile running")
		}
		pprof.StopCPUProfile()
		err := w.prof.Close()
		w.prof = nil
		return reply{CPUNs: cpuTime()}, err
	}
	return reply{}, fmt.Errorf("unknown command")
}

// storeWorker is a storage node and its client in one process (a client
// with a segment, as Mooncake's are): its segment holds what the
// neighbour's client puts, its client puts into and gets from the
// neighbour's segment.
type storeWorker struct {
	a    workerArgs
	c    *client.Client
	mem  []byte
	meta []*client.Client // the master benchmark's clients, made on demand
	seq  atomic.Int64     // numbers the keys of puts
}

func newStoreWorker(ctx context.Context, a workerArgs) (*storeWorker, error) {
	c, err := client.New(ctx, client.Config{Master: a.Master, SegmentSize: a.Segment, LocalBufferSize: 16 << 20,
		RPCTimeout: 10 * time.Second,
		EngineConfig: engine.Config{Host: a.IP, Transport: "tcp", Lanes: a.Lanes, Timeout: cmp.Or(a.Timeout, 30*time.Second),
			SliceSize: a.Slice, Logger: quiet}})
	if err != nil {
		return nil, err
	}
	w := &storeWorker{a: a, c: c, mem: make([]byte, a.Buffer)}
	for i := range w.mem {
		w.mem[i] = byte(i*7 + i>>12)
	}
	if err := c.RegisterBuffer(w.mem); err != nil {
		_ = c.Close()
		return nil, err
	}
	return w, nil
}

func (w *storeWorker) addr() string { return w.c.SegmentName() }

func (w *storeWorker) close() {
	for _, m := range w.meta {
		_ = m.Close()
	}
	_ = w.c.Close()
}

// bufs is slot's batch of value buffers, out of the registered memory.
func (w *storeWorker) bufs(slot, batch, size int) ([][]byte, error) {
	if (slot+1)*batch*size > len(w.mem) {
		return nil, fmt.Errorf("%d calls of %d x %d bytes need more than the %d bytes registered", slot+1, batch, size, len(w.mem))
	}
	out := make([][]byte, batch)
	for i := range out {
		off := (slot*batch + i) * size
		out[i] = w.mem[off : off+size : off+size]
	}
	return out, nil
}

func key(prefix string, i int) string { return fmt.Sprintf("%s/%08d", prefix, i) }

func (w *storeWorker) do(ctx context.Context, req request) (reply, error) {
	switch req.Cmd {
	case "preload":
		return w.preload(ctx, req)
	case "run":
		return w.run(ctx, req)
	case "meta":
		return w.metaLoad(ctx, req)
	case "clear":
		_, err := w.c.RemoveAll(ctx, true)
		return reply{}, err
	case "sput", "sclear", "sget", "ssum":
		return w.stripeDo(ctx, req)
	}
	return reply{}, fmt.Errorf("unknown command")
}

func (w *storeWorker) rc(target string) *client.ReplicateConfig {
	return &client.ReplicateConfig{Replicas: 1, PreferredSegments: []string{target}}
}

// preload puts Keys objects under Prefix into Target's segment.
func (w *storeWorker) preload(ctx context.Context, req request) (reply, error) {
	bufs, err := w.bufs(0, req.Batch, req.ValueSize)
	if err != nil {
		return reply{}, err
	}
	for i := 0; i < req.Keys; i += req.Batch {
		n := min(req.Batch, req.Keys-i)
		keys := make([]string, n)
		for j := range keys {
			keys[j] = key(req.Prefix, i+j)
		}
		if err := errors.Join(w.c.BatchPut(ctx, keys, bufs[:n], w.rc(req.Target))...); err != nil {
			return reply{}, err
		}
	}
	return reply{}, w.placed(ctx, key(req.Prefix, 0), req.Target)
}

// placed checks that k lives in the target segment: the master places a
// put elsewhere when the preferred segment is full, and bytes that do not
// cross the links would not be what the benchmark measures.
func (w *storeWorker) placed(ctx context.Context, k, target string) error {
	reps, errs := w.c.BatchReplicas(ctx, []string{k})
	if errs[0] != nil {
		return errs[0]
	}
	if m := reps[0][0].GetMemory(); m == nil || m.SegmentName != target {
		return fmt.Errorf("%s placed on %v, not on %s (segment full? raise -segment)", k, reps[0][0], target)
	}
	return nil
}

// window counts the calls and objects of the timed window [Begin, End).
// A call that straddles an edge counts for the part of it inside, as if
// its objects moved evenly over its time: whole calls of megabytes, on a
// link of a hundred megabits, would otherwise count a third of a second
// or none by the luck of where the edge falls.
type window struct {
	begin, end time.Time

	mu             sync.Mutex
	calls, objects float64
	total          int // objects of every call, in the window or not
}

func (w *window) done(start, end time.Time, objects int) {
	w.mu.Lock()
	w.total += objects
	w.mu.Unlock()
	from, to := start, end
	if from.Before(w.begin) {
		from = w.begin
	}
	if to.After(w.end) {
		to = w.end
	}
	if !to.After(from) {
		return
	}
	part := 1.0
	if d := end.Sub(start); d > 0 {
		part = float64(to.Sub(from)) / float64(d)
	}
	w.mu.Lock()
	w.calls += part
	w.objects += part * float64(objects)
	w.mu.Unlock()
}

// loop runs conc copies of call from now until End, and counts the calls
// and objects completed in the window; it returns the first error.
func loop(ctx context.Context, req request, conc int, call func(ctx context.Context, slot, n int) (int, error)) (reply, error) {
	win := &window{begin: time.Unix(0, req.Begin), end: time.Unix(0, req.End)}
	cpu0 := cpuTime()
	var (
		wg    sync.WaitGroup
		first atomic.Pointer[error]
	)
	for slot := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; time.Now().Before(win.end); n++ {
				start := time.Now()
				objects, err := call(ctx, slot, n)
				if err != nil {
					first.CompareAndSwap(nil, &err)
					return
				}
				win.done(start, time.Now(), objects)
			}
		}()
	}
	wg.Wait()
	if e := first.Load(); e != nil {
		return reply{}, *e
	}
	return reply{Calls: win.calls, Keys: win.objects, Total: win.total, CPUNs: cpuTime() - cpu0}, nil
}

// run puts new objects into Target's segment, or gets the Keys objects
// preloaded under Prefix, Conc calls of Batch objects at a time.
func (w *storeWorker) run(ctx context.Context, req request) (reply, error) {
	slots := make([][][]byte, req.Conc)
	for i := range slots {
		b, err := w.bufs(i, req.Batch, req.ValueSize)
		if err != nil {
			return reply{}, err
		}
		slots[i] = b
	}
	rc := w.rc(req.Target)
	r, err := loop(ctx, req, req.Conc, func(ctx context.Context, slot, n int) (int, error) {
		keys := make([]string, req.Batch)
		switch req.Op {
		case "put":
			for j := range keys {
				keys[j] = key(req.Prefix, int(w.seq.Add(1)))
			}
			return len(keys), errors.Join(w.c.BatchPut(ctx, keys, slots[slot], rc)...)
		case "get":
			for j := range keys {
				keys[j] = key(req.Prefix, ((n*req.Conc+slot)*req.Batch+j)%req.Keys)
			}
			got, errs := w.c.BatchGetInto(ctx, keys, slots[slot])
			for j, g := range got {
				if errs[j] == nil && g != req.ValueSize {
					errs[j] = fmt.Errorf("%s: %d bytes, want %d", keys[j], g, req.ValueSize)
				}
			}
			return len(keys), errors.Join(errs...)
		}
		return 0, fmt.Errorf("op %q", req.Op)
	})
	r.Bytes = r.Keys * float64(req.ValueSize)
	return r, err
}

// metaLoad runs Conc clients without segments, each calling the master
// with batches of Batch keys out of the Keys preloaded under Prefix:
// BatchExistKey (op exists) or BatchGetReplicaList (op replicas).
func (w *storeWorker) metaLoad(ctx context.Context, req request) (reply, error) {
	for len(w.meta) < req.Conc {
		c, err := client.New(ctx, client.Config{Master: w.a.Master, SegmentSize: client.NoSegment,
			LeaseCache: client.NoLeaseCache, RPCTimeout: 10 * time.Second,
			EngineConfig: engine.Config{Host: w.a.IP, Transport: "tcp", Logger: quiet}})
		if err != nil {
			return reply{}, err
		}
		w.meta = append(w.meta, c)
	}
	return loop(ctx, req, req.Conc, func(ctx context.Context, slot, n int) (int, error) {
		keys := make([]string, req.Batch)
		for j := range keys {
			keys[j] = key(req.Prefix, ((n*req.Conc+slot)*req.Batch+j)%req.Keys)
		}
		var errs []error
		c := w.meta[slot]
		switch req.Op {
		case "exists":
			var ok []bool
			ok, errs = c.BatchExist(ctx, keys)
			for j := range ok {
				if errs[j] == nil && !ok[j] {
					errs[j] = fmt.Errorf("%s: missing", keys[j])
				}
			}
		case "replicas":
			_, errs = c.BatchReplicas(ctx, keys)
		default:
			return 0, fmt.Errorf("op %q", req.Op)
		}
		return len(keys), errors.Join(errs...)
	})
}

// p2pWorker is a P2P store node with one buffer the size of the object:
// the seed serves it, a receiver fetches into it.
type p2pWorker struct {
	s   *p2p.Store
	buf *engine.Buffer
}

func newP2PWorker(ctx context.Context, a workerArgs) (*p2pWorker, error) {
	log := quiet
	if a.Trace {
		// The store logs each shard read (source, start, duration) at
		// debug level; the engine stays quiet.
		log = slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("host", a.IP)
	}
	s, err := p2p.New(ctx, p2p.Config{Metadata: a.Etcd, Timeout: time.Minute, Concurrency: a.Parallel, Logger: log,
		EngineConfig: engine.Config{Host: a.IP, Transport: "tcp", Lanes: a.Lanes, Logger: quiet}})
	if err != nil {
		return nil, err
	}
	buf, err := s.Engine().AllocateBuffer(ctx, int(a.Buffer), "cpu:0")
	if err != nil {
		_ = s.Close()
		return nil, err
	}
	return &p2pWorker{s: s, buf: buf}, nil
}

func (w *p2pWorker) addr() string { return w.s.LocalServerName() }

func (w *p2pWorker) close() {
	_ = w.s.Close()
	_ = w.buf.Free()
}

func (w *p2pWorker) span() ([]uintptr, []uint64) {
	return []uintptr{w.buf.Addr()}, []uint64{uint64(w.buf.Len())}
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func (w *p2pWorker) do(ctx context.Context, req request) (reply, error) {
	addrs, sizes := w.span()
	switch req.Cmd {
	case "seed":
		// Every name is the same bytes: the seed-only yardstick gives
		// each receiver a swarm of its own.
		b := w.buf.Bytes()
		for i := range b {
			b[i] = byte(i*13 + i>>16)
		}
		for _, name := range req.Names {
			if err := w.s.Register(ctx, name, addrs, sizes, req.Shard, "cpu:0", true); err != nil {
				return reply{}, err
			}
		}
		return reply{Sum: crc32.Checksum(b, castagnoli)}, nil
	case "unseed":
		var errs []error
		for _, name := range req.Names {
			errs = append(errs, w.s.Unregister(ctx, name))
		}
		return reply{}, errors.Join(errs...)
	case "fetch":
		clear(w.buf.Bytes())
		start := time.Now()
		if err := w.s.GetReplica(ctx, req.Name, addrs, sizes); err != nil {
			return reply{}, err
		}
		end := time.Now()
		return reply{StartNs: start.UnixNano(), EndNs: end.UnixNano(), Seconds: end.Sub(start).Seconds(),
			Sum: crc32.Checksum(w.buf.Bytes(), castagnoli)}, nil
	case "drop":
		return reply{}, w.s.DeleteReplica(ctx, req.Name)
	}
	return reply{}, fmt.Errorf("unknown command")
}

// proc is a worker as the coordinator sees it.
type proc struct {
	name string
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *json.Decoder
	addr string // from its first reply
}

// startWorker starts a worker for a on h and waits for it to be ready.
func startWorker(h *netlab.Host, a workerArgs) (*proc, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	js, err := json.Marshal(a)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), envWorker+"="+string(js))
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := h.Start(cmd); err != nil {
		return nil, fmt.Errorf("start %s worker on %s: %w", a.Role, h, err)
	}
	p := &proc{name: a.Role + "@" + h.Name, cmd: cmd, in: in, out: json.NewDecoder(out)}
	var r reply
	if err := p.out.Decode(&r); err != nil || r.Err != "" {
		p.close()
		return nil, fmt.Errorf("%s: not ready: %v%s", p.name, err, r.Err)
	}
	p.addr = r.Addr
	return p, nil
}

// call sends req and waits for the answer.
func (p *proc) call(req request) (reply, error) {
	js, _ := json.Marshal(req)
	if _, err := p.in.Write(append(js, '\n')); err != nil {
		return reply{}, fmt.Errorf("%s: %w", p.name, err)
	}
	var r reply
	if err := p.out.Decode(&r); err != nil {
		return reply{}, fmt.Errorf("%s: %s: %w", p.name, req.Cmd, err)
	}
	if r.Err != "" {
		return r, errors.New(r.Err)
	}
	return r, nil
}

// pid is the worker's process id.
func (p *proc) pid() int { return p.cmd.Process.Pid }

// close ends the worker: its input closes, so it closes its store and
// exits; it is killed if it has not within a few seconds.
func (p *proc) close() {
	_ = p.in.Close()
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
	}
}

// callAll sends each worker its request at once and waits for every answer.
func callAll(ps []*proc, req func(i int) request) ([]reply, error) {
	out := make([]reply, len(ps))
	errs := make([]error, len(ps))
	var wg sync.WaitGroup
	for i, p := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i], errs[i] = p.call(req(i))
		}()
	}
	wg.Wait()
	return out, errors.Join(errs...)
}
