package te

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/pprof"
	"strconv"
	"sync"

	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	"github.com/mooncake-go/mooncake/engine"
)

// TargetConfig configures the passive side of the benchmark.
type TargetConfig struct {
	// Transport is the data path the initiator will use, "tcp" or "shm";
	// with "shm" the target publishes what a same-host peer needs to map
	// its buffer. Zero: "tcp".
	Transport string
	// BufferSize is the size of the buffer the initiator reads and writes.
	// Required.
	BufferSize int
	// CPUProfile, when set, is where ServeTarget writes a CPU profile of
	// the target process. NewTarget ignores it.
	CPUProfile string
	// GPU, when >= 0, puts the target's buffer in that GPU's memory.
	GPU int
	// Logger receives the engine's logs. Zero: slog.Default().
	Logger *slog.Logger
}

// BindFlags defines the flags a target child process reads; Args writes
// them, so the two sides of the process boundary cannot drift apart.
func (c *TargetConfig) BindFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.Transport, "transport", "tcp", "data path the initiator uses: tcp or shm")
	fs.IntVar(&c.BufferSize, "buffer-size", 0, "buffer size in bytes")
	fs.StringVar(&c.CPUProfile, "cpuprofile", "", "write a CPU profile of the target to this file")
	fs.IntVar(&c.GPU, "gpu", -1, "put the buffer in this GPU's memory (-1: host memory)")
}

// Args are the command-line flags that make BindFlags yield c.
func (c TargetConfig) Args() []string {
	a := []string{"--transport", c.transport(), "--buffer-size", strconv.Itoa(c.BufferSize), "--gpu", strconv.Itoa(c.GPU)}
	if c.CPUProfile != "" {
		a = append(a, "--cpuprofile", c.CPUProfile)
	}
	return a
}

func (c TargetConfig) transport() string {
	if c.Transport == "" {
		return "tcp"
	}
	return c.Transport
}

// TargetInfo is what the initiator needs to reach a target: the line a
// target child process prints on stdout.
type TargetInfo struct {
	Segment string `json:"segment"` // segment name to open
	Addr    uint64 `json:"addr"`    // buffer address in the target process
	Length  uint64 `json:"length"`  // buffer length
	PID     int    `json:"pid"`
}

// Target is an engine holding one registered buffer for an initiator to
// read and write.
type Target struct {
	e    *engine.Engine
	buf  buffer
	info TargetInfo

	once sync.Once
	err  error
}

// NewTarget starts the target engine (P2PHANDSHAKE metadata, on 127.0.0.1)
// and allocates its memfd-backed buffer, touched once so that page faults
// stay out of the measurement.
func NewTarget(ctx context.Context, cfg TargetConfig) (*Target, error) {
	if cfg.BufferSize <= 0 {
		return nil, fmt.Errorf("te: target BufferSize %d", cfg.BufferSize)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	e, err := engine.New(ctx, engine.Config{Host: "127.0.0.1", Transport: cfg.transport(), Logger: cfg.Logger})
	if err != nil {
		return nil, fmt.Errorf("te: target engine: %w", err)
	}
	buf, err := allocate(ctx, e, cfg.BufferSize, cfg.GPU)
	if err != nil {
		e.Close()
		return nil, fmt.Errorf("te: target buffer: %w", err)
	}
	return &Target{e: e, buf: buf, info: TargetInfo{
		Segment: e.Name(), Addr: uint64(buf.Addr()), Length: uint64(buf.Len()), PID: os.Getpid(),
	}}, nil
}

// Info says how to reach the target.
func (t *Target) Info() TargetInfo { return t.info }

// Close frees the buffer and stops the engine. It is idempotent and safe
// to call concurrently.
func (t *Target) Close() error {
	t.once.Do(func() { t.err = errors.Join(t.buf.Free(), t.e.Close()) })
	return t.err
}

// ServeTarget runs a target until ctx ends, after printing its TargetInfo
// as one JSON line on out. It is the body of the target child process.
func ServeTarget(ctx context.Context, cfg TargetConfig, out io.Writer) (err error) {
	if cfg.CPUProfile != "" {
		f, err := os.Create(cfg.CPUProfile)
		if err != nil {
			return fmt.Errorf("te: cpu profile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("te: cpu profile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	t, err := NewTarget(ctx, cfg)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, t.Close()) }()
	if err := json.NewEncoder(out).Encode(t.Info()); err != nil {
		return fmt.Errorf("te: announce target: %w", err)
	}
	<-ctx.Done()
	return nil
}

// mapAnon maps n bytes of private anonymous memory, outside the Go heap,
// and touches every page.
func mapAnon(n int) ([]byte, error) {
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("te: mmap %d bytes: %w", n, err)
	}
	touch(b)
	return b, nil
}

// touch faults every page of b in, with a non-zero pattern so that no page
// stays shared with the zero page.
func touch(b []byte) {
	for i := 0; i < len(b); i += 4096 {
		b[i] = byte(i>>12) | 1
	}
}
