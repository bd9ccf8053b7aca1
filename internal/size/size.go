// Package size reads and writes byte counts the way Mooncake's configs
// spell them, for every size the CLI, the benchmarks and the Python
// package take: "4096", "512KB", "16GB", "1.5GiB".
//
// Every unit is binary, with or without "i" and "B": K, KB, KiB = 1024;
// M, MB, MiB = 1024^2; G, GB, GiB = 1024^3; T, TB, TiB = 1024^4; any case.
// This is what Mooncake and the frameworks' Mooncake configs mean by
// "16GB" (16 GiB), not the SI 16*10^9. A fraction is allowed when it
// names whole bytes ("1.5K" = 1536, "1.3" is refused). The cases in
// testdata/cases.json are shared with the Python package's parser, so the
// two cannot drift.
package size

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
)

// ErrSyntax is returned, wrapped with the input, for anything that is not
// a non-negative whole number of bytes in range.
var ErrSyntax = errors.New("size: want a whole number of bytes with an optional unit (K, KB, KiB, M, MB, MiB, G, GB, GiB, T, TB, TiB; all 1024-based)")

// shifts maps a lower-cased unit to its power of two.
var shifts = map[string]uint{
	"": 0, "b": 0,
	"k": 10, "kb": 10, "ki": 10, "kib": 10,
	"m": 20, "mb": 20, "mi": 20, "mib": 20,
	"g": 30, "gb": 30, "gi": 30, "gib": 30,
	"t": 40, "tb": 40, "ti": 40, "tib": 40,
}

// Parse reads a byte count (see the package doc). Spaces around the number
// and between it and the unit are ignored.
func Parse(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := strings.IndexFunc(t, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	if i < 0 {
		i = len(t)
	}
	num, unit := t[:i], strings.ToLower(strings.TrimSpace(t[i:]))
	shift, ok := shifts[unit]
	if !ok || !validNumber(num) {
		return 0, fmt.Errorf("%q: %w", s, ErrSyntax)
	}
	// Exact arithmetic: a float would round "9007199254740993" and accept
	// fractions of a byte that happen to round to a whole one.
	r, ok := new(big.Rat).SetString(num)
	if !ok {
		return 0, fmt.Errorf("%q: %w", s, ErrSyntax)
	}
	r.Mul(r, new(big.Rat).SetInt(new(big.Int).Lsh(big.NewInt(1), shift)))
	if !r.IsInt() {
		return 0, fmt.Errorf("%q is not a whole number of bytes: %w", s, ErrSyntax)
	}
	if !r.Num().IsInt64() {
		return 0, fmt.Errorf("%q is over %d bytes: %w", s, int64(math.MaxInt64), ErrSyntax)
	}
	return r.Num().Int64(), nil
}

// validNumber accepts digits with at most one '.', and at least one digit
// ("1.", ".5" and "1.5" pass; "", "." and "1.2.3" do not).
func validNumber(num string) bool {
	return strings.Count(num, ".") <= 1 && strings.Trim(num, ".") != "" && strings.Trim(num, "0123456789.") == ""
}

// Format spells n with the largest binary unit that divides it ("128KiB",
// "3GiB"), or as a plain number; Parse reads it back to n.
func Format(n int64) string {
	for _, u := range []struct {
		name  string
		shift uint
	}{{"TiB", 40}, {"GiB", 30}, {"MiB", 20}, {"KiB", 10}} {
		if d := int64(1) << u.shift; n != 0 && n%d == 0 {
			return strconv.FormatInt(n/d, 10) + u.name
		}
	}
	return strconv.FormatInt(n, 10)
}

// Size is a byte count that is a pflag.Value, for size flags:
// fs.Var(&s, "block-size", "...").
type Size int64

// String implements pflag.Value (and fmt.Stringer) with Format.
func (s Size) String() string { return Format(int64(s)) }

// Set implements pflag.Value with Parse.
func (s *Size) Set(v string) error {
	n, err := Parse(v)
	if err != nil {
		return err
	}
	*s = Size(n)
	return nil
}

// Type implements pflag.Value.
func (s *Size) Type() string { return "size" }
