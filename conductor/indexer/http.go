package indexer

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"

	"github.com/vmihailenco/msgpack/v5"
)

// Routes mounts official Mooncake's Conductor indexer API on mux:
//
//   - POST /register (a Registration) -> {"status": "registered
//     successfully", "instance_id": ...}
//   - POST /unregister ({instance_id, tenant_id, dp_rank}) ->
//     {"status": "unregistered successfully", "removed_instances":
//     ["instance|tenant|rank"]}
//   - POST /query (a Query with token_ids) and /query_by_hash (with
//     seq_hashes, alias block_hash) -> {tenant: {instance:
//     {"longest_matched", "GPU", "CPU", "DISK", "DP": {rank: tokens}}}}
//   - GET /services: every registration with its subscription's state.
//
// Bodies are JSON, or msgpack when the request's Content-Type is
// application/msgpack (the answer then is too; token_ids may then also be
// a bin of little-endian int32s), as the official service accepts both.
// Errors are {"error": message} with 400 (malformed), 404 (unknown
// registration), 409 (taken) or 405.
func (x *Indexer) Routes(mux *http.ServeMux) {
	mux.HandleFunc("/register", x.post(x.handleRegister))
	mux.HandleFunc("/unregister", x.post(x.handleUnregister))
	mux.HandleFunc("/query", x.post(x.handleQuery))
	mux.HandleFunc("/query_by_hash", x.post(x.handleQuery))
	mux.HandleFunc("/services", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			writeError(w, false, http.StatusMethodNotAllowed, errors.New("GET only"))
			return
		}
		st := x.Stats()
		write(w, false, http.StatusOK, map[string]any{"count": len(st), "services": st})
	})
}

// maxBody bounds a request body: a 1M-token query fits.
const maxBody = 16 << 20

type handlerFunc func(body []byte, packed bool) (any, error)

func (x *Indexer) post(h handlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		packed := isMsgpack(r.Header.Get("Content-Type"))
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			writeError(w, packed, http.StatusMethodNotAllowed, errors.New("POST only"))
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
		if err != nil {
			writeError(w, packed, http.StatusBadRequest, err)
			return
		}
		if len(body) > maxBody {
			writeError(w, packed, http.StatusRequestEntityTooLarge, fmt.Errorf("body over %d bytes", maxBody))
			return
		}
		out, err := h(body, packed)
		if err != nil {
			code := http.StatusInternalServerError
			switch {
			case errors.Is(err, ErrInvalid):
				code = http.StatusBadRequest
			case errors.Is(err, ErrNotFound):
				code = http.StatusNotFound
			case errors.Is(err, ErrConflict):
				code = http.StatusConflict
			}
			writeError(w, packed, code, err)
			return
		}
		write(w, packed, http.StatusOK, out)
	}
}

func isMsgpack(ct string) bool {
	t, _, _ := mime.ParseMediaType(ct)
	return t == "application/msgpack" || t == "application/x-msgpack"
}

func decode(body []byte, packed bool, v any) error {
	var err error
	if packed {
		d := msgpack.NewDecoder(bytesReader(body))
		d.SetCustomStructTag("json")
		err = d.Decode(v)
	} else {
		err = json.Unmarshal(body, v)
	}
	if err != nil {
		return invalid("body: %v", err)
	}
	return nil
}

