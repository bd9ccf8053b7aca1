package chaos

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/mooncake-go/mooncake/internal/embedetcd"
	"github.com/mooncake-go/mooncake/internal/etcdopt"
	"github.com/mooncake-go/mooncake/internal/netlab"
	"github.com/mooncake-go/mooncake/store/cluster"
	"github.com/mooncake-go/mooncake/store/ha"
)

// ProcsConfig configures a store of child processes. Zero values are the
// defaults each field names.
type ProcsConfig struct {
	// Command runs the mooncake CLI: the subcommand ("master", "node") and
	// its flags are appended. Required.
	Command []string
	// Env is added to the children's environment.
	Env []string
	// Masters is the number of masters, all under HA. Zero: 2.
	Masters int
	// Nodes is the number of storage nodes. Zero: 3.
	Nodes int
	// NodeSegment is each node's contribution. Zero: 64 MiB.
	NodeSegment int64
	// ClusterID names the HA cluster. Zero: "chaos".
	ClusterID string
	// MasterArgs and NodeArgs are added to every master's and node's
	// flags (leases, client TTL; the data path).
	MasterArgs, NodeArgs []string
	// LogLevel is the children's --log-level. Zero: warn.
	LogLevel string
	// Stderr receives the children's logs. Zero: os.Stderr.
	Stderr io.Writer
	// Seed picks which node a kill-node fault kills.
	Seed uint64
	// Lab, when set, puts etcd, every master and every node on a host of
	// its own (the clients are its local host), and adds the network
	// faults (NetFaults). Nodes should then use the TCP data path
	// (NodeArgs "--transport tcp"): shared memory would bypass the links.
	Lab *netlab.Lab
}

// Procs is a store whose masters and nodes are child processes, so that
// faults can kill -9 them; etcd runs in this process (the masters journal
// there, and its loss is a fault of its own, not one of these).
type Procs struct {
	cfg      ProcsConfig
	etcd     *embedetcd.Etcd
	etcdHost *netlab.Host // nil without a Lab
	tmp      string
	cli      *clientv3.Client

	mu      sync.Mutex
	masters []*proc
	nodes   []*proc
	rng     *rand.Rand
}

// proc is one child: its arguments (to restart it) and what it said when
// ready.
type proc struct {
	host   *netlab.Host // where it runs; nil: this host
	name   string       // "master 1", "node 0"
	args   []string     // the subcommand and its flags
	ready  string       // the stdout line that says it serves
	cmd    *exec.Cmd
	exited chan struct{}
	line   string // its ready line, the part after the prefix
}

// StartProcs starts etcd, the masters (waiting for one to lead) and the
// nodes (waiting for each to mount its segment). A failure stops what
// was started.
func StartProcs(ctx context.Context, cfg ProcsConfig) (_ *Procs, err error) {
	if len(cfg.Command) == 0 {
		return nil, errors.New("chaos: ProcsConfig.Command is empty")
	}
	if cfg.Masters == 0 {
		cfg.Masters = 2
	}
	if cfg.Nodes == 0 {
		cfg.Nodes = 3
	}
	if cfg.NodeSegment == 0 {
		cfg.NodeSegment = 64 << 20
	}
	if cfg.ClusterID == "" {
		cfg.ClusterID = "chaos"
	}
	if cfg.LogLevel == "" {
		cfg.LogLevel = "warn"
	}
	if cfg.Stderr == nil {
		cfg.Stderr = os.Stderr
	}
	p := &Procs{cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, 0x6e656d))}
	defer func() {
		if err != nil {
			p.Close()
		}
	}()
	if p.tmp, err = os.MkdirTemp("", "mooncake-chaos-etcd-"); err != nil {
		return nil, fmt.Errorf("chaos: etcd directory: %w", err)
	}
	startEtcd := func() (err error) {
		p.etcd, err = embedetcd.Start(p.tmp, net.JoinHostPort(p.addrOf(p.etcdHost), "0"), embedetcd.NoFsync())
		return err
	}
	if cfg.Lab != nil {
		if p.etcdHost, err = cfg.Lab.Host("etcd"); err != nil {
			return nil, fmt.Errorf("chaos: %w", err)
		}
		err = p.etcdHost.Do(startEtcd) // its listeners on its host
	} else {
		err = startEtcd()
	}
	if err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	if p.cli, err = clientv3.New(etcdopt.Config([]string{p.etcd.Addr()}, 5*time.Second)); err != nil {
		return nil, fmt.Errorf("chaos: etcd client: %w", err)
	}
	for i := range cfg.Masters {
		m := &proc{name: "master " + strconv.Itoa(i), ready: "master listening rpc="}
		if m.host, err = p.host(m.name); err != nil {
			return nil, err
		}
		m.args = append([]string{"master", "--enable_ha", "--etcd_endpoints", p.etcd.Addr(), "--cluster_id", cfg.ClusterID,
			"--rpc_address", p.addrOf(m.host), "--rpc_port", "0", "--metrics_port", "-1"}, cfg.MasterArgs...)
		p.masters = append(p.masters, m)
		if err := p.start(ctx, m); err != nil {
			return nil, err
		}
	}
	if _, err := p.Leader(ctx); err != nil {
		return nil, err
	}
	for i := range cfg.Nodes {
		n := &proc{name: "node " + strconv.Itoa(i), ready: cluster.ReadyLine("")}
		if n.host, err = p.host(n.name); err != nil {
			return nil, err
		}
		n.args = []string{"node", "--master", p.MasterURL(), "--cluster_id", cfg.ClusterID, "--local_hostname", p.addrOf(n.host),
			"--global_segment_size", strconv.FormatInt(cfg.NodeSegment, 10), "--local_buffer_size", "4MiB"}
		n.args = append(n.args, cfg.NodeArgs...)
		p.nodes = append(p.nodes, n)
		if err := p.start(ctx, n); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// start runs pr and waits for its ready line.
func (p *Procs) start(ctx context.Context, pr *proc) error {
	args := append(slices.Clone(p.cfg.Command[1:]), pr.args...)
	args = append(args, "--log-level", p.cfg.LogLevel)
	cmd := exec.Command(p.cfg.Command[0], args...)
	cmd.Env = append(os.Environ(), p.cfg.Env...)
	cmd.Stderr = p.cfg.Stderr
	// Children die with this process, even if it is killed itself.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	start := cmd.Start
	if pr.host != nil {
		start = func() error { return pr.host.Start(cmd) }
	}
	if err := start(); err != nil {
		return fmt.Errorf("chaos: %s: start %s: %w", pr.name, p.cfg.Command[0], err)
	}
	pr.cmd, pr.exited = cmd, make(chan struct{})
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if s, ok := strings.CutPrefix(sc.Text(), pr.ready); ok {
				ready <- s
				break
			}
		}
		close(ready) // found, or stdout closed: the process exited
		_, _ = io.Copy(io.Discard, out)
		_ = cmd.Wait()
		close(pr.exited)
	}()
	select {
	case s, ok := <-ready:
		if !ok {
			return fmt.Errorf("chaos: %s exited before it was ready (its stderr says why)", pr.name)
		}
		pr.line = s
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(time.Minute):
		return fmt.Errorf("chaos: %s not ready after a minute", pr.name)
	}
}

