//go:build race

package master

// raceEnabled: the race detector slows the service down several times,
// so wall-clock bounds do not hold under it.
const raceEnabled = true
