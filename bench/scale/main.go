// Command scale measures how mooncake-go scales over many hosts, emulated
// on one machine with internal/netlab: each host is a network namespace
// whose link to the lab's switch is rate-limited both ways, as a NIC is.
//
// Three measurements, each a median of repeated runs:
//
//   - store: at 1, 2, 4 and 8 hosts, each host runs a storage node and a
//     client in one worker process (a client with a segment). Client i puts
//     into, and gets from, the segment of host i+1 (mod n), so every byte
//     crosses two links and none stays on a host. One host's figure is one
//     client against a neighbour's node (a second host whose client stays
//     idle), the same path a host takes at n hosts. Scaling efficiency is
//     the aggregate at n hosts over n times one host's figure.
//   - p2p: one object fanned out by the P2P store from a seed host to
//     receiver hosts fetching together, against the same receivers each
//     fetching its own copy from the seed alone (a swarm of one each), and
//     against the ideal, size over link rate.
//   - master: clients without segments, spread over the hosts, calling
//     BatchExistKey and BatchGetReplicaList in a loop: calls per second,
//     the master's CPU per call (it runs alone in its process), and a CPU
//     profile of the master summarised by go tool pprof.
//   - stripes (not in the default -phases: a 1 GiB object at 100 Mbit/s
//     takes minutes): one object striped over storage hosts, got by a
//     reader whose link is faster than theirs together, against the same
//     object in one piece on one of them and the ideal, the size over
//     their links' rates summed.
//
// Creating namespaces needs root: without it the command says so and
// exits 0. It re-runs itself in a network namespace of its own first, so
// the lab never touches the machine's network.
//
//	go run ./bench/scale -out build/bench/scale      # JSON, Parquet, PNG
//	go run ./bench/scale -plot build/bench/scale      # Parquet and PNG again from the JSON
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/mooncake-go/mooncake/internal/netlab"
)

// options is one run's configuration; flags set it.
type options struct {
	Hosts    []int         `json:"hosts"`     // store: host counts measured
	Rate     int64         `json:"rate_bps"`  // every host's link, each way, bits/s
	Sparse   int           `json:"sparse"`    // netlab.Config.Sparse
	Queue    time.Duration `json:"queue"`     // netlab.Config.Queue
	Lanes    int           `json:"lanes"`     // TCP connections per peer of every engine
	Value    int           `json:"value"`     // store: object size
	Batch    int           `json:"batch"`     // store: objects per call
	Conc     int           `json:"conc"`      // store: calls in flight per client
	GetKeys  int           `json:"get_keys"`  // store: objects each client reads in turn
	Segment  int64         `json:"segment"`   // store: each node's segment; 0: sized for the rate
	Warmup   time.Duration `json:"warmup"`    // before each timed window
	Duration time.Duration `json:"duration"`  // of each timed window
	Repeat   int           `json:"repeat"`    // runs per point
	Phases   []string      `json:"phases"`    // store, p2p, master
	P2PSize  int64         `json:"p2p_size"`  // the object fanned out
	P2PShard uint64        `json:"p2p_shard"` // its shards
	P2PRecv  int           `json:"p2p_receivers"`
	P2PPar   int           `json:"p2p_parallel"` // shards in flight per receiver
	P2PRuns  int           `json:"p2p_repeat"`
	P2PWays  []string      `json:"p2p_ways"` // swarm, seed-only
	P2PTrace bool          `json:"p2p_trace"`
	MetaCli  int           `json:"meta_clients"`
	MetaB    int           `json:"meta_batch"` // keys per call
	MetaKeys int           `json:"meta_keys"`  // objects the calls name
	MetaDur  time.Duration `json:"meta_duration"`
	StripeN  int           `json:"stripe_hosts"` // stripes: storage hosts, one piece each
	StripeSz int64         `json:"stripe_size"`  // stripes: the object
	ReaderR  int64         `json:"reader_rate"`  // stripes: the reader's link, bits/s (0: unlimited; < 0: 1.25 x the storage hosts')
	StripeW  []string      `json:"stripe_ways"`  // stripes: striped, unstriped
	Slice    uint64        `json:"slice"`        // stripes: the engines' SliceSize (0: the default)
}

func (o *options) has(phase string) bool { return slices.Contains(o.Phases, phase) }

func (o *options) validate() error {
	switch {
	case len(o.Hosts) == 0 || slices.Min(o.Hosts) < 1:
		return fmt.Errorf("-hosts %v: want counts >= 1", o.Hosts)
	case o.Value <= 0 || o.Batch <= 0 || o.Conc <= 0 || o.GetKeys < o.Batch:
		return errors.New("-value, -batch and -conc must be positive and -get-keys at least -batch")
	case o.Repeat < 1 || o.P2PRuns < 1:
		return errors.New("-repeat and -p2p-repeat must be at least 1")
	case o.P2PRecv < 1 || o.P2PSize <= 0 || o.P2PShard == 0:
		return errors.New("-p2p-receivers, -p2p-size and -p2p-shard must be positive")
	case o.MetaCli < 1 || o.MetaB < 1 || o.MetaKeys < o.MetaB:
		return errors.New("-meta-clients and -meta-batch must be positive and -meta-keys at least -meta-batch")
	case o.has("stripes") && (o.StripeN < 1 || o.StripeSz < int64(o.StripeN) || o.Rate <= 0):
		return errors.New("-stripe-hosts and -rate must be positive and -stripe-size at least -stripe-hosts")
	}
	for _, w := range o.P2PWays {
		if w != "swarm" && w != "seed-only" {
			return fmt.Errorf("-p2p-ways: unknown way %q", w)
		}
	}
	for _, w := range o.StripeW {
		if w != "striped" && w != "unstriped" {
			return fmt.Errorf("-stripe-ways: unknown way %q", w)
		}
	}
	for _, p := range o.Phases {
		if p != "store" && p != "p2p" && p != "master" && p != "stripes" {
			return fmt.Errorf("-phases: unknown phase %q", p)
		}
	}
	return nil
}

