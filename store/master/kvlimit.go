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

	"github.com/mooncake-go/mooncake/engine/transport/conn"
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
// kvTransport, under the limit s's context carries (kvContext).
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

// kvConnLimit is one socket's connection limit; its listener, once zmq4
// has made it, counts the connections.
type kvConnLimit struct {
	max int
	log *slog.Logger // with the socket's name

	mu sync.Mutex
	ll *conn.LimitListener
}

// counts returns the connections open and refused so far.
func (l *kvConnLimit) counts() (open int, refused uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ll == nil {
		return 0, 0
	}
	return l.ll.Open(), l.ll.Refused()
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
	ll := conn.Limit(ln, conn.Limits{Total: lim.max}, lim.log)
	lim.mu.Lock()
	lim.ll = ll
	lim.mu.Unlock()
	return kvListener{ll}, nil
}

// kvListener hands out connections within the limit, each with a
// deadline on its handshake.
type kvListener struct{ *conn.LimitListener }

func (l kvListener) Accept() (net.Conn, error) {
	c, err := l.LimitListener.Accept()
	if err != nil {
		return nil, err
	}
	_ = c.SetDeadline(time.Now().Add(kvHandshakeTimeout))
	return &kvConn{Conn: c, in: zmtpReader{need: zmtpGreeting}}, nil
}

// kvConn is a connection that checks the frames it reads. Its Close, that
// of a conn.LimitListener's connection, gives its place back.
type kvConn struct {
	net.Conn
	in zmtpReader // used by the one goroutine zmq4 reads with at a time
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
