package kvevents

import (
	"bufio"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"time"
)

// ZMTP 3.0 (rfc.zeromq.org/spec/23) with the NULL mechanism: the part of
// it a SUB or a DEALER needs to talk to libzmq's (or any ZMTP 3 peer's)
// PUB and ROUTER sockets. The engines publish their KV events over ZeroMQ;
// speaking the wire protocol ourselves keeps the Conductor free of cgo and
// lets it see a publisher's connection drop the moment it happens, which
// is how a killed engine leaves the index.

// zconn is one ZMTP connection.
type zconn struct {
	c net.Conn
	r *bufio.Reader
	w *bufio.Writer
	// max bounds one message, all frames together.
	max int
}

// Frame flags.
const (
	flagMore    = 0x01
	flagLong    = 0x02
	flagCommand = 0x04
)

// maxCommand bounds a command frame (READY, PING): a few properties.
const maxCommand = 64 << 10

// errTooLarge is returned for a message over zconn.max bytes.
var errTooLarge = errors.New("zmtp: message too large")

// errNotZMTP is a peer whose greeting lacks ZMTP's signature: something
// else listens on the endpoint.
var errNotZMTP = errors.New("zmtp: not a ZMTP peer")

// tcpAddr turns a ZeroMQ endpoint, tcp://host:port, into host:port. A
// wildcard host (the publisher's bind form, tcp://*:5557) means this host.
func tcpAddr(endpoint string) (string, error) {
	u, err := url.Parse(endpoint)
	if err != nil {
		return "", fmt.Errorf("endpoint %q: %w", endpoint, err)
	}
	if u.Scheme != "tcp" || u.Host == "" || u.Path != "" {
		return "", fmt.Errorf("endpoint %q: want tcp://host:port", endpoint)
	}
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil {
		return "", fmt.Errorf("endpoint %q: %w", endpoint, err)
	}
	if host == "*" || host == "" || host == "0.0.0.0" {
		host = "127.0.0.1"
	}
	if port == "" || port == "0" {
		return "", fmt.Errorf("endpoint %q: no port", endpoint)
	}
	return net.JoinHostPort(host, port), nil
}

// dialZMTP connects to addr and completes the handshake as a socket of
// type sockType ("SUB", "DEALER"), within timeout.
func dialZMTP(ctx context.Context, addr, sockType string, timeout time.Duration, max int) (*zconn, error) {
	d := net.Dialer{Timeout: timeout}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	z := &zconn{c: c, r: bufio.NewReaderSize(c, 64<<10), w: bufio.NewWriterSize(c, 4<<10), max: max}
	_ = c.SetDeadline(time.Now().Add(timeout))
	stop := context.AfterFunc(ctx, func() { c.Close() }) // a cancelled dial ends the handshake too
	err = z.handshake(sockType)
	if !stop() || err != nil {
		c.Close()
		return nil, fmt.Errorf("zmtp handshake with %s: %w", addr, cmp.Or(err, ctx.Err()))
	}
	_ = c.SetDeadline(time.Time{})
	return z, nil
}

func (z *zconn) handshake(sockType string) error {
	var g [64]byte
	g[0], g[9] = 0xff, 0x7f
	g[10], g[11] = 3, 0 // ZMTP 3.0: no heartbeats, subscriptions as messages
	copy(g[12:32], "NULL")
	if _, err := z.w.Write(g[:]); err != nil {
		return err
	}
	if err := z.command("READY", "Socket-Type", sockType); err != nil {
		return err
	}
	var peer [64]byte
	if _, err := io.ReadFull(z.r, peer[:]); err != nil {
		return fmt.Errorf("greeting: %w", err)
	}
	if peer[0] != 0xff || peer[9]&1 != 1 {
		return fmt.Errorf("greeting: %w", errNotZMTP)
	}
	if peer[10] < 3 {
		return fmt.Errorf("greeting: ZMTP %d.%d, want 3.x", peer[10], peer[11])
	}
	if mech := strings.TrimRight(string(peer[12:32]), "\x00"); mech != "NULL" {
		return fmt.Errorf("greeting: mechanism %q, want NULL", mech)
	}
	// The peer's READY: its properties do not matter here.
	flags, body, err := z.frame()
	if err != nil {
		return fmt.Errorf("ready: %w", err)
	}
	if flags&flagCommand == 0 || len(body) < 6 || string(body[1:6]) != "READY" {
		return errors.New("ready: the peer's first frame is not READY")
	}
	return nil
}

// command writes a command frame named name with one property, and
// flushes.
func (z *zconn) command(name, prop, value string) error {
	body := make([]byte, 0, 1+len(name)+1+len(prop)+4+len(value))
	body = append(body, byte(len(name)))
	body = append(body, name...)
	body = append(body, byte(len(prop)))
	body = append(body, prop...)
	body = binary.BigEndian.AppendUint32(body, uint32(len(value)))
	body = append(body, value...)
	z.writeFrame(flagCommand, body)
	return z.w.Flush()
}

func (z *zconn) writeFrame(flags byte, body []byte) {
	if len(body) > 255 {
		var n [9]byte
		n[0] = flags | flagLong
		binary.BigEndian.PutUint64(n[1:], uint64(len(body)))
		z.w.Write(n[:])
	} else {
		z.w.Write([]byte{flags, byte(len(body))})
	}
	z.w.Write(body)
}

// send writes one message of frames and flushes.
func (z *zconn) send(frames ...[]byte) error {
	for i, f := range frames {
		var flags byte
		if i < len(frames)-1 {
			flags = flagMore
		}
		z.writeFrame(flags, f)
	}
	return z.w.Flush()
}

// frame reads one frame.
func (z *zconn) frame() (flags byte, body []byte, err error) {
	if flags, err = z.r.ReadByte(); err != nil {
		return 0, nil, err
	}
	var n uint64
	if flags&flagLong != 0 {
		var b [8]byte
		if _, err = io.ReadFull(z.r, b[:]); err != nil {
			return 0, nil, err
		}
		n = binary.BigEndian.Uint64(b[:])
	} else {
		c, err := z.r.ReadByte()
		if err != nil {
			return 0, nil, err
		}
		n = uint64(c)
	}
	limit := uint64(z.max)
	if flags&flagCommand != 0 {
		limit = maxCommand
	}
	if n > limit {
		return 0, nil, fmt.Errorf("%w: a frame of %d bytes (limit %d)", errTooLarge, n, limit)
	}
	body = make([]byte, n)
	if _, err = io.ReadFull(z.r, body); err != nil {
		return 0, nil, err
	}
	return flags, body, nil
}

// recv reads one message, skipping the commands between messages (a ZMTP
// 3.1 peer's PINGs, say).
func (z *zconn) recv() ([][]byte, error) {
	var msg [][]byte
	total := 0
	for {
		flags, body, err := z.frame()
		if err != nil {
			return nil, err
		}
		if flags&flagCommand != 0 {
			if len(msg) > 0 {
				return nil, errors.New("zmtp: a command inside a message")
			}
			continue
		}
		if total += len(body); total > z.max {
			return nil, fmt.Errorf("%w: over %d bytes", errTooLarge, z.max)
		}
		msg = append(msg, body)
		if flags&flagMore == 0 {
			return msg, nil
		}
	}
}

func (z *zconn) Close() error { return z.c.Close() }
