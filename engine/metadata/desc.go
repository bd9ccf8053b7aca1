package metadata

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
)

// Keys and JSON below follow Mooncake's transfer metadata exactly, so that
// our engines and the official ones find each other in one etcd or HTTP
// metadata server.

// KeyPrefix is "mooncake/" plus "<MC_METADATA_CLUSTER_ID>/" when that is set.
func KeyPrefix() string {
	if id := os.Getenv("MC_METADATA_CLUSTER_ID"); id != "" {
		return "mooncake/" + id + "/"
	}
	return "mooncake/"
}

// SegmentKey is where the descriptor of segment name lives: ram/<name>, or
// the bare name when it already contains a '/'.
func SegmentKey(name string) string {
	if strings.Contains(name, "/") {
		return KeyPrefix() + name
	}
	return KeyPrefix() + "ram/" + name
}

// RPCMetaKey is where the handshake address of server name lives.
func RPCMetaKey(name string) string { return KeyPrefix() + "rpc_meta/" + name }

// RPCMeta is the handshake address of an engine.
type RPCMeta struct {
	IPOrHostName string `json:"ip_or_host_name"`
	RPCPort      int    `json:"rpc_port"`
}

// Buffer is one registered memory region as published in a descriptor.
type Buffer struct {
	Name   string `json:"name"` // TCP engines write their segment name here
	Addr   uint64 `json:"addr"`
	Length uint64 `json:"length"`
	// RKey and LKey are RDMA keys; empty for TCP, kept for round-trips.
	RKey []uint32 `json:"rkey,omitempty"`
	LKey []uint32 `json:"lkey,omitempty"`
	// Location, our extension, is "cuda:N" for a buffer in GPU memory
	// (empty for host memory): a same-host peer must not reach it with
	// host-memory copies.
	Location string `json:"mcgo_location,omitempty"`
}

// SegmentDesc is Mooncake's segment descriptor. Protocol is a string for a
// single-protocol engine ("tcp"); a multi-protocol engine writes an array,
// which is kept raw.
type SegmentDesc struct {
	Name            string          `json:"name"`
	Protocol        json.RawMessage `json:"protocol"`
	TCPDataHost     string          `json:"tcp_data_host,omitempty"`
	TCPDataPort     int             `json:"tcp_data_port"`
	TCPProtoVersion int             `json:"tcp_proto_version,omitempty"`
	Timestamp       string          `json:"timestamp,omitempty"`
	RDMAServerName  string          `json:"rdma_server_name"`
	Buffers         []Buffer        `json:"buffers"`

	// Local is our extension for same-host transfers. Engines that do not
	// know it ignore unknown fields.
	Local *LocalInfo `json:"mcgo_local,omitempty"`
	// TCPDataAddrs, our extension, lists more "host:port" addresses of the
	// TCP data port (other NICs of a multi-homed host), to be used after
	// tcp_data_host:tcp_data_port.
	TCPDataAddrs []string `json:"mcgo_tcp_data_addrs,omitempty"`
	// CudaIPC, our extension, publishes the CUDA IPC handles of this
	// engine's GPU buffers: a process on the same host maps them and
	// copies device memory without a socket.
	CudaIPC *CudaIPCInfo `json:"mcgo_cuda_ipc,omitempty"`
}

// CudaIPCInfo is what a process on the same host needs to map this
// engine's GPU buffers.
type CudaIPCInfo struct {
	// HostID and PID say which process of which host made the handles
	// (as LocalInfo's): only another process of the same host opens them.
	HostID  string      `json:"host_id"`
	PID     int         `json:"pid"`
	Buffers []IPCBuffer `json:"buffers"`
}

// IPCHandleSize is the size of a CUDA IPC memory handle.
const IPCHandleSize = 64

// IPCBuffer is a registered GPU buffer with the IPC handle of the device
// allocation holding it. A buffer may be part of an allocation: the handle
// maps the allocation from Base, and Addr lies Addr-Base bytes into it.
type IPCBuffer struct {
	Addr   uint64 `json:"addr"`
	Length uint64 `json:"length"`
	Base   uint64 `json:"base"`   // the allocation's base address
	Size   uint64 `json:"size"`   // and its size
	Device int    `json:"device"` // CUDA ordinal of the GPU holding it
	Handle []byte `json:"handle"` // IPCHandleSize bytes, base64 in JSON
}

// LocalInfo lets a peer on the same host reach this process's memory without
// the network stack.
type LocalInfo struct {
	// HostID is the boot id plus the pid namespace: two processes with the
	// same HostID see the same pids and the same /proc.
	HostID string `json:"host_id"`
	PID    int    `json:"pid"`
	// StartTime is the process start time (clock ticks since boot, from
	// /proc/<pid>/stat), so a recycled pid is never mistaken for us.
	StartTime uint64 `json:"start_time"`
	// ControlFD is a one-page memfd whose counter moves whenever this
	// process unregisters memory, so peers drop stale mappings.
	ControlFD int `json:"control_fd"`
	// Generation is the counter of the control page, read before the
	// buffers were listed: a peer's view of them is current while the
	// counter still holds it. Absent from older descriptors.
	Generation *uint64 `json:"generation,omitempty"`
	// Shared lists the registered buffers backed by a memfd: a peer maps
	// /proc/<pid>/fd/<fd> once and copies with plain memcpy.
	Shared []SharedBuffer `json:"shared,omitempty"`
}

