package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// memStore is a map behind a lock: the trivial store Drive is checked with.
type memStore struct {
	mu      sync.Mutex
	objects map[string][]byte
	gets    map[string]int
	closed  atomic.Int32
	failAt  int // the put or get call, counted from 1 over all workers, that fails; 0: none
	calls   atomic.Int64
}

func newMemStore() *memStore {
	return &memStore{objects: map[string][]byte{}, gets: map[string]int{}}
}

// memWorker is a Worker of a memStore, with one batch of memory.
type memWorker struct {
	s    *memStore
	mem  []byte
	size int
}

var _ Worker = (*memWorker)(nil)

var errInjected = errors.New("injected failure")

func (s *memStore) newWorker(o Options) func(int) (Worker, error) {
	o = o.WithDefaults()
	return func(int) (Worker, error) {
		return &memWorker{s: s, mem: make([]byte, o.BatchSize*o.ValueSize), size: o.ValueSize}, nil
	}
}

func (w *memWorker) call() error {
	if n := w.s.calls.Add(1); int(n) == w.s.failAt {
		return errInjected
	}
	return nil
}

func (w *memWorker) Put(_ context.Context, keys []string) error {
	if err := w.call(); err != nil {
		return err
	}
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	for i, k := range keys {
		if _, ok := w.s.objects[k]; ok {
			return fmt.Errorf("put of %s, which exists", k)
		}
		w.s.objects[k] = append([]byte(nil), w.mem[i*w.size:(i+1)*w.size]...)
	}
	return nil
}

func (w *memWorker) Get(_ context.Context, keys []string) error {
	if err := w.call(); err != nil {
		return err
	}
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	for i, k := range keys {
		v, ok := w.s.objects[k]
		if !ok || len(v) != w.size {
			return fmt.Errorf("get of %s: missing or %d bytes", k, len(v))
		}
		copy(w.mem[i*w.size:], v)
		w.s.gets[k]++
	}
	return nil
}

func (w *memWorker) Close() error {
	w.s.closed.Add(1)
	return nil
}

func TestDrive(t *testing.T) {
	defer goleak.VerifyNone(t)
	for _, tc := range []struct {
		name string
		o    Options
	}{
		// A batch that does not divide the working set wraps around it.
		{"get", Options{Op: OpGet, ValueSize: 64, BatchSize: 3, Clients: 3, Keys: 10}},
		{"get one", Options{Op: OpGet, ValueSize: 64, Keys: 1}},
		{"put", Options{Op: OpPut, ValueSize: 64, BatchSize: 4, Clients: 3, Keys: 10}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := tc.o
			o.Duration, o.Warmup = 50*time.Millisecond, 10*time.Millisecond
			o = o.WithDefaults() // the figures the checks use
			s := newMemStore()
			res, err := Drive(context.Background(), o, s.newWorker(o))
			require.NoError(t, err)
			assert.Equal(t, int32(o.Clients), s.closed.Load(), "every worker closed")
			assert.Empty(t, res.Name, "the caller names the system")
			assert.Equal(t, o.Op, res.Op)
			assert.Equal(t, []int{o.ValueSize, o.BatchSize, o.Clients, o.Keys},
				[]int{res.ValueSize, res.BatchSize, res.Clients, res.Keys})
			assert.GreaterOrEqual(t, res.Seconds, o.Duration.Seconds())
			require.Positive(t, res.Calls)
			assert.Equal(t, res.Calls*uint64(o.BatchSize), res.Ops)
			assert.Equal(t, res.Ops*uint64(o.ValueSize), res.Bytes)
			assert.InDelta(t, float64(res.Ops)/res.Seconds, res.OpsPerS, 1e-6)
			assert.InDelta(t, float64(res.Bytes)/res.Seconds/1e9, res.GBPerS, 1e-12)
			assert.Positive(t, res.P50us)
			assert.GreaterOrEqual(t, res.P99us, res.P50us)
			// Warm-up calls and preload puts are not counted, timed ones are.
			total := uint64(s.calls.Load())
			if o.Op == OpGet {
				// The working set only, every key of it read about as often.
				assert.Len(t, s.objects, o.Keys)
				for i := range o.Keys {
					assert.Positive(t, s.gets[Key(DefaultKeyPrefix, i)], "key %d never read", i)
				}
				preload := uint64(0)
				for c := range o.Clients {
					n := (c+1)*o.Keys/o.Clients - c*o.Keys/o.Clients
					preload += uint64((n + o.BatchSize - 1) / o.BatchSize)
				}
				assert.Greater(t, total-preload, res.Calls)
			} else {
				// Fresh keys only (memWorker.Put refuses others), past the working set.
				assert.Len(t, s.objects, int(total)*o.BatchSize)
				for i := range o.Keys {
					assert.NotContains(t, s.objects, Key(DefaultKeyPrefix, i))
				}
				assert.Greater(t, total, res.Calls)
			}
		})
	}
}

func TestDriveFailure(t *testing.T) {
	defer goleak.VerifyNone(t)
	o := Options{Op: OpGet, ValueSize: 8, Clients: 4, Keys: 16, Duration: 10 * time.Second}

	// A worker that fails ends the run at once, naming the client.
	s := newMemStore()
	s.failAt = 100
	start := time.Now()
	_, err := Drive(context.Background(), o, s.newWorker(o))
	require.ErrorIs(t, err, errInjected)
	assert.Regexp(t, `^store: client \d: get: injected failure$`, err.Error())
	assert.Less(t, time.Since(start), 5*time.Second)
	assert.Equal(t, int32(4), s.closed.Load())

	// So does a failed preload.
	s = newMemStore()
	s.failAt = 1
	_, err = Drive(context.Background(), o, s.newWorker(o))
	require.ErrorIs(t, err, errInjected)
	assert.Contains(t, err.Error(), "preload")

	// A worker that cannot be made: those made already are closed.
	s = newMemStore()
	made := s.newWorker(o)
	_, err = Drive(context.Background(), o, func(i int) (Worker, error) {
		if i == 2 {
			return nil, errInjected
		}
		return made(i)
	})
	require.ErrorIs(t, err, errInjected)
	assert.Equal(t, "store: worker 2: injected failure", err.Error())
	assert.Equal(t, int32(2), s.closed.Load())

	// Cancellation.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	s = newMemStore()
	_, err = Drive(ctx, o, s.newWorker(o))
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Equal(t, int32(4), s.closed.Load())

	// Bad options never reach the store.
	_, err = Drive(context.Background(), Options{Op: "scan"}, nil)
	require.ErrorContains(t, err, "store: Op")
}
