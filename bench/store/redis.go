package store

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"time"
)

// ErrNoRedis means redis-server is not installed.
var ErrNoRedis = errors.New("store: redis-server not found in PATH (Debian package redis-server; scripts/test-deps.sh installs it)")

// RedisConfig configures the Redis yardstick's server.
type RedisConfig struct {
	// Path is the redis-server executable. Zero: redis-server in PATH.
	Path string
	// MaxMemory is the server's maxmemory in bytes, beyond which it evicts
	// keys (allkeys-lru), as a cache does. Zero: no limit (RunRedis sets
	// the capacity it gives every yardstick).
	MaxMemory int64
	// StartTimeout bounds the start. Zero: 30 s.
	StartTimeout time.Duration
}

// RedisServer is a redis-server child process on a loopback port, with
// persistence off (no RDB snapshots, no AOF) and its files in a temporary
// directory. Redis executes commands on one thread, with its socket I/O on
// that thread too unless io-threads is set, which it is not here: that is
// the Redis most deployments run, and the yardstick says so.
type RedisServer struct {
	p    *proc
	addr string
	dir  string
}

// StartRedis starts a server and waits until it answers PING.
func StartRedis(ctx context.Context, cfg RedisConfig) (*RedisServer, error) {
	path := cfg.Path
	if path == "" {
		var err error
		if path, err = exec.LookPath("redis-server"); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrNoRedis, err)
		}
	}
	timeout := cfg.StartTimeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	dir, err := os.MkdirTemp("", "mcbench-redis-")
	if err != nil {
		return nil, err
	}
	// A port free a moment ago may be taken by the time the server binds
	// it; the server then exits at once and another port is tried.
	for attempt := 0; ; attempt++ {
		s, err := startRedis(ctx, path, dir, cfg.MaxMemory, timeout)
		if err == nil {
			return s, nil
		}
		if attempt == 2 || ctx.Err() != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
}

func startRedis(ctx context.Context, path, dir string, maxMemory int64, timeout time.Duration) (*RedisServer, error) {
	ports, err := freePorts(1)
	if err != nil {
		return nil, err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))
	args := []string{
		"--port", strconv.Itoa(ports[0]), "--bind", "127.0.0.1", "--protected-mode", "no",
		"--save", "", "--appendonly", "no", "--dir", dir, "--daemonize", "no",
		"--logfile", "", "--loglevel", "warning", "--databases", "1",
		"--maxmemory", strconv.FormatInt(maxMemory, 10),
	}
	if maxMemory > 0 {
		args = append(args, "--maxmemory-policy", "allkeys-lru")
	}
	p, err := startProc("redis-server", path, args, nil, false)
	if err != nil {
		return nil, err
	}
	s := &RedisServer{p: p, addr: addr, dir: dir}
	if err := waitTCP(ctx, p, addr, timeout); err != nil {
		p.Close()
		return nil, err
	}
	// Listening is not yet serving while it loads; PING says it is ready.
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err == nil {
		c.SetDeadline(time.Now().Add(timeout))
		err = newRespConn(c).ping()
		c.Close()
	}
	if err != nil {
		p.Close()
		return nil, p.fail(fmt.Errorf("PING: %w", err))
	}
	return s, nil
}

// Addr is the server's host:port.
func (s *RedisServer) Addr() string { return s.addr }

// PID is the server's process id.
func (s *RedisServer) PID() int { return s.p.pid() }

// Close stops the server (SIGTERM, then SIGKILL), waits for it and removes
// its directory. It is idempotent.
func (s *RedisServer) Close() error {
	s.p.Close()
	return os.RemoveAll(s.dir)
}

// NewWorker connects a client of o (after WithDefaults): its own connection,
// and one batch of memory, which puts send and gets fill. A batch is one
// MSET or MGET (SET or GET for a batch of one), so one round trip, as it is
// one call for the other systems.
func (s *RedisServer) NewWorker(o Options) (Worker, error) {
	o = o.WithDefaults()
	c, err := net.Dial("tcp", s.addr)
	if err != nil {
		return nil, fmt.Errorf("store: redis: %w", err)
	}
	mem := make([]byte, o.BatchSize*o.ValueSize)
	for i := range mem {
		mem[i] = byte(i) // a pattern, not zeros
	}
	return &redisWorker{c: c, rc: newRespConn(c), mem: mem, size: o.ValueSize}, nil
}

// redisWorker is a Worker on one connection to a RedisServer.
type redisWorker struct {
	c    net.Conn
	rc   *respConn
	mem  []byte
	size int
}

var _ Worker = (*redisWorker)(nil)

// call runs fn, cutting it short when ctx ends.
func (w *redisWorker) call(ctx context.Context, fn func() error) error {
	stop := context.AfterFunc(ctx, func() { w.c.SetDeadline(time.Unix(1, 0)) })
	err := fn()
	if !stop() {
		return errors.Join(ctx.Err(), err)
	}
	return err
}

// Put implements Worker with one SET or MSET.
func (w *redisWorker) Put(ctx context.Context, keys []string) error {
	return w.call(ctx, func() error { return w.rc.set(keys, w.mem, w.size) })
}

// Get implements Worker with one GET or MGET.
func (w *redisWorker) Get(ctx context.Context, keys []string) error {
	return w.call(ctx, func() error { return w.rc.get(keys, w.mem, w.size) })
}

// Close implements Worker.
func (w *redisWorker) Close() error { return w.c.Close() }

// RunRedis measures one run of o against a fresh RedisServer, capped at
// the memory every yardstick gets (twice a get run's working set, at least
// 512 MiB) unless cfg says otherwise, and stops it.
func RunRedis(ctx context.Context, o Options, cfg RedisConfig) (res Result, err error) {
	if err := o.Validate(); err != nil {
		return Result{}, err
	}
	o = o.WithDefaults()
	if cfg.MaxMemory == 0 {
		cfg.MaxMemory = o.capacity()
	}
	s, err := StartRedis(ctx, cfg)
	if err != nil {
		return Result{}, err
	}
	defer func() { err = errors.Join(err, s.Close()) }()
	res, err = Drive(ctx, o, func(int) (Worker, error) { return s.NewWorker(o) })
	res.Name = Redis
	return res, err
}
