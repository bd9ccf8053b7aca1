package indexer

import (
	"cmp"
	"slices"
	"strconv"
)

// Query asks how much of a prompt each engine instance has cached. Its
// JSON is official Mooncake's /query and /query_by_hash body.
type Query struct {
	Model string `json:"model"`
	LoRA  string `json:"lora_name,omitempty"`
	// Tokens are the prompt's token ids (/query); only full blocks count.
	Tokens []int `json:"token_ids,omitempty"`
	// Hashes are the blocks' ids (/query_by_hash), in order.
	Hashes []uint64 `json:"seq_hashes,omitempty"`
	// Tenant "" means "default"; Instance "" means every engine instance
	// of the scope.
	Tenant   string `json:"tenant_id,omitempty"`
	Instance string `json:"instance_id,omitempty"`
	// BlockSize is the tokens per block: required.
	BlockSize int `json:"block_size"`
	// Salt is the namespace salt the publishers registered
	// (additionalsalt).
	Salt string `json:"cache_salt,omitempty"`
}

// Hits is how much of a prompt one instance has, in tokens.
type Hits struct {
	// Longest is the longest leading run of blocks held on any medium
	// by any rank of the instance or by a pool of its scope.
	Longest int
	// Media is that run per medium (GPU, CPU, DISK and any other
	// published).
	Media map[string]int
	// DP is the run per data-parallel rank of the instance, on any of its
	// own media.
	DP map[int]int
}

// Answer is a query's result: tenant -> instance -> hits.
type Answer map[string]map[string]Hits

// Query answers q.
func (x *Indexer) Query(q Query) (Answer, error) {
	if q.BlockSize <= 0 {
		return nil, invalid("block_size %d: want > 0", q.BlockSize)
	}
	if q.Model == "" {
		return nil, invalid("model is required")
	}
	tenant := cmp.Or(q.Tenant, "default")
	sc := scope{tenant: tenant, model: q.Model, lora: q.LoRA, salt: q.Salt, blockSize: q.BlockSize}
	x.mu.RLock()
	defer x.mu.RUnlock()
	ans := Answer{tenant: {}}
	// The engines of the scope, each with its ranks' sources.
	ranks := map[string][]*source{}
	var first *source // whose scheme hashes a token query
	for _, s := range x.sources {
		if s.reg.scope() != sc {
			continue
		}
		if !s.pool && (q.Instance == "" || s.reg.Instance == q.Instance) {
			ranks[s.reg.Instance] = append(ranks[s.reg.Instance], s)
			if first == nil || first.pool || s.reg.key() < first.reg.key() {
				first = s
			}
		} else if s.pool && first == nil {
			first = s
		}
	}
	if len(ranks) == 0 {
		return ans, nil
	}
	hashes := q.Hashes
	if q.Tokens != nil {
		scheme, err := first.reg.scheme()
		if err != nil {
			return nil, err
		}
		hashes = scheme.Blocks(nil, q.Tokens)
	}
	b := x.scopes[sc]
	for inst, srcs := range ranks {
		ans[tenant][inst] = hits(b, inst, srcs, hashes, q.BlockSize)
	}
	return ans, nil
}

// hits scans hashes for one instance. x.mu is held.
func hits(b *blocks, inst string, ranks []*source, hashes []uint64, blockSize int) Hits {
	h := Hits{Media: map[string]int{}, DP: map[int]int{}}
	for _, m := range mediaNames {
		h.Media[m] = 0
	}
	slices.SortFunc(ranks, func(a, b *source) int { return a.reg.DPRank - b.reg.DPRank })
	// Runs still going, in blocks.
	anyOn := true
	mediaOn := media(0xffff)
	rankOn := make([]bool, len(ranks))
	for i := range rankOn {
		rankOn[i] = true
	}
	var perMedia [16]int
	rankRun := make([]int, len(ranks))
	longest := 0
	for _, k := range hashes {
		var all media
		var holders []*source
		if b != nil {
			holders = b.by[k]
		}
		for _, s := range holders {
			if s.pool || s.reg.Instance == inst {
				all |= s.held[k]
			}
		}
		if anyOn && all != 0 {
			longest++
		} else {
			anyOn = false
		}
		mediaOn &= all
		for bit := 0; bit < 16; bit++ {
			if mediaOn&(1<<bit) != 0 {
				perMedia[bit]++
			}
		}
		still := false
		for i, r := range ranks {
			if rankOn[i] && r.held[k] != 0 {
				rankRun[i]++
				still = true
			} else {
				rankOn[i] = false
			}
		}
		if !anyOn && mediaOn == 0 && !still {
			break
		}
	}
	h.Longest = longest * blockSize
	for name, bit := range mediaBits {
		h.Media[name] = perMedia[bitIndex(bit)] * blockSize
	}
	for i, r := range ranks {
		h.DP[r.reg.DPRank] = rankRun[i] * blockSize
	}
	return h
}

func bitIndex(m media) int {
	for i := 0; i < 16; i++ {
		if m == 1<<i {
			return i
		}
	}
	return 0
}

// jsonHits is Hits as official Mooncake writes it: {"longest_matched": n,
// "GPU": n, "CPU": n, "DISK": n, "DP": {"0": n}}.
func (h Hits) jsonHits() map[string]any {
	out := map[string]any{"longest_matched": h.Longest}
	for m, n := range h.Media {
		out[m] = n
	}
	dp := map[string]int{}
	for r, n := range h.DP {
		dp[strconv.Itoa(r)] = n
	}
	out["DP"] = dp
	return out
}
