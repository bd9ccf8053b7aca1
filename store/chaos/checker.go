package chaos

import (
	"fmt"
	"math"
	"sort"
	"time"
)

// AnomalyKind names what a checker found wrong.
type AnomalyKind string

// Anomaly kinds.
const (
	// WrongBytes: a get read bytes that no write of the key made: they do
	// not decode, name another key, or name a write the history lacks.
	WrongBytes AnomalyKind = "wrong-bytes"
	// FailedWriteRead: a get read the value of a write that certainly
	// failed.
	FailedWriteRead AnomalyKind = "read-of-failed-write"
	// FutureRead: a get read a value whose write began after the get ended.
	FutureRead AnomalyKind = "future-read"
	// StaleRead: a get read a value that an acknowledged upsert or remove
	// replaced before the get began (by more than CheckConfig.StaleWindow
	// for another client's write).
	StaleRead AnomalyKind = "stale-read"
	// LostWrite: a get found nothing although a write of the key was
	// acknowledged before it began and nothing could have removed it: no
	// remove of the workload that may have happened, no eviction the
	// master reported, no write racing it that may have left the key
	// empty.
	LostWrite AnomalyKind = "lost-write"
)

// Anomaly is one thing the checker found wrong, with the operations that
// show it.
type Anomaly struct {
	Kind AnomalyKind
	Key  string
	// Get is the read that saw it.
	Get Op
	// Write is the write concerned: the one read (stale, failed, future)
	// or the acknowledged one lost; nil for wrong bytes.
	Write *Op
	// By is, for a stale read, the acknowledged upsert or remove that had
	// replaced the value read.
	By     *Op
	Detail string
}

func (a Anomaly) String() string {
	s := fmt.Sprintf("%s key=%s get#%d (client %d, %v..%v", a.Kind, a.Key, a.Get.Index, a.Get.Client,
		a.Get.Invoke.Round(time.Millisecond), a.Get.Complete.Round(time.Millisecond))
	if a.Get.Final {
		s += ", final"
	}
	s += ")"
	if a.Write != nil {
		s += " " + opString(a.Write)
	}
	if a.By != nil {
		s += " replaced by " + opString(a.By)
	}
	if a.Detail != "" {
		s += ": " + a.Detail
	}
	return s
}

func opString(o *Op) string {
	return fmt.Sprintf("%s#%d %s (client %d, %v..%v, %s)", o.Kind, o.Index, o.Value, o.Client,
		o.Invoke.Round(time.Millisecond), o.Complete.Round(time.Millisecond), o.Result)
}

// CheckConfig says what the store promises beyond "a get reads a value
// some write made".
type CheckConfig struct {
	// StaleWindow is how long a get may go on reading a value after
	// another client's acknowledged upsert or remove replaced it. The
	// store client keeps a looked-up replica list for the first three
	// quarters of the read lease it was granted, and reads from it
	// without asking the master (store/client: leaseCache), so it may
	// see the value as of that lookup; its own upserts and removes drop
	// the entry, so a client reads its own writes at once. Zero: no lag.
	StaleWindow time.Duration
}

// Check verifies a history: every get that read bytes read a value that
// a write of that key made, that may have happened (not failed, not begun
// after the get) and that no acknowledged upsert or remove had replaced
// before the get began; and every get that found nothing (the final reads
// among them) did so with no acknowledged write of the key before it that
// nothing could have removed. Operations of Unknown result may or may not
// have happened: their values may be read, they never replace a value,
// and a remove of Unknown result may explain a key found missing.
// evictions are the master's: an evicted key may be missing.
func Check(ops []Op, evictions []Eviction, cfg CheckConfig) []Anomaly {
	byKey := map[string][]*Op{}
	for i := range ops {
		byKey[ops[i].Key] = append(byKey[ops[i].Key], &ops[i])
	}
	evicted := map[string][]time.Duration{}
	for _, e := range evictions {
		evicted[e.Key] = append(evicted[e.Key], e.At)
	}
	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var out []Anomaly
	for _, k := range keys {
		kc := keyChecker{key: k, ops: byKey[k], evictedAt: evicted[k], cfg: cfg, writes: map[ValueID]*Op{}}
		out = append(out, kc.check()...)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Get.Invoke < out[j].Get.Invoke })
	return out
}

