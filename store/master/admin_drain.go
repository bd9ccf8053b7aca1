package master

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/mooncake-go/mooncake/store/storepb"
)

// Drain jobs (POST /api/v1/drain_jobs): move every object off some DRAM
// segments, as Mooncake's master does before a node is taken out. The
// segments stop taking new replicas (DRAINING); each object with a replica
// on one of them is a unit: the master allocates a replica on another
// segment (the job's targets, or any other DRAM segment) and asks the
// client owning the source to copy it there, with the SSD tier's move
// machinery (tier.go: the task goes out in that client's next ping answer
// and ends with MoveEnd). When the copy ends the object has the new
// replica and the source's space is freed (once no reader holds a lease
// on it). When no unit is left the job SUCCEEDED and its segments are
// DRAINED: still mounted, taking nothing, until unmounted. A copy that
// fails is tried again, up to drainTries times, after which the unit is
// given up and the job ends FAILED (its segments take replicas again).
// Cancelling stops the job; moves in flight finish, and the segments take
// replicas again.
//
// Jobs are journaled (JournalDrain, the whole job in each record): when
// created, when their counts or status change, so that a new leader (or a
// restart from the journal) resumes the jobs running, their segments
// DRAINING again, and answers for those that ended; it keeps the last
// keepEndedDrains that ended. Units are planned when the job starts, on
// every query, on the Service's monitor tick, and as moves end.

// Mooncake's job and segment statuses, by number.
const (
	jobCreated   = 0
	jobRunning   = 2
	jobSucceeded = 3
	jobFailed    = 4
	jobCanceled  = 5

	segDraining = 2
	segDrained  = 3
)

var jobStatusNames = map[int]string{0: "CREATED", 1: "PLANNING", 2: "RUNNING", 3: "SUCCEEDED", 4: "FAILED", 5: "CANCELED"}
var segStatusNames = map[int]string{0: "UNDEFINED", 1: "OK", 2: "DRAINING", 3: "DRAINED", 4: "GRACEFULLY_UNMOUNTING"}

// drainTries is how many failed copies of a unit a job takes before it
// gives the unit up.
const drainTries = 3

// defaultDrainConcurrency bounds the units in flight when the request
// gives no max_concurrency.
const defaultDrainConcurrency = 64

// keepEndedDrains is how many jobs that ended a Service keeps for queries,
// the latest; the oldest go first.
const keepEndedDrains = 64

// drainJob is one job. Its fields are under drainSet.mu.
type drainJob struct {
	id               string
	segs, targets    []string
	segIDs           []string // the segments it made DRAINING
	concurrency      int
	created, updated time.Time
	status           int
	message          string

	succeeded, active, blocked int
	migrated                   uint64
	fails                      map[string]int // failed copies by key
	givenUp                    int            // units with drainTries failures

	recorded *storepb.JournalDrain // the job's last record, nil before any
	seq      uint64                // that record's sequence number (0: none, or a new leader's restored job)
}

func (j *drainJob) running() bool { return j.status == jobCreated || j.status == jobRunning }

// record is j as a journal record. drainSet.mu is held.
func (j *drainJob) record() *storepb.JournalDrain {
	return &storepb.JournalDrain{Id: j.id, Segments: j.segs, Targets: j.targets, Concurrency: uint32(j.concurrency),
		CreatedUnixMs: j.created.UnixMilli(), UpdatedUnixMs: j.updated.UnixMilli(), Status: uint32(j.status),
		Message: j.message, SucceededUnits: uint64(j.succeeded), FailedUnits: uint64(j.givenUp), MigratedBytes: j.migrated,
		SegmentIds: j.segIDs}
}

// journalDrainLocked appends j's record when its status or counts changed
// since its last one, and returns the record's sequence number (0: none
// appended). drains.mu is held, so a job's records go in the order of its
// changes. A job no longer kept (pruned) records nothing more.
func (s *Service) journalDrainLocked(j *drainJob) uint64 {
	r := j.record()
	if p := j.recorded; (p != nil && p.Status == r.Status && p.SucceededUnits == r.SucceededUnits &&
		p.FailedUnits == r.FailedUnits && p.MigratedBytes == r.MigratedBytes) || s.drains.jobs[j.id] != j {
		return 0
	}
	j.recorded = r
	j.seq = s.record(&storepb.JournalRecord{Op: &storepb.JournalRecord_Drain{Drain: r}})
	return j.seq
}

