package client

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/engine/metadata"
	"github.com/mooncake-go/mooncake/internal/secure"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// Defaults of Config, as Mooncake's client where it has one.
const (
	DefaultSegmentSize     = 512 << 20
	DefaultLocalBufferSize = 128 << 20
	DefaultRPCTimeout      = 30 * time.Second // MC_RPC_TIMEOUT_MS
	DefaultPingInterval    = time.Second
	DefaultClusterID       = "mooncake_cluster" // MC_STORE_CLUSTER_ID
)

// Config configures a Client. The zero value of every field but Master
// means the default it documents.
type Config struct {
	// Master is where the master listens: "host:port" for one master, or
	// "etcd://h1:2379;h2:2379" to follow the leader of several (HA).
	Master string
	// ClusterID names the HA cluster in etcd. Zero: MC_STORE_CLUSTER_ID,
	// else "mooncake_cluster".
	ClusterID string
	// Engine moves the bytes. Nil: the client starts one from EngineConfig
	// and closes it on Close.
	Engine *engine.Engine
	// EngineConfig configures the engine the client starts when Engine is
	// nil; its zero fields take the engine's defaults (see engine.Config).
	EngineConfig engine.Config
	// SegmentSize is how many bytes of DRAM this client contributes to the
	// pool (Mooncake's global_segment_size). Zero: 512 MiB; NoSegment for a
	// client that only reads and writes.
	SegmentSize int64
	// LocalBufferSize is the registered staging memory for values that live
	// in Go memory (Put, Get). Zero: 128 MiB.
	LocalBufferSize int64
	// ID identifies the client to the master. Zero: a random UUID.
	ID string
	// RPCTimeout bounds each call to the master, retries after a failover
	// included. Zero: 30 s.
	RPCTimeout time.Duration
	// MasterGRPC sends every call to the master over gRPC. Zero: unary
	// calls go as frames on the same port (internal/framerpc), inside TLS
	// with MasterTLS, about half gRPC's latency for a small call, where the
	// master answers them; gRPC otherwise.
	MasterGRPC bool
	// PingInterval is the heartbeat period; the master forgets a client
	// silent for its client TTL (10 s). Zero: 1 s.
	PingInterval time.Duration
	// Registerer receives the client's metrics (Mooncake's client metric
	// names). Zero: they are counted but not exported.
	Registerer prometheus.Registerer
	// NoPrefault leaves the segment's pages to be faulted in by the first
	// puts that touch them, instead of backing them all at New.
	NoPrefault bool
	// LeaseCache is how many replica lists the client keeps for the
	// leases the master granted with them, so that reads within a lease
	// skip the lookup (see Get). Zero: 65536; NoLeaseCache for none.
	LeaseCache int
	// NoChecksum skips the CRC-32C of values: none is computed on put, and
	// reads of objects that carry one do not verify it.
	NoChecksum bool
	// Replicate is the default replication of puts without their own.
	Replicate ReplicateConfig
	// ReservePuts makes puts write into space reserved on the master
	// while the puts before them were written, and commit it with one
	// round trip (one journal wait under HA) instead of two: for clients
	// that put batch after batch of values of one length (put_slots.go).
	// The client then holds up to 64 MiB of the pool reserved (counted as
	// allocated, never evicted) for as long as it puts, gives slots back
	// once they are too old to use (5 s, at the next ping) and all of them
	// at Close. A master that restarts without a journal knows none of
	// the slots; the client drops them at its next ping, and the master
	// holds the segments mounted again meanwhile (its RemountHold, 10 s
	// by default, twice a slot's life), which bounds the window in which
	// a slot could reach space it gave again (docs/tiers-restarts.md).
	// Zero: values of at most 64 KiB still get slots (see NoAutoSlots);
	// others start on the master when they are put.
	ReservePuts bool
	// NoAutoSlots turns off the slots a client without ReservePuts takes
	// for small values: values of at most 64 KiB, from its second put
	// (or batch put) of a length within 5 s of the one before, about half
	// as many as it put of that length in the last 5 s, with at most
	// 4 MiB of values reserved (times their replicas), and no more per
	// reserve than 1/64 of the pool. Zero: small
	// values put again and again commit with one round trip, unless
	// MC_STORE_AUTO_SLOTS is 0 or false (for clients through the C ABI
	// and Python).
	NoAutoSlots bool
	// ReportExisting makes a put (Put, PutFrom, the batch puts and puts of
	// parts; not an upsert) of a key that exists fail with
	// ObjectAlreadyExists, the value stored left as it is. Zero: such a
	// put succeeds without writing, as Mooncake's put does.
	ReportExisting bool
	// SSDDir, when set, gives the client an SSD tier of SSDSize bytes: a
	// file there that objects evicted from DRAM spill to and are promoted
	// back from on a hit. Where the file cannot be allocated the client
	// runs without a tier and logs why.
	SSDDir  string
	SSDSize int64
	// MasterTLS is how the client dials the master over TLS: its CAFile
	// verifies the master, and its certificate is presented to a master
	// that requires one (mutual TLS). Zero: plaintext, as Mooncake's.
	MasterTLS secure.TLS
	// Token is the bearer token presented on every call to the master
	// (master.ServerConfig.Token). Zero: none.
	Token string
	// EtcdTLS is how the client dials etcd over TLS to find the leader
	// (an etcd:// Master). Zero: plaintext.
	EtcdTLS secure.TLS
	// TenantID is the tenant whose objects the client puts and sees
	// (Mooncake's tenant_id): two tenants' objects never mix, even under
	// the same key, and the master holds each tenant to its quota. It is
	// sent with every call to the master. Zero: MOONCAKE_TENANT_ID, else
	// "default", the tenant of clients that name none.
	TenantID string
}