func main() {
	if os.Getenv(envWorker) != "" {
		os.Exit(workerMain())
	}
	o := options{}
	hosts := flag.String("hosts", "1,2,4,8", "store: host counts")
	flag.Int64Var(&o.Rate, "rate", 100e6, "every host's link rate, each way, bits/s")
	flag.IntVar(&o.Sparse, "sparse", netlab.SparseAcks, "packets up to this size go ahead of queued bulk (netlab.Config.Sparse; 0: one FIFO per link)")
	flag.DurationVar(&o.Queue, "queue", netlab.DefaultQueue, "the longest a packet waits for a link before it is dropped")
	flag.IntVar(&o.Lanes, "lanes", 0, "TCP connections per peer of every engine (0: the engine's default)")
	flag.IntVar(&o.Value, "value", 1<<20, "store: object size, bytes")
	flag.IntVar(&o.Batch, "batch", 4, "store: objects per call")
	flag.IntVar(&o.Conc, "conc", 2, "store: calls in flight per client")
	flag.IntVar(&o.GetKeys, "get-keys", 16, "store: objects each client reads in turn")
	flag.Int64Var(&o.Segment, "segment", 0, "store: each node's segment, bytes (0: what a put window at the link rate needs, at least 256 MiB)")
	flag.DurationVar(&o.Warmup, "warmup", time.Second, "untimed, before each timed window")
	flag.DurationVar(&o.Duration, "duration", 4*time.Second, "each timed window")
	flag.IntVar(&o.Repeat, "repeat", 3, "store, master and stripes: runs per point (the median is reported)")
	phases := flag.String("phases", "store,p2p,master", "what to measure: store, p2p, master, stripes")
	flag.Int64Var(&o.P2PSize, "p2p-size", 64<<20, "p2p: the object's size, bytes")
	flag.Uint64Var(&o.P2PShard, "p2p-shard", 4<<20, "p2p: its shard size, bytes")
	flag.IntVar(&o.P2PRecv, "p2p-receivers", 8, "p2p: receiver hosts")
	flag.IntVar(&o.P2PPar, "p2p-parallel", 0, "p2p: shards in flight per receiver (0: the store's default)")
	flag.IntVar(&o.P2PRuns, "p2p-repeat", 3, "p2p: runs of each way")
	ways := flag.String("p2p-ways", "swarm,seed-only", "p2p: the ways to fan out")
	flag.BoolVar(&o.P2PTrace, "p2p-trace", false, "p2p: every receiver logs each shard read (source, start, duration) to standard error")
	flag.IntVar(&o.MetaCli, "meta-clients", 64, "master: clients, spread over the hosts")
	flag.IntVar(&o.MetaB, "meta-batch", 32, "master: keys per call")
	flag.IntVar(&o.MetaKeys, "meta-keys", 4096, "master: objects the calls name")
	flag.DurationVar(&o.MetaDur, "meta-duration", 4*time.Second, "master: each timed window")
	flag.IntVar(&o.StripeN, "stripe-hosts", 4, "stripes: storage hosts the object is striped over")
	flag.Int64Var(&o.StripeSz, "stripe-size", 1<<30, "stripes: the object's size, bytes")
	stripeWays := flag.String("stripe-ways", "striped,unstriped", "stripes: the ways to store the object (unstriped is the yardstick)")
	flag.Uint64Var(&o.Slice, "slice", 0, "stripes: the engines' slice size, bytes (0: the engine's default)")
	flag.Int64Var(&o.ReaderR, "reader-rate", -1, "stripes: the reader's link, bits/s (0: unlimited; -1: 1.25 x the storage hosts' links together)")
	out := flag.String("out", "build/bench/scale", "output path without extension (.json, .parquet, .png, .pprof)")
	plotOnly := flag.String("plot", "", "only turn this JSON (path without .json) into Parquet and PNG")
	flag.Parse()
	if *plotOnly != "" {
		exit(plotFiles(*plotOnly))
	}
	for _, s := range strings.Split(*hosts, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			exit(fmt.Errorf("-hosts %q: %w", *hosts, err))
		}
		o.Hosts = append(o.Hosts, n)
	}
	o.Phases = strings.Split(*phases, ",")
	o.P2PWays = strings.Split(*ways, ",")
	o.StripeW = strings.Split(*stripeWays, ",")
	if err := o.validate(); err != nil {
		exit(err)
	}
	if !netlab.InOwnNamespace() {
		if err := netlab.Available(); err != nil {
			fmt.Println("scale: skipped, no emulated hosts here:", err)
			os.Exit(0)
		}
		code, err := netlab.Reexec()
		if err != nil {
			fmt.Fprintln(os.Stderr, "scale:", err)
		}
		os.Exit(code)
	}
	if err := netlab.UpLoopback(); err != nil {
		exit(err)
	}
	lab, err := netlab.New(netlab.Config{Seed: 1, Sparse: o.Sparse, Queue: o.Queue})
	if err != nil {
		exit(err)
	}
	res, err := measure(context.Background(), lab, o, *out, os.Stderr)
	_ = lab.Close()
	if err != nil {
		exit(err)
	}
	exit(save(res, *out))
}

func exit(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "scale:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// save writes res as out.json, then its Parquet and PNG.
func save(res *results, out string) error {
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	js, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(out+".json", append(js, '\n'), 0o644); err != nil {
		return err
	}
	return plotFiles(out)
}
