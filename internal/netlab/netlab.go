// Package netlab emulates a network of hosts on one machine, for tests that
// need what crosses a network: partitions, loss, delay, reordering and link
// rates between processes that each believe they run on a host of their own.
//
// Each Host is a Linux network namespace holding one TUN interface with an
// address in 10.77.0.0/16. The Lab's switch, in the test process, reads the
// IPv4 packets every host sends, decides their fate by the rules of the link
// they cross, and writes them into the destination host's TUN at the time
// the rules give. The switch is the emulator: the kernel's netem and tbf are
// not needed (kernels built without them are common on CI machines).
//
// The process that creates a Lab is itself a host, Local, so that servers
// and clients the test runs in-process can reach the others. Its TUN lives
// in the namespace the process runs in: run the tests in a namespace of
// their own (labtest.Main) so that the machine's network is never touched.
// Processes are put on a host with Host.Start, listeners and other sockets
// with Host.Do. Everything is released when the Lab closes or the process
// exits; nothing is named in /run/netns, so a killed test leaks nothing.
//
// Creating namespaces and TUN devices needs root (CAP_NET_ADMIN and
// CAP_SYS_ADMIN) and /dev/net/tun; Available says whether they are here.
package netlab

import (
	"container/heap"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// The lab's network: the local host is .0.1, the others follow.
var (
	labNet   = netip.MustParsePrefix("10.77.0.0/16")
	localIP  = netip.MustParseAddr("10.77.0.1")
	tunName  = "lab0"
	maxFrame = 65536
)

// DefaultMTU is the TUN interfaces' MTU unless Config says otherwise:
// jumbo frames, as data-centre networks run, keep the switch's packet rate
// (and so its CPU) low at the link rates tests use.
const DefaultMTU = 9000

// DefaultQueue bounds the time a packet may wait for a rate-limited link,
// as tbf's latency does; packets that would wait longer are dropped.
const DefaultQueue = 50 * time.Millisecond

// Config tunes a Lab. The zero value is usable.
type Config struct {
	MTU  int    // of every TUN interface; 0: DefaultMTU
	Seed uint64 // of the loss and jitter draws; 0: from the clock
	// Sparse, when positive, lets a packet of at most this many bytes go
	// ahead of the bulk queued on a rate-limited link (its time on the
	// wire still delays what follows), as a host's fq_codel serves flows
	// with nothing queued first. SparseAcks is the size of a pure TCP
	// acknowledgement with options. Without it, the acknowledgements of a
	// transfer one way wait behind a full queue of another's data the
	// same way (DefaultQueue deep), and a link carrying bulk both ways
	// loses a large part of its rate to the stretched round trips.
	// 0: one FIFO per link and direction.
	Sparse int
	// Queue bounds the time a packet may wait for a rate-limited link
	// before it is dropped. 0: DefaultQueue.
	Queue time.Duration
}

// SparseAcks is a Config.Sparse that lets pure TCP acknowledgements (IPv4
// and TCP headers with timestamps and SACK blocks) ahead of bulk data.
const SparseAcks = 128

// Link is the behaviour of the packets from one host to another. The zero
// value is a clean link.
type Link struct {
	Down    bool          // partitioned: every packet is dropped
	Loss    float64       // probability that a packet is dropped
	Delay   time.Duration // added to every packet
	Jitter  time.Duration // the delay varies by up to this much either way
	Reorder float64       // probability that a packet skips the delay, overtaking those before it
}

// Stats counts what the switch did with the packets of a link.
type Stats struct {
	Packets, Bytes uint64 // delivered
	Dropped        uint64 // by Down, Loss or a full rate-limit queue
}

// Available says whether this process can build a Lab: it can create a
// network namespace holding a TUN device, and the ip command exists.
// Without it (not root, a container without CAP_SYS_ADMIN or NET_ADMIN, no
// /dev/net/tun), tests that need a Lab skip (labtest). It tries once.
func Available() error {
	availableOnce.Do(func() { availableErr = probe() })
	return availableErr
}

var (
	availableOnce sync.Once
	availableErr  error
)

func probe() error {
	if _, err := exec.LookPath("ip"); err != nil {
		return fmt.Errorf("netlab: no ip command (iproute2): %w", err)
	}
	ns, err := newNamespace()
	if err != nil {
		return fmt.Errorf("netlab: cannot create network namespaces (root with CAP_SYS_ADMIN needed): %w", err)
	}
	defer ns.Close()
	h := &Host{Name: "probe", ns: ns}
	return h.Do(func() error {
		tun, err := openTUN(tunName)
		if err != nil {
			return fmt.Errorf("netlab: cannot create TUN devices: %w", err)
		}
		return tun.Close()
	})
}

// Lab is a set of emulated hosts and the switch between them.
type Lab struct {
	mtu    int
	sparse int
	queue  time.Duration

	mu    sync.Mutex
	rng   *rand.Rand
	hosts []*Host
	next  int // the number of the next host's address
	byIP  map[netip.Addr]*Host
	links map[[2]*Host]*linkState

	closed chan struct{}
	wg     sync.WaitGroup
}

type linkState struct {
	Link
	Stats
}

// New builds a Lab whose local host is this process's own namespace.
func New(cfg Config) (*Lab, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	if cfg.MTU == 0 {
		cfg.MTU = DefaultMTU
	}
	if cfg.Queue == 0 {
		cfg.Queue = DefaultQueue
	}
	seed := cfg.Seed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	l := &Lab{mtu: cfg.MTU, sparse: cfg.Sparse, queue: cfg.Queue, next: 1, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		byIP: map[netip.Addr]*Host{}, links: map[[2]*Host]*linkState{}, closed: make(chan struct{})}
	self, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return nil, fmt.Errorf("netlab: own namespace: %w", err)
	}
	if _, err := l.add("local", self, localIP); err != nil {
		_ = self.Close()
		return nil, err
	}
	return l, nil
}

