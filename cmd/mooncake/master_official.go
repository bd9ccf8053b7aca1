package main

import (
	"log/slog"

	"github.com/spf13/pflag"
)

// officialFlag is a flag of an official Mooncake binary that ours accepts
// without acting on it, so that a deployment's command line or config file
// written for the official binary starts ours unchanged. Why says what
// happens here instead; it is logged when the flag is set, and
// docs/operator-flags.md gives every flag's row.
type officialFlag struct {
	name string
	bool bool   // a gflags bool: "--name" alone means true
	def  string // the official default, as --help prints it
	why  string
}

// Reasons shared by many flags.
const (
	whyGlog      = "glog logging flag; our logs are structured lines on stderr (level: --log-level, MC_LOG_LEVEL)"
	whyGflags    = "gflags flag; use --config_path (a JSON, YAML or TOML file of flag names) or MC_MASTER_<FLAG> environment variables"
	whyRPC       = "gRPC here serves every call on Go's scheduler, no thread pool to size"
	whyCXL       = "no CXL memory segments here"
	whyNoF       = "no NVMe-oF segments here"
	whyTaskMgr   = "no master-driven task queue here (replication and copies run in the clients)"
	whySnapshot  = "snapshots here are local files (--enable_snapshot, --snapshot_backup_dir): no catalog, object store or child process to configure; see docs/tiers-restarts.md"
	whyOffload   = "the SSD tier is each client's own (MOONCAKE_ENABLE_SSD_OFFLOAD, ssd_offload_path); the master keeps no offload queue; see docs/tiers-restarts.md"
	whyKVEvents  = "deprecated upstream and not emitted on events there either"
	whyDynRepl   = "no dynamic replication here: the replica count is the client's per put"
	whyArena     = "segments are mmap'd once at mount; no arena allocator to configure"
	whyAllocator = "one allocator here (offset-style, per segment); nothing to choose"
)

// officialMasterFlags are official mooncake_master's flags that ours has no
// equivalent of; the flags it does have keep their names in newMasterCmd.
var officialMasterFlags = []officialFlag{
	{"allow_evict_soft_pinned_objects", true, "true", "always as the official default: eviction takes soft-pinned objects only in a second pass, after the unpinned ones"},
	{"batch_oplog_retry_timeout_sec", false, "180", "no OpLog here: HA journals every durable change to etcd"},
	{"cxl_path", false, "/dev/dax0.0", whyCXL},
	{"cxl_size", false, "8589934592", whyCXL},
	{"dynamic_replication_admission_qps_threshold", false, "0.8", whyDynRepl},
	{"dynamic_replication_heat_window_seconds", false, "10", whyDynRepl},
	{"dynamic_replication_max_memory_replicas", false, "2", whyDynRepl},
	{"dynamic_replication_mode", false, "off", whyDynRepl},
	{"enable_cxl", true, "false", whyCXL},
	{"enable_disk_eviction", true, "true", whyOffload},
	{"enable_metadata_cleanup_on_timeout", true, "false", "segment descriptors of a client that timed out stay in the metadata server until it unmounts or the key is overwritten"},
	{"enable_metric_reporting", true, "true", "no periodic metric log lines; scrape /metrics or read /metrics/summary"},
	{"enable_offload", true, "false", whyOffload},
	{"enable_oplog", true, "false", "HA always journals every durable change to etcd (--enable_ha); there is no separate OpLog to enable"},
	{"global_file_segment_size", false, "9223372036854775807", "no shared NFS/3FS file segment here"},
	{"kv_events_additional_salt", false, "", whyKVEvents},
	{"kv_events_dp_rank", false, "0", whyKVEvents},
	{"kv_events_emit_legacy_compat", true, "true", "the events always carry the vLLM/SGLang-compatible fields; see docs/kv-events.md"},
	{"kv_events_emit_object_key", true, "true", "the events always carry the object key; see docs/kv-events.md"},
	{"kv_events_lora_name", false, "", whyKVEvents},
	{"kv_events_queue_capacity", false, "65536", "events go out as they happen; a slow subscriber is dropped, not queued for"},
	{"kv_events_tenant_id", false, "default", whyKVEvents},
	{"max_kv_soft_pin_ttl", false, "86400000", "no request-level soft-pin TTL here: --default_kv_soft_pin_ttl applies to every soft pin"},
	{"max_retry_attempts", false, "10", whyTaskMgr},
	{"max_threads", false, "16", whyRPC},
	{"max_total_finished_tasks", false, "10000", whyTaskMgr},
	{"max_total_pending_tasks", false, "10000", whyTaskMgr},
	{"max_total_processing_tasks", false, "10000", whyTaskMgr},
	{"memory_allocator", false, "offset", whyAllocator},
	{"mmap_arena_pool_size", false, "8589934592", whyArena},
	{"nof_eviction_high_watermark_ratio", false, "0.9", whyNoF},
	{"nof_eviction_ratio", false, "0.05", whyNoF},
	{"nof_heartbeat_failures_threshold", false, "3", whyNoF},
	{"nof_heartbeat_interval_sec", false, "10", whyNoF},
	{"nof_heartbeat_probe_timeout_ms", false, "1000", whyNoF},
	{"offload_cap_ratio", false, "0.5", whyOffload},
	{"offload_force_evict", true, "false", whyOffload},
	{"offload_on_evict", true, "false", whyOffload},
	{"offloading_queue_limit", false, "50000", whyOffload},
	{"oplog_batch_max_entries", false, "1024", "no OpLog here: HA journals every durable change to etcd"},
	{"oplog_poll_interval_ms", false, "1000", "no OpLog here: standbys watch the etcd journal instead of polling"},
	{"pending_task_timeout_sec", false, "300", whyTaskMgr},
	{"pod_name", false, "", "no Kubernetes HA backend here (etcd only)"},
	{"pod_namespace", false, "", "no Kubernetes HA backend here (etcd only)"},
	{"processing_task_timeout_sec", false, "300", whyTaskMgr},
	{"promotion_admission_threshold", false, "2", whyOffload},
	{"promotion_max_per_heartbeat", false, "1", whyOffload},
	{"promotion_on_hit", true, "false", whyOffload},
	{"promotion_queue_limit", false, "50000", whyOffload},
	{"quota_bytes", false, "0", whyOffload},
	{"root_fs_dir", false, "", whyOffload},
	{"rpc_conn_timeout_seconds", false, "0", "idle gRPC connections are kept alive by keepalives; a dead client is found by --client_ttl"},
	{"rpc_enable_tcp_no_delay", true, "true", "Go sets TCP_NODELAY on every connection, always"},
	{"rpc_thread_num", false, "0", whyRPC},
	{"snapshot_catalog_backend_connstring", false, "", whySnapshot},
	{"snapshot_catalog_backend_type", false, "", whySnapshot},
	{"snapshot_catalog_store_connstring", false, "", whySnapshot},
	{"snapshot_catalog_store_type", false, "", whySnapshot},
	{"snapshot_child_timeout_seconds", false, "300", whySnapshot},
	{"snapshot_payload_backend_type", false, "", whySnapshot},
	{"snapshot_payload_store_type", false, "", whySnapshot},
	{"use_mmap_arena_allocator", true, "false", whyArena},
}

