package master

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"

	"github.com/mooncake-go/mooncake/store/storepb"
)

// The /api/v1 endpoints of Mooncake's admin server: segment status, drain
// jobs (admin_drain.go) and remove_all. Their bodies are JSON, errors
// Mooncake's {"success":false,"error_code":N,"error_message":"NAME"}.

// Error codes of Mooncake's that only the admin server uses here.
const (
	codeJobNotFound storepb.Code = -1402
)

var adminCodeNames = map[storepb.Code]string{codeJobNotFound: "JOB_NOT_FOUND"}

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

// segmentOK is Mooncake's status of a segment not drained.
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
	st, ok := svc.segmentStatus(name)
	if !ok {
		adminFail(w, http.StatusNotFound, storepb.SegmentNotFound, "")
		return
	}
	writeJSON(w, http.StatusOK, segmentStatusBody{Success: true, Segment: name, Status: st, StatusName: segStatusNames[st]})
}

// drainRequest is the body of POST /api/v1/drain_jobs.
type drainRequest struct {
	Segments       []string `json:"segments"`
	TargetSegments []string `json:"target_segments"`
	MaxConcurrency uint32   `json:"max_concurrency"`
}

// jobAnswer is Mooncake's answer to a drain job's creation or cancel.
type jobAnswer struct {
	Success bool   `json:"success"`
	JobID   string `json:"job_id"`
	Status  string `json:"status"`
	Code    int32  `json:"error_code"`
	Message string `json:"error_message"`
}

// createDrainJob starts a drain of the body's segments.
func createDrainJob(svc *Service, w http.ResponseWriter, r *http.Request) {
	var req drainRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		adminFail(w, http.StatusBadRequest, storepb.InvalidParams, "Invalid JSON body: "+err.Error())
		return
	}
	id, err := svc.startDrain(r.Context(), req.Segments, req.TargetSegments, int(req.MaxConcurrency))
	switch {
	case errors.Is(err, errDrainNoSegment):
		adminFail(w, http.StatusNotFound, storepb.SegmentNotFound, "")
	case id != "" && err != nil:
		// The job runs here, but a new leader may not know it.
		adminFail(w, http.StatusInternalServerError, codeOf(err), "drain job "+id+" created, its record not durable: "+err.Error())
	case err != nil:
		adminFail(w, http.StatusBadRequest, storepb.InvalidParams, "")
	default:
		writeJSON(w, http.StatusOK, jobAnswer{Success: true, JobID: id, Status: "CREATED"})
	}
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

func queryDrainJob(svc *Service, w http.ResponseWriter, r *http.Request) {
	id, ok := jobID(r)
	if !ok {
		adminFail(w, http.StatusBadRequest, storepb.InvalidParams, "Missing or invalid job_id")
		return
	}
	v := svc.drainJobView(id)
	if v == nil {
		adminFail(w, http.StatusNotFound, codeJobNotFound, "")
		return
	}
	writeJSON(w, http.StatusOK, v)
}

// cancelDrainJob cancels a job; one that ended stays as it ended, and the
// answer gives its status.
func cancelDrainJob(svc *Service, w http.ResponseWriter, r *http.Request) {
	id, ok := jobID(r)
	if !ok {
		adminFail(w, http.StatusBadRequest, storepb.InvalidParams, "Missing or invalid job_id")
		return
	}
	status, err := svc.cancelDrain(r.Context(), id)
	switch {
	case status == "":
		adminFail(w, http.StatusNotFound, codeJobNotFound, "")
	case err != nil:
		adminFail(w, http.StatusInternalServerError, codeOf(err), "drain job "+id+" "+status+", its record not durable: "+err.Error())
	default:
		writeJSON(w, http.StatusOK, jobAnswer{Success: true, JobID: id, Status: status})
	}
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
