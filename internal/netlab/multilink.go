package netlab

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
)

// AddLink gives h a second network interface, as a host with two NICs has:
// the returned Host is that link, with an address of its own, a rate of its
// own (SetRate) and links of its own to every other host (SetLink,
// Partition, Stats), in h's namespace. Sockets bound to its address send
// through it (a routing rule on the source address); everything else
// still leaves through h's first interface. The link's Do and Start run
// in h's namespace, which both share.
func (l *Lab) AddLink(h *Host, name string) (*Host, error) {
	l.mu.Lock()
	n := l.next
	l.next++
	l.mu.Unlock()
	ip := labNet.Addr().As4()
	ip[2], ip[3] = byte((n+1)>>8), byte(n+1)
	addr := netip.AddrFrom4(ip)
	link := &Host{Name: name, IP: addr, lab: l, wake: make(chan struct{}, 1)}
	dev, table := fmt.Sprintf("lab%d", n), fmt.Sprint(100+n)
	err := h.Do(func() error {
		ns, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			return err
		}
		link.ns = ns // its own handle on h's namespace: Close releases each
		if link.tun, err = openTUN(dev); err != nil {
			return err
		}
		for _, args := range [][]string{
			// No prefix route in the main table: that would compete
			// with h's first interface for every packet.
			{"addr", "add", fmt.Sprintf("%s/%d", addr, labNet.Bits()), "dev", dev, "noprefixroute"},
			{"link", "set", dev, "mtu", fmt.Sprint(l.mtu), "txqueuelen", "10000", "up"},
			{"route", "add", labNet.String(), "dev", dev, "src", addr.String(), "table", table},
			{"rule", "add", "from", addr.String(), "lookup", table},
		} {
			if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
				return fmt.Errorf("ip %v: %w: %s", args, err, out)
			}
		}
		return nil
	})
	if err != nil {
		if link.tun != nil {
			_ = link.tun.Close()
		}
		if link.ns != nil {
			_ = link.ns.Close()
		}
		return nil, fmt.Errorf("netlab: link %s of %s: %w", name, h.Name, err)
	}
	l.mu.Lock()
	l.hosts = append(l.hosts, link)
	l.byIP[addr] = link
	l.mu.Unlock()
	l.wg.Add(2)
	go link.read()
	go link.deliver()
	return link, nil
}