// officialLoggingFlags are the glog and gflags flags every official binary
// takes (their --help lists them).
var officialLoggingFlags = []officialFlag{
	{"alsologtoemail", false, "", whyGlog},
	{"alsologtostderr", true, "false", whyGlog},
	{"colorlogtostderr", true, "false", whyGlog},
	{"drop_log_memory", true, "true", whyGlog},
	{"log_backtrace_at", false, "", whyGlog},
	{"log_dir", false, "", whyGlog},
	{"log_link", false, "", whyGlog},
	{"log_prefix", true, "true", whyGlog},
	{"logbuflevel", false, "0", whyGlog},
	{"logbufsecs", false, "30", whyGlog},
	{"logemaillevel", false, "999", whyGlog},
	{"logfile_mode", false, "436", whyGlog},
	{"logmailer", false, "/bin/mail", whyGlog},
	{"logtostderr", true, "false", whyGlog},
	{"max_log_size", false, "1800", whyGlog},
	{"minloglevel", false, "0", whyGlog},
	{"stderrthreshold", false, "2", whyGlog},
	{"stop_logging_if_full_disk", true, "false", whyGlog},
	{"symbolize_stacktrace", true, "true", whyGlog},
	{"v", false, "0", whyGlog},
	{"vmodule", false, "", whyGlog},
	{"flagfile", false, "", whyGflags},
	{"fromenv", false, "", whyGflags},
	{"tryfromenv", false, "", whyGflags},
	{"undefok", false, "", whyGflags},
}

// addOfficialFlags defines, hidden, each flag of table that fs does not
// define yet (a flag a command implements keeps its own definition), and
// returns the ones it defined.
func addOfficialFlags(fs *pflag.FlagSet, tables ...[]officialFlag) []officialFlag {
	var added []officialFlag
	for _, table := range tables {
		for _, o := range table {
			if fs.Lookup(o.name) != nil {
				continue
			}
			usage := "official Mooncake flag, no effect here: " + o.why
			if o.bool {
				fs.Bool(o.name, o.def == "true", usage)
			} else {
				fs.String(o.name, o.def, usage)
			}
			_ = fs.MarkHidden(o.name)
			added = append(added, o)
		}
	}
	return added
}

// warnOfficialFlags logs a warning for each flag of added that the command
// line sets (or, where inConfig is not nil, the config file), naming the
// flag and why it has no effect here. It returns the names it warned of.
func warnOfficialFlags(fs *pflag.FlagSet, added []officialFlag, inConfig func(string) bool) []string {
	var warned []string
	for _, o := range added {
		if !fs.Changed(o.name) && (inConfig == nil || !inConfig(o.name)) {
			continue
		}
		slog.Warn("official Mooncake flag accepted but has no effect here", "flag", "--"+o.name, "why", o.why)
		warned = append(warned, o.name)
	}
	return warned
}