// Local is the host this process is: in-process servers and clients send
// and receive as it.
func (l *Lab) Local() *Host { return l.hosts[0] }

// Hosts returns every host, the local one first.
func (l *Lab) Hosts() []*Host {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]*Host(nil), l.hosts...)
}

// Host adds a host in a new network namespace, with the next address.
func (l *Lab) Host(name string) (*Host, error) {
	l.mu.Lock()
	n := l.next // reserved: hosts added at once get addresses of their own
	l.next++
	l.mu.Unlock()
	ip := labNet.Addr().As4()
	ip[2], ip[3] = byte((n+1)>>8), byte(n+1)
	ns, err := newNamespace()
	if err != nil {
		return nil, err
	}
	h, err := l.add(name, ns, netip.AddrFrom4(ip))
	if err != nil {
		_ = ns.Close()
		return nil, err
	}
	return h, nil
}

func (l *Lab) add(name string, ns *os.File, ip netip.Addr) (*Host, error) {
	h := &Host{Name: name, IP: ip, lab: l, ns: ns, wake: make(chan struct{}, 1)}
	err := h.Do(func() error {
		tun, err := openTUN(tunName)
		if err != nil {
			return err
		}
		h.tun = tun
		for _, args := range [][]string{
			{"link", "set", "lo", "up"},
			{"addr", "add", fmt.Sprintf("%s/%d", ip, labNet.Bits()), "dev", tunName},
			// A long queue: the switch reads in bursts on a loaded machine.
			{"link", "set", tunName, "mtu", fmt.Sprint(l.mtu), "txqueuelen", "10000", "up"},
		} {
			if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
				return fmt.Errorf("ip %v: %w: %s", args, err, out)
			}
		}
		return nil
	})
	if err != nil {
		if h.tun != nil {
			_ = h.tun.Close()
		}
		return nil, fmt.Errorf("netlab: host %s: %w", name, err)
	}
	l.mu.Lock()
	l.hosts = append(l.hosts, h)
	l.byIP[ip] = h
	l.mu.Unlock()
	l.wg.Add(2)
	go h.read()
	go h.deliver()
	return h, nil
}

// SetLink sets the behaviour of the packets from one host to another.
func (l *Lab) SetLink(from, to *Host, k Link) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.link(from, to).Link = k
}

// SetLinks sets k on the links both ways between every host of a and every
// host of b.
func (l *Lab) SetLinks(a, b []*Host, k Link) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, x := range a {
		for _, y := range b {
			l.link(x, y).Link = k
			l.link(y, x).Link = k
		}
	}
}

// Partition cuts every link between the hosts of a and those of b, both
// ways. One way is SetLink(from, to, Link{Down: true}).
func (l *Lab) Partition(a, b []*Host) { l.SetLinks(a, b, Link{Down: true}) }

// Isolate cuts h off from every other host, both ways.
func (l *Lab) Isolate(h *Host) {
	l.mu.Lock()
	others := make([]*Host, 0, len(l.hosts))
	for _, o := range l.hosts {
		if o != h {
			others = append(others, o)
		}
	}
	l.mu.Unlock()
	l.Partition([]*Host{h}, others)
}

// Heal makes every link clean again. Host rates stay.
func (l *Lab) Heal() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range l.links {
		s.Link = Link{}
	}
}

