package conductor

// ReplicaHistogram counts the blocks of the prefix index by their number
// of replicas in the prefill instances' caches, the store not counted:
// h[n] is the number of blocks that exactly n prefill instances hold, and
// h[0] the number held by the store alone. It reuses dst when it is large
// enough and returns h with len(h)-1 the most replicas any block has (h
// has at least one element). The cost is one pass over the index's
// blocks; nothing else is allocated once dst is large enough.
//
// Cache load balancing shows in it: under GlobalCacheAware, a request
// routed away from its prefix's holders makes the chosen instance pull
// and keep the prefix, so hot blocks move to the higher counts.
func (s *Scheduler) ReplicaHistogram(dst []int) []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := dst[:0]
	for _, e := range s.idx.blocks {
		n := s.replicas(e)
		for len(h) <= n {
			h = append(h, 0)
		}
		h[n]++
	}
	if len(h) == 0 {
		h = append(h, 0)
	}
	return h
}
