package chaos

import (
	"context"
	"fmt"
	"time"

	"github.com/mooncake-go/mooncake/internal/netlab"
)

// Network faults, with a Lab (ProcsConfig.Lab). Each holds until its heal,
// which makes every link clean again; the nemesis runs one fault at a time.
//
//   - partition-leader: the leading master isolated from every host
//     (clients, nodes, etcd);
//   - split-leader: the leading master cut off from etcd and the nodes,
//     while clients still reach it;
//   - partition-node: a storage node picked at random isolated;
//   - partition-etcd: etcd isolated;
//   - lossy-links: every link drops 5% of its packets and delays the rest
//     by 20 ms.
//
// Without a Lab there are none.
func (p *Procs) NetFaults() Faults {
	lab := p.cfg.Lab
	if lab == nil {
		return Faults{}
	}
	heal := func(context.Context) error { lab.Heal(); return nil }
	leader := func(ctx context.Context) (*proc, error) {
		addr, err := p.Leader(ctx)
		if err != nil {
			return nil, err
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, m := range p.masters {
			if rpcAddr(m) == addr {
				return m, nil
			}
		}
		return nil, fmt.Errorf("the leader %s is none of the masters started", addr)
	}
	return Faults{
		"partition-leader": FaultFunc(func(ctx context.Context) (string, func(context.Context) error, error) {
			m, err := leader(ctx)
			if err != nil {
				return "", nil, err
			}
			lab.Isolate(m.host)
			return "isolate " + m.name + " (leader) " + m.host.String(), heal, nil
		}),
		"split-leader": FaultFunc(func(ctx context.Context) (string, func(context.Context) error, error) {
			m, err := leader(ctx)
			if err != nil {
				return "", nil, err
			}
			p.mu.Lock()
			others := []*netlab.Host{p.etcdHost}
			for _, n := range p.nodes {
				others = append(others, n.host)
			}
			p.mu.Unlock()
			lab.Partition([]*netlab.Host{m.host}, others)
			return "cut " + m.name + " (leader) " + m.host.String() + " off from etcd and the nodes", heal, nil
		}),
		"partition-node": FaultFunc(func(context.Context) (string, func(context.Context) error, error) {
			p.mu.Lock()
			n := p.nodes[p.rng.IntN(len(p.nodes))]
			p.mu.Unlock()
			lab.Isolate(n.host)
			return "isolate " + n.name + " " + n.host.String(), heal, nil
		}),
		"partition-etcd": FaultFunc(func(context.Context) (string, func(context.Context) error, error) {
			lab.Isolate(p.etcdHost)
			return "isolate etcd " + p.etcdHost.String(), heal, nil
		}),
		"lossy-links": FaultFunc(func(context.Context) (string, func(context.Context) error, error) {
			all := lab.Hosts()
			lab.SetLinks(all, all, netlab.Link{Loss: 0.05, Delay: 20 * time.Millisecond})
			return "every link: 5% loss, 20 ms delay", heal, nil
		}),
	}
}
