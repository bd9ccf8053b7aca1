package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/store/client"
	"github.com/mooncake-go/mooncake/store/cluster"
)

// SameHost is a topology of ours: the objects live in a storage node
// process on this host, which clients reach through shared memory.
const SameHost = "same-host"

// OursConfig configures RunOurs.
type OursConfig struct {
	// Topology is where the objects live: Local (each client holds its
	// share in its own segment: a plain copy), SameHost (a storage node
	// process; shared memory), Remote (a storage node process; TCP
	// forced). Zero: Remote.
	Topology string
	// Master, when set, is a running store to use instead of starting one
	// (the topology then only chooses the clients' transport).
	Master string
	// NodeCommand runs a storage node (`mooncake node` and its flags) for
	// SameHost and Remote. Required for those without Master.
	NodeCommand []string
	// HA journals the started master's changes to an embedded etcd, as
	// `mooncake up` does. Zero: a single master without etcd.
	HA bool
	// Masters is the number of masters under HA: more than one starts
	// standbys, whose acknowledgements make journal records durable
	// unless SyncEtcd. Zero: 1.
	Masters int
	// SyncEtcd makes puts wait for etcd even with a standby.
	SyncEtcd bool
	// Capacity is the pool's size. Zero: what Redis is given.
	Capacity int64
	// ReservePuts sets client.Config.ReservePuts: puts write into space
	// reserved during the puts before them, one master round trip each.
	ReservePuts bool
	// NoAutoSlots sets client.Config.NoAutoSlots: without ReservePuts,
	// every put starts on the master.
	NoAutoSlots bool
}

// RunOurs measures o against our store: it starts a cluster for the
// topology (unless cfg.Master is set) and drives one store client per
// benchmark client, each with registered value buffers so puts and gets
// move bytes straight between them and the pool.
func RunOurs(ctx context.Context, o Options, cfg OursConfig) (res Result, err error) {
	if err := o.Validate(); err != nil {
		return Result{}, err
	}
	o = o.WithDefaults()
	if cfg.Topology == "" {
		cfg.Topology = Remote
	}
	if cfg.Capacity == 0 {
		cfg.Capacity = o.capacity()
	}
	transport := "auto"
	switch cfg.Topology {
	case Local:
	case SameHost:
	case Remote:
		transport = "tcp"
	default:
		return Result{}, fmt.Errorf("store: topology %q: want %s, %s or %s", cfg.Topology, Local, SameHost, Remote)
	}
	master := cfg.Master
	if master == "" {
		cc := cluster.Config{NoHA: !cfg.HA, Masters: cfg.Masters, SyncEtcd: cfg.SyncEtcd, Nodes: cluster.NoNodes}
		if cfg.Topology != Local {
			if len(cfg.NodeCommand) == 0 {
				return Result{}, errors.New("store: RunOurs needs a NodeCommand to start a storage node")
			}
			cc.Nodes, cc.NodeSegment = 1, cfg.Capacity
			cc.NodeCommand = append(append([]string(nil), cfg.NodeCommand...), "--transport", transport, "--local_hostname", "127.0.0.1")
		}
		cl, err := cluster.Start(ctx, cc)
		if err != nil {
			return Result{}, err
		}
		defer func() { err = errors.Join(err, cl.Close()) }()
		master = cl.MasterURL()
	}
	res, err = Drive(ctx, o, func(i int) (Worker, error) { return newOursWorker(ctx, o, cfg, master, transport) })
	res.Name, res.Topology = Ours, cfg.Topology
	return res, err
}

// oursWorker is one store client with a registered buffer per batch slot.
type oursWorker struct {
	c    *client.Client
	bufs [][]byte
	rc   *client.ReplicateConfig
	mem  []byte
}

func newOursWorker(ctx context.Context, o Options, cfg OursConfig, master, transport string) (*oursWorker, error) {
	seg := int64(client.NoSegment)
	var rc *client.ReplicateConfig
	if cfg.Topology == Local {
		seg = max(cfg.Capacity/int64(o.Clients), 2*int64(o.BatchSize)*int64(o.ValueSize)+(64<<20))
	}
	c, err := client.New(ctx, client.Config{Master: master, SegmentSize: seg, LocalBufferSize: 8 << 20,
		EngineConfig: engine.Config{Host: "127.0.0.1", Transport: transport}, ReservePuts: cfg.ReservePuts, NoAutoSlots: cfg.NoAutoSlots})
	if err != nil {
		return nil, err
	}
	if cfg.Topology == Local {
		rc = &client.ReplicateConfig{PreferredSegments: []string{c.SegmentName()}}
	}
	w := &oursWorker{c: c, rc: rc, mem: make([]byte, o.BatchSize*o.ValueSize)}
	for i := range o.BatchSize {
		b := w.mem[i*o.ValueSize : (i+1)*o.ValueSize]
		for j := range b {
			b[j] = byte(i + j)
		}
		w.bufs = append(w.bufs, b)
	}
	if err := c.RegisterBuffer(w.mem); err != nil {
		_ = c.Close()
		return nil, err
	}
	return w, nil
}

func (w *oursWorker) Put(ctx context.Context, keys []string) error {
	return errors.Join(w.c.BatchPut(ctx, keys, w.bufs[:len(keys)], w.rc)...)
}

func (w *oursWorker) Get(ctx context.Context, keys []string) error {
	ns, errs := w.c.BatchGetInto(ctx, keys, w.bufs[:len(keys)])
	for i, n := range ns {
		if errs[i] == nil && n != len(w.bufs[i]) {
			errs[i] = fmt.Errorf("store: %s: %d bytes, want %d", keys[i], n, len(w.bufs[i]))
		}
	}
	return errors.Join(errs...)
}

func (w *oursWorker) Close() error { return w.c.Close() }