// NoSegment as Config.SegmentSize: the client contributes no memory.
const NoSegment = -1

// NoLeaseCache as Config.LeaseCache: every read asks the master.
const NoLeaseCache = -1

// Validate reports the first field out of range, by name.
func (c *Config) Validate() error {
	switch {
	case c.Master == "":
		return fmt.Errorf("client: Config.Master is empty")
	case strings.HasPrefix(c.Master, "etcd://") && len(metadata.EtcdEndpoints(c.Master)) == 0:
		return fmt.Errorf("client: Config.Master %q names no etcd endpoint", c.Master)
	case c.SegmentSize < 0 && c.SegmentSize != NoSegment:
		return fmt.Errorf("client: Config.SegmentSize %d is negative", c.SegmentSize)
	case c.LocalBufferSize < 0:
		return fmt.Errorf("client: Config.LocalBufferSize %d is negative", c.LocalBufferSize)
	case c.RPCTimeout < 0:
		return fmt.Errorf("client: Config.RPCTimeout %v is negative", c.RPCTimeout)
	case c.SSDDir != "" && c.SSDSize <= 0:
		return fmt.Errorf("client: Config.SSDSize %d must be positive with an SSDDir", c.SSDSize)
	case c.PingInterval < 0:
		return fmt.Errorf("client: Config.PingInterval %v is negative", c.PingInterval)
	}
	if c.TenantID != "" {
		if err := storepb.CheckTenant(c.TenantID); err != nil {
			return fmt.Errorf("client: Config.TenantID: %w", err)
		}
	}
	return c.Replicate.validate()
}

// ReplicateConfig says how a put is replicated and protected, as
// Mooncake's ReplicateConfig.
type ReplicateConfig struct {
	// Replicas is the number of memory replicas, each on a distinct
	// segment. Zero: 1. Placement is best effort: a put succeeds with at
	// least one.
	Replicas int
	// SoftPin keeps the object through eviction rounds until the pin
	// expires (SoftPinTTL, zero: the master's default of 30 min).
	SoftPin    bool
	SoftPinTTL time.Duration
	// HardPin: never evicted.
	HardPin bool
	// PreferredSegments are segment names to place replicas on first.
	PreferredSegments []string
	// PreferLocal places replicas on this client's host first.
	PreferLocal bool
	// Stripes cuts each replica into this many pieces on distinct
	// segments (distinct hosts where possible), which a get reads in
	// parallel: 1 for none. Best effort: fewer where fewer segments fit.
	// Zero: the master's policy (its StripeMinSize and StripeCount).
	Stripes int
}

func (r *ReplicateConfig) validate() error {
	switch {
	case r.Replicas < 0:
		return fmt.Errorf("client: ReplicateConfig.Replicas %d is negative", r.Replicas)
	case r.SoftPinTTL < 0:
		return fmt.Errorf("client: ReplicateConfig.SoftPinTTL %v is negative", r.SoftPinTTL)
	case r.Stripes < 0:
		return fmt.Errorf("client: ReplicateConfig.Stripes %d is negative", r.Stripes)
	case r.Stripes > math.MaxInt32:
		return fmt.Errorf("client: ReplicateConfig.Stripes %d is too large", r.Stripes)
	}
	return nil
}

func (r *ReplicateConfig) proto() *storepb.ReplicateConfig {
	return &storepb.ReplicateConfig{
		ReplicaNum:        int32(r.Replicas),
		WithSoftPin:       r.SoftPin,
		WithHardPin:       r.HardPin,
		SoftPinTtlMs:      r.SoftPinTTL.Milliseconds(),
		PreferredSegments: r.PreferredSegments,
		PreferLocal:       r.PreferLocal,
		StripeCount:       int32(r.Stripes),
	}
}
