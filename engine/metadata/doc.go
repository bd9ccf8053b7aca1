// Package metadata is where Transfer Engine segment descriptors live and how
// engines find each other, exactly as Mooncake's transfer metadata:
//
//   - keys mooncake/ram/<segment> (descriptor JSON) and
//     mooncake/rpc_meta/<segment> ({"ip_or_host_name", "rpc_port"});
//   - backends behind one Store interface: etcd, HTTP (GET/PUT/DELETE
//     /metadata?key=), and an in-process Memory store for tests; Open picks
//     one from a Mooncake connection string;
//   - P2PHANDSHAKE mode, with no store at all: descriptors travel over the
//     handshake socket (HandshakeServer, Call), which also carries
//     notifications and probes;
//   - Server, the HTTP metadata server behind `mooncake metadata`.
//
// Every decoder of bytes from the network here (ReadFrame,
// ParseSegmentDesc, ParseRPCMeta) has a fuzz target.
package metadata
