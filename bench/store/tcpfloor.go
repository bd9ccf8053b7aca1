package store

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	"github.com/mooncake-go/mooncake/engine/transport/conn"
)

// TCPServerConfig configures the tcp floor's server.
type TCPServerConfig struct {
	// ValueSize is the size of every value. Required.
	ValueSize int
	// Slots is the number of values the server holds: a get run's working
	// set. Required.
	Slots int
}

// BindFlags defines the flags a server child process reads.
func (c *TCPServerConfig) BindFlags(fs *pflag.FlagSet) {
	fs.IntVar(&c.ValueSize, "value-size", 0, "bytes per value")
	fs.IntVar(&c.Slots, "slots", 0, "values held")
}

// Args are the command-line flags that make BindFlags yield c.
func (c TCPServerConfig) Args() []string {
	return []string{"--value-size", strconv.Itoa(c.ValueSize), "--slots", strconv.Itoa(c.Slots)}
}

// TCPServerInfo is the line a server child process prints on stdout once it
// listens.
type TCPServerInfo struct {
	Addr string `json:"addr"`
	PID  int    `json:"pid"`
}

// TCPServer is the server of the tcp floor: a buffer of Slots values,
// mapped and faulted in before it serves, and a loopback listener serving
// each connection on its own goroutine, one request at a time (see the
// wire in tcpwire.go). A get is answered with one writev of the values
// straight from the buffer; a put's values are read from the socket
// straight into it. Sockets keep the kernel's default buffer sizes, with
// Nagle off (Go's default), as the engine's TCP transport does.
type TCPServer struct {
	l     *conn.Listener
	mem   []byte
	slots *slots
	lim   tcpLimits
}

// NewTCPServer maps the buffer and listens on a free loopback port.
func NewTCPServer(cfg TCPServerConfig) (*TCPServer, error) {
	if cfg.ValueSize <= 0 || cfg.Slots <= 0 || cfg.ValueSize > 1<<32-1 {
		return nil, fmt.Errorf("store: tcp server: value size %d, slots %d", cfg.ValueSize, cfg.Slots)
	}
	mem, err := unix.Mmap(-1, 0, cfg.ValueSize*cfg.Slots, unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("store: tcp server: map %d bytes: %w", cfg.ValueSize*cfg.Slots, err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		unix.Munmap(mem)
		return nil, fmt.Errorf("store: tcp server: %w", err)
	}
	s := &TCPServer{mem: mem, slots: newSlots(cfg.Slots), lim: tcpLimits{valueSize: cfg.ValueSize, maxCount: cfg.Slots}}
	s.l = conn.Serve(ln, 0, nil, s.serve)
	return s, nil
}

// Addr is the server's host:port.
func (s *TCPServer) Addr() string { return s.l.Addr().String() }

// Close stops the server, cuts its connections, waits for them and
// unmaps the buffer.
func (s *TCPServer) Close() error {
	err := s.l.Close()
	return errors.Join(err, unix.Munmap(s.mem))
}

// value is slot i of the buffer.
func (s *TCPServer) value(i int) []byte {
	return s.mem[i*s.lim.valueSize : (i+1)*s.lim.valueSize]
}

// serve answers the requests of one connection until it ends or sends
// something the server cannot decode.
func (s *TCPServer) serve(c net.Conn) {
	// Big enough for a batch's keys; a put's values bypass it, read
	// straight into the buffer once the keys are consumed.
	r := bufio.NewReaderSize(c, 64<<10)
	var (
		req  tcpRequest
		at   []int
		bufs net.Buffers
		ack  = []byte{tcpAck}
		vals = []byte{tcpValues}
	)
	for {
		err := readTCPRequest(r, s.lim, &req)
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			refuse(c, err)
			return
		}
		switch req.op {
		case tcpGet:
			if at, err = s.slots.find(req.keys, at[:0]); err != nil {
				if _, err := c.Write(appendTCPError(nil, err)); err != nil {
					return
				}
				continue
			}
			bufs = append(bufs[:0], vals)
			for _, i := range at {
				bufs = append(bufs, s.value(i))
			}
			// WriteTo consumes its receiver: hand it a copy of the header.
			out := bufs
			if _, err := out.WriteTo(c); err != nil {
				return
			}
		case tcpPut:
			// The count is within the slots, so reserve cannot fail.
			at, _ = s.slots.reserve(req.keys, at[:0])
			for _, i := range at {
				if _, err := io.ReadFull(r, s.value(i)); err != nil {
					return
				}
			}
			s.slots.publish(req.keys, at)
			if _, err := c.Write(ack); err != nil {
				return
			}
		}
	}
}

// refuse answers a request that cannot be decoded with err, then ends the
// connection. What the client still sends is read and dropped for a moment
// first: closing a socket with unread bytes resets the connection, which
// could discard the message before the client reads it.
func refuse(c net.Conn, err error) {
	if _, err := c.Write(appendTCPError(nil, err)); err != nil {
		return
	}
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
	c.SetReadDeadline(time.Now().Add(time.Second))
	io.Copy(io.Discard, c)
}