// Stats returns the counters of the link from one host to another.
func (l *Lab) Stats(from, to *Host) Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.link(from, to).Stats
}

func (l *Lab) link(from, to *Host) *linkState {
	k := [2]*Host{from, to}
	s := l.links[k]
	if s == nil {
		s = &linkState{}
		l.links[k] = s
	}
	return s
}

// Close stops the switch and releases every host's TUN and namespace.
// Processes still running on a host keep its namespace, cut off.
func (l *Lab) Close() error {
	select {
	case <-l.closed:
		return nil
	default:
	}
	close(l.closed)
	l.mu.Lock()
	hosts := l.hosts
	l.mu.Unlock()
	for _, h := range hosts {
		_ = h.tun.Close()
	}
	l.wg.Wait()
	for _, h := range hosts {
		_ = h.ns.Close()
	}
	return nil
}

// forward decides the fate of a packet from src and queues it for its
// destination at the time the links give.
func (l *Lab) forward(src *Host, pkt []byte) bool {
	if len(pkt) < 20 || pkt[0]>>4 != 4 {
		return false // not IPv4 (IPv6 router solicitations and the like)
	}
	dstIP := netip.AddrFrom4([4]byte(pkt[16:20]))
	now := time.Now()
	l.mu.Lock()
	dst := l.byIP[dstIP]
	if dst == nil || dst == src {
		l.mu.Unlock()
		return false
	}
	s := l.link(src, dst)
	if s.Down || (s.Loss > 0 && l.rng.Float64() < s.Loss) {
		s.Dropped++
		l.mu.Unlock()
		return false
	}
	at, ok := src.up.depart(now, now, len(pkt))
	if ok {
		delay := s.Delay
		if s.Jitter > 0 {
			delay += time.Duration((l.rng.Float64()*2 - 1) * float64(s.Jitter))
		}
		if s.Reorder > 0 && l.rng.Float64() < s.Reorder {
			delay = 0
		}
		at, ok = dst.down.depart(now, at.Add(max(delay, 0)), len(pkt))
	}
	if !ok {
		s.Dropped++
		l.mu.Unlock()
		return false
	}
	s.Packets++
	s.Bytes += uint64(len(pkt))
	l.mu.Unlock()
	dst.queue(pkt, at)
	return true
}

// Host is one emulated machine: a network namespace with one address.
type Host struct {
	Name string
	IP   netip.Addr

	lab *Lab
	ns  *os.File
	tun *os.File

	up, down bucket // guarded by lab.mu

	qmu  sync.Mutex
	q    packetHeap
	seq  uint64
	wake chan struct{}
}

// Addr is host:port on this host.
func (h *Host) Addr(port int) string { return netip.AddrPortFrom(h.IP, uint16(port)).String() }

func (h *Host) String() string { return h.Name + "(" + h.IP.String() + ")" }

// SetRate limits the host's link to bits per second each way, as its NIC
// would (0: unlimited). Packets that would queue longer than Config.Queue
// are dropped.
func (h *Host) SetRate(bps int64) {
	h.lab.mu.Lock()
	defer h.lab.mu.Unlock()
	h.up = bucket{rate: bps, queue: h.lab.queue, sparse: h.lab.sparse}
	h.down = bucket{rate: bps, queue: h.lab.queue, sparse: h.lab.sparse}
}