// keyChecker checks the operations of one key.
type keyChecker struct {
	key       string
	ops       []*Op
	evictedAt []time.Duration
	cfg       CheckConfig
	writes    map[ValueID]*Op
}

// forever is the completion of an operation of unknown outcome: its
// effect, if any, may come at any time after its invocation.
const forever = time.Duration(math.MaxInt64)

// end is when o's effect happened at the latest.
func end(o *Op) time.Duration {
	if o.Result == OK {
		return o.Complete
	}
	return forever
}

func (c *keyChecker) check() []Anomaly {
	for _, o := range c.ops {
		if o.Kind.writes() {
			c.writes[o.Value] = o
		}
	}
	var out []Anomaly
	for _, g := range c.ops {
		if g.Kind != Get || g.Result != OK {
			continue
		}
		var a *Anomaly
		if g.Found() {
			a = c.checkRead(g)
		} else {
			a = c.checkMissing(g)
		}
		if a != nil {
			a.Key, a.Get = c.key, *g
			out = append(out, *a)
		}
	}
	return out
}

// checkRead checks a get that read bytes.
func (c *keyChecker) checkRead(g *Op) *Anomaly {
	if g.Value.IsZero() {
		return &Anomaly{Kind: WrongBytes, Detail: g.Err}
	}
	w := c.writes[g.Value]
	switch {
	case w == nil:
		return &Anomaly{Kind: WrongBytes, Detail: fmt.Sprintf("value %s was written by no put or upsert of this key", g.Value)}
	case w.Result == Fail:
		return &Anomaly{Kind: FailedWriteRead, Write: w}
	case w.Invoke > g.Complete:
		return &Anomaly{Kind: FutureRead, Write: w}
	}
	for _, x := range c.ops {
		if (x.Kind == Upsert || x.Kind == Remove) && x.Result == OK && x != w &&
			end(w) < x.Invoke && x.Complete+c.lag(x, g) < g.Invoke {
			return &Anomaly{Kind: StaleRead, Write: w, By: x}
		}
	}
	return nil
}

// lag is how long after x completed g may still miss it.
func (c *keyChecker) lag(x, g *Op) time.Duration {
	if x.Client == g.Client {
		return 0
	}
	return c.cfg.StaleWindow
}

// checkMissing checks a get that found nothing.
func (c *keyChecker) checkMissing(g *Op) *Anomaly {
	var lost *Op
	for _, w := range c.ops {
		if w.Kind.writes() && w.Result == OK && w.Complete < g.Invoke && !c.mayBeGone(w, g) {
			if lost == nil || w.Complete > lost.Complete {
				lost = w
			}
		}
	}
	if lost == nil {
		return nil
	}
	return &Anomaly{Kind: LostWrite, Write: lost, Detail: "acknowledged before the get began; not removed, not evicted"}
}

// mayBeGone reports whether something may have emptied the key after the
// acknowledged write w took effect and before get g looked.
func (c *keyChecker) mayBeGone(w, g *Op) bool {
	for _, x := range c.ops {
		switch {
		case x == w:
		case x.Kind == Remove:
			// A remove that may have happened after w and before g.
			if x.Result != Fail && x.Invoke < g.Complete && end(x) > w.Invoke {
				return true
			}
		case x.Kind.writes() && w.Kind == Put:
			// A put or upsert in flight when put w ran makes w succeed
			// without writing (write-once: the key "exists"); if that one
			// then failed, or had not ended when g looked, the key may hold
			// nothing readable. An upsert that succeeds has written.
			if x.Invoke < w.Complete && end(x) > w.Invoke && (x.Result != OK || x.Complete > g.Invoke) {
				return true
			}
		}
	}
	for _, at := range c.evictedAt {
		// The eviction happened at or before at: after w began, it may
		// have taken w's value.
		if at > w.Invoke {
			return true
		}
	}
	return false
}
