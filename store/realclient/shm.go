package realclient

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// shm is one dummy client's shared memory: a memfd that the real client
// creates, both processes map (MAP_SHARED), and the real client registers
// with its store, so that a put reads and a get writes those pages
// directly.
type shm struct {
	fd  int
	mem []byte
}

// newShm creates and maps size bytes of shared memory; the pages are
// allocated as they are first touched. The memfd is sealed at that size:
// the dummy it is handed to cannot shrink it under the real client, whose
// reads of the pages cut off would raise SIGBUS.
func newShm(size uint64) (*shm, error) {
	fd, err := unix.MemfdCreate("mooncake-dummy", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("realclient: memfd_create: %w", err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("realclient: size the shared memory to %d bytes: %w", size, err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("realclient: seal the shared memory: %w", err)
	}
	m, err := mapShm(fd, size)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	return &shm{fd: fd, mem: m}, nil
}

func mapShm(fd int, size uint64) ([]byte, error) {
	m, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("realclient: map %d bytes of shared memory: %w", size, err)
	}
	return m, nil
}

func (s *shm) close() {
	if s.mem != nil {
		_ = unix.Munmap(s.mem)
		s.mem = nil
	}
	if s.fd >= 0 {
		_ = unix.Close(s.fd)
		s.fd = -1
	}
}

// span is the part of m that off and n name, or an error naming what is
// out of range.
func span(m []byte, off, n uint64) ([]byte, error) {
	if off > uint64(len(m)) || n > uint64(len(m))-off {
		return nil, fmt.Errorf("bytes [%d, +%d) outside the %d shared bytes", off, n, len(m))
	}
	return m[off : off+n : off+n], nil
}

// within is the offset of b in m, if b lies entirely inside m.
func within(m, b []byte) (uint64, bool) {
	if len(b) == 0 || len(m) == 0 {
		return 0, false
	}
	base := uintptr(unsafe.Pointer(unsafe.SliceData(m)))
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	if p < base || p-base > uintptr(len(m)) || uintptr(len(b)) > uintptr(len(m))-(p-base) {
		return 0, false
	}
	return uint64(p - base), true
}

// DefaultPort is where the official real client (mooncake_client --port)
// listens for dummy clients, and so the port setup_dummy's server_address
// names by default.
const DefaultPort = 50052

// SocketFor is the unix socket of the real client that a dummy's
// server_address names: a path ("/run/mc.sock", "unix:/run/mc.sock") or an
// abstract name ("@name") as given, else "host:port" -> the abstract name
// "@mooncake_client.<port>". Dummy clients live on the real client's host
// (they share its memory), so the host is not part of the name.
func SocketFor(addr string) (string, error) {
	switch {
	case strings.HasPrefix(addr, "unix:"):
		return strings.TrimPrefix(addr, "unix:"), nil
	case strings.HasPrefix(addr, "/"), strings.HasPrefix(addr, "@"):
		return addr, nil
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		// A bare port, as some launchers pass it.
		port = addr
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil || p == 0 {
		return "", fmt.Errorf("realclient: server address %q is not host:port, a port, a path or @name", addr)
	}
	return "@mooncake_client." + strconv.FormatUint(p, 10), nil
}

// unixAddr is the net.UnixAddr of a socket SocketFor named.
func unixAddr(path string) *net.UnixAddr { return &net.UnixAddr{Name: path, Net: "unix"} }

// removeStale deletes a socket file that no process listens on, left by a
// real client that was killed; abstract names vanish with their owner.
func removeStale(path string) {
	if strings.HasPrefix(path, "@") {
		return
	}
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
		if c, err := net.DialUnix("unix", nil, unixAddr(path)); err == nil {
			c.Close()
			return
		}
		_ = os.Remove(path)
	}
}