// pruneDrainsLocked drops the jobs that ended but the latest
// keepEndedDrains (by their last record, then their last change: a new
// leader's restored jobs are older than its own), never keep, the job
// that just ended, whose caller answers for it. drains.mu is held.
func (s *Service) pruneDrainsLocked(keep *drainJob) {
	var ended []*drainJob
	for _, j := range s.drains.jobs {
		if !j.running() && j != keep {
			ended = append(ended, j)
		}
	}
	room := keepEndedDrains
	if keep != nil && !keep.running() {
		room-- // keep is the latest, whatever the clock says
	}
	if len(ended) <= room {
		return
	}
	slices.SortFunc(ended, func(a, b *drainJob) int {
		if c := cmpU64(a.seq, b.seq); c != 0 {
			return c
		}
		if c := a.updated.Compare(b.updated); c != 0 {
			return c
		}
		if c := a.created.Compare(b.created); c != 0 {
			return c
		}
		return strings.Compare(a.id, b.id)
	})
	for _, j := range ended[:len(ended)-room] {
		delete(s.drains.jobs, j.id)
	}
}

// drainSet holds a Service's jobs. mu is taken last: never hold it while
// taking a shard's lock or segMu.
type drainSet struct {
	mu   sync.Mutex
	jobs map[string]*drainJob
}

// drainView is a job's state as /api/v1/drain_jobs/query answers it.
type drainView struct {
	Success      bool     `json:"success"`
	JobID        string   `json:"job_id"`
	Type         int      `json:"type"`
	TypeName     string   `json:"type_name"`
	Status       int      `json:"status"`
	StatusName   string   `json:"status_name"`
	CreatedAt    int64    `json:"created_at_ms_epoch"`
	UpdatedAt    int64    `json:"last_updated_at_ms_epoch"`
	Segments     []string `json:"segments"`
	Succeeded    int      `json:"succeeded_units"`
	Failed       int      `json:"failed_units"`
	Blocked      int      `json:"blocked_units"`
	Active       int      `json:"active_units"`
	MigratedByte uint64   `json:"migrated_bytes"`
	Message      string   `json:"message"`
	Code         int32    `json:"error_code"`
	ErrorMessage string   `json:"error_message"`
}

// Errors of startDrain, with the answers Mooncake gives them.
var (
	errDrainNoSegment = errors.New("a segment to drain is not mounted")
	errDrainBad       = errors.New("invalid drain request")
)

