package router

import (
	"cmp"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mooncake-go/mooncake/conductor"
	"github.com/mooncake-go/mooncake/conductor/blockhash"
	"github.com/mooncake-go/mooncake/conductor/indexer"
)

// Defaults for the zero values of Config.
const (
	DefaultPrefillTimeout   = 60 * time.Second
	DefaultDecodeTimeout    = 10 * time.Minute
	DefaultIdleTimeout      = 60 * time.Second
	DefaultMaxBodyBytes     = 32 << 20
	DefaultProbeTimeout     = time.Second
	DefaultProbeInterval    = 2 * time.Second
	defaultMaxResponseBytes = 64 << 20
	defaultMaxEventBytes    = 16 << 20
)

// Roles an Instance takes, as written in the registration API and flags.
const (
	RolePrefill = "prefill"
	RoleDecode  = "decode"
)

// Config configures a Router.
type Config struct {
	// Scheduler picks the prefill and decode instance of every request and
	// keeps their load; conductor.New builds the real one. Required.
	Scheduler Scheduler
	// Instances are registered at New, in order, as if POSTed to
	// /v1/instances.
	Instances []Instance
	// PrefillTimeout bounds each call whose answer should come quickly: a
	// /tokenize and the prefill request (max_tokens=1). Zero means
	// DefaultPrefillTimeout.
	PrefillTimeout time.Duration
	// DecodeTimeout bounds the whole decode request, streamed or not. Zero
	// means DefaultDecodeTimeout.
	DecodeTimeout time.Duration
	// IdleTimeout bounds the silence on a decode stream: before its headers
	// and between two events. Zero means DefaultIdleTimeout.
	IdleTimeout time.Duration
	// MaxBodyBytes bounds a client's request body; a larger one is answered
	// 413. Zero means DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// ProbeTimeout bounds each probe of an instance (its engine's GET
	// /health) that the router's /health makes to tell which instances are
	// reachable. Zero means DefaultProbeTimeout.
	ProbeTimeout time.Duration
	// ProbeInterval is how long a probe's outcome stands: /health probes
	// an instance again only once it is older, so that polling /health
	// costs the engines little. Zero means DefaultProbeInterval.
	ProbeInterval time.Duration
	// Client sends the requests to engines. Nil: the router's own, with no
	// overall timeout (the router sets deadlines per call) and idle
	// connections closed by Close.
	Client *http.Client
	// Registry receives the router's metrics and is what /metrics serves.
	// Nil: a registry of the router's own.
	Registry *prometheus.Registry
	// Logger logs engine failures. Nil means slog.Default().
	Logger *slog.Logger

	// BlockHash, BlockSize and HashSeed name the blocks of a prompt in the
	// prefix index (blockhash.Parse): they must be how the engines hash
	// their blocks when the engines' KV events feed the index
	// (Instance.KVEvents), e.g. "vllm:sha256" and vLLM's block size. Zero:
	// "fnv" over conductor.BlockTokens, the naming of the traces and of
	// the store keys the conductor reads.
	BlockHash string
	BlockSize int
	HashSeed  string
	// LoRAModules maps the LoRA adapters the engines serve, by the name
	// a request gives as its "model", to the path each was loaded from
	// (vLLM's --lora-modules name=path): vLLM hashes both into every
	// block of a request that runs with the adapter, so the index names
	// such a request's blocks only when the router knows the path. A
	// request's "cache_salt" needs no configuration. Both matter only
	// with a vLLM BlockHash.
	LoRAModules map[string]string
	// Indexer, if set, follows the KV events of the instances that
	// publish them (Instance.KVEvents), and its API (official Mooncake's
	// indexer: /register, /unregister, /query, /query_by_hash, /services)
	// is served beside the router's. Its Mirror should be the Scheduler,
	// so that the engines' real cache contents steer the routing.
	Indexer *indexer.Indexer
	// Model is the served model's name: the scope the instances' KV
	// events are registered under in the Indexer.
	Model string
	// Token, when set, is the bearer token ("Authorization: Bearer
	// <token>") every request must carry but those to the OpenAI routes
	// (/v1/completions, /v1/chat/completions, /v1/models), /health and
	// /metrics: the instance registration API, the index query and the
	// Indexer's API answer 401 without it. Zero: none, as Mooncake's.
	Token string
	// TokenOnInference requires the Token on the OpenAI routes too.
	TokenOnInference bool
}

