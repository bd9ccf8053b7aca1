package master

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
)

// The KV events sockets listen for TCP through kvTransport, TCP with the
// bounds zmq4's own lacks, so that no subscriber can make the master hold
// unbounded connections or memory:
//
//   - at most KVEventsConfig.MaxSubscribers connections per socket; more
//     are closed as they are accepted, and the refusal logged;
//   - a deadline on the ZMTP handshake (kvHandshakeTimeout), which zmq4's
//     accept loop runs inline: a peer that connects and says nothing
//     would otherwise keep every other subscriber out;
//   - no frame from a peer larger than kvMaxFrame: zmq4 allocates a frame's
//     announced size before reading it. Subscriptions and replay requests
//     are a few bytes.
//
// A connection that breaks a bound is closed; the ones zmq4 gives up on
// during the handshake it never closes, so the transport does.

const (
	kvTransport = "mctcp"
	kvMaxFrame  = 64 << 10
)

// kvHandshakeTimeout is the time a peer has to finish its ZMTP handshake
// (a variable for tests).
var kvHandshakeTimeout = 5 * time.Second

// DefaultKVEventsMaxSubscribers is the default of
// KVEventsConfig.MaxSubscribers.
const DefaultKVEventsMaxSubscribers = 256

var registerKVTransport = sync.OnceValue(func() error {
	return zmq4.RegisterTransport(kvTransport, kvLimitedTCP{})
})

// kvLimitKey carries a socket's *kvConnLimit in the context its listener
// is made with (zmq4 hands the socket's context to Transport.Listen).
type kvLimitKey struct{}

// kvListen binds s to endpoint; a tcp:// endpoint goes through
// kvTransport under lim. s must have been made with kvContext.
func kvListen(s zmq4.Socket, endpoint string) error {
	if rest, ok := strings.CutPrefix(endpoint, "tcp://"); ok {
		if err := registerKVTransport(); err != nil {
			return err
		}
		endpoint = kvTransport + "://" + rest
	}
	return s.Listen(endpoint)
}

// kvContext is ctx carrying a connection limit for a socket's listener.
func kvContext(ctx context.Context, lim *kvConnLimit) context.Context {
	return context.WithValue(ctx, kvLimitKey{}, lim)
}

// kvConnLimit counts one socket's connections.
type kvConnLimit struct {
	max  int
	name string // what the socket is, for the logs
	log  *slog.Logger

	mu      sync.Mutex
	open    int
	refused uint64
	lastLog time.Time
}

func (l *kvConnLimit) take() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open >= l.max {
		l.refused++
		// A flood logs a line a second, not one a connection.
		if now := time.Now(); now.Sub(l.lastLog) >= time.Second {
			l.lastLog = now
			l.log.Warn("master: refused a KV events connection", "socket", l.name,
				"reason", fmt.Sprintf("%d connections open, the limit (max_subscribers)", l.max), "refused", l.refused)
		}
		return false
	}
	l.open++
	return true
}

func (l *kvConnLimit) release() {
	l.mu.Lock()
	l.open--
	l.mu.Unlock()
}

// counts returns the connections open and refused so far.
func (l *kvConnLimit) counts() (open int, refused uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open, l.refused
}

// kvLimitedTCP is kvTransport.
type kvLimitedTCP struct{}

var tcpTransport = transport.New("tcp")

func (kvLimitedTCP) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	return tcpTransport.Dial(ctx, d, addr)
}

func (kvLimitedTCP) Addr(ep string) (string, error) { return tcpTransport.Addr(ep) }

func (kvLimitedTCP) Listen(ctx context.Context, addr string) (net.Listener, error) {
	lim, ok := ctx.Value(kvLimitKey{}).(*kvConnLimit)
	if !ok {
		return nil, errors.New("master: kv events listener without a connection limit")
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	return &kvListener{Listener: ln, lim: lim}, nil
}

type kvListener struct {
	net.Listener
	lim *kvConnLimit
}

func (l *kvListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if !l.lim.take() {
			c.Close()
			continue
		}
		_ = c.SetDeadline(time.Now().Add(kvHandshakeTimeout))
		return &kvConn{Conn: c, lim: l.lim, in: zmtpReader{need: zmtpGreeting}}, nil
	}
}

// kvConn is a counted connection that checks the frames it reads.
type kvConn struct {
	net.Conn
	lim  *kvConnLimit
	once sync.Once
	in   zmtpReader // used by the one goroutine zmq4 reads with at a time
}

var errKVFrame = fmt.Errorf("master: kv events: a frame over %d bytes", kvMaxFrame)

func (c *kvConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	shook := c.in.frames > 0
	if ferr := c.in.feed(p[:n]); ferr != nil {
		c.Close()
		return 0, ferr
	}
	if !shook && c.in.frames > 0 {
		_ = c.Conn.SetDeadline(time.Time{}) // the peer's READY is in
	}
	if err != nil && !shook {
		c.Close() // zmq4 drops a failed handshake without closing it
	}
	return n, err
}

func (c *kvConn) Close() error {
	c.once.Do(c.lim.release)
	return c.Conn.Close()
}

// zmtpGreeting is the length of a ZMTP 3 greeting.
const zmtpGreeting = 64

// zmtpReader follows the bytes a ZMTP 3 peer sends: the greeting, then
// frames of a flags byte, a size of 1 byte (8 with the LONG flag, 0x02)
// and a body. It counts the frames and refuses one over kvMaxFrame.
type zmtpReader struct {
	phase  int    // 0 greeting, 1 flags, 2 size, 3 body
	need   uint64 // bytes left of this phase
	size   uint64
	frames int // frames read whole
}

func (z *zmtpReader) feed(p []byte) error {
	for len(p) > 0 {
		switch z.phase {
		case 0, 3:
			n := min(z.need, uint64(len(p)))
			z.need -= n
			p = p[n:]
			if z.need == 0 {
				if z.phase == 3 {
					z.frames++
				}
				z.phase = 1
			}
		case 1:
			z.need, z.size, z.phase = 1, 0, 2
			if p[0]&0x02 != 0 {
				z.need = 8
			}
			p = p[1:]
		case 2:
			z.size = z.size<<8 | uint64(p[0])
			p = p[1:]
			if z.need--; z.need > 0 {
				continue
			}
			if z.size > kvMaxFrame {
				return errKVFrame
			}
			z.need, z.phase = z.size, 3
			if z.size == 0 {
				z.frames++
				z.phase = 1
			}
		}
	}
	return nil
}
