//go:build cgo

package device

// Probes is how many times Present has looked for a loaded driver.
func Probes() int {
	mu.Lock()
	defer mu.Unlock()
	return probes
}