// Validate reports the first invalid field of c.
func (c Config) Validate() error {
	if c.Scheduler == nil {
		return fmt.Errorf("%w: Config.Scheduler is nil", ErrInvalidConfig)
	}
	durs := []struct {
		name string
		d    time.Duration
	}{{"PrefillTimeout", c.PrefillTimeout}, {"DecodeTimeout", c.DecodeTimeout}, {"IdleTimeout", c.IdleTimeout},
		{"ProbeTimeout", c.ProbeTimeout}, {"ProbeInterval", c.ProbeInterval}}
	for _, d := range durs {
		if d.d < 0 {
			return fmt.Errorf("%w: Config.%s is negative (%v)", ErrInvalidConfig, d.name, d.d)
		}
	}
	if c.MaxBodyBytes < 0 {
		return fmt.Errorf("%w: Config.MaxBodyBytes is negative (%d)", ErrInvalidConfig, c.MaxBodyBytes)
	}
	if _, err := c.scheme(); err != nil {
		return fmt.Errorf("%w: Config.BlockHash: %w", ErrInvalidConfig, err)
	}
	seen := map[string]bool{}
	for i, in := range c.Instances {
		if err := in.Validate(); err != nil {
			return fmt.Errorf("%w: Config.Instances[%d]: %w", ErrInvalidConfig, i, err)
		}
		if seen[in.ID] {
			return fmt.Errorf("%w: Config.Instances[%d]: %w: %q", ErrInvalidConfig, i, ErrDuplicateInstance, in.ID)
		}
		seen[in.ID] = true
	}
	return nil
}

// scheme is the block naming c asks for.
func (c Config) scheme() (blockhash.Scheme, error) {
	spec := cmp.Or(c.BlockHash, "fnv")
	size := c.BlockSize
	if size == 0 {
		if spec != "fnv" {
			return nil, fmt.Errorf("%s needs the engines' block size", spec)
		}
		size = conductor.BlockTokens
	}
	return blockhash.Parse(spec, size, c.HashSeed)
}

// hashProfile describes c's block naming to the indexer; nil for "fnv",
// which no engine publishes.
func (c Config) hashProfile() *indexer.HashProfile {
	spec := cmp.Or(c.BlockHash, "fnv")
	switch {
	case spec == "mooncake":
		return &indexer.HashProfile{Strategy: "xxh3", Seed: c.HashSeed}
	case spec == "vllm":
		return &indexer.HashProfile{Strategy: "vllm_v1", Algorithm: "sha256", Seed: c.HashSeed}
	case strings.HasPrefix(spec, "vllm:"):
		return &indexer.HashProfile{Strategy: "vllm_v1", Algorithm: strings.TrimPrefix(spec, "vllm:"), Seed: c.HashSeed}
	}
	return nil
}

func (c Config) withDefaults() Config {
	c.PrefillTimeout = cmp.Or(c.PrefillTimeout, DefaultPrefillTimeout)
	c.DecodeTimeout = cmp.Or(c.DecodeTimeout, DefaultDecodeTimeout)
	c.IdleTimeout = cmp.Or(c.IdleTimeout, DefaultIdleTimeout)
	c.MaxBodyBytes = cmp.Or(c.MaxBodyBytes, DefaultMaxBodyBytes)
	c.ProbeTimeout = cmp.Or(c.ProbeTimeout, DefaultProbeTimeout)
	c.ProbeInterval = cmp.Or(c.ProbeInterval, DefaultProbeInterval)
	c.Logger = cmp.Or(c.Logger, slog.Default())
	return c
}

// Instance is an inference engine the router sends requests to: a vLLM
// (or compatible) OpenAI server started with a KV connector.
type Instance struct {
	// ID names the instance in the scheduler, the index and the API.
	ID string `json:"id"`
	// Role is RolePrefill or RoleDecode.
	Role string `json:"role"`
	// URL is the engine's root, http://host:port: the router appends
	// /v1/completions, /v1/chat/completions and /tokenize.
	URL string `json:"url"`
	// CacheBlocks is the size of a prefill instance's local prefix cache in
	// blocks of conductor.BlockTokens tokens. Zero: no local cache.
	CacheBlocks int `json:"cache_blocks,omitempty"`
	// EngineID and Bootstrap describe a prefill instance to decode instances
	// when its answer carries no kv_transfer_params (vLLM's
	// MooncakeConnector): the decode request then gets remote_engine_id
	// EngineID (vLLM's kv_transfer_config engine_id) and
	// remote_bootstrap_addr Bootstrap (http://host:8998, the prefill's
	// bootstrap server). Optional.
	EngineID  string `json:"engine_id,omitempty"`
	Bootstrap string `json:"bootstrap_addr,omitempty"`
	// KVEvents is the engine's KV event publisher (vLLM's
	// --kv-events-config endpoint, tcp://host:port) and KVReplay its
	// replay socket (optional): the router's Indexer follows them, so the
	// prefix index holds what the engine's cache really holds. A prefill
	// instance with KVEvents and no CacheBlocks gets an index bound of
	// DefaultEventCacheBlocks: its events, not the bound, say what it
	// keeps.
	KVEvents string `json:"kv_events,omitempty"`
	KVReplay string `json:"kv_replay,omitempty"`
}