// kill sends SIGKILL to pr and waits for it to be gone.
func kill(pr *proc) error {
	if err := pr.cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	<-pr.exited
	return nil
}

// host is a new Lab host for the child called name; nil without a Lab.
func (p *Procs) host(name string) (*netlab.Host, error) {
	if p.cfg.Lab == nil {
		return nil, nil
	}
	h, err := p.cfg.Lab.Host(strings.ReplaceAll(name, " ", ""))
	if err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	return h, nil
}

// addrOf is the address a child on h serves at.
func (p *Procs) addrOf(h *netlab.Host) string {
	if h == nil {
		return "127.0.0.1"
	}
	return h.IP.String()
}

// MasterURL is what clients give as their master: the cluster in etcd.
func (p *Procs) MasterURL() string { return "etcd://" + p.etcd.Addr() }

// ClusterID is the HA cluster's name.
func (p *Procs) ClusterID() string { return p.cfg.ClusterID }

// Leader waits (up to 30 s) for a master to lead and returns its address.
func (p *Procs) Leader(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		addr, _, err := ha.Leader(ctx, p.cli, p.cfg.ClusterID)
		if err == nil {
			return addr, nil
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("chaos: no master leads: %w", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// rpcAddr is a master's gRPC address from its ready line.
func rpcAddr(pr *proc) string {
	f := strings.Fields(pr.line)
	if len(f) == 0 {
		return ""
	}
	return f[0]
}

// KillNode is the fault kill-node: kill -9 of a storage node picked at
// random; the heal starts it again (a fresh segment: its memory died
// with it).
func (p *Procs) KillNode() Fault {
	return FaultFunc(func(context.Context) (string, func(context.Context) error, error) {
		p.mu.Lock()
		n := p.nodes[p.rng.IntN(len(p.nodes))]
		p.mu.Unlock()
		return p.killAndRestart(n, n.name+" segment="+n.line)
	})
}

// KillMaster is the fault kill-master: kill -9 of the leading master; a
// standby takes over, and the heal starts the killed one again (as a
// standby).
func (p *Procs) KillMaster() Fault {
	return FaultFunc(func(ctx context.Context) (string, func(context.Context) error, error) {
		addr, err := p.Leader(ctx)
		if err != nil {
			return "", nil, err
		}
		p.mu.Lock()
		var m *proc
		for _, c := range p.masters {
			if rpcAddr(c) == addr {
				m = c
			}
		}
		p.mu.Unlock()
		if m == nil {
			return "", nil, fmt.Errorf("the leader %s is none of the masters started", addr)
		}
		return p.killAndRestart(m, m.name+" (leader) rpc="+addr)
	})
}

func (p *Procs) killAndRestart(pr *proc, what string) (string, func(context.Context) error, error) {
	pid := pr.cmd.Process.Pid
	if err := kill(pr); err != nil {
		return what, nil, err
	}
	return fmt.Sprintf("kill -9 %s pid=%d", what, pid), func(ctx context.Context) error {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.start(ctx, pr)
	}, nil
}

// Faults are the process faults, kill-node and kill-master, and with a Lab
// the network faults (NetFaults).
func (p *Procs) Faults() Faults {
	f := Faults{"kill-node": p.KillNode(), "kill-master": p.KillMaster()}
	for name, nf := range p.NetFaults() {
		f[name] = nf
	}
	return f
}

// Close stops every child (SIGTERM, then SIGKILL after 5 s) and etcd, and
// removes etcd's directory.
func (p *Procs) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pr := range append(slices.Clone(p.nodes), p.masters...) {
		if pr.cmd == nil || pr.cmd.Process == nil {
			continue
		}
		_ = pr.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-pr.exited:
		case <-time.After(5 * time.Second):
			_ = kill(pr)
		}
	}
	if p.cli != nil {
		_ = p.cli.Close()
	}
	if p.etcd != nil {
		p.etcd.Close()
	}
	if p.tmp != "" {
		_ = os.RemoveAll(p.tmp)
	}
}
