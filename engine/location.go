package engine

// MemoryLocation says where registered memory lives: ok when one
// registered region holds [addr, addr+n), and then onDevice with dev the
// GPU holding it, or dev -1 for host memory. Callers that copy or checksum
// registered memory themselves (the store's local replicas, its staging)
// ask here first, since the CPU must not touch device memory: those bytes
// go through a transfer (the driver copies them) instead.
func (e *Engine) MemoryLocation(addr uintptr, n uint64) (dev int, onDevice, ok bool) {
	r := e.mem.find(uint64(addr), n)
	if r == nil {
		return -1, false, false
	}
	return r.dev, r.onDevice(), true
}