// startDrain creates a job draining the DRAM segments named segs onto
// those named targets (none: any other), plans its first units, and waits
// for its record: a job answered created survives a failover. An error
// after the job was made (the record's wait) comes with its id.
func (s *Service) startDrain(ctx context.Context, segs, targets []string, concurrency int) (string, error) {
	if len(segs) == 0 {
		return "", fmt.Errorf("%w: no segments", errDrainBad)
	}
	if concurrency <= 0 {
		concurrency = defaultDrainConcurrency
	}
	s.segMu.Lock()
	byName := map[string][]*segment{}
	for _, sg := range s.segList {
		if sg.medium == storepb.Medium_MEDIUM_DRAM && !sg.dead.Load() {
			byName[sg.name] = append(byName[sg.name], sg)
		}
	}
	var bad error
	for _, n := range segs {
		switch {
		case byName[n] == nil:
			bad = errDrainNoSegment
		case byName[n][0].drain == segDraining:
			bad = fmt.Errorf("%w: %s is being drained", errDrainBad, n)
		}
	}
	for _, n := range targets {
		if byName[n] == nil || slices.Contains(segs, n) || byName[n][0].drain != 0 {
			bad = cmpErr(bad, fmt.Errorf("%w: target %s", errDrainBad, n))
		}
	}
	if bad != nil {
		s.segMu.Unlock()
		return "", bad
	}
	var ids []string
	for _, n := range segs {
		for _, sg := range byName[n] {
			sg.drain = segDraining
			ids = append(ids, sg.id)
		}
	}
	s.segMu.Unlock()

	now := s.now()
	j := &drainJob{id: fmt.Sprintf("%d-%d", rand.Uint64(), rand.Uint64()), segs: slices.Clone(segs),
		targets: slices.Clone(targets), segIDs: ids, concurrency: concurrency, created: now, updated: now,
		status: jobCreated, message: "Drain job created", fails: map[string]int{}}
	s.drains.mu.Lock()
	if s.drains.jobs == nil {
		s.drains.jobs = map[string]*drainJob{}
	}
	s.drains.jobs[j.id] = j
	seq := s.journalDrainLocked(j)
	s.drains.mu.Unlock()
	seq = max(seq, s.stepDrain(j))
	return j.id, s.durable(ctx, seq)
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// stepDrains plans the units of every running job (the monitor tick).
func (s *Service) stepDrains() {
	s.drains.mu.Lock()
	var run []*drainJob
	for _, j := range s.drains.jobs {
		if j.status == jobCreated || j.status == jobRunning {
			run = append(run, j)
		}
	}
	s.drains.mu.Unlock()
	for _, j := range run {
		s.stepDrain(j)
	}
}

// stepDrain plans j's units: a move for each object with a replica on a
// drained segment and none in flight, while the job's concurrency allows
// and a target has room; it counts the units in flight and those blocked,
// and ends the job when none is left. It returns the sequence number of
// the job's record when it appended one (0: none).
func (s *Service) stepDrain(j *drainJob) uint64 {
	s.drains.mu.Lock()
	if !j.running() {
		s.drains.mu.Unlock()
		return 0
	}
	segs, targets, concurrency := j.segs, j.targets, j.concurrency
	fails := make(map[string]int, len(j.fails))
	for k, n := range j.fails {
		fails[k] = n
	}
	s.drains.mu.Unlock()

	// New moves may take what the concurrency leaves to those in flight.
	s.segMu.Lock()
	budget := concurrency
	for _, t := range s.tasks {
		if t.drain == j {
			budget--
		}
	}
	s.segMu.Unlock()
	active, blocked, waiting, givenUp := 0, 0, 0, 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for key, o := range sh.objects {
			src, ok := drainedReplica(o, segs)
			if p := o.pending; p != nil && !ok {
				if _, onSrc := drainedReplica(&object{replicas: p.replicas}, segs); onSrc {
					blocked++ // a put in flight: its object moves once readable
				}
			}
			if !ok {
				continue
			}
			switch {
			case o.moving != nil && o.moving.drain == j:
				active++
				continue
			case fails[key] >= drainTries:
				givenUp++
				continue
			case o.moving != nil || o.pending != nil:
				blocked++ // another move, or an upsert, in flight
				continue
			case budget <= 0:
				waiting++
				continue
			}
			s.segMu.Lock()
			dst, placed := s.drainTargetLocked(o, src, segs, targets)
			if placed {
				t := s.newTaskLocked(key, o, src, dst, false)
				t.drain = j
			}
			s.segMu.Unlock()
			if placed {
				active++
				budget--
			} else {
				blocked++
			}
		}
		sh.mu.Unlock()
	}

	s.drains.mu.Lock()
	if !j.running() {
		s.drains.mu.Unlock()
		return 0 // cancelled meanwhile
	}
	j.active, j.blocked, j.givenUp, j.updated = active, blocked, givenUp, s.now()
	var to uint8
	switch {
	case active+blocked+waiting > 0:
		j.status, j.message = jobRunning, "Drain job running"
		seq := s.journalDrainLocked(j)
		s.drains.mu.Unlock()
		return seq
	case givenUp > 0:
		// The objects left there stay readable; the segments take puts
		// again, as after a cancel.
		j.status, j.message = jobFailed, "Drain job failed: unrecoverable units remain"
	default:
		j.status, j.message, to = jobSucceeded, "Drain job finished successfully", segDrained
	}
	seq := s.journalDrainLocked(j)
	s.pruneDrainsLocked(j)
	s.drains.mu.Unlock()
	s.setDrainState(segs, to, segDraining)
	return seq
}

// setDrainState moves the DRAM segments named in names from drain state
// from to to.
func (s *Service) setDrainState(names []string, to, from uint8) {
	s.segMu.Lock()
	defer s.segMu.Unlock()
	for _, sg := range s.segList {
		if sg.drain == from && slices.Contains(names, sg.name) {
			sg.drain = to
		}
	}
}

