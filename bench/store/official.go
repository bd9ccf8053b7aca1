package store

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/mooncake-go/mooncake/internal/hist"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ErrNoOfficial means the official Mooncake Store cannot be run here: no
// interpreter with the wheel, or the wheel does not import.
var ErrNoOfficial = errors.New("store: official Mooncake Store unavailable")

//go:embed official_store.py
var officialScript []byte

// OfficialConfig configures the official Mooncake Store yardstick.
type OfficialConfig struct {
	// Python is an interpreter that imports mooncake.store, from the PyPI
	// wheel mooncake-transfer-engine-non-cuda. Zero: $MOONCAKE_OFFICIAL_PYTHON,
	// else .venv-official/bin/python in the working directory or the
	// nearest parent that has one (`make deps` makes it at the root).
	Python string
	// Topology is where the objects live. Zero: Remote.
	//   - Remote: one storage process mounts the only segment; the clients
	//     mount none, so every byte crosses loopback TCP between processes.
	//   - Local: every client mounts a segment of its own, puts there
	//     (ReplicateConfig.preferred_segment) and reads only what it put, so
	//     the official client copies in memory and no byte crosses a socket.
	//     Each client then holds a working set of its own.
	Topology string
	// Capacity is the size of each segment that holds objects. Zero: what
	// every yardstick gets (twice a get run's working set, at least 512 MiB).
	Capacity int64
	// StartTimeout bounds each step of the start: the master listening, a
	// process's setup and its share of the preload. Zero: 60 s.
	StartTimeout time.Duration
}

// officialArgs is the JSON argument of official_store.py.
type officialArgs struct {
	Role        string  `json:"role"` // "storage" or "client"
	Master      string  `json:"master"`
	Metadata    string  `json:"metadata"`
	Segment     int64   `json:"segment"`
	LocalBuffer int64   `json:"local_buffer"`
	Op          string  `json:"op,omitempty"`
	ValueSize   int     `json:"value_size,omitempty"`
	Batch       int     `json:"batch,omitempty"`
	Keys        int     `json:"keys,omitempty"`
	Clients     int     `json:"clients,omitempty"`
	Index       int     `json:"index"`
	Prefix      string  `json:"prefix,omitempty"`
	Topology    string  `json:"topology,omitempty"`
	WarmupS     float64 `json:"warmup_s"`
	DurationS   float64 `json:"duration_s"`
	LatPath     string  `json:"lat_path,omitempty"`
}

// officialLocalBuffer is each process's local_buffer_size: the zero-copy
// calls the driver makes never stage through it.
const officialLocalBuffer = 16 << 20

