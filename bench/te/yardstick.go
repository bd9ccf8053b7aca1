package te

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/engine/transport/conn"
)

// The yardsticks say what the hardware and kernel give a plain program, so
// that our figures read as a ratio rather than an absolute:
//
//   - for TCP, loopback streams between this process and a sink (a child
//     process by default, as the target is), with big reads and writes
//     straight between sockets and buffers as large as the engine's;
//   - for shared memory, a single-thread memcpy of block-size chunks
//     between two mmap'd buffers too large for any cache.

// SinkConfig configures the loopback TCP sink.
type SinkConfig struct {
	// BufferSize is the memory the sink reads into and writes from, split
	// between its connections as the initiator asks. Required.
	BufferSize int
}

// BindFlags defines the flags a sink child process reads.
func (c *SinkConfig) BindFlags(fs *pflag.FlagSet) {
	fs.IntVar(&c.BufferSize, "buffer-size", 0, "buffer size in bytes")
}

// Args are the command-line flags that make BindFlags yield c.
func (c SinkConfig) Args() []string {
	return []string{"--buffer-size", strconv.Itoa(c.BufferSize)}
}

// SinkInfo is the line a sink child process prints on stdout.
type SinkInfo struct {
	Addr string `json:"addr"` // host:port to dial
	PID  int    `json:"pid"`
}

// Stream header, initiator to sink: magic, mode, then u64 chunk size,
// offset and span of the part of the sink's buffer this connection uses.
const (
	streamMagic  = "MCYS"
	streamHeader = 32
	modeSink     = 'W' // the initiator writes, the sink reads and finally answers the byte count
	modeSource   = 'R' // the sink writes until the initiator hangs up
)

// Sink serves yardstick TCP streams.
type Sink struct {
	l   *conn.Listener
	buf []byte
}

// NewSink listens on a loopback port.
func NewSink(cfg SinkConfig) (*Sink, error) {
	if cfg.BufferSize <= 0 {
		return nil, fmt.Errorf("te: sink BufferSize %d", cfg.BufferSize)
	}
	buf, err := mapAnon(cfg.BufferSize)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		unix.Munmap(buf)
		return nil, fmt.Errorf("te: sink: %w", err)
	}
	s := &Sink{buf: buf}
	s.l = conn.Serve(ln, 0, nil, s.serve)
	return s, nil
}

// Info says how to reach the sink.
func (s *Sink) Info() SinkInfo { return SinkInfo{Addr: s.l.Addr().String(), PID: os.Getpid()} }

// Close stops the sink, ends its streams and waits for them.
func (s *Sink) Close() error {
	s.l.Close()
	return unix.Munmap(s.buf)
}

func (s *Sink) serve(c net.Conn) {
	var h [streamHeader]byte
	if _, err := io.ReadFull(c, h[:]); err != nil || string(h[:4]) != streamMagic {
		return
	}
	chunk := binary.LittleEndian.Uint64(h[8:])
	off := binary.LittleEndian.Uint64(h[16:])
	span := binary.LittleEndian.Uint64(h[24:])
	if chunk == 0 || span < chunk || off+span > uint64(len(s.buf)) || off+span < off {
		return
	}
	mem := s.buf[off : off+span]
	pos := uint64(0)
	next := func() []byte {
		if pos+chunk > span {
			pos = 0
		}
		b := mem[pos : pos+chunk]
		pos += chunk
		return b
	}
	switch h[4] {
	case modeSink:
		var total uint64
		for {
			n, err := io.ReadFull(c, next())
			total += uint64(n)
			if err != nil {
				break // EOF: the initiator is done
			}
		}
		var ack [8]byte
		binary.LittleEndian.PutUint64(ack[:], total)
		c.Write(ack[:])
	case modeSource:
		for {
			if _, err := c.Write(next()); err != nil {
				return // the initiator hung up
			}
		}
	}
}

// ServeSink runs a sink until ctx ends, after printing its SinkInfo as one
// JSON line on out. It is the body of the sink child process.
func ServeSink(ctx context.Context, cfg SinkConfig, out io.Writer) error {
	s, err := NewSink(cfg)
	if err != nil {
		return err
	}
	defer s.Close()
	if err := json.NewEncoder(out).Encode(s.Info()); err != nil {
		return fmt.Errorf("te: announce sink: %w", err)
	}
	<-ctx.Done()
	return nil
}

// TCPOptions configures one loopback TCP yardstick run.
type TCPOptions struct {
	Addr  string    // the sink
	Conns int       // concurrent connections, each driven by one goroutine
	Op    engine.Op // Write: we send, the sink receives; Read: the other way
	Chunk int       // bytes per read or write call
	// Buffer is our side's memory, split between the connections as the
	// sink's is; each connection cycles through its part chunk by chunk.
	Buffer     []byte
	SinkBuffer int // size of the sink's buffer
	Duration   time.Duration
	// Progress, when set, counts bytes as they move.
	Progress *atomic.Uint64
}