// drainedReplica returns o's replica on a segment named in segs, if any:
// of a striped replica, the piece there (a drain moves a piece at a time).
func drainedReplica(o *object, segs []string) (replica, bool) {
	var found replica
	ok := false
	for _, r := range o.replicas {
		r.pieces(func(p replica) {
			if !ok && p.seg.medium == storepb.Medium_MEDIUM_DRAM && !p.seg.dead.Load() && slices.Contains(segs, p.seg.name) {
				found, ok = p, true
			}
		})
	}
	return found, ok
}

// drainTargetLocked allocates the new place of src, o's replica or piece,
// on a target: a DRAM segment named in targets (any not drained when
// there are none), holding no piece of o, most free space first. segMu is
// held.
func (s *Service) drainTargetLocked(o *object, src replica, segs, targets []string) (replica, bool) {
	var cands []*segment
	for _, sg := range s.segList {
		if sg.medium != storepb.Medium_MEDIUM_DRAM || sg.dead.Load() || sg.drain != 0 || s.heldLocked(sg) || slices.Contains(segs, sg.name) {
			continue
		}
		if len(targets) > 0 && !slices.Contains(targets, sg.name) {
			continue
		}
		if slices.ContainsFunc(o.replicas, func(r replica) bool { return r.on(sg) }) {
			continue
		}
		cands = append(cands, sg)
	}
	slices.SortStableFunc(cands, func(a, b *segment) int {
		return -cmpU64(a.alloc.FreeBytes(), b.alloc.FreeBytes())
	})
	for _, sg := range cands {
		if off, ok := sg.alloc.Alloc(src.size); ok {
			return replica{seg: sg, off: off, size: src.size}, true
		}
	}
	return replica{}, false
}

