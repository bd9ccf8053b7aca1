package main

import (
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// docs/operator-flags.md has a row for every flag of the official
// binaries (read from their --help) and for every MC_* and MOONCAKE_*
// variable the official wheel reads, so that a flag or variable added
// upstream fails here until someone says what it means on ours.
func TestOperatorFlagsDocComplete(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "operator-flags.md"))
	require.NoError(t, err)
	logging := docSection(t, string(doc), "## Logging")
	for _, bin := range []string{"mooncake_master", "mooncake_client", "transfer_engine_bench"} {
		t.Run(bin, func(t *testing.T) {
			rows := docSection(t, string(doc), "## "+bin) + logging
			assert.Empty(t, missingRows(rows, officialHelpFlags(t, bin), "--"), "docs/operator-flags.md: no row for these flags of %s", bin)
		})
	}
	t.Run("environment", func(t *testing.T) {
		rows := docSection(t, string(doc), "## Environment variables")
		assert.Empty(t, missingRows(rows, officialEnvNames(t), ""), "docs/operator-flags.md: no row for these variables")
	})
}

// missingRows are the names that have no "| `<prefix><name>` |" row in rows.
func missingRows(rows string, names []string, prefix string) []string {
	var missing []string
	for _, n := range names {
		if !strings.Contains(rows, "| `"+prefix+n+"` |") {
			missing = append(missing, n)
		}
	}
	return missing
}

// docSection is the text of doc from the heading to the next "## ".
func docSection(t *testing.T, doc, heading string) string {
	t.Helper()
	i := strings.Index(doc, "\n"+heading)
	require.GreaterOrEqual(t, i, 0, "docs/operator-flags.md has no %q section", heading)
	rest := doc[i+1:]
	if j := strings.Index(rest[len(heading):], "\n## "); j >= 0 {
		return rest[:len(heading)+j]
	}
	return rest
}

// officialEnvNames are the MC_* and MOONCAKE_* names in the official
// wheel: the strings of its binaries and libraries, and what its Python
// modules read from os.environ.
func officialEnvNames(t *testing.T) []string {
	t.Helper()
	pkgs, _ := filepath.Glob(filepath.Join("..", "..", ".venv-official", "lib", "python3*", "site-packages", "mooncake"))
	if len(pkgs) == 0 {
		t.Skip("official wheel not installed (scripts/test-deps.sh installs .venv-official)")
	}
	pkg := pkgs[0]
	inBinary := regexp.MustCompile(`(?:^|[^A-Za-z0-9_])((?:MC|MOONCAKE)_[A-Z0-9_]*[A-Z0-9])(?:[^A-Za-z0-9_]|$)`)
	inPython := regexp.MustCompile(`(?:getenv|environ(?:\.get)?)[\[(]\s*['"]((?:MC|MOONCAKE)_[A-Z0-9_]+)`)
	seen := map[string]bool{}
	scan := func(pattern string, re *regexp.Regexp) {
		files, _ := filepath.Glob(filepath.Join(pkg, pattern))
		for _, f := range files {
			b, err := os.ReadFile(f)
			require.NoError(t, err)
			for _, m := range re.FindAllSubmatch(b, -1) {
				seen[string(m[1])] = true
			}
		}
	}
	for _, bin := range []string{"mooncake_master", "mooncake_client", "transfer_engine_bench", "store.so", "engine.so"} {
		scan(bin, inBinary)
	}
	scan("*.py", inPython)
	names := make([]string, 0, len(seen))
	for n := range seen {
		names = append(names, n)
	}
	sort.Strings(names)
	require.Greater(t, len(names), 50, "found the official wheel's environment variables")
	return names
}
