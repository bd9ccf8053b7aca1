package sim

// lru is the actual content of one simulated cache (a prefill instance's
// local cache, the store): blocks in least-recently-used order under a
// capacity. The scheduler keeps its own view (conductor.Index); the two
// differ as a real deployment's would, since the scheduler records a
// prompt's blocks when it routes the request and the cache gets them when
// the prefill ends.
type lru struct {
	capacity int // blocks; 0: unbounded
	nodes    map[uint64]*lruNode
	head     lruNode // sentinel: head.next is the most recent
}

type lruNode struct {
	key        uint64
	prev, next *lruNode
}

func newLRU(capacity int) *lru {
	c := &lru{capacity: capacity, nodes: make(map[uint64]*lruNode)}
	c.head.next, c.head.prev = &c.head, &c.head
	return c
}

// prefix is the number of leading blocks the cache has.
func (c *lru) prefix(blocks []uint64) int {
	for i, k := range blocks {
		if _, ok := c.nodes[k]; !ok {
			return i
		}
	}
	return len(blocks)
}

// insert makes blocks the most recently used, last to first so that a
// prompt's head outlives its tail (the order conductor.Index keeps), and
// calls evicted with every block pushed out beyond the capacity.
func (c *lru) insert(blocks []uint64, evicted func(uint64)) {
	for i := len(blocks) - 1; i >= 0; i-- {
		k := blocks[i]
		if n, ok := c.nodes[k]; ok {
			c.unlink(n)
			c.pushFront(n)
			continue
		}
		// Full: the least recently used block leaves and its node
		// carries k.
		var n *lruNode
		if c.capacity > 0 && len(c.nodes) >= c.capacity {
			n = c.head.prev
			c.unlink(n)
			delete(c.nodes, n.key)
			if evicted != nil {
				evicted(n.key)
			}
		} else {
			n = new(lruNode)
		}
		n.key = k
		c.nodes[k] = n
		c.pushFront(n)
	}
}

func (c *lru) pushFront(n *lruNode) {
	n.prev, n.next = &c.head, c.head.next
	c.head.next.prev = n
	c.head.next = n
}

func (c *lru) unlink(n *lruNode) {
	n.prev.next, n.next.prev = n.next, n.prev
}
