package main

import (
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/spf13/pflag"

	"github.com/mooncake-go/mooncake/store/master"
)

// envSnapshotPath is official mooncake_master's directory for snapshots on
// the local file system (its "local" snapshot object store).
const envSnapshotPath = "MOONCAKE_SNAPSHOT_LOCAL_PATH"

// addPersistFlags adds the flags of a master's state across restarts:
// official mooncake_master's snapshot flags, which here turn on a journal
// plus snapshots on local disk (docs/tiers-restarts.md).
func addPersistFlags(f *pflag.FlagSet) {
	f.Bool("enable_snapshot", false, "without --enable_ha: keep the master's state on local disk across restarts "+
		"(a journal of every change, fsync'd before it is acknowledged, plus snapshots) in --snapshot_backup_dir or $"+envSnapshotPath)
	f.String("snapshot_backup_dir", "", "directory of the journal and snapshots (default $"+envSnapshotPath+")")
	f.String("snapshot_interval_seconds", "600", "seconds (or a duration) between snapshots while changes come in; "+
		"a snapshot is also written every 100000 journal records")
	f.Int("snapshot_retention_count", 2, "snapshots kept in the directory")
	f.Bool("enable_snapshot_restore", true, "restore the state found in the directory at start (false: start empty and discard it)")
	f.String("snapshot_object_store_type", "", "where snapshots go: \"local\" (or empty) only here")
}

// persistConfig reads the persistence flags into cfg.
func persistConfig(s *settings, cfg *master.ServerConfig) error {
	if !s.boolean("enable_snapshot") {
		return nil
	}
	if cfg.HA != nil {
		slog.Warn("master: --enable_snapshot has no effect with --enable_ha: the HA journal and its snapshots are in etcd")
		return nil
	}
	if t := s.str("snapshot_object_store_type"); t != "" && t != "local" {
		return fmt.Errorf("--snapshot_object_store_type %q: only \"local\" here", t)
	}
	dir := s.str("snapshot_backup_dir")
	if dir == "" {
		dir = os.Getenv(envSnapshotPath)
	}
	if dir == "" {
		return fmt.Errorf("--enable_snapshot needs --snapshot_backup_dir or $%s", envSnapshotPath)
	}
	every, err := s.duration("snapshot_interval_seconds", time.Second)
	if err != nil {
		return err
	}
	if every <= 0 {
		return fmt.Errorf("--snapshot_interval_seconds %v must be positive", every)
	}
	keep := s.integer("snapshot_retention_count")
	if keep < 1 {
		return fmt.Errorf("--snapshot_retention_count %d must be at least 1", keep)
	}
	cfg.Persist = &master.PersistConfig{Dir: dir, SnapshotInterval: every, Retain: keep,
		Fresh: !s.boolean("enable_snapshot_restore")}
	return nil
}
