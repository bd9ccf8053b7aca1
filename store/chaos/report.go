package chaos

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// MaxListed is how many anomalies Report lists in full; the rest are
// counted by kind.
const MaxListed = 20

// Report prints what a run did and what the checker found: operations by
// kind and result, the faults injected, evictions and notes, and the
// anomalies.
func Report(w io.Writer, h *History, anomalies []Anomaly) error {
	ops := h.Ops()
	type count struct{ ok, fail, unknown, found, final int }
	counts := map[Kind]*count{}
	for _, o := range ops {
		c := counts[o.Kind]
		if c == nil {
			c = &count{}
			counts[o.Kind] = c
		}
		switch {
		case o.Final:
			c.final++
		case o.Result == OK:
			c.ok++
		case o.Result == Fail:
			c.fail++
		default:
			c.unknown++
		}
		if o.Found() && !o.Final {
			c.found++
		}
	}
	var span time.Duration
	for _, o := range ops {
		if !o.Final {
			span = max(span, o.Complete)
		}
	}
	fmt.Fprintf(w, "operations: %d in %v\n", len(ops), span.Round(time.Millisecond))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "op\tok\tfail\tunknown\tfound\tfinal\t")
	for _, k := range []Kind{Put, Upsert, Remove, Get} {
		if c := counts[k]; c != nil {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t\n", k, c.ok, c.fail, c.unknown, c.found, c.final)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	reportErrors(w, ops)
	faults := h.Faults()
	fmt.Fprintf(w, "faults: %d\n", len(faults))
	for _, f := range faults {
		fmt.Fprintf(w, "  %8v  %-12s %s", f.At.Round(time.Millisecond), f.Name, f.What)
		if f.Healed > 0 {
			fmt.Fprintf(w, "; healed at %v", f.Healed.Round(time.Millisecond))
		}
		if d, ok := firstWriteAfter(ops, f.At); ok {
			fmt.Fprintf(w, "; first write acknowledged %v after", d.Round(time.Millisecond))
		}
		if f.Err != "" {
			fmt.Fprintf(w, "; error: %s", f.Err)
		}
		fmt.Fprintln(w)
	}
	ev := h.Evictions()
	keys := map[string]bool{}
	for _, e := range ev {
		keys[e.Key] = true
	}
	fmt.Fprintf(w, "evictions seen: %d (%d keys)\n", len(ev), len(keys))
	gone := map[string][]Vanished{}
	for _, v := range h.Vanished() {
		gone[v.Key] = append(gone[v.Key], v)
	}
	if len(gone) > 0 {
		fmt.Fprintf(w, "keys gone while no watch was open: %d (not excused)\n", len(gone))
	}
	for _, n := range h.Notes() {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	byKind := map[AnomalyKind]int{}
	for _, a := range anomalies {
		byKind[a.Kind]++
	}
	fmt.Fprintf(w, "anomalies: %d", len(anomalies))
	kinds := make([]AnomalyKind, 0, len(byKind))
	for k := range byKind {
		kinds = append(kinds, k)
	}
	slices.Sort(kinds)
	for _, k := range kinds {
		fmt.Fprintf(w, " %s=%d", k, byKind[k])
	}
	fmt.Fprintln(w)
	for i, a := range anomalies {
		if i == MaxListed {
			fmt.Fprintf(w, "  ... %d more\n", len(anomalies)-MaxListed)
			break
		}
		fmt.Fprintf(w, "  %s%s\n", a, vanishedNote(a, gone[a.Key]))
	}
	return nil
}

// reportErrors prints the most frequent errors of failed and unknown
// operations, by kind, with the store's code and the first words.
func reportErrors(w io.Writer, ops []Op) {
	type key struct {
		kind Kind
		err  string
	}
	n := map[key]int{}
	for _, o := range ops {
		if o.Result != OK && o.Err != "" {
			n[key{o.Kind, errClass(o.Err)}]++
		}
	}
	keys := make([]key, 0, len(n))
	for k := range n {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b key) int { return n[b] - n[a] })
	if len(keys) > 8 {
		keys = keys[:8]
	}
	for _, k := range keys {
		fmt.Fprintf(w, "  %6d %s: %s\n", n[k], k.kind, k.err)
	}
}

// errClass is an error's text up to its first details: its code and what
// failed, without keys and addresses, so that like errors count together.
func errClass(s string) string {
	if len(s) > 60 {
		s = s[:60]
	}
	if i := strings.IndexAny(s, "\"0123456789"); i > 0 {
		s = s[:i]
	}
	return strings.TrimSpace(s)
}

// firstWriteAfter is how long after t the first write invoked after t
// was acknowledged: how long the store took to serve writes again after a
// fault (ops are ordered by invocation).
func firstWriteAfter(ops []Op, t time.Duration) (time.Duration, bool) {
	best, ok := time.Duration(0), false
	for _, o := range ops {
		if o.Invoke < t || o.Final {
			continue
		}
		if ok && o.Invoke-t > best {
			break // invoked later than the best completion: none beats it
		}
		if o.Kind.writes() && o.Result == OK && (!ok || o.Complete-t < best) {
			best, ok = o.Complete-t, true
		}
	}
	return best, ok
}

// vanishedNote says, for a lost write, that its key went while no watch
// was open after the write began: an eviction the checker could not see,
// or a loss in a failover.
func vanishedNote(a Anomaly, gone []Vanished) string {
	if a.Kind != LostWrite || a.Write == nil {
		return ""
	}
	for _, v := range gone {
		if v.To > a.Write.Invoke && v.From < a.Get.Complete {
			return fmt.Sprintf(" (the key went while no watch was open, %v..%v: evicted unseen, or lost)",
				v.From.Round(time.Millisecond), v.To.Round(time.Millisecond))
		}
	}
	return ""
}