// ServeTCPServer runs a server until ctx ends, after printing its
// TCPServerInfo as one JSON line on out. It is the body of the server child
// process ("mooncake bench store tcp-server").
func ServeTCPServer(ctx context.Context, cfg TCPServerConfig, out io.Writer) error {
	s, err := NewTCPServer(cfg)
	if err != nil {
		return err
	}
	defer s.Close()
	if err := json.NewEncoder(out).Encode(TCPServerInfo{Addr: s.Addr(), PID: os.Getpid()}); err != nil {
		return fmt.Errorf("store: announce tcp server: %w", err)
	}
	<-ctx.Done()
	return nil
}

// NewTCPWorker connects a client of o (after WithDefaults) to a TCPServer
// at addr: its own connection, and one batch of memory, which puts send
// and gets fill.
func NewTCPWorker(o Options, addr string) (Worker, error) {
	o = o.WithDefaults()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("store: tcp: %w", err)
	}
	mem := make([]byte, o.BatchSize*o.ValueSize)
	for i := range mem {
		mem[i] = byte(i) // a pattern, not zeros
	}
	return &tcpWorker{c: c, mem: mem, size: o.ValueSize}, nil
}

// tcpWorker is a Worker on one connection to a TCPServer.
type tcpWorker struct {
	c    net.Conn
	mem  []byte
	size int
	req  []byte // the request being sent, reused
}

var _ Worker = (*tcpWorker)(nil)

// call runs fn, cutting it short when ctx ends.
func (w *tcpWorker) call(ctx context.Context, fn func() error) error {
	stop := context.AfterFunc(ctx, func() { w.c.SetDeadline(time.Unix(1, 0)) })
	err := fn()
	if !stop() {
		return errors.Join(ctx.Err(), err)
	}
	return err
}

// Put implements Worker: the request and the values in one writev, then
// the server's ack.
func (w *tcpWorker) Put(ctx context.Context, keys []string) error {
	return w.call(ctx, func() error {
		w.req = appendTCPRequest(w.req[:0], tcpPut, w.size, keys)
		out := net.Buffers{w.req, w.mem[:len(keys)*w.size]}
		if _, err := out.WriteTo(w.c); err != nil {
			return fmt.Errorf("store: tcp: put: %w", err)
		}
		if err := readTCPReply(w.c, tcpAck); err != nil {
			return fmt.Errorf("store: tcp: put: %w", err)
		}
		return nil
	})
}

// Get implements Worker: the request, then the values read straight into
// the worker's memory.
func (w *tcpWorker) Get(ctx context.Context, keys []string) error {
	return w.call(ctx, func() error {
		w.req = appendTCPRequest(w.req[:0], tcpGet, w.size, keys)
		if _, err := w.c.Write(w.req); err != nil {
			return fmt.Errorf("store: tcp: get: %w", err)
		}
		if err := readTCPReply(w.c, tcpValues); err != nil {
			return fmt.Errorf("store: tcp: get: %w", err)
		}
		if _, err := io.ReadFull(w.c, w.mem[:len(keys)*w.size]); err != nil {
			return fmt.Errorf("store: tcp: get: %w", unexpected(err))
		}
		return nil
	})
}

// Close implements Worker.
func (w *tcpWorker) Close() error { return w.c.Close() }

// TCPConfig configures RunTCP.
type TCPConfig struct {
	// Command runs the server child process: a binary and the arguments
	// that make it call ServeTCPServer ("mooncake bench store tcp-server");
	// the server's flags follow. Zero: the server runs in this process,
	// sharing its Go runtime with the clients (for tests).
	Command []string
	// StartTimeout bounds the child's start. Zero: 30 s.
	StartTimeout time.Duration
}

// RunTCP measures one run of o against a fresh TCPServer holding the
// working set (Keys values), one connection per client, and stops it.
func RunTCP(ctx context.Context, o Options, cfg TCPConfig) (res Result, err error) {
	if err := o.Validate(); err != nil {
		return Result{}, err
	}
	o = o.WithDefaults()
	scfg := TCPServerConfig{ValueSize: o.ValueSize, Slots: o.Keys}
	var addr string
	if len(cfg.Command) == 0 {
		s, err := NewTCPServer(scfg)
		if err != nil {
			return Result{}, err
		}
		defer func() { err = errors.Join(err, s.Close()) }()
		addr = s.Addr()
	} else {
		timeout := cfg.StartTimeout
		if timeout <= 0 {
			timeout = 30 * time.Second
		}
		p, err := startProc("tcp server", cfg.Command[0], append(append([]string(nil), cfg.Command[1:]...), scfg.Args()...), nil, true)
		if err != nil {
			return Result{}, err
		}
		defer p.Close()
		var info TCPServerInfo
		if err := p.recv(ctx, timeout, &info); err != nil {
			return Result{}, err
		}
		if info.Addr == "" {
			return Result{}, p.fail(errors.New("announced no address"))
		}
		addr = info.Addr
	}
	res, err = Drive(ctx, o, func(int) (Worker, error) { return NewTCPWorker(o, addr) })
	res.Name, res.Topology = TCP, Remote
	return res, err
}
