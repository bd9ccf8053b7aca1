package framerpc

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc/credentials"
)

// prefaceTimeout bounds how long a new connection may take to send its
// first bytes before it is dropped. An HTTP/2 client sends its preface
// at once.
const prefaceTimeout = 10 * time.Second

// Split returns a listener of ln's connections that do not open with
// Preface, for a gRPC server; those that do go to s.ServeConn. A
// connection is told apart on its own goroutine, so a slow one holds up
// no other. Closing the returned listener closes ln.
func Split(ln net.Listener, s *Server) net.Listener {
	return SplitTLS(ln, s, nil)
}

// ALPN is the application protocol a framed client over TLS asks for; a
// server without framerpc (gRPC's, which knows only "h2") refuses the
// handshake, and the client turns to gRPC.
const ALPN = "mcframe1"

// SplitTLS is Split of connections that speak TLS with cfg (nil: none):
// each one's handshake runs on its goroutine, within the time its preface
// has, and the frames and gRPC's HTTP/2 are told apart inside it. The
// gRPC server then takes the connections as they are, handshaken: its
// transport credentials must be Handshaken(cfg).
func SplitTLS(ln net.Listener, s *Server, cfg *tls.Config) net.Listener {
	if cfg != nil {
		cfg = cfg.Clone()
		cfg.NextProtos = []string{"h2", ALPN}
	}
	sl := &splitListener{Listener: ln, s: s, tls: cfg, conns: make(chan net.Conn), done: make(chan struct{})}
	go sl.accept()
	return sl
}

type splitListener struct {
	net.Listener
	s     *Server
	tls   *tls.Config   // nil: plaintext
	conns chan net.Conn // for the gRPC server
	done  chan struct{} // closed by Close

	mu  sync.Mutex
	err error // ln's Accept failed for good
	end sync.Once
}

func (sl *splitListener) accept() {
	for {
		c, err := sl.Listener.Accept()
		if err != nil {
			if ne, ok := err.(interface{ Temporary() bool }); ok && ne.Temporary() {
				time.Sleep(5 * time.Millisecond)
				continue
			}
			sl.mu.Lock()
			sl.err = err
			sl.mu.Unlock()
			sl.end.Do(func() { close(sl.done) })
			return
		}
		go sl.sort(c)
	}
}

// sort reads c's first bytes (inside TLS, with it) and passes it on.
func (sl *splitListener) sort(c net.Conn) {
	var head [len(Preface)]byte
	deadline := time.Now().Add(prefaceTimeout)
	_ = c.SetDeadline(deadline)
	if sl.tls != nil {
		tc := tls.Server(c, sl.tls)
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		err := tc.HandshakeContext(ctx)
		cancel()
		if err != nil {
			_ = c.Close()
			return
		}
		c = tc
	}
	n, err := io.ReadFull(c, head[:])
	_ = c.SetDeadline(time.Time{})
	switch {
	case err == nil && string(head[:]) == Preface:
		sl.s.ServeConn(c)
		return
	case err != nil && n == 0:
		_ = c.Close() // closed or silent before a byte
		return
	}
	pc := &prefixConn{Conn: c, prefix: append([]byte(nil), head[:n]...)}
	select {
	case sl.conns <- pc:
	case <-sl.done:
		_ = c.Close()
	}
}

// Accept returns the next connection for gRPC.
func (sl *splitListener) Accept() (net.Conn, error) {
	select {
	case c := <-sl.conns:
		return c, nil
	case <-sl.done:
		sl.mu.Lock()
		defer sl.mu.Unlock()
		if sl.err == nil {
			return nil, net.ErrClosed
		}
		return nil, sl.err
	}
}

// Close closes the listener; connections already accepted stay open.
func (sl *splitListener) Close() error {
	err := sl.Listener.Close()
	sl.end.Do(func() { close(sl.done) })
	return err
}

// prefixConn is a connection whose first bytes were read already.
type prefixConn struct {
	net.Conn
	prefix []byte
}

func (c *prefixConn) Read(p []byte) (int, error) {
	if len(c.prefix) > 0 {
		n := copy(p, c.prefix)
		c.prefix = c.prefix[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// closeConn closes c at once: a TLS connection without its close_notify,
// whose write may wait up to 5 s on a peer that stopped reading (a frame
// says its length, so a cut is never taken for an end).
func closeConn(c net.Conn) error {
	for {
		switch x := c.(type) {
		case *tls.Conn:
			c = x.NetConn()
		case *prefixConn:
			c = x.Conn
		default:
			return c.Close()
		}
	}
}

// ConnectionState is the TLS state of a connection SplitTLS handshook.
func (c *prefixConn) ConnectionState() tls.ConnectionState {
	if tc, ok := c.Conn.(*tls.Conn); ok {
		return tc.ConnectionState()
	}
	return tls.ConnectionState{}
}

// Handshaken returns the gRPC server's transport credentials for the
// connections of a SplitTLS listener of cfg: their handshake is done, and
// each is taken as it is, with its TLS state as its peer's AuthInfo.
func Handshaken(cfg *tls.Config) credentials.TransportCredentials {
	return handshaken{credentials.NewTLS(cfg)}
}

type handshaken struct {
	credentials.TransportCredentials
}

func (h handshaken) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	tc, ok := c.(interface{ ConnectionState() tls.ConnectionState })
	if !ok {
		_ = c.Close()
		return nil, nil, errors.New("framerpc: a connection not from SplitTLS")
	}
	st := tc.ConnectionState()
	if !st.HandshakeComplete {
		_ = c.Close()
		return nil, nil, errors.New("framerpc: a connection without its TLS handshake")
	}
	return c, credentials.TLSInfo{State: st, CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity}}, nil
}

func (h handshaken) Clone() credentials.TransportCredentials {
	return handshaken{h.TransportCredentials.Clone()}
}