func write(w http.ResponseWriter, packed bool, code int, v any) {
	if packed {
		b, err := msgpack.Marshal(v)
		if err != nil {
			writeError(w, false, http.StatusInternalServerError, err)
			return
		}
		w.Header().Set("Content-Type", "application/msgpack")
		w.WriteHeader(code)
		w.Write(b)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, packed bool, code int, err error) {
	write(w, packed, code, map[string]string{"error": err.Error()})
}

func (x *Indexer) handleRegister(body []byte, packed bool) (any, error) {
	var r Registration
	if err := decode(body, packed, &r); err != nil {
		return nil, err
	}
	if err := x.Register(r); err != nil {
		return nil, err
	}
	return map[string]string{"status": "registered successfully", "instance_id": r.Instance}, nil
}

func (x *Indexer) handleUnregister(body []byte, packed bool) (any, error) {
	var r struct {
		Instance string `json:"instance_id"`
		Tenant   string `json:"tenant_id"`
		DPRank   int    `json:"dp_rank"`
	}
	if err := decode(body, packed, &r); err != nil {
		return nil, err
	}
	if r.Instance == "" {
		return nil, invalid("instance_id is required")
	}
	key, err := x.Unregister(r.Instance, r.Tenant, r.DPRank)
	if err != nil {
		return nil, err
	}
	return map[string]any{"status": "unregistered successfully", "removed_instances": []string{key}}, nil
}

// wireQuery is Query as it arrives: block_hash is seq_hashes' old name,
// and token_ids may be a msgpack bin of little-endian int32s.
type wireQuery struct {
	Model     string   `json:"model"`
	LoRA      string   `json:"lora_name"`
	Tokens    tokenIDs `json:"token_ids"`
	Hashes    []uint64 `json:"seq_hashes"`
	BlockHash []uint64 `json:"block_hash"`
	Tenant    string   `json:"tenant_id"`
	Instance  string   `json:"instance_id"`
	BlockSize int      `json:"block_size"`
	Salt      string   `json:"cache_salt"`
}

type tokenIDs []int

func (t *tokenIDs) DecodeMsgpack(d *msgpack.Decoder) error {
	v, err := d.DecodeInterface()
	if err != nil {
		return err
	}
	switch v := v.(type) {
	case nil:
		*t = nil
	case []byte:
		if len(v)%4 != 0 {
			return fmt.Errorf("token_ids: %d bytes, not int32s", len(v))
		}
		out := make([]int, len(v)/4)
		for i := range out {
			out[i] = int(int32(binary.LittleEndian.Uint32(v[4*i:])))
		}
		*t = out
	case []any:
		out := make([]int, len(v))
		for i, e := range v {
			switch n := e.(type) {
			case int64:
				out[i] = int(n)
			case uint64:
				out[i] = int(n)
			case int8, int16, int32, uint8, uint16, uint32:
				out[i] = int(toInt64(n))
			default:
				return fmt.Errorf("token_ids[%d]: %T", i, e)
			}
		}
		*t = out
	default:
		return fmt.Errorf("token_ids: %T", v)
	}
	return nil
}

func toInt64(v any) int64 {
	switch n := v.(type) {
	case int8:
		return int64(n)
	case int16:
		return int64(n)
	case int32:
		return int64(n)
	case uint8:
		return int64(n)
	case uint16:
		return int64(n)
	case uint32:
		return int64(n)
	}
	return 0
}

func (x *Indexer) handleQuery(body []byte, packed bool) (any, error) {
	var q wireQuery
	if err := decode(body, packed, &q); err != nil {
		return nil, err
	}
	qq := Query{Model: q.Model, LoRA: q.LoRA, Tokens: q.Tokens, Hashes: q.Hashes, Tenant: q.Tenant,
		Instance: q.Instance, BlockSize: q.BlockSize, Salt: q.Salt}
	if qq.Hashes == nil {
		qq.Hashes = q.BlockHash
	}
	if (qq.Tokens == nil) == (qq.Hashes == nil) {
		return nil, invalid("give token_ids (/query) or seq_hashes (/query_by_hash)")
	}
	for _, t := range qq.Tokens {
		if t < 0 {
			return nil, invalid("token_ids: negative token %d", t)
		}
	}
	ans, err := x.Query(qq)
	if err != nil {
		return nil, err
	}
	out := map[string]map[string]map[string]any{}
	for tenant, insts := range ans {
		out[tenant] = map[string]map[string]any{}
		for inst, h := range insts {
			out[tenant][inst] = h.jsonHits()
		}
	}
	return out, nil
}

func bytesReader(b []byte) *bytes.Reader { return bytes.NewReader(b) }
