package p2p

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/engine/metadata"
)

// DefaultMaxShardSize is the shard size Register uses when given zero, the
// default of Mooncake's P2P store.
const DefaultMaxShardSize = 64 << 20

// Config configures a Store; fields say what zero means.
type Config struct {
	// Metadata is the etcd cluster holding the objects: "host:port",
	// "etcd://h1:2379;h2:2379" or a comma-separated list. Required.
	Metadata string
	// LocalServerName names this node. It is passed to the engine the Store
	// creates (in P2PHANDSHAKE mode that engine's name becomes
	// "<host>:<rpc port>"). With Engine set it must be zero or that
	// engine's name. Either way the Store publishes Engine.Name(), the
	// name peers can open.
	LocalServerName string
	// Engine moves the bytes. Zero: the Store starts one from EngineConfig
	// and closes it on Close; a given engine stays the caller's.
	Engine *engine.Engine
	// EngineConfig configures the engine the Store starts when Engine is
	// nil. Its zero value is a P2PHANDSHAKE engine: the Store keeps its own
	// metadata in etcd and needs nothing more from the engine.
	EngineConfig engine.Config
	// Retries is the least number of attempts per shard in GetReplica; a
	// shard is tried at least once per source it has. Zero: 3.
	Retries int
	// Timeout bounds each metadata call and each attempt at a shard.
	// Zero: 30 s. The engine the Store starts gets at least this timeout;
	// a given Engine bounds each request by its own (Config.Timeout).
	Timeout time.Duration
	// Concurrency is the number of shards GetReplica fetches at once; of
	// those, it reads about Concurrency divided by the number of receivers
	// fetching (at least one) from the seeds (see the package doc). Zero: 4.
	Concurrency int
	// Logger receives structured logs. Zero: slog.Default().
	Logger *slog.Logger
}

// Validate names the first bad field.
func (c *Config) Validate() error {
	switch {
	case len(metadata.EtcdEndpoints(c.Metadata)) == 0:
		return fmt.Errorf("%w: config: Metadata %q names no etcd endpoint", ErrInvalidArgument, c.Metadata)
	case c.Retries < 0:
		return fmt.Errorf("%w: config: Retries %d", ErrInvalidArgument, c.Retries)
	case c.Timeout < 0:
		return fmt.Errorf("%w: config: Timeout %v", ErrInvalidArgument, c.Timeout)
	case c.Concurrency < 0 || c.Concurrency > 1024:
		return fmt.Errorf("%w: config: Concurrency %d (0..1024)", ErrInvalidArgument, c.Concurrency)
	case c.Engine != nil && c.LocalServerName != "" && c.LocalServerName != c.Engine.Name():
		return fmt.Errorf("%w: config: LocalServerName %q is not the engine's name %q",
			ErrInvalidArgument, c.LocalServerName, c.Engine.Name())
	case c.Engine == nil:
		if err := c.EngineConfig.Validate(); err != nil {
			return fmt.Errorf("%w: config: EngineConfig: %w", ErrInvalidArgument, err)
		}
	}
	return nil
}

func (c Config) withDefaults() Config {
	if c.Retries == 0 {
		c.Retries = 3
	}
	if c.Timeout == 0 {
		c.Timeout = 30 * time.Second
	}
	if c.Concurrency == 0 {
		c.Concurrency = 4
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.EngineConfig.LocalServerName == "" {
		c.EngineConfig.LocalServerName = c.LocalServerName
	}
	if c.EngineConfig.Logger == nil {
		c.EngineConfig.Logger = c.Logger
	}
	return c
}
