package te

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Size is a byte count that parses human spellings, for flags: "4096",
// "128KiB", "4MiB", "1M", "1GiB". K, M, G and T with or without "i" are
// binary (1M = 1 MiB, as fio and dd read them); KB, MB, GB and TB are
// decimal. It implements pflag.Value.
type Size int64

var sizeUnits = map[string]float64{
	"": 1, "b": 1,
	"k": 1 << 10, "ki": 1 << 10, "kib": 1 << 10, "kb": 1e3,
	"m": 1 << 20, "mi": 1 << 20, "mib": 1 << 20, "mb": 1e6,
	"g": 1 << 30, "gi": 1 << 30, "gib": 1 << 30, "gb": 1e9,
	"t": 1 << 40, "ti": 1 << 40, "tib": 1 << 40, "tb": 1e12,
}

// ParseSize reads a human byte count (see Size).
func ParseSize(s string) (Size, error) {
	t := strings.TrimSpace(s)
	i := strings.IndexFunc(t, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	if i < 0 {
		i = len(t)
	}
	num, unit := t[:i], strings.ToLower(strings.TrimSpace(t[i:]))
	mult, ok := sizeUnits[unit]
	if !ok || num == "" {
		return 0, fmt.Errorf("te: size %q: want a number with an optional unit (KiB, MiB, GiB, K, M, G, KB, MB, GB)", s)
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil {
		return 0, fmt.Errorf("te: size %q: %v", s, err)
	}
	v := f * mult
	if v != math.Trunc(v) || v > math.MaxInt64/2 {
		return 0, fmt.Errorf("te: size %q is not a whole number of bytes", s)
	}
	return Size(v), nil
}

// String spells the size with the largest binary unit that divides it.
func (s Size) String() string {
	for _, u := range []struct {
		name string
		n    Size
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if s != 0 && s%u.n == 0 {
			return strconv.FormatInt(int64(s/u.n), 10) + u.name
		}
	}
	return strconv.FormatInt(int64(s), 10)
}

// Set implements pflag.Value.
func (s *Size) Set(v string) error {
	n, err := ParseSize(v)
	if err != nil {
		return err
	}
	*s = n
	return nil
}

// Type implements pflag.Value.
func (s *Size) Type() string { return "size" }