// RunOfficial measures one run of o against a fresh official Mooncake Store
// on this host, and stops it: its mooncake_master (the binary in the wheel,
// with its HTTP metadata server, on free loopback ports), a storage process
// for the Remote topology, and Clients client processes, one Python
// interpreter each so that no client waits on another's GIL. Every client
// makes the same calls Drive would make (official_store.py), one
// batch_put_from or batch_get_into on registered memory per batch (put_from
// or get_into for a batch of one), with protocol "tcp"; it times each call
// with perf_counter_ns and hands the latencies back through a file.
func RunOfficial(ctx context.Context, o Options, cfg OfficialConfig) (res Result, err error) {
	if err := o.Validate(); err != nil {
		return Result{}, err
	}
	o = o.WithDefaults()
	if cfg.Topology == "" {
		cfg.Topology = Remote
	}
	if cfg.Topology != Remote && cfg.Topology != Local {
		return Result{}, fmt.Errorf("store: OfficialConfig.Topology %q (want %s or %s)", cfg.Topology, Remote, Local)
	}
	if cfg.Capacity == 0 {
		cfg.Capacity = o.capacity()
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = 60 * time.Second
	}
	py, master, err := officialPython(ctx, cfg.Python)
	if err != nil {
		return Result{}, err
	}
	dir, err := os.MkdirTemp("", "mcbench-official-")
	if err != nil {
		return Result{}, err
	}
	defer func() { err = errors.Join(err, os.RemoveAll(dir)) }()
	script := filepath.Join(dir, "official_store.py")
	if err := os.WriteFile(script, officialScript, 0o644); err != nil {
		return Result{}, err
	}

	ports, err := freePorts(3)
	if err != nil {
		return Result{}, err
	}
	rpc := net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))
	meta := net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[2]))
	// Loopback only, and fewer log lines, so its errors stay in the tail
	// we keep.
	env := []string{"MC_TCP_BIND_ADDRESS=127.0.0.1", "GLOG_minloglevel=1"}
	m, err := startProc("mooncake_master", master, []string{
		"--rpc_address=127.0.0.1", "--rpc_port=" + strconv.Itoa(ports[0]),
		"--metrics_host=127.0.0.1", "--metrics_port=" + strconv.Itoa(ports[1]),
		"--enable_http_metadata_server=true", "--http_metadata_server_host=127.0.0.1",
		"--http_metadata_server_port=" + strconv.Itoa(ports[2]),
	}, env, false)
	if err != nil {
		return Result{}, err
	}
	// Stopped last, after every process that talks to it, and killed: it
	// keeps nothing (no HA, no snapshots), and would take seconds to stop.
	m.stop = syscall.SIGKILL
	defer m.Close()
	for _, addr := range []string{rpc, meta} {
		if err := waitTCP(ctx, m, addr, cfg.StartTimeout); err != nil {
			return Result{}, err
		}
	}

	base := officialArgs{Master: rpc, Metadata: "http://" + meta + "/metadata", LocalBuffer: officialLocalBuffer}
	var ready struct {
		Ready    bool   `json:"ready"`
		Hostname string `json:"hostname"`
	}
	if cfg.Topology == Remote {
		a := base
		a.Role, a.Segment = "storage", cfg.Capacity
		s, err := startPython(py, script, "official storage", a, env)
		if err != nil {
			return Result{}, err
		}
		defer s.Close()
		if err := s.recv(ctx, cfg.StartTimeout, &ready); err != nil {
			return Result{}, err
		}
	}

	clients := make([]*proc, 0, o.Clients)
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	for i := range o.Clients {
		a := base
		a.Role, a.Index = "client", i
		a.Op, a.ValueSize, a.Batch, a.Keys, a.Clients = o.Op, o.ValueSize, o.BatchSize, o.Keys, o.Clients
		a.Prefix, a.Topology = o.KeyPrefix, cfg.Topology
		a.WarmupS, a.DurationS = o.Warmup.Seconds(), o.Duration.Seconds()
		a.LatPath = filepath.Join(dir, fmt.Sprintf("lat-%d", i))
		if cfg.Topology == Local {
			a.Segment = cfg.Capacity
		}
		c, err := startPython(py, script, fmt.Sprintf("official client %d", i), a, env)
		if err != nil {
			return Result{}, err
		}
		clients = append(clients, c)
	}
	// They set up and preload at once; each answers when done.
	for _, c := range clients {
		if err := c.recv(ctx, cfg.StartTimeout, &ready); err != nil {
			return Result{}, err
		}
	}
	for _, c := range clients {
		if err := c.send("go"); err != nil {
			return Result{}, err
		}
	}
	var all hist.Histogram
	for i, c := range clients {
		var done struct {
			Calls   uint64  `json:"calls"`
			Ops     uint64  `json:"ops"`
			Seconds float64 `json:"seconds"`
		}
		if err := c.recv(ctx, o.Warmup+o.Duration+cfg.StartTimeout, &done); err != nil {
			return Result{}, err
		}
		n, err := readLatencies(filepath.Join(dir, fmt.Sprintf("lat-%d", i)), &all)
		if err != nil {
			return Result{}, c.fail(err)
		}
		if n != done.Calls || done.Ops != done.Calls*uint64(o.BatchSize) {
			return Result{}, c.fail(fmt.Errorf("%d calls and %d ops reported, %d latencies written", done.Calls, done.Ops, n))
		}
		res.Calls += done.Calls
		// All started together on "go"; the clock is the slowest one's.
		res.Seconds = max(res.Seconds, done.Seconds)
	}
	res.Name, res.Topology = Official, cfg.Topology
	res.fill(o, &all)
	return res, nil
}

// startPython starts official_store.py with its argument.
func startPython(py, script, name string, a officialArgs, env []string) (*proc, error) {
	arg, err := json.Marshal(a)
	if err != nil {
		return nil, err
	}
	return startProc(name, py, []string{script, string(arg)}, env, true)
}

// readLatencies records the int64 nanoseconds in the file at path and
// returns how many there were.
func readLatencies(path string, h *hist.Histogram) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	if len(b)%8 != 0 {
		return 0, fmt.Errorf("latency file of %d bytes", len(b))
	}
	for i := 0; i < len(b); i += 8 {
		// Python's array("q") writes in the machine's order; ours is
		// little-endian wherever the wheel exists (x86-64, arm64).
		h.Record(time.Duration(binary.LittleEndian.Uint64(b[i:])), 1)
	}
	return uint64(len(b) / 8), nil
}

// officialPython finds the interpreter (see OfficialConfig.Python), checks
// that it imports mooncake.store and returns it with the mooncake_master
// binary of the wheel. That binary rather than the console script of the
// same name: the script would run it as a child, which stopping the script
// would orphan.
func officialPython(ctx context.Context, py string) (python, master string, err error) {
	if py == "" {
		py = os.Getenv("MOONCAKE_OFFICIAL_PYTHON")
	}
	if py == "" {
		dir, err := os.Getwd()
		if err != nil {
			return "", "", err
		}
		for {
			p := filepath.Join(dir, ".venv-official", "bin", "python")
			if _, err := os.Stat(p); err == nil {
				py = p
				break
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				return "", "", fmt.Errorf("%w: no .venv-official/bin/python here or above (run `make deps`, or set MOONCAKE_OFFICIAL_PYTHON)", ErrNoOfficial)
			}
			dir = parent
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, py, "-c", "import os, mooncake, mooncake.store; print(os.path.dirname(mooncake.__file__))")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		err = fmt.Errorf("%w: %s -c 'import mooncake.store': %v", ErrNoOfficial, py, err)
		// The last line names the cause, e.g. a shared library not found.
		if lines := strings.Split(strings.TrimSpace(stderr.String()), "\n"); lines[len(lines)-1] != "" {
			err = fmt.Errorf("%w: %s", err, lines[len(lines)-1])
		}
		return "", "", err
	}
	master = filepath.Join(strings.TrimSpace(stdout.String()), "mooncake_master")
	if _, err := os.Stat(master); err != nil {
		return "", "", fmt.Errorf("%w: the wheel has no mooncake_master: %v", ErrNoOfficial, err)
	}
	return py, master, nil
}
