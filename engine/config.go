package engine

import (
	"cmp"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mooncake-go/mooncake/engine/metadata"
	"github.com/mooncake-go/mooncake/engine/transport"
	"github.com/mooncake-go/mooncake/engine/transport/tcp"
	"github.com/mooncake-go/mooncake/internal/secure"
)

// Config configures an Engine. The zero value is a working P2P-handshake
// engine on an automatically chosen address; fields say what zero means.
type Config struct {
	// Metadata is where segment descriptors live (see metadata.Open):
	// "P2PHANDSHAKE" (zero), "etcd://h:p", "http://h:p/metadata",
	// "memory://name".
	Metadata string
	// MetadataToken is the bearer token presented to an HTTP metadata
	// server that requires one (mooncake metadata --auth_token). Zero:
	// none.
	MetadataToken string
	// MetadataTLS dials an https:// metadata server, or etcd, over TLS.
	// Zero: plaintext.
	MetadataTLS secure.TLS
	// LocalServerName is this engine's segment name. In P2PHANDSHAKE mode it
	// becomes "<host>:<rpc port>", as Mooncake does; elsewhere zero means the
	// same.
	LocalServerName string
	// Host is the address peers reach this engine at and the address its
	// sockets bind. Zero: MC_TCP_BIND_ADDRESS, else the host part of
	// LocalServerName when it is an IP, else the first non-loopback IPv4,
	// else 127.0.0.1.
	Host string
	// ExtraHosts are more addresses of this host (IPs of its other NICs).
	// The TCP data port listens on each too (the same port number where
	// it is free), the descriptor publishes them (mcgo_tcp_data_addrs,
	// which official engines ignore: they reach Host), and lanes to
	// peers dial from Host and these in turn, so transfers spread over
	// the links and move off one that goes down. Zero:
	// MC_TCP_BIND_ADDRESSES, a comma-separated list whose first entry is
	// also Host when Host and MC_TCP_BIND_ADDRESS are unset, less Host;
	// else none (one address, as Mooncake's TCP transport).
	ExtraHosts []string
	// RPCPort is the handshake port; DataPort the TCP data port. Zero picks
	// a free port.
	RPCPort, DataPort int
	// Transport picks the data path: "auto" (zero: shared memory with peers
	// on this host, TCP otherwise), "tcp", or "shm" (same-host peers only).
	Transport string
	// Secret, when set, must be known by every peer (handshake and data
	// connections both authenticate). Zero: MC_TE_SECRET, else none, which
	// keeps the wire identical to Mooncake's.
	Secret string
	// Lanes is the number of TCP connections per peer. Zero: 4
	// (MC_TCP_LANES_PER_PEER).
	Lanes int
	// MaxConnsPerPeer caps the data connections this engine serves at once
	// from one IP address (4096 in all), so that one peer cannot take every
	// one; connections over it are closed and logged. Zero:
	// MC_TCP_MAX_CONNS_PER_PEER, else tcp.DefaultMaxConnsPerPeer (1024).
	MaxConnsPerPeer int
	// SliceSize is the largest piece a request is cut into. Zero: 128 KiB,
	// which reads a lone 1 MiB request over loopback TCP about 1.4x as fast
	// as 1 MiB slices (the answers pipeline) and leaves batches as fast.
	SliceSize uint64
	// DeviceSliceSize is the largest piece of a request whose local
	// memory is on a GPU, staged through page-locked buffers on TCP and
	// copied by the driver on CUDA IPC, where each piece costs a driver
	// call. Zero: 1 MiB, or SliceSize if larger. On an H200, 4 MiB GPU
	// requests over loopback TCP moved 1.45x (write) and 2.0x (read) as
	// fast in 1 MiB pieces as in 128 KiB ones.
	DeviceSliceSize uint64
	// Timeout is the deadline of each request from its submission. Zero:
	// MC_TRANSFER_TIMEOUT seconds, else 30 s.
	Timeout time.Duration
	// MaxRetries bounds the retries of a slice on another lane. Zero: 3.
	MaxRetries int
	// TCPv1 speaks protocol version 1 to peers (MC_TCP_PROTO=1).
	TCPv1 bool
	// Logger receives structured logs. Zero: slog.Default().
	Logger *slog.Logger
	// Registerer receives the engine's metrics. Zero: none are exported
	// (they are still counted; see Engine.Metrics).
	Registerer prometheus.Registerer
	// Transports are more data paths, preferred to the built-in ones (see
	// package transport): a peer one of them opens takes its slices, and
	// what it cannot serve goes on to the next path. The engine closes them
	// when it closes, or when New fails.
	Transports []transport.Transport
}

