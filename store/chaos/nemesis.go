package chaos

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"time"
)

// Fault is one kind of fault the nemesis injects: kill -9 of a storage
// node or of the leading master here; a partition, loss or delay on a
// link of the network-namespace harness plugs in the same way. The
// checker sees only the history, never the faults, so a new kind needs no
// change to it.
type Fault interface {
	// Inject puts the fault in force and says what it did (which process,
	// which link). heal undoes it (restarts the process, mends the link);
	// nil when there is nothing to undo.
	Inject(ctx context.Context) (what string, heal func(context.Context) error, err error)
}

// FaultFunc is a Fault made of a function.
type FaultFunc func(ctx context.Context) (string, func(context.Context) error, error)

// Inject calls f.
func (f FaultFunc) Inject(ctx context.Context) (string, func(context.Context) error, error) {
	return f(ctx)
}

var _ Fault = FaultFunc(nil)

// Faults are the faults a schedule may name, by name.
type Faults map[string]Fault

// Step is one entry of a fault schedule.
type Step struct {
	Name string
	// At is the first injection, from the start of the run.
	At time.Duration
	// Every, when set, repeats the fault at this period after At.
	Every time.Duration
	// Hold is how long the fault stays in force before it is healed
	// (a killed process restarted). Zero: DefaultHold.
	Hold time.Duration
}

// DefaultHold is how long a fault stays in force unless its step says.
const DefaultHold = time.Second

func (s Step) String() string {
	var b strings.Builder
	b.WriteString(s.Name)
	if s.Every > 0 && s.At == s.Every {
		fmt.Fprintf(&b, "/%v", s.Every)
	} else {
		fmt.Fprintf(&b, "@%v", s.At)
		if s.Every > 0 {
			fmt.Fprintf(&b, "/%v", s.Every)
		}
	}
	if s.Hold > 0 {
		fmt.Fprintf(&b, "+%v", s.Hold)
	}
	return b.String()
}

// ParseSchedule reads a schedule: steps separated by commas, each
//
//	name@at[/every][+hold]   at `at`, then every `every` if given
//	name/every[+hold]        every `every`, the first after one period
//
// with Go durations: "kill-node@5s,kill-master@10s+2s" kills a node at
// 5 s and the leading master at 10 s, restarting the master 2 s later;
// "kill-node/7s" kills a node every 7 s. "" and "none" are no faults.
func ParseSchedule(spec string) ([]Step, error) {
	spec = strings.TrimSpace(spec)
	if spec == "" || spec == "none" {
		return nil, nil
	}
	var steps []Step
	for _, part := range strings.Split(spec, ",") {
		s, err := parseStep(strings.TrimSpace(part))
		if err != nil {
			return nil, fmt.Errorf("chaos: fault %q: %w", part, err)
		}
		steps = append(steps, s)
	}
	return steps, nil
}

func parseStep(p string) (Step, error) {
	var s Step
	rest, hold, ok := strings.Cut(p, "+")
	if ok {
		d, err := positive(hold, "hold")
		if err != nil {
			return s, err
		}
		s.Hold = d
	}
	name, when, at := strings.Cut(rest, "@")
	if !at {
		var every string
		if name, every, ok = strings.Cut(rest, "/"); !ok {
			return s, fmt.Errorf("want name@time or name/period")
		}
		d, err := positive(every, "period")
		if err != nil {
			return s, err
		}
		s.At, s.Every = d, d
	} else {
		when, every, repeat := strings.Cut(when, "/")
		d, err := time.ParseDuration(when)
		if err != nil || d < 0 {
			return s, fmt.Errorf("time %q: want a duration from the start (5s)", when)
		}
		s.At = d
		if repeat {
			if s.Every, err = positive(every, "period"); err != nil {
				return s, err
			}
		}
	}
	if name == "" {
		return s, fmt.Errorf("no fault name")
	}
	s.Name = name
	return s, nil
}

func positive(v, what string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%s %q: want a positive duration", what, v)
	}
	return d, nil
}

// Validate reports the first step that names a fault not in faults.
func (f Faults) Validate(steps []Step) error {
	for _, s := range steps {
		if f[s.Name] == nil {
			names := make([]string, 0, len(f))
			for n := range f {
				names = append(names, n)
			}
			sort.Strings(names)
			return fmt.Errorf("chaos: no fault %q here (have: %s)", s.Name, strings.Join(names, ", "))
		}
	}
	return nil
}

// injection is one planned injection of a step.
type injection struct {
	at   time.Duration
	step Step
}

// plan lists the injections of steps before until, in time order.
func plan(steps []Step, until time.Duration) []injection {
	var out []injection
	for _, s := range steps {
		for at := s.At; at < until; at += s.Every {
			out = append(out, injection{at, s})
			if s.Every <= 0 {
				break
			}
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].at < out[j].at })
	return out
}

// Nemesis injects faults on a schedule and records them in a history.
// Faults run one at a time: an injection due while the one before is
// still held waits for its heal.
type Nemesis struct {
	Faults Faults
	Steps  []Step
	Log    *slog.Logger
}

// Run injects the faults planned before until (from h's start) and
// returns once the last one is healed. When ctx ends it heals the fault
// in force and returns.
func (n *Nemesis) Run(ctx context.Context, h *History, until time.Duration) {
	log := n.Log
	if log == nil {
		log = slog.Default()
	}
	for _, in := range plan(n.Steps, until) {
		if !sleepUntil(ctx, h, in.at) {
			return
		}
		what, heal, err := n.Faults[in.step.Name].Inject(ctx)
		ev := FaultEvent{At: h.Now(), Name: in.step.Name, What: what}
		if err != nil {
			ev.Err = err.Error()
		}
		i := h.AddFault(ev)
		log.Info("chaos: fault", "name", ev.Name, "what", what, "err", err)
		if heal == nil {
			continue
		}
		hold := in.step.Hold
		if hold == 0 {
			hold = DefaultHold
		}
		// Healing is not cut short by ctx: a run that ends mid-fault still
		// restarts what it killed before its final reads.
		sleepUntil(ctx, h, h.Now()+hold)
		hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		err = heal(hctx)
		cancel()
		h.Healed(i, err)
		log.Info("chaos: healed", "name", ev.Name, "what", what, "err", err)
	}
}

// sleepUntil waits until h's time t; false when ctx ended first.
func sleepUntil(ctx context.Context, h *History, t time.Duration) bool {
	d := t - h.Now()
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}
