package client

import (
	"strings"

	"github.com/mooncake-go/mooncake/store/storepb"
)

// Striped replicas: the master may cut a replica into pieces, each one
// allocation in a segment of its own (MemoryReplica.Stripes, in order; the
// value is their concatenation), so that one get reads from several hosts
// at once. Every read and write of a replica goes through spans, which
// maps a stretch of the value onto the pieces it overlaps; each piece is
// then moved by its own engine request, and the requests of all pieces go
// in one batch, in parallel. An ordinary replica is its own one piece.

// spans calls fn for each piece of replica m that bytes [off, off+n) of
// the value overlap, in order: the piece, the remote address of its first
// byte concerned, where that byte is in the value, and how many bytes of
// the piece are concerned. A zero-length stretch overlaps nothing. Bytes
// past the pieces' end are not yielded (lookup refuses a replica shorter
// than its value).
func spans(m *storepb.MemoryReplica, off, n uint64, fn func(piece *storepb.MemoryReplica, remote, at, n uint64)) {
	if len(m.Stripes) == 0 {
		if n > 0 {
			fn(m, m.BufferAddress+off, off, n)
		}
		return
	}
	start := uint64(0) // where piece p begins in the value
	for _, p := range m.Stripes {
		if n == 0 {
			return
		}
		if end := start + p.Size; off < end {
			k := min(end-off, n)
			fn(p, p.BufferAddress+(off-start), off, k)
			off, n = off+k, n-k
		}
		start += p.Size
	}
}

// replicaLen is how many bytes replica m holds: the sum of its pieces'
// sizes when it is striped (its top-level Size is the master's word for
// the whole), else its Size.
func replicaLen(m *storepb.MemoryReplica) uint64 {
	if len(m.Stripes) == 0 {
		return m.Size
	}
	var n uint64
	for _, p := range m.Stripes {
		n += p.Size
	}
	return n
}

// inProcess reports whether every piece of replica m is in the segment
// named seg (this client's): only then is the replica written by the pass
// that copies into this process's replicas.
func inProcess(m *storepb.MemoryReplica, seg string) bool {
	if len(m.Stripes) == 0 {
		return m.SegmentName == seg
	}
	for _, p := range m.Stripes {
		if p.SegmentName != seg {
			return false
		}
	}
	return true
}

// onHost reports whether every piece of replica m is on this client's
// host.
func (c *Client) onHost(m *storepb.MemoryReplica) bool {
	if len(m.Stripes) == 0 {
		return c.sameHost(m.TransportEndpoint)
	}
	for _, p := range m.Stripes {
		if p.SegmentName != c.name && !c.sameHost(p.TransportEndpoint) {
			return false
		}
	}
	return true
}

// replicaWhere names where replica m lies, for errors: its segment, or
// its pieces' segments in order.
func replicaWhere(m *storepb.MemoryReplica) string {
	if len(m.Stripes) == 0 {
		return "replica on " + m.SegmentName
	}
	names := make([]string, len(m.Stripes))
	for i, p := range m.Stripes {
		names[i] = p.SegmentName
	}
	return "striped replica on " + strings.Join(names, ", ")
}
