package router

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
)

// Errors of the registration API. The HTTP layer maps them to status codes:
// ErrUnknownInstance to 404, ErrDuplicateInstance to 409, ErrInvalidInstance
// to 400.
var (
	ErrUnknownInstance   = errors.New("router: unknown instance")
	ErrDuplicateInstance = errors.New("router: instance already registered")
	ErrInvalidInstance   = errors.New("router: invalid instance")
)

// ErrInvalidConfig is wrapped by the errors of Config.Validate (and so of
// New), which name the field; an instance's own error is wrapped too.
var ErrInvalidConfig = errors.New("router: invalid config")

// Outcomes label every answered request in the requests_total metric; each
// maps to one family of HTTP statuses.
const (
	outcomeOK          = "ok"           // 200
	outcomeBadRequest  = "bad_request"  // 4xx other than 429: the request's fault
	outcomeRejected    = "rejected"     // 429: admission control said no
	outcomeEngineError = "engine_error" // 502: an engine failed or answered 5xx
	outcomeTimeout     = "timeout"      // 504: an engine did not answer in time
	outcomeUnavailable = "unavailable"  // 503: nothing to route to
	outcomeCanceled    = "canceled"     // the client went away first
)

// statusClientClosed is what the router records (never sends) when the
// client disconnected before the answer: nginx's 499 convention.
const statusClientClosed = 499

// apiError is an answer the router gives instead of an engine's: an HTTP
// status, the outcome it counts as, and a message for the client.
type apiError struct {
	status  int
	outcome string
	msg     string
	param   string // the request field at fault, if one is
}

func (e *apiError) Error() string { return fmt.Sprintf("%d %s", e.status, e.msg) }

func errorf(status int, format string, args ...any) *apiError {
	return &apiError{status: status, outcome: outcomeFor(status), msg: fmt.Sprintf(format, args...)}
}

// badParam is a 400 naming the request field at fault.
func badParam(param, format string, args ...any) *apiError {
	e := errorf(http.StatusBadRequest, format, args...)
	e.param = param
	return e
}

// outcomeFor is the outcome label of a status the router answers with.
func outcomeFor(status int) string {
	switch {
	case status < 400:
		return outcomeOK
	case status == http.StatusTooManyRequests:
		return outcomeRejected
	case status == statusClientClosed:
		return outcomeCanceled
	case status < 500:
		return outcomeBadRequest
	case status == http.StatusServiceUnavailable:
		return outcomeUnavailable
	case status == http.StatusGatewayTimeout:
		return outcomeTimeout
	default:
		return outcomeEngineError
	}
}

// errorBody is an OpenAI-style error, the shape vLLM answers with too, so
// OpenAI clients raise it as an APIError carrying the message.
type errorBody struct {
	Error errorDetail `json:"error"`
}

type errorDetail struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

func newErrorBody(status int, msg, param string) errorBody {
	typ := "invalid_request_error"
	switch {
	case status == http.StatusTooManyRequests:
		typ = "rate_limit_error"
	case status >= 500:
		typ = "server_error"
	}
	b := errorBody{Error: errorDetail{Message: msg, Type: typ, Code: status}}
	if param != "" {
		b.Error.Param = &param
	}
	return b
}

// writeError answers with e as an OpenAI error body. A client that is gone
// gets nothing: there is no one to read it.
func writeError(w http.ResponseWriter, e *apiError) {
	if e.status == statusClientClosed {
		return
	}
	writeJSON(w, e.status, newErrorBody(e.status, e.msg, e.param))
}

// sseError is the event a stream ends with when the engine fails after the
// router already answered 200: the status can no longer change, so the
// error travels in the stream, as vLLM reports errors inside its streams.
func sseError(e *apiError) []byte {
	b, _ := json.Marshal(newErrorBody(e.status, e.msg, e.param))
	return append(append([]byte("data: "), b...), "\n\n"...)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// engineMessage pulls a human message out of an engine's error body:
// OpenAI's {"error":{"message"}}, vLLM's older {"message"} or FastAPI's
// {"detail"}; otherwise the body itself, cut short.
func engineMessage(body []byte) string {
	var v struct {
		Error   json.RawMessage `json:"error"`
		Message string          `json:"message"`
		Detail  json.RawMessage `json:"detail"`
	}
	if json.Unmarshal(body, &v) == nil {
		var nested struct {
			Message string `json:"message"`
		}
		if len(v.Error) > 0 && json.Unmarshal(v.Error, &nested) == nil && nested.Message != "" {
			return nested.Message
		}
		var s string
		if len(v.Error) > 0 && json.Unmarshal(v.Error, &s) == nil && s != "" {
			return s
		}
		if v.Message != "" {
			return v.Message
		}
		if len(v.Detail) > 0 {
			if json.Unmarshal(v.Detail, &s) == nil {
				return s
			}
			return string(v.Detail)
		}
	}
	const max = 512
	if len(body) > max {
		return string(body[:max]) + "..."
	}
	return string(body)
}