// DefaultEventCacheBlocks bounds the index's entries for a prefill
// instance whose KV events feed it and that set no CacheBlocks.
const DefaultEventCacheBlocks = 1 << 20

// Validate reports what is wrong with in, wrapping ErrInvalidInstance.
func (in Instance) Validate() error {
	if in.ID == "" || strings.ContainsAny(in.ID, "/ \t\n") {
		return fmt.Errorf("%w: id %q must be non-empty, without '/' or spaces", ErrInvalidInstance, in.ID)
	}
	if in.ID == conductor.StoreHolder {
		return fmt.Errorf("%w: id %q names the store in the prefix index", ErrInvalidInstance, in.ID)
	}
	if _, err := in.role(); err != nil {
		return err
	}
	if err := checkRoot(in.URL); err != nil {
		return fmt.Errorf("%w: %s: url: %v", ErrInvalidInstance, in.ID, err)
	}
	if in.CacheBlocks < 0 {
		return fmt.Errorf("%w: %s: cache_blocks is negative (%d)", ErrInvalidInstance, in.ID, in.CacheBlocks)
	}
	if in.KVReplay != "" && in.KVEvents == "" {
		return fmt.Errorf("%w: %s: kv_replay without kv_events", ErrInvalidInstance, in.ID)
	}
	if in.Bootstrap != "" {
		if err := checkRoot(in.Bootstrap); err != nil {
			return fmt.Errorf("%w: %s: bootstrap_addr: %v", ErrInvalidInstance, in.ID, err)
		}
	}
	return nil
}

func (in Instance) role() (conductor.Role, error) {
	switch in.Role {
	case RolePrefill:
		return conductor.Prefill, nil
	case RoleDecode:
		return conductor.Decode, nil
	}
	return 0, fmt.Errorf("%w: %s: role %q is neither %q nor %q", ErrInvalidInstance, in.ID, in.Role, RolePrefill, RoleDecode)
}

// checkRoot accepts http(s)://host:port with no path: the router owns the
// paths, and a root ending in /v1 would double it.
func checkRoot(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return err
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("%q: want http://host:port", raw)
	}
	if u.Host == "" {
		return fmt.Errorf("%q: no host", raw)
	}
	if u.Path != "" && u.Path != "/" || u.RawQuery != "" {
		return fmt.Errorf("%q: want the engine's root (http://host:port), not a path", raw)
	}
	return nil
}

// ParseInstance reads the command-line form of an instance of role:
//
//	id=url[,cache_blocks=N][,engine_id=E][,bootstrap_addr=URL][,kv_events=tcp://H:P][,kv_replay=tcp://H:P]
//
// for example p0=http://10.0.0.1:8100,cache_blocks=4096.
func ParseInstance(role, spec string) (Instance, error) {
	in := Instance{Role: role}
	head, rest, _ := strings.Cut(spec, ",")
	id, u, ok := strings.Cut(head, "=")
	if !ok {
		return in, fmt.Errorf("%w: %q: want id=url[,cache_blocks=N]", ErrInvalidInstance, spec)
	}
	in.ID, in.URL = strings.TrimSpace(id), strings.TrimRight(strings.TrimSpace(u), "/")
	for rest != "" {
		var kv string
		kv, rest, _ = strings.Cut(rest, ",")
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return in, fmt.Errorf("%w: %q: option %q is not key=value", ErrInvalidInstance, spec, kv)
		}
		switch strings.TrimSpace(k) {
		case "cache_blocks":
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				return in, fmt.Errorf("%w: %q: cache_blocks: %v", ErrInvalidInstance, spec, err)
			}
			in.CacheBlocks = n
		case "engine_id":
			in.EngineID = strings.TrimSpace(v)
		case "bootstrap_addr":
			in.Bootstrap = strings.TrimRight(strings.TrimSpace(v), "/")
		case "kv_events":
			in.KVEvents = strings.TrimSpace(v)
		case "kv_replay":
			in.KVReplay = strings.TrimSpace(v)
		default:
			return in, fmt.Errorf("%w: %q: unknown option %q (cache_blocks, engine_id, bootstrap_addr, kv_events, kv_replay)", ErrInvalidInstance, spec, k)
		}
	}
	return in, in.Validate()
}
