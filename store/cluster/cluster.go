// Package cluster starts a whole Mooncake Store on one machine: an
// embedded etcd, one or more masters (HA, journaling to that etcd) and
// storage nodes that contribute DRAM, in this process or as child
// processes. `mooncake up`, the store benchmark and the trace replay run on
// it; production spreads the same pieces over machines.
//
//	c, _ := cluster.Start(ctx, cluster.Config{Nodes: 2, NodeSegment: 1 << 30})
//	defer c.Close()
//	cli, _ := client.New(ctx, client.Config{Master: c.MasterURL()})
package cluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/internal/embedetcd"
	"github.com/mooncake-go/mooncake/internal/secure"
	"github.com/mooncake-go/mooncake/store/client"
	"github.com/mooncake-go/mooncake/store/master"
)

// Config configures a Cluster. Zero values are the all-in-one defaults.
type Config struct {
	// Dir holds etcd's data. Zero: a temporary directory removed by Close.
	Dir string
	// Etcd is etcd's client address. Zero: "127.0.0.1:0" (a free port).
	Etcd string
	// EtcdFsync makes the embedded etcd fsync its log. Zero: it does not,
	// since on one machine a crash loses the DRAM pool the journal
	// describes anyway (see embedetcd.NoFsync).
	EtcdFsync bool
	// Masters is the number of masters. Zero: 1.
	Masters int
	// SyncEtcd makes the masters answer puts only once etcd has their
	// journal records, never on a standby's acknowledgement
	// (master.HAConfig.SyncEtcd).
	SyncEtcd bool
	// NoHA runs a single master without etcd election and journal (and
	// without etcd at all). Masters must then be 1.
	NoHA bool
	// MasterListen and Admin are the first master's gRPC and admin HTTP
	// addresses; further masters take free ports. Zero: free ports.
	MasterListen, Admin string
	// Service configures every master's metadata service.
	Service master.ServiceConfig
	// KVEvents, when set, makes the masters publish KV events (the leader
	// does): the first on the configured endpoints, the others on free
	// ports of the same hosts. Zero: none.
	KVEvents *master.KVEventsConfig
	// Nodes is the number of storage nodes. Zero: 1; NoNodes for none.
	Nodes int
	// NodeSegment is each node's contribution. Zero: 1 GiB.
	NodeSegment int64
	// NodeCommand, when set, runs each node as a child process: the
	// command line of `mooncake node` (the flags --master and
	// --global_segment_size are appended). Zero: nodes run in this process.
	NodeCommand []string
	// NodeStderr receives the child-process nodes' stderr, their logs.
	// Zero: this process's stderr.
	NodeStderr io.Writer
	// Engine configures in-process nodes' engines.
	Engine engine.Config
	// Logger receives progress. Zero: slog.Default().
	Logger *slog.Logger
	// Token, when set, is required by the masters and presented by the
	// nodes (to child processes through MC_AUTH_TOKEN, not their command
	// line). Zero: none.
	Token string
	// TLS, when set (secure.Generate), makes the masters serve mutual TLS
	// with its server certificate and the nodes dial them with its client
	// certificate. Zero: plaintext. The embedded etcd stays plaintext, on
	// the address it is given (loopback by default).
	TLS secure.Files
}

// NoNodes as Config.Nodes: a cluster of masters only.
const NoNodes = -1

// Cluster is a running store.
type Cluster struct {
	cfg     Config
	etcd    *embedetcd.Etcd
	tmp     string
	Masters []*master.Server
	Nodes   []*client.Client // in-process nodes
	procs   []*exec.Cmd      // child-process nodes
	// NodeSegments names every node's segment, in order.
	NodeSegments []string
}

// AddrInUseError is a Start that found one of its addresses held by
// another socket. errors.Is(err, syscall.EADDRINUSE) holds for it.
type AddrInUseError struct {
	What string // "etcd client", "master rpc" or "master metrics"
	Addr string
}

func (e *AddrInUseError) Error() string { return e.What + " address " + e.Addr + " in use" }

// Unwrap is the errno, so callers need not know this type.
func (e *AddrInUseError) Unwrap() error { return syscall.EADDRINUSE }

