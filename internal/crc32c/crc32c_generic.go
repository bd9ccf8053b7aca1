//go:build !amd64 || purego

package crc32c

import "hash/crc32"

// update is hash/crc32 with the Castagnoli table where no folding
// implementation exists.
func update(crc uint32, b []byte) uint32 { return crc32.Update(crc, table, b) }