// movePiece is reps with piece from (a replica, or a striped replica's
// piece) replaced by to: a moved replica goes to the end, as a new one
// does; a moved piece keeps its replica's place.
func movePiece(reps []replica, from, to replica) []replica {
	out := make([]replica, 0, len(reps))
	moved := false
	for _, r := range reps {
		switch {
		case r.is(from):
			moved = true
		case r.holds(from):
			out = append(out, r.withPiece(from, to))
		default:
			out = append(out, r)
		}
	}
	if moved {
		out = append(out, to)
	}
	return out
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// drainMovedLocked ends a drain move that succeeded: t.dst takes the place
// of t.src, a replica or a striped replica's piece, whose space is freed
// once the record is durable and no reader holds a lease on it. sh.mu is
// held. The record is a move that drops its source only (OnlyFrom): the
// object's other replicas (and pieces) stay.
func (s *Service) drainMovedLocked(t *moveTask, o *object) uint64 {
	rec := &storepb.JournalRecord{Op: &storepb.JournalRecord_Move{Move: &storepb.JournalMove{
		Key: t.key, From: locations([]replica{t.src})[0], To: locations([]replica{t.dst})[0], OnlyFrom: true,
		Id: t.moveEndID()}}}
	now := s.now()
	leased, until := o.lease.After(now), o.lease
	src := t.src
	seq := s.after(rec, func() {
		if !leased {
			s.freeReplicas([]replica{src})
			return
		}
		s.segMu.Lock()
		defer s.segMu.Unlock()
		if !src.seg.dead.Load() {
			s.deferred = append(s.deferred, deferredFree{at: until, reps: []replica{src}})
		}
	})
	if s.goneBefore(src.seg, seq) {
		// The source's segment was unmounted after MoveEnd saw it, its
		// record before this one: a replay drops the replica with the
		// unmount and finds nothing to move. So does the leader: the
		// sweep still to come drops the replica as it stands, and the
		// target goes back (the source, dead, has nothing to free).
		s.freeReplicas([]replica{t.dst})
		return seq
	}
	o.replicas = movePiece(o.replicas, t.src, t.dst)
	s.drains.mu.Lock()
	t.drain.succeeded++
	t.drain.migrated += t.src.size
	t.drain.updated = now
	// The job's counts, right behind the move (the caller waits for both).
	seq = max(seq, s.journalDrainLocked(t.drain))
	s.drains.mu.Unlock()
	return seq
}

// goneBefore reports whether sg was unmounted by a record before record
// seq.
func (s *Service) goneBefore(sg *segment, seq uint64) bool {
	s.segMu.Lock()
	defer s.segMu.Unlock()
	return sg.dead.Load() && sg.gone != 0 && sg.gone < seq
}

// drainEnded counts a drain move that ended without moving: a failed copy
// (!ok) counts against its unit.
func (s *Service) drainEnded(t *moveTask, ok bool) {
	if t.drain == nil || ok {
		return
	}
	s.drains.mu.Lock()
	t.drain.fails[t.key]++
	s.drains.mu.Unlock()
}

// drainJobView reports job id, after planning its units; nil if unknown.
func (s *Service) drainJobView(id string) *drainView {
	s.drains.mu.Lock()
	j := s.drains.jobs[id]
	s.drains.mu.Unlock()
	if j == nil {
		return nil
	}
	s.stepDrain(j)
	s.drains.mu.Lock()
	defer s.drains.mu.Unlock()
	return &drainView{Success: true, JobID: j.id, TypeName: "DRAIN", Status: j.status,
		StatusName: jobStatusNames[j.status], CreatedAt: j.created.UnixMilli(), UpdatedAt: j.updated.UnixMilli(),
		Segments: slices.Clone(j.segs), Succeeded: j.succeeded, Failed: j.givenUp, Blocked: j.blocked,
		Active: j.active, MigratedByte: j.migrated, Message: j.message}
}

// cancelDrain cancels job id, and waits for its last record: its status
// name then, "" if unknown. A job that ended stays as it ended.
func (s *Service) cancelDrain(ctx context.Context, id string) (status string, err error) {
	s.drains.mu.Lock()
	j := s.drains.jobs[id]
	if j == nil {
		s.drains.mu.Unlock()
		return "", nil
	}
	running := j.running()
	if running {
		j.status, j.message, j.updated = jobCanceled, "Drain job canceled", s.now()
		s.journalDrainLocked(j)
		s.pruneDrainsLocked(j)
	}
	segs, seq, status := j.segs, j.seq, jobStatusNames[j.status]
	s.drains.mu.Unlock()
	if running {
		s.setDrainState(segs, 0, segDraining)
	}
	// The end it answers may be another call's, not durable yet.
	return status, s.durable(ctx, seq)
}

// drainRecords adds the jobs s keeps to drains, as their records.
func (s *Service) drainRecords(drains map[string]*storepb.JournalDrain) {
	s.drains.mu.Lock()
	defer s.drains.mu.Unlock()
	for id, j := range s.drains.jobs {
		drains[id] = j.record()
	}
}

// restoreDrainsLocked makes the jobs of drains s's own, the latest
// keepEndedDrains of those that ended. (Their segments' drain states come
// with the segments: restore.) segMu is held.
func (s *Service) restoreDrainsLocked(drains map[string]*storepb.JournalDrain) {
	s.drains.mu.Lock()
	defer s.drains.mu.Unlock()
	s.drains.jobs = make(map[string]*drainJob, len(drains))
	for id, r := range drains {
		s.drains.jobs[id] = &drainJob{id: id, segs: r.Segments, targets: r.Targets, segIDs: r.SegmentIds,
			concurrency: int(r.Concurrency), created: time.UnixMilli(r.CreatedUnixMs),
			updated: time.UnixMilli(r.UpdatedUnixMs), status: int(r.Status), message: r.Message,
			succeeded: int(r.SucceededUnits), givenUp: int(r.FailedUnits), migrated: r.MigratedBytes,
			fails: map[string]int{}, recorded: r}
	}
	s.pruneDrainsLocked(nil)
}

// segmentStatus is the drain status of the DRAM segments named name (1
// OK when none drains), and whether any is mounted.
func (s *Service) segmentStatus(name string) (int, bool) {
	s.segMu.Lock()
	defer s.segMu.Unlock()
	for _, sg := range s.segList {
		if sg.medium == storepb.Medium_MEDIUM_DRAM && sg.name == name {
			if sg.drain == 0 {
				return segmentOK, true
			}
			return int(sg.drain), true
		}
	}
	return 0, false
}
