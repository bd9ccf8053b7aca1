package chaos

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/internal/crc32c"
	"github.com/mooncake-go/mooncake/store/client"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// Config configures a Run. Zero values are the defaults each field names.
type Config struct {
	// Master and ClusterID are the store's, as client.Config takes them.
	Master, ClusterID string
	// Leader finds the leading master's gRPC address, for the eviction
	// watch. Required.
	Leader func(context.Context) (string, error)
	// Duration is how long the workload runs. Zero: 30 s.
	Duration time.Duration
	// Clients is the number of workload clients, each its own store
	// client running one operation at a time. Zero: 4.
	Clients int
	// Keys is the number of keys the workload touches. Zero: 32.
	Keys int
	// ValueSize is the size of each value. Zero: 16 KiB.
	ValueSize int
	// Replicas per write. Zero: 2.
	Replicas int
	// OpTimeout bounds each operation; one that runs out is Unknown.
	// Zero: 5 s.
	OpTimeout time.Duration
	// Seed drives the workload's choices and the faults'.
	Seed uint64
	// Host is the address of the clients' engines. Zero: 127.0.0.1.
	Host string
	// Transport is the clients' data path (engine.Config.Transport).
	// Zero: auto.
	Transport string
	// ForceRemoves is the share of removes that are forced (a leased
	// object removed too); the others fail on an object read within its
	// lease. Zero: none.
	ForceRemoves float64
	// Steps and Faults are the nemesis' schedule and the faults it may
	// name. The fault "lose-keys" (remove every object behind the
	// checker's back, a control that the checker catches a loss) is added
	// by Run.
	Steps  []Step
	Faults Faults
	// Logger receives progress. Zero: slog.Default().
	Logger *slog.Logger
}

func (c *Config) defaults() error {
	if c.Master == "" || c.Leader == nil {
		return errors.New("chaos: Config.Master and Config.Leader are required")
	}
	if c.Duration == 0 {
		c.Duration = 30 * time.Second
	}
	if c.Clients == 0 {
		c.Clients = 4
	}
	if c.Keys == 0 {
		c.Keys = 32
	}
	if c.ValueSize == 0 {
		c.ValueSize = 16 << 10
	}
	if c.Replicas == 0 {
		c.Replicas = 2
	}
	if c.OpTimeout == 0 {
		c.OpTimeout = 5 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	switch {
	case c.ForceRemoves < 0 || c.ForceRemoves > 1:
		return fmt.Errorf("chaos: ForceRemoves %v is not a share between 0 and 1", c.ForceRemoves)
	case c.Duration < 0 || c.Clients < 0 || c.Keys < 0 || c.Replicas < 0 || c.OpTimeout < 0:
		return errors.New("chaos: Duration, Clients, Keys, Replicas and OpTimeout must not be negative")
	case c.ValueSize < MinValueSize(keyName(c.Keys-1)):
		return fmt.Errorf("chaos: ValueSize %d below the %d bytes a value's header and checksum take", c.ValueSize, MinValueSize(keyName(c.Keys-1)))
	}
	faults := Faults{"lose-keys": nil}
	for n, f := range c.Faults {
		faults[n] = f
	}
	c.Faults = faults
	return nil
}

func keyName(i int) string { return fmt.Sprintf("chaos-%04d", i) }

// barrierKey is written after the final reads; seeing it in the watch
// means every eviction before it has been seen.
const barrierKey = "chaos-barrier"

// Run runs the workload for cfg.Duration while the nemesis injects the
// scheduled faults, heals them, reads every key once more (the final
// reads) and returns the history for Check. The error is about the run
// itself (clients that could not start), not about anomalies.
func Run(ctx context.Context, cfg Config) (*History, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	newClient := func() (*client.Client, error) {
		return client.New(ctx, client.Config{Master: cfg.Master, ClusterID: cfg.ClusterID, SegmentSize: client.NoSegment,
			LocalBufferSize: int64(max(cfg.ValueSize, 1<<20)), RPCTimeout: cfg.OpTimeout,
			Replicate:    client.ReplicateConfig{Replicas: cfg.Replicas},
			EngineConfig: engine.Config{Host: cmp.Or(cfg.Host, "127.0.0.1"), Timeout: cfg.OpTimeout, Transport: cfg.Transport}})
	}
	var clients []*client.Client
	defer func() {
		for _, c := range clients {
			_ = c.Close()
		}
	}()
	for range cfg.Clients + 2 {
		c, err := newClient()
		if err != nil {
			return nil, fmt.Errorf("chaos: store client: %w", err)
		}
		clients = append(clients, c)
	}
	workers, final, saboteur := clients[:cfg.Clients], clients[cfg.Clients], clients[cfg.Clients+1]
	cfg.Faults["lose-keys"] = loseKeys(saboteur)
	if err := cfg.Faults.Validate(cfg.Steps); err != nil {
		return nil, err
	}

	h := NewHistory()
	wctx, stopWatch := context.WithCancel(ctx)
	w := newWatcher(h, cfg.Leader)
	var watchDone sync.WaitGroup
	watchDone.Go(func() { w.run(wctx) })
	defer func() { stopWatch(); watchDone.Wait() }()

	runCtx, stop := context.WithTimeout(ctx, cfg.Duration)
	defer stop()
	var wg sync.WaitGroup
	for i, c := range workers {
		wg.Go(func() { work(runCtx, h, cfg, i, c) })
	}
	n := &Nemesis{Faults: cfg.Faults, Steps: cfg.Steps, Log: cfg.Logger}
	wg.Go(func() { n.Run(runCtx, h, cfg.Duration) })
	wg.Wait()
	cfg.Logger.Info("chaos: workload done; final reads", "ops", h.Len())
	finalReads(ctx, h, cfg, final)
	// Evictions up to the final reads reach the watch before the
	// barrier's put does.
	seen := w.await(barrierKey)
	if err := barrier(ctx, final); err != nil {
		h.Note("barrier put failed (" + err.Error() + "): evictions just before the end may be missing")
	} else {
		select {
		case <-seen:
		case <-time.After(10 * time.Second):
			h.Note("the watch did not see the barrier within 10s: evictions just before the end may be missing")
		case <-ctx.Done():
		}
	}
	return h, ctx.Err()
}

// barrier writes barrierKey, retrying for a while: a node killed last may
// still be in the pool, and a write placed on it fails.
func barrier(ctx context.Context, c *client.Client) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := c.Upsert(ctx, barrierKey, []byte("barrier"), nil)
		if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// work is one workload client: random operations on random keys until
// ctx ends.
func work(ctx context.Context, h *History, cfg Config, id int, c *client.Client) {
	r := rand.New(rand.NewPCG(cfg.Seed, uint64(id)+1))
	writer := uint32(id + 1)
	var seq uint64
	for ctx.Err() == nil {
		op := Op{Client: id, Key: keyName(r.IntN(cfg.Keys))}
		switch p := r.IntN(100); {
		case p < 40:
			op.Kind = Get
		case p < 60:
			op.Kind = Put
		case p < 90:
			op.Kind = Upsert
		default:
			op.Kind = Remove
		}
		var value []byte
		if op.Kind.writes() {
			seq++
			op.Value = ValueID{Writer: writer, Seq: seq}
			value, _ = EncodeValue(op.Key, op.Value, cfg.ValueSize) // sizes checked by defaults
			op.Size, op.Digest = len(value), crc32c.Checksum(value)
		}
		// Not ctx: an operation the end of the run cut short would be
		// Unknown for no reason.
		octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.OpTimeout)
		op.Invoke = h.Now()
		var err error
		var got []byte
		switch op.Kind {
		case Get:
			got, err = c.Get(octx, op.Key)
		case Put:
			err = c.Put(octx, op.Key, value, nil)
		case Upsert:
			err = c.Upsert(octx, op.Key, value, nil)
		case Remove:
			err = c.Remove(octx, op.Key, r.Float64() < cfg.ForceRemoves)
		}
		op.Complete = h.Now()
		cancel()
		settle(&op, got, err)
		h.Add(op)
	}
}