// Start starts the cluster and returns once every node has mounted its
// segment. A failure at any step stops what the steps before it started
// (nodes, masters, etcd and its temporary directory) before Start returns.
func Start(ctx context.Context, cfg Config) (_ *Cluster, err error) {
	if cfg.Masters == 0 {
		cfg.Masters = 1
	}
	if cfg.NoHA && cfg.Masters != 1 {
		return nil, errors.New("cluster: several masters need HA")
	}
	switch {
	case cfg.Nodes == 0:
		cfg.Nodes = 1
	case cfg.Nodes == NoNodes:
		cfg.Nodes = 0
	case cfg.Nodes < 0:
		return nil, fmt.Errorf("cluster: Nodes %d is negative", cfg.Nodes)
	}
	if cfg.NodeSegment == 0 {
		cfg.NodeSegment = 1 << 30
	}
	if cfg.Etcd == "" {
		cfg.Etcd = "127.0.0.1:0"
	}
	if cfg.MasterListen == "" {
		cfg.MasterListen = "127.0.0.1:0"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	// c, not the named result: a failing return sets that to nil before
	// the deferred Close runs.
	c := &Cluster{cfg: cfg}
	defer func() {
		if err != nil {
			_ = c.Close()
		}
	}()
	if !cfg.NoHA {
		if err := c.startEtcd(); err != nil {
			return nil, err
		}
	}
	for i := range cfg.Masters {
		if err := c.startMaster(i); err != nil {
			return nil, err
		}
	}
	if err := c.waitLeader(ctx); err != nil {
		return nil, err
	}
	for i := range cfg.Nodes {
		if err := c.startNode(ctx, i); err != nil {
			return nil, fmt.Errorf("cluster: node %d: %w", i, err)
		}
	}
	return c, nil
}

func (c *Cluster) startEtcd() error {
	dir := c.cfg.Dir
	if dir == "" {
		tmp, err := os.MkdirTemp("", "mooncake-etcd-")
		if err != nil {
			return fmt.Errorf("cluster: etcd data directory: %w", err)
		}
		c.tmp, dir = tmp, tmp
	}
	var opts []embedetcd.Option
	if !c.cfg.EtcdFsync {
		opts = append(opts, embedetcd.NoFsync())
	}
	e, err := embedetcd.Start(dir, c.cfg.Etcd, opts...)
	switch {
	case errors.Is(err, syscall.EADDRINUSE):
		// The peer address takes a free port; only the client's can be held.
		return &AddrInUseError{What: "etcd client", Addr: c.cfg.Etcd}
	case err != nil:
		return fmt.Errorf("cluster: %w", err)
	}
	c.etcd = e
	return nil
}

// startMaster starts master i. The first takes the configured addresses,
// the others free ports.
func (c *Cluster) startMaster(i int) error {
	sc := master.ServerConfig{Service: c.cfg.Service, Listen: "127.0.0.1:0", Logger: c.cfg.Logger, Token: c.cfg.Token}
	if c.cfg.TLS.CA != "" {
		sc.TLS = c.cfg.TLS.ServerTLS()
	}
	if i == 0 {
		sc.Listen, sc.Admin = c.cfg.MasterListen, c.cfg.Admin
	} else if c.cfg.Admin != "" {
		sc.Admin = "127.0.0.1:0"
	}
	if !c.cfg.NoHA {
		// The masters call the etcd of this process in process: a put's
		// journal write skips gRPC over loopback TCP.
		sc.HA = &master.HAConfig{Etcd: []string{c.etcd.Addr()}, Client: c.etcd.Client(), SyncEtcd: c.cfg.SyncEtcd}
	}
	if kv := c.cfg.KVEvents; kv != nil {
		kv := *kv
		if i > 0 {
			kv.Bind, kv.Replay = anyPort(kv.Bind), anyPort(kv.Replay)
		}
		sc.KVEvents = &kv
	}
	m, err := master.Start(sc)
	var le *master.ListenError
	switch {
	case errors.As(err, &le) && errors.Is(err, syscall.EADDRINUSE):
		what := "master rpc"
		switch le.Listener {
		case "admin":
			what = "master metrics" // the admin server, on Mooncake's --metrics_port
		case "kv_events", "kv_events_replay":
			what = "master " + strings.ReplaceAll(le.Listener, "_", " ")
		}
		return &AddrInUseError{What: what, Addr: le.Addr}
	case err != nil:
		return fmt.Errorf("cluster: master %d: %w", i, err)
	}
	c.Masters = append(c.Masters, m)
	return nil
}

// anyPort is endpoint (a ZMQ "tcp://host:port", or empty) with port 0.
func anyPort(endpoint string) string {
	if i := strings.LastIndexByte(endpoint, ':'); i > strings.Index(endpoint, "://") {
		return endpoint[:i] + ":0"
	}
	return endpoint
}

// startNode starts node i, in this process or as a child.
func (c *Cluster) startNode(ctx context.Context, i int) error {
	if len(c.cfg.NodeCommand) > 0 {
		return c.startProc(ctx)
	}
	cc := client.Config{Master: c.MasterURL(), SegmentSize: c.cfg.NodeSegment,
		LocalBufferSize: 16 << 20, EngineConfig: c.cfg.Engine, Token: c.cfg.Token}
	if c.cfg.TLS.CA != "" {
		cc.MasterTLS = c.cfg.TLS.ClientTLS()
	}
	n, err := client.New(ctx, cc)
	if err != nil {
		return err
	}
	c.Nodes = append(c.Nodes, n)
	c.NodeSegments = append(c.NodeSegments, n.SegmentName())
	return nil
}

func (c *Cluster) waitLeader(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		if c.Leader() != nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster: no master leads: %w", ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// readyPrefix starts the line `mooncake node` prints once its segment is
// mounted: "node ready segment=<name>".
const readyPrefix = "node ready segment="

// ReadyLine is what a node prints on stdout once serving.
func ReadyLine(segment string) string { return readyPrefix + segment }

func (c *Cluster) startProc(ctx context.Context) error {
	args := append(slices.Clone(c.cfg.NodeCommand[1:]), "--master", c.MasterURL(),
		"--global_segment_size", strconv.FormatInt(c.cfg.NodeSegment, 10))
	if f := c.cfg.TLS; f.CA != "" {
		args = append(args, "--master_tls_ca_file", f.CA, "--master_tls_cert_file", f.ClientCert, "--master_tls_key_file", f.ClientKey)
	}
	cmd := exec.Command(c.cfg.NodeCommand[0], args...)
	if c.cfg.Token != "" || c.cfg.Engine.Secret != "" {
		cmd.Env = os.Environ()
	}
	if c.cfg.Token != "" {
		cmd.Env = append(cmd.Env, "MC_AUTH_TOKEN="+c.cfg.Token)
	}
	if c.cfg.Engine.Secret != "" { // Engine configures in-process nodes only
		cmd.Env = append(cmd.Env, "MC_TE_SECRET="+c.cfg.Engine.Secret)
	}
	cmd.Stderr = c.cfg.NodeStderr
	if cmd.Stderr == nil {
		cmd.Stderr = os.Stderr
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", c.cfg.NodeCommand[0], err)
	}
	// Close stops (and waits for) every process from here on.
	c.procs = append(c.procs, cmd)
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if s, ok := strings.CutPrefix(sc.Text(), readyPrefix); ok {
				ready <- s
				break
			}
		}
		// Closed without a ready line: the node exited (its stdout with it).
		close(ready)
		_, _ = io.Copy(io.Discard, out)
	}()
	select {
	case seg, ok := <-ready:
		if !ok {
			return fmt.Errorf("process %d exited before it was ready (its stderr says why)", cmd.Process.Pid)
		}
		c.NodeSegments = append(c.NodeSegments, seg)
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(time.Minute):
		return errors.New("not ready after a minute")
	}
}

