package main

import (
	"fmt"
	"regexp"
	"strings"
)

// export is one function of the Go library, as cgo declares it.
type export struct {
	Name   string
	Ret    string  // the C result type: "void", "int", "mc_status_t", "notify_msg_t*"
	Params []param // in order; none for (void)
}

type param struct {
	Type string // "char*", "mc_error_t*"
	Name string
}

// prologueEnd ends the part of a cgo header that is not exports.
const prologueEnd = "/* End of boilerplate cgo prologue.  */"

var exportRE = regexp.MustCompile(`^extern\s+(.+?)\s*\b([A-Za-z_]\w*)\((.*)\);$`)
var paramRE = regexp.MustCompile(`^(.+?)\s*\b([A-Za-z_]\w*)$`)

// parseExports reads the exported functions from a header cgo wrote: one
// "extern RET NAME(TYPE NAME, ...);" line each, after the prologue.
func parseExports(header string) ([]export, error) {
	_, body, ok := strings.Cut(header, prologueEnd)
	if !ok {
		return nil, fmt.Errorf("no %q: not a header cgo wrote", prologueEnd)
	}
	var out []export
	for line := range strings.SplitSeq(body, "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "extern ") || line == `extern "C" {` {
			continue
		}
		m := exportRE.FindStringSubmatch(line)
		if m == nil {
			return nil, fmt.Errorf("cannot read the export %q", line)
		}
		e := export{Ret: m[1], Name: m[2]}
		if args := strings.TrimSpace(m[3]); args != "" && args != "void" {
			for a := range strings.SplitSeq(args, ",") {
				pm := paramRE.FindStringSubmatch(strings.TrimSpace(a))
				if pm == nil {
					return nil, fmt.Errorf("cannot read parameter %q of %s", a, e.Name)
				}
				e.Params = append(e.Params, param{Type: pm[1], Name: pm[2]})
			}
		}
		out = append(out, e)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no exports")
	}
	return out, nil
}

// declaredFunctions returns the names of the functions a C header
// declares at file scope, in order: prototypes, not static inline
// definitions, typedefs, struct members or macros.
func declaredFunctions(header string) []string {
	src := stripPreprocessor(stripComments(header))
	src = strings.ReplaceAll(src, `extern "C" {`, "")
	var names []string
	var stmt strings.Builder
	depth := 0
	for _, c := range src {
		switch {
		case c == '{':
			depth++
		case c == '}' && depth == 0:
			continue // the brace of extern "C" (its opening one is gone)
		case c == '}':
			depth--
			if depth == 0 {
				// A function definition ends at its brace, without ';'.
				head, _, _ := strings.Cut(stmt.String(), "{")
				if strings.HasSuffix(strings.TrimSpace(head), ")") {
					stmt.Reset()
					continue
				}
			}
		case c == ';' && depth == 0:
			if name := functionName(stmt.String()); name != "" {
				names = append(names, name)
			}
			stmt.Reset()
			continue
		}
		stmt.WriteRune(c)
	}
	return names
}

var declRE = regexp.MustCompile(`^[A-Za-z_][\w\s\*]*?[\s\*]([A-Za-z_]\w*)\s*\(`)

// functionName is the name a file-scope declaration declares if it is a
// function prototype, else "".
func functionName(stmt string) string {
	stmt = strings.TrimSpace(stmt)
	if strings.HasPrefix(stmt, "typedef") || strings.Contains(stmt, "{") {
		return ""
	}
	m := declRE.FindStringSubmatch(stmt)
	if m == nil {
		return ""
	}
	return m[1]
}

var commentRE = regexp.MustCompile(`(?s)/\*.*?\*/|//[^\n]*`)

func stripComments(s string) string {
	return commentRE.ReplaceAllStringFunc(s, func(c string) string {
		return strings.Repeat("\n", strings.Count(c, "\n")) + " "
	})
}

// stripPreprocessor drops preprocessor lines, continued lines included.
func stripPreprocessor(s string) string {
	var b strings.Builder
	cont := false
	for line := range strings.SplitSeq(s, "\n") {
		t := strings.TrimSpace(line)
		if cont || strings.HasPrefix(t, "#") {
			cont = strings.HasSuffix(t, `\`)
			continue
		}
		b.WriteString(line)
		b.WriteByte('\n')
	}
	return b.String()
}