// Validate names the first bad field.
func (c *Config) Validate() error {
	switch c.Transport {
	case "", "auto", "tcp", "shm":
	default:
		return errorf(CodeInvalidArgument, "config: Transport %q (want auto, tcp or shm)", c.Transport)
	}
	if c.RPCPort < 0 || c.RPCPort > 65535 {
		return errorf(CodeInvalidArgument, "config: RPCPort %d", c.RPCPort)
	}
	if c.DataPort < 0 || c.DataPort > 65535 {
		return errorf(CodeInvalidArgument, "config: DataPort %d", c.DataPort)
	}
	if c.Lanes < 0 || c.Lanes > 64 {
		return errorf(CodeInvalidArgument, "config: Lanes %d (0..64)", c.Lanes)
	}
	if c.MaxConnsPerPeer < 0 {
		return errorf(CodeInvalidArgument, "config: MaxConnsPerPeer %d is negative", c.MaxConnsPerPeer)
	}
	if c.SliceSize != 0 && c.SliceSize < 4096 {
		return errorf(CodeInvalidArgument, "config: SliceSize %d (at least 4096)", c.SliceSize)
	}
	if c.DeviceSliceSize != 0 && c.DeviceSliceSize < 4096 {
		return errorf(CodeInvalidArgument, "config: DeviceSliceSize %d (at least 4096)", c.DeviceSliceSize)
	}
	if c.Timeout < 0 || c.MaxRetries < 0 {
		return errorf(CodeInvalidArgument, "config: negative Timeout or MaxRetries")
	}
	return checkExtraHosts(c.ExtraHosts)
}

// checkExtraHosts: lanes bind their local end to each, so each must be an
// IP address.
func checkExtraHosts(hosts []string) error {
	for _, h := range hosts {
		if net.ParseIP(h) == nil {
			return errorf(CodeInvalidArgument, "config: ExtraHosts entry %q is not an IP address", h)
		}
	}
	return nil
}

// withDefaults fills zero fields from the environment and defaults.
func (c Config) withDefaults() Config {
	c.Metadata = cmp.Or(c.Metadata, metadata.P2PHandshake)
	c.Transport = cmp.Or(c.Transport, "auto")
	c.Secret = cmp.Or(c.Secret, os.Getenv("MC_TE_SECRET"))
	if hosts := splitHosts(os.Getenv("MC_TCP_BIND_ADDRESSES")); len(c.ExtraHosts) == 0 && len(hosts) > 0 {
		if c.Host == "" && os.Getenv("MC_TCP_BIND_ADDRESS") == "" {
			c.Host = hosts[0]
		}
		c.ExtraHosts = hosts
	}
	if c.Host == "" {
		c.Host = defaultHost(c.LocalServerName)
	}
	c.ExtraHosts = extraHosts(c.Host, c.ExtraHosts)
	c.Lanes = cmp.Or(c.Lanes, envInt("MC_TCP_LANES_PER_PEER", 4))
	c.MaxConnsPerPeer = cmp.Or(c.MaxConnsPerPeer, envInt("MC_TCP_MAX_CONNS_PER_PEER", tcp.DefaultMaxConnsPerPeer))
	c.SliceSize = cmp.Or(c.SliceSize, 128<<10)
	c.DeviceSliceSize = cmp.Or(c.DeviceSliceSize, max(1<<20, c.SliceSize))
	c.Timeout = cmp.Or(c.Timeout, time.Duration(envInt("MC_TRANSFER_TIMEOUT", 30))*time.Second)
	c.MaxRetries = cmp.Or(c.MaxRetries, 3)
	if os.Getenv("MC_TCP_PROTO") == "1" {
		c.TCPv1 = true
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// splitHosts splits a comma-separated list of addresses, dropping blanks.
func splitHosts(v string) []string {
	var hosts []string
	for h := range strings.SplitSeq(v, ",") {
		if h = strings.TrimSpace(h); h != "" {
			hosts = append(hosts, h)
		}
	}
	return hosts
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func defaultHost(serverName string) string {
	if h := os.Getenv("MC_TCP_BIND_ADDRESS"); h != "" {
		return h
	}
	host := serverName
	if h, _, err := net.SplitHostPort(serverName); err == nil {
		host = h
	}
	if net.ParseIP(host) != nil {
		return host
	}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && !ipn.IP.IsLoopback() && ipn.IP.To4() != nil {
				return ipn.IP.String()
			}
		}
	}
	return "127.0.0.1"
}

func (c *Config) String() string {
	return fmt.Sprintf("metadata=%s name=%s host=%s transport=%s lanes=%d", c.Metadata, c.LocalServerName, c.Host, c.Transport, c.Lanes)
}

// extraHosts is hosts without host and without repeats, an address
// written two ways (::1, 0:0::1) counting as one: each extra address gets
// one listener and one share of the lanes.
func extraHosts(host string, hosts []string) []string {
	var out []string
	seen := func(h string) bool {
		return sameHost(h, host) || slices.ContainsFunc(out, func(o string) bool { return sameHost(o, h) })
	}
	for _, h := range hosts {
		if !seen(h) {
			out = append(out, h)
		}
	}
	return out
}

// sameHost reports whether a and b name the same address.
func sameHost(a, b string) bool {
	ia, ib := net.ParseIP(a), net.ParseIP(b)
	if ia != nil && ib != nil {
		return ia.Equal(ib)
	}
	return a == b
}