// NodeProcess returns the child process of node i (nil for in-process
// nodes), for fault tests that kill it.
func (c *Cluster) NodeProcess(i int) *os.Process {
	if i < len(c.procs) {
		return c.procs[i].Process
	}
	return nil
}

// MasterURL is what clients pass as client.Config.Master: "etcd://..."
// under HA, the master's address otherwise.
func (c *Cluster) MasterURL() string {
	if c.etcd != nil {
		return "etcd://" + c.etcd.Addr()
	}
	return c.Masters[0].Addr()
}

// EtcdAddr is the embedded etcd's client address ("" without HA).
func (c *Cluster) EtcdAddr() string {
	if c.etcd == nil {
		return ""
	}
	return c.etcd.Addr()
}

// Leader is the master that leads now, or nil.
func (c *Cluster) Leader() *master.Server {
	for _, m := range c.Masters {
		if m.Leading() {
			return m
		}
	}
	return nil
}

// Close stops nodes, masters and etcd, in that order, and removes the
// temporary directory.
func (c *Cluster) Close() error {
	var errs []error
	for _, n := range c.Nodes {
		errs = append(errs, n.Close())
	}
	for _, p := range c.procs {
		_ = p.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = p.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = p.Process.Kill()
			<-done
		}
	}
	for _, m := range c.Masters {
		errs = append(errs, m.Close())
	}
	if c.etcd != nil {
		c.etcd.Close()
	}
	if c.tmp != "" {
		errs = append(errs, os.RemoveAll(c.tmp))
	}
	return errors.Join(errs...)
}
