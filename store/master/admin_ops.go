package master

import (
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/mooncake-go/mooncake/store/storepb"
)

// The /api/v1 endpoints of Mooncake's admin server: segment status, drain
// jobs and remove_all. Their bodies are JSON, errors Mooncake's
// {"success":false,"error_code":N,"error_message":"NAME"}.
//
// Drain jobs are refused: Mooncake drains a segment by having the clients
// copy each object's replica elsewhere (a job of copy tasks they fetch and
// report), and this master's moves (tier.go) only copy between DRAM and a
// node's SSD tier; there is no DRAM to DRAM move to drain with, and
// answering "CREATED" for a job nothing carries out would be a lie. A
// well-formed request naming mounted segments is answered 409
// UNAVAILABLE_IN_CURRENT_MODE, as Mooncake answers a feature its mode
// lacks; malformed ones get Mooncake's own errors, so callers see the
// same answers for the same mistakes. No job ever exists, so a query or
// cancel of a well-formed id is JOB_NOT_FOUND.

// Error codes of Mooncake's that only the admin server uses here.
const (
	codeUnavailableInMode storepb.Code = -1011
	codeJobNotFound       storepb.Code = -1402
)

var adminCodeNames = map[storepb.Code]string{
	codeUnavailableInMode: "UNAVAILABLE_IN_CURRENT_MODE",
	codeJobNotFound:       "JOB_NOT_FOUND",
}

func codeName(c storepb.Code) string {
	if n, ok := adminCodeNames[c]; ok {
		return n
	}
	return c.String()
}

// adminFail writes Mooncake's JSON error; msg "" is the code's name.
func adminFail(w http.ResponseWriter, status int, c storepb.Code, msg string) {
	if msg == "" {
		msg = codeName(c)
	}
	writeJSON(w, status, adminError{Code: int32(c), Message: msg})
}

// Mooncake's segment statuses (/api/v1/segments/status, and the "status"
// of /get_segments_detail). A mounted segment here is always OK: nothing
// drains.
const segmentOK = 1

type segmentStatusBody struct {
	Success    bool   `json:"success"`
	Segment    string `json:"segment"`
	Status     int    `json:"status"`
	StatusName string `json:"status_name"`
	Code       int32  `json:"error_code"`
	Message    string `json:"error_message"`
}

// segmentStatus answers ?segment=<name>.
func segmentStatus(svc *Service, w http.ResponseWriter, r *http.Request) {
	name := r.URL.Query().Get("segment")
	if name == "" {
		adminFail(w, http.StatusBadRequest, storepb.InvalidParams, "Missing segment query parameter")
		return
	}
	if !svc.hasDRAMSegment(name) {
		adminFail(w, http.StatusNotFound, storepb.SegmentNotFound, "")
		return
	}
	writeJSON(w, http.StatusOK, segmentStatusBody{Success: true, Segment: name, Status: segmentOK, StatusName: "OK"})
}

func (s *Service) hasDRAMSegment(name string) bool {
	for _, sg := range s.dramSegments() {
		if sg.name == name {
			return true
		}
	}
	return false
}

// drainRequest is the body of POST /api/v1/drain_jobs.
type drainRequest struct {
	Segments       []string `json:"segments"`
	TargetSegments []string `json:"target_segments"`
	MaxConcurrency uint32   `json:"max_concurrency"`
}

// createDrainJob checks the request as Mooncake does, then refuses it
// (see above).
func createDrainJob(svc *Service, w http.ResponseWriter, r *http.Request) {
	var req drainRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		adminFail(w, http.StatusBadRequest, storepb.InvalidParams, "Invalid JSON body: "+err.Error())
		return
	}
	if len(req.Segments) == 0 {
		adminFail(w, http.StatusBadRequest, storepb.InvalidParams, "")
		return
	}
	for _, name := range req.Segments {
		if !svc.hasDRAMSegment(name) {
			adminFail(w, http.StatusNotFound, storepb.SegmentNotFound, "")
			return
		}
	}
	for _, t := range req.TargetSegments {
		if slices.Contains(req.Segments, t) || !svc.hasDRAMSegment(t) {
			adminFail(w, http.StatusBadRequest, storepb.InvalidParams, "")
			return
		}
	}
	adminFail(w, http.StatusConflict, codeUnavailableInMode, "")
}

// jobID reads ?job_id=, Mooncake's "<uint64>-<uint64>".
func jobID(r *http.Request) (string, bool) {
	id := r.URL.Query().Get("job_id")
	hi, lo, ok := strings.Cut(id, "-")
	if !ok {
		return "", false
	}
	if _, err := strconv.ParseUint(hi, 10, 64); err != nil {
		return "", false
	}
	if _, err := strconv.ParseUint(lo, 10, 64); err != nil {
		return "", false
	}
	return id, true
}

// queryDrainJob and cancelDrainJob: no job exists (see above).
func queryDrainJob(_ *Service, w http.ResponseWriter, r *http.Request) {
	if _, ok := jobID(r); !ok {
		adminFail(w, http.StatusBadRequest, storepb.InvalidParams, "Missing or invalid job_id")
		return
	}
	adminFail(w, http.StatusNotFound, codeJobNotFound, "")
}

func cancelDrainJob(svc *Service, w http.ResponseWriter, r *http.Request) {
	queryDrainJob(svc, w, r)
}

// removeAll is POST /api/v1/remove_all: every readable object goes, those
// leased too with ?force=true or {"force":true}; counted as the RemoveAll
// RPC is, as Mooncake counts it.
func (s *Server) removeAll(svc *Service, w http.ResponseWriter, r *http.Request) {
	force := r.URL.Query().Get("force") == "true"
	var body struct {
		Force bool `json:"force"`
	}
	if json.NewDecoder(r.Body).Decode(&body) == nil && body.Force {
		force = true
	}
	rc := s.metrics.counters("RemoveAll")
	rc.requests.Add(1)
	n, err := svc.removeAll(r.Context(), force)
	if err != nil {
		rc.failures.Add(1)
		c := codeOf(err)
		adminFail(w, http.StatusInternalServerError, c, "")
		return
	}
	writeJSON(w, http.StatusOK, struct {
		Success bool `json:"success"`
		Removed int  `json:"removed_count"`
	}{true, n})
}
