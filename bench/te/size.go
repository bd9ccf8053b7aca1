package te

import "github.com/mooncake-go/mooncake/internal/size"

// Size is a byte count for flags and reports: "4096", "128KiB", "4MB",
// "1GiB", every unit 1024-based as Mooncake reads them (internal/size).
// It implements pflag.Value.
type Size = size.Size

// ParseSize reads a human byte count (see internal/size.Parse).
func ParseSize(s string) (Size, error) {
	n, err := size.Parse(s)
	return Size(n), err
}