// SharedBuffer is a memfd-backed registered buffer.
type SharedBuffer struct {
	Addr   uint64 `json:"addr"`
	Length uint64 `json:"length"`
	FD     int    `json:"fd"`
}

// ErrBadDescriptor: a descriptor that does not parse or makes no sense.
var ErrBadDescriptor = errors.New("metadata: malformed segment descriptor")

// ProtocolName returns the descriptor's protocol: the string, or the first
// entry of an array.
func (d *SegmentDesc) ProtocolName() string {
	var s string
	if json.Unmarshal(d.Protocol, &s) == nil {
		return s
	}
	var arr []string
	if json.Unmarshal(d.Protocol, &arr) == nil && len(arr) > 0 {
		return arr[0]
	}
	return ""
}

// HasProtocol reports whether the descriptor offers protocol p.
func (d *SegmentDesc) HasProtocol(p string) bool {
	var s string
	if json.Unmarshal(d.Protocol, &s) == nil {
		return s == p
	}
	var arr []string
	if json.Unmarshal(d.Protocol, &arr) == nil {
		for _, a := range arr {
			if a == p {
				return true
			}
		}
	}
	return false
}

// ParseSegmentDesc decodes and checks a descriptor from the network.
func ParseSegmentDesc(b []byte) (*SegmentDesc, error) {
	var d SegmentDesc
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadDescriptor, err)
	}
	if d.Name == "" {
		return nil, fmt.Errorf("%w: no name", ErrBadDescriptor)
	}
	if d.TCPDataPort < 0 || d.TCPDataPort > 65535 {
		return nil, fmt.Errorf("%w: tcp_data_port %d", ErrBadDescriptor, d.TCPDataPort)
	}
	for _, a := range d.TCPDataAddrs {
		if _, port, err := net.SplitHostPort(a); err != nil || !validPort(port) {
			return nil, fmt.Errorf("%w: data address %q", ErrBadDescriptor, a)
		}
	}
	for _, buf := range d.Buffers {
		if buf.Addr+buf.Length < buf.Addr {
			return nil, fmt.Errorf("%w: buffer %#x+%d wraps", ErrBadDescriptor, buf.Addr, buf.Length)
		}
	}
	if err := d.CudaIPC.check(); err != nil {
		return nil, err
	}
	return &d, nil
}

// check validates a descriptor's CUDA IPC part, if any: each buffer must
// lie inside its allocation and carry a whole handle.
func (c *CudaIPCInfo) check() error {
	if c == nil {
		return nil
	}
	if c.HostID == "" || c.PID <= 0 {
		return fmt.Errorf("%w: cuda ipc: host %.64q pid %d", ErrBadDescriptor, c.HostID, c.PID)
	}
	for _, b := range c.Buffers {
		where := fmt.Sprintf("cuda ipc buffer %#x+%d", b.Addr, b.Length)
		switch {
		case b.Length == 0 || b.Addr+b.Length < b.Addr || b.Base+b.Size < b.Base:
			return fmt.Errorf("%w: %s: empty or wraps", ErrBadDescriptor, where)
		case b.Addr < b.Base || b.Addr+b.Length > b.Base+b.Size:
			return fmt.Errorf("%w: %s: outside its allocation %#x+%d", ErrBadDescriptor, where, b.Base, b.Size)
		case b.Device < 0:
			return fmt.Errorf("%w: %s: device %d", ErrBadDescriptor, where, b.Device)
		case len(b.Handle) != IPCHandleSize:
			return fmt.Errorf("%w: %s: handle of %d bytes, want %d", ErrBadDescriptor, where, len(b.Handle), IPCHandleSize)
		}
	}
	return nil
}

// validPort reports whether port is a decimal TCP port, 1 to 65535.
func validPort(port string) bool {
	n, err := strconv.Atoi(port)
	return err == nil && n > 0 && n <= 65535 && strconv.Itoa(n) == port
}

// ErrBadRPCMeta: an rpc_meta record that does not parse or makes no sense.
var ErrBadRPCMeta = errors.New("metadata: malformed rpc_meta")

// ParseRPCMeta decodes an rpc_meta record.
func ParseRPCMeta(b []byte) (RPCMeta, error) {
	var m RPCMeta
	if err := json.Unmarshal(b, &m); err != nil {
		return RPCMeta{}, fmt.Errorf("%w: %v", ErrBadRPCMeta, err)
	}
	if m.IPOrHostName == "" || m.RPCPort <= 0 || m.RPCPort > 65535 {
		return RPCMeta{}, fmt.Errorf("%w: host %.64q port %d", ErrBadRPCMeta, m.IPOrHostName, m.RPCPort)
	}
	return m, nil
}