// Do runs f on an OS thread that is in the host's namespace: the sockets f
// opens, and the processes it starts, are on the host. Goroutines f starts
// are not (they run on other threads): open what they need in f.
func (h *Host) Do(f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		back, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("netlab: own namespace: %w", err)
			return
		}
		defer back.Close()
		if err := unix.Setns(int(h.ns.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("netlab: enter %s: %w", h.Name, err)
			return
		}
		err = f()
		if serr := unix.Setns(int(back.Fd()), unix.CLONE_NEWNET); serr != nil {
			// Stay locked: the goroutine's end retires this thread,
			// which must not run anything else in the wrong namespace.
			errc <- errors.Join(err, fmt.Errorf("netlab: leave %s: %w", h.Name, serr))
			return
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	return <-errc
}

// Start starts cmd on the host (a fork inherits its thread's namespace).
func (h *Host) Start(cmd *exec.Cmd) error { return h.Do(cmd.Start) }

// read takes every packet the host sends to the switch.
func (h *Host) read() {
	defer h.lab.wg.Done()
	buf := make([]byte, maxFrame)
	for {
		n, err := h.tun.Read(buf)
		if err != nil {
			return // closed
		}
		h.lab.forward(h, buf[:n])
	}
}

// queue holds a copy of pkt for delivery at at.
func (h *Host) queue(pkt []byte, at time.Time) {
	buf := pool.Get().(*[]byte)
	p := &packet{at: at, buf: buf, data: append((*buf)[:0], pkt...)}
	h.qmu.Lock()
	h.seq++
	p.seq = h.seq
	heap.Push(&h.q, p)
	first := h.q[0] == p
	h.qmu.Unlock()
	if first {
		select {
		case h.wake <- struct{}{}:
		default:
		}
	}
}

// deliver writes the queued packets into the host's TUN as they fall due.
func (h *Host) deliver() {
	defer h.lab.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		h.qmu.Lock()
		var wait time.Duration = -1
		for len(h.q) > 0 {
			p := h.q[0]
			if d := time.Until(p.at); d > 0 {
				wait = d
				break
			}
			heap.Pop(&h.q)
			h.qmu.Unlock()
			_, _ = h.tun.Write(p.data) // a full queue in the kernel drops, as a NIC's would
			pool.Put(p.buf)
			h.qmu.Lock()
		}
		h.qmu.Unlock()
		if wait >= 0 {
			timer.Reset(wait)
		}
		select {
		case <-h.lab.closed:
			return
		case <-h.wake:
		case <-timer.C:
		}
		if wait >= 0 && !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

// bucket serialises packets onto a link of a given rate.
type bucket struct {
	rate   int64         // bits per second; 0: unlimited
	queue  time.Duration // the longest wait before a packet is dropped
	sparse int           // packets up to this size skip the queue (Config.Sparse)
	free   time.Time     // when the link has sent what it holds
}

// depart returns when a packet of n bytes that reaches the link at arrive
// has left it, or false if it would wait past the queue bound.
func (b *bucket) depart(now, arrive time.Time, n int) (time.Time, bool) {
	if b.rate <= 0 {
		return arrive, true
	}
	wire := time.Duration(int64(n) * 8 * int64(time.Second) / b.rate)
	if n <= b.sparse {
		// Ahead of the queue, on the wire now; the bulk behind it takes
		// its time back.
		b.free = laterOf(b.free, arrive).Add(wire)
		return arrive.Add(wire), true
	}
	start := arrive
	if b.free.After(start) {
		start = b.free
	}
	ref := arrive
	if now.After(ref) {
		ref = now
	}
	if start.Sub(ref) > b.queue {
		return time.Time{}, false
	}
	b.free = start.Add(wire)
	return b.free, true
}

func laterOf(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

var pool = sync.Pool{New: func() any { b := make([]byte, 0, maxFrame); return &b }}

type packet struct {
	at   time.Time
	seq  uint64
	buf  *[]byte // from pool, holding data
	data []byte
}

// packetHeap orders packets by due time, then by arrival.
type packetHeap []*packet

func (q packetHeap) Len() int { return len(q) }
func (q packetHeap) Less(i, j int) bool {
	if !q[i].at.Equal(q[j].at) {
		return q[i].at.Before(q[j].at)
	}
	return q[i].seq < q[j].seq
}
func (q packetHeap) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *packetHeap) Push(x any)   { *q = append(*q, x.(*packet)) }
func (q *packetHeap) Pop() any {
	old := *q
	p := old[len(old)-1]
	*q = old[:len(old)-1]
	return p
}

// newNamespace returns a new network namespace, held by the open file.
func newNamespace() (*os.File, error) {
	type result struct {
		ns  *os.File
		err error
	}
	c := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		back, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			c <- result{err: err}
			return
		}
		defer back.Close()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			c <- result{err: fmt.Errorf("netlab: new namespace: %w", err)}
			return
		}
		ns, err := os.Open("/proc/thread-self/ns/net")
		if serr := unix.Setns(int(back.Fd()), unix.CLONE_NEWNET); serr != nil {
			if ns != nil {
				_ = ns.Close()
			}
			c <- result{err: fmt.Errorf("netlab: leave new namespace: %w", serr)} // thread retired
			return
		}
		runtime.UnlockOSThread()
		c <- result{ns, err}
	}()
	r := <-c
	return r.ns, r.err
}

// openTUN creates a TUN interface (IPv4 packets, no header) in the calling
// thread's namespace and returns its file, non-blocking so that Close
// ends a pending Read.
func openTUN(name string) (*os.File, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open /dev/net/tun: %w", err)
	}
	ifr, err := unix.NewIfreq(name)
	if err == nil {
		ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI)
		err = unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr)
	}
	if err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("create TUN %s: %w", name, err)
	}
	return os.NewFile(uintptr(fd), name), nil
}
