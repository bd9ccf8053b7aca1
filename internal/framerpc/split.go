package framerpc

import (
	"io"
	"net"
	"sync"
	"time"
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
	sl := &splitListener{Listener: ln, s: s, conns: make(chan net.Conn), done: make(chan struct{})}
	go sl.accept()
	return sl
}

type splitListener struct {
	net.Listener
	s     *Server
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

// sort reads c's first bytes and passes it on.
func (sl *splitListener) sort(c net.Conn) {
	var head [len(Preface)]byte
	_ = c.SetReadDeadline(time.Now().Add(prefaceTimeout))
	n, err := io.ReadFull(c, head[:])
	_ = c.SetReadDeadline(time.Time{})
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