// TCPYardstick streams over Conns loopback connections for Duration and
// returns the aggregate throughput. In the Write direction the clock stops
// when the sink has acknowledged every byte.
func TCPYardstick(ctx context.Context, o TCPOptions) (Figures, error) {
	if o.Conns <= 0 || o.Chunk <= 0 || len(o.Buffer) < o.Chunk || o.SinkBuffer < o.Chunk {
		return Figures{}, fmt.Errorf("te: tcp yardstick: bad options (conns %d, chunk %d, buffers %d and %d)",
			o.Conns, o.Chunk, len(o.Buffer), o.SinkBuffer)
	}
	conns := make([]net.Conn, 0, o.Conns)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	var d net.Dialer
	for i := range o.Conns {
		c, err := d.DialContext(ctx, "tcp", o.Addr)
		if err != nil {
			return Figures{}, fmt.Errorf("te: tcp yardstick: %w", err)
		}
		conns = append(conns, c)
		off, span := part(o.SinkBuffer, o.Chunk, i, o.Conns)
		var h [streamHeader]byte
		copy(h[:], streamMagic)
		h[4] = modeSink
		if o.Op == engine.Read {
			h[4] = modeSource
		}
		binary.LittleEndian.PutUint64(h[8:], uint64(o.Chunk))
		binary.LittleEndian.PutUint64(h[16:], uint64(off))
		binary.LittleEndian.PutUint64(h[24:], uint64(span))
		if _, err := c.Write(h[:]); err != nil {
			return Figures{}, fmt.Errorf("te: tcp yardstick: %w", err)
		}
	}
	// Cancellation closes the sockets, which ends any blocked call.
	stop := context.AfterFunc(ctx, func() {
		for _, c := range conns {
			c.Close()
		}
	})
	defer stop()

	start := time.Now()
	end := start.Add(o.Duration)
	var wg sync.WaitGroup
	moved := make([]uint64, len(conns))
	errs := make([]error, len(conns))
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			off, span := part(len(o.Buffer), o.Chunk, i, len(conns))
			moved[i], errs[i] = stream(c, o, o.Buffer[off:off+span], end)
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := ctx.Err(); err != nil {
		return Figures{}, err
	}
	var total uint64
	for i := range conns {
		if errs[i] != nil {
			return Figures{}, fmt.Errorf("te: tcp yardstick connection %d: %w", i, errs[i])
		}
		total += moved[i]
	}
	return figures(total, elapsed), nil
}

// stream drives one yardstick connection until end.
func stream(c net.Conn, o TCPOptions, mem []byte, end time.Time) (uint64, error) {
	pos := 0
	next := func() []byte {
		if pos+o.Chunk > len(mem) {
			pos = 0
		}
		b := mem[pos : pos+o.Chunk]
		pos += o.Chunk
		return b
	}
	var n uint64
	if o.Op == engine.Read {
		for time.Now().Before(end) {
			k, err := io.ReadFull(c, next())
			n += uint64(k)
			if o.Progress != nil {
				o.Progress.Add(uint64(k))
			}
			if err != nil {
				return n, err
			}
		}
		return n, nil
	}
	for time.Now().Before(end) {
		k, err := c.Write(next())
		n += uint64(k)
		if o.Progress != nil {
			o.Progress.Add(uint64(k))
		}
		if err != nil {
			return n, err
		}
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		return n, err
	}
	var ack [8]byte
	if _, err := io.ReadFull(c, ack[:]); err != nil {
		return n, fmt.Errorf("sink acknowledgement: %w", err)
	}
	if got := binary.LittleEndian.Uint64(ack[:]); got != n {
		return n, fmt.Errorf("sink received %d bytes, %d sent", got, n)
	}
	return n, nil
}

// part is connection (or worker) i's share of a buffer of n bytes, in
// whole chunks; when there are fewer chunks than sharers, shares overlap.
func part(n, chunk, i, of int) (off, span int) {
	chunks := n / chunk
	per := max(chunks/of, 1)
	first := (i * per) % chunks
	if first+per > chunks {
		first = 0
	}
	return first * chunk, per * chunk
}

// MemcpySpan is the least memory the memcpy yardstick cycles through, so
// that its copies come from and go to DRAM as the engine's do.
const MemcpySpan = 256 << 20

// MemcpyOptions configures one memcpy yardstick run.
type MemcpyOptions struct {
	Chunk int // bytes per copy
	// Src and Dst are the two buffers, of equal size (see NewMemcpyBuffers).
	Src, Dst []byte
	Duration time.Duration
	// Progress, when set, counts bytes as they move.
	Progress *atomic.Uint64
}

// NewMemcpyBuffers maps two touched buffers of span bytes each; free them
// with unix.Munmap, or through the returned function.
func NewMemcpyBuffers(span int) (src, dst []byte, free func(), err error) {
	if src, err = mapAnon(span); err != nil {
		return nil, nil, nil, err
	}
	if dst, err = mapAnon(span); err != nil {
		unix.Munmap(src)
		return nil, nil, nil, err
	}
	return src, dst, func() { unix.Munmap(src); unix.Munmap(dst) }, nil
}

// MemcpyYardstick copies Chunk-byte pieces from Src to Dst on the calling
// goroutine, cycling through the buffers, for Duration.
func MemcpyYardstick(ctx context.Context, o MemcpyOptions) (Figures, error) {
	if o.Chunk <= 0 || len(o.Src) < o.Chunk || len(o.Dst) != len(o.Src) {
		return Figures{}, errors.New("te: memcpy yardstick: bad options")
	}
	// Look at the clock every ~4 MiB so small chunks are not timing calls.
	every := max(1, (4<<20)/o.Chunk)
	var n, reported uint64
	pos := 0
	start := time.Now()
	end := start.Add(o.Duration)
	for i := 0; ; i++ {
		if i%every == 0 {
			if !time.Now().Before(end) {
				break
			}
			if err := ctx.Err(); err != nil {
				return Figures{}, err
			}
			if o.Progress != nil {
				o.Progress.Add(n - reported)
				reported = n
			}
		}
		if pos+o.Chunk > len(o.Src) {
			pos = 0
		}
		copy(o.Dst[pos:pos+o.Chunk], o.Src[pos:pos+o.Chunk])
		pos += o.Chunk
		n += uint64(o.Chunk)
	}
	return figures(n, time.Since(start)), nil
}

func figures(n uint64, d time.Duration) Figures {
	return Figures{Seconds: d.Seconds(), Bytes: n, GBPerS: float64(n) / d.Seconds() / 1e9}
}
