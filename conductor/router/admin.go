package router

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"

	"github.com/google/uuid"

	"github.com/mooncake-go/mooncake/conductor/blockhash"
)

// handleInstances serves GET (list) and POST (register) /v1/instances.
func (r *Router) handleInstances(w http.ResponseWriter, req *http.Request) {
	switch req.Method {
	case http.MethodGet:
		writeJSON(w, http.StatusOK, map[string]any{"instances": r.Instances()})
	case http.MethodPost:
		var in Instance
		if e := decodeBody(w, req, r.cfg.MaxBodyBytes, &in); e != nil {
			writeError(w, e)
			return
		}
		if err := r.Register(in); err != nil {
			writeError(w, errorf(statusOf(err), "%v", err))
			return
		}
		got, _ := r.instance(in.ID)
		writeJSON(w, http.StatusCreated, got)
	default:
		w.Header().Set("Allow", "GET, POST")
		writeError(w, errorf(http.StatusMethodNotAllowed, "%s /v1/instances: use GET or POST", req.Method))
	}
}

// handleInstance serves GET and DELETE /v1/instances/{id}.
func (r *Router) handleInstance(w http.ResponseWriter, req *http.Request) {
	id := req.PathValue("id")
	switch req.Method {
	case http.MethodGet:
		in, ok := r.instance(id)
		if !ok {
			writeError(w, errorf(http.StatusNotFound, "%v: %q", ErrUnknownInstance, id))
			return
		}
		writeJSON(w, http.StatusOK, in)
	case http.MethodDelete:
		in, _ := r.instance(id)
		if err := r.Remove(id); err != nil {
			writeError(w, errorf(statusOf(err), "%v", err))
			return
		}
		writeJSON(w, http.StatusOK, in)
	default:
		w.Header().Set("Allow", "GET, DELETE")
		writeError(w, errorf(http.StatusMethodNotAllowed, "%s /v1/instances/%s: use GET or DELETE", req.Method, id))
	}
}

// indexQuery is the body of POST /v1/index/query: a prompt as token ids
// (hashed into blocks as the scheduler does, with the request's
// cache_salt and the LoRA adapter its model names, as a completion's)
// or the block hashes themselves (the traces' hash_ids). Exactly one of
// them.
type indexQuery struct {
	Tokens    []int    `json:"tokens"`
	Hashes    []uint64 `json:"hashes"`
	CacheSalt string   `json:"cache_salt"`
	Model     string   `json:"model"`
}

// indexAnswer is the answer of POST /v1/index/query: the longest cached
// prefix of the query per holder, in blocks (of Config.BlockSize tokens).
type indexAnswer struct {
	Blocks       int            `json:"blocks"`
	PrefixBlocks map[string]int `json:"prefix_blocks"`
}

func (r *Router) handleIndexQuery(w http.ResponseWriter, req *http.Request) {
	var q indexQuery
	if e := decodeBody(w, req, r.cfg.MaxBodyBytes, &q); e != nil {
		writeError(w, e)
		return
	}
	if (q.Tokens == nil) == (q.Hashes == nil) {
		writeError(w, errorf(http.StatusBadRequest, "give exactly one of tokens and hashes"))
		return
	}
	blocks := q.Hashes
	if q.Tokens != nil {
		x := blockhash.Extra{CacheSalt: q.CacheSalt}
		if path, ok := r.cfg.LoRAModules[q.Model]; ok {
			x.LoRAName, x.LoRAPath = q.Model, path
		}
		if err := x.Validate(); err != nil {
			writeError(w, errorf(http.StatusBadRequest, "%v", err))
			return
		}
		blocks = blockhash.BlocksFor(r.scheme, nil, q.Tokens, x)
	}
	prefix := r.Longest(blocks)
	if prefix == nil {
		prefix = map[string]int{}
	}
	writeJSON(w, http.StatusOK, indexAnswer{Blocks: len(blocks), PrefixBlocks: prefix})
}

// handleModels answers GET /v1/models from one engine: OpenAI clients and
// benchmark tools ask it for the model name before anything else.
func (r *Router) handleModels(w http.ResponseWriter, req *http.Request) {
	list := r.Instances()
	if len(list) == 0 {
		writeError(w, errorf(http.StatusServiceUnavailable, "no instance registered"))
		return
	}
	var last *apiError
	for _, in := range list {
		body, status, e := r.call(req, uuid.NewString(), in, phaseModels, http.MethodGet, "/v1/models", nil)
		if e == nil {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			_, _ = w.Write(body)
			return
		}
		if last = e; e.status < 500 {
			break
		}
	}
	writeError(w, last)
}

// decodeBody reads a JSON body of at most limit bytes into v.
func decodeBody(w http.ResponseWriter, req *http.Request, limit int64, v any) *apiError {
	body, e := readBody(w, req, limit)
	if e != nil {
		return e
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return errorf(http.StatusBadRequest, "malformed JSON body: %v", err)
	}
	return nil
}

func readBody(w http.ResponseWriter, req *http.Request, limit int64) ([]byte, *apiError) {
	body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, limit))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return nil, errorf(http.StatusRequestEntityTooLarge, "request body over %d bytes", limit)
		}
		return nil, errorf(http.StatusBadRequest, "reading the request body: %v", err)
	}
	return body, nil
}
