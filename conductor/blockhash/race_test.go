//go:build race

package blockhash

// raceEnabled: under the race detector sync.Pool drops a random share of
// what is put back, so a warm pool still allocates.
const raceEnabled = true