// settle sets op's result from the store's answer.
func settle(op *Op, got []byte, err error) {
	op.Result = classify(op.Kind, err)
	if err != nil && !(op.Kind == Get && errors.Is(err, storepb.ErrObjectNotFound)) {
		op.Err = err.Error()
	}
	if op.Kind != Get || op.Result != OK || len(got) == 0 {
		return
	}
	op.Size, op.Digest = len(got), crc32c.Checksum(got)
	key, id, derr := DecodeValue(got)
	switch {
	case derr != nil:
		op.Err = derr.Error()
	case key != op.Key:
		op.Err = fmt.Sprintf("the value of key %q (%s)", key, id)
	default:
		op.Value = id
	}
}

// classify is how certain an error is. A get that found nothing is OK
// (it saw the key empty). A write or remove fails for certain only when
// the master refused it before anything happened (no space, bad
// arguments, a leased object, an upsert meeting another write of the key
// in flight); any other error, a timeout or a lost
// connection above all, leaves it Unknown. A remove's NOT_FOUND is
// Unknown too: the client repeats a call whose answer a failover lost,
// and the repeat finds the key its first attempt removed gone.
func classify(k Kind, err error) Result {
	switch {
	case err == nil:
		return OK
	case k == Get && errors.Is(err, storepb.ErrObjectNotFound):
		return OK
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, storepb.ErrRPCTimeout):
		return Unknown
	case k == Get:
		return Fail
	case errors.Is(err, storepb.ErrNoAvailableHandle) || errors.Is(err, storepb.ErrInvalidParams) ||
		errors.Is(err, storepb.ErrObjectHasLease) || (k == Upsert && errors.Is(err, storepb.ErrObjectAlreadyExists)):
		return Fail
	}
	return Unknown
}

// finalReads reads every key after the faults were healed, retrying a
// read that failed (a replica on a node killed last, a master still
// taking over) for up to a minute in all.
func finalReads(ctx context.Context, h *History, cfg Config, c *client.Client) {
	deadline := time.Now().Add(time.Minute)
	for i := range cfg.Keys {
		for attempt := 0; ; attempt++ {
			op := Op{Client: cfg.Clients, Kind: Get, Key: keyName(i), Final: true}
			octx, cancel := context.WithTimeout(ctx, cfg.OpTimeout)
			op.Invoke = h.Now()
			got, err := c.Get(octx, op.Key)
			op.Complete = h.Now()
			cancel()
			settle(&op, got, err)
			h.Add(op)
			if op.Result == OK || time.Now().After(deadline) || ctx.Err() != nil {
				break
			}
			time.Sleep(min(time.Duration(attempt+1)*100*time.Millisecond, time.Second))
		}
	}
}

// loseKeys is the fault lose-keys: a client outside the workload removes
// every object, leased or not, and nothing records it. It is a control:
// a checker that reports no lost write after it is broken.
func loseKeys(c *client.Client) Fault {
	return FaultFunc(func(ctx context.Context) (string, func(context.Context) error, error) {
		n, err := c.RemoveAll(ctx, true)
		return fmt.Sprintf("removed %d objects behind the checker's back", n), nil, err
	})
}
