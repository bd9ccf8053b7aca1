package master

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// FileQuotaStore keeps the tenant quotas in a YAML file (the master's
// --tenant_quota_connector_uri with --tenant_quota_connector_type=file):
//
//	version: 1
//	tenants:
//	  - tenant_id: acme
//	    quota: 64GiB      # bytes; or with KiB, MiB, GiB, TiB (or KB, MB, GB, TB: powers of 1000)
//
// Save replaces the file atomically (a new file renamed over it, fsync'd),
// so a master that crashes mid-save leaves the old quotas or the new ones.
// Masters of an HA cluster that share the file (a shared volume) share the
// quotas: a new leader loads them when it starts.
type FileQuotaStore struct{ Path string }

var _ QuotaStore = FileQuotaStore{}

type quotaFile struct {
	Version int          `yaml:"version"`
	Tenants []quotaEntry `yaml:"tenants"`
}

type quotaEntry struct {
	Tenant string `yaml:"tenant_id"`
	Quota  string `yaml:"quota"`
}

// Load reads the file; a missing file holds no quotas.
func (f FileQuotaStore) Load() (map[string]uint64, error) {
	b, err := os.ReadFile(f.Path)
	if errors.Is(err, os.ErrNotExist) {
		return map[string]uint64{}, nil
	}
	if err != nil {
		return nil, err
	}
	var qf quotaFile
	if err := yaml.Unmarshal(b, &qf); err != nil {
		return nil, fmt.Errorf("%s: %w", f.Path, err)
	}
	if qf.Version != 1 && (qf.Version != 0 || len(qf.Tenants) > 0) {
		return nil, fmt.Errorf("%s: version %d: only version 1 is known", f.Path, qf.Version)
	}
	out := make(map[string]uint64, len(qf.Tenants))
	for i, e := range qf.Tenants {
		n, err := ParseQuota(e.Quota)
		if err != nil {
			return nil, fmt.Errorf("%s: tenants[%d] (%q): %w", f.Path, i, e.Tenant, err)
		}
		if _, dup := out[e.Tenant]; dup {
			return nil, fmt.Errorf("%s: tenant %q is listed twice", f.Path, e.Tenant)
		}
		out[e.Tenant] = n
	}
	return out, nil
}

// Save writes quotas to the file, sorted by tenant.
func (f FileQuotaStore) Save(quotas map[string]uint64) error {
	qf := quotaFile{Version: 1, Tenants: []quotaEntry{}}
	for _, t := range slices.Sorted(maps.Keys(quotas)) {
		qf.Tenants = append(qf.Tenants, quotaEntry{Tenant: t, Quota: strconv.FormatUint(quotas[t], 10)})
	}
	b, err := yaml.Marshal(qf)
	if err != nil {
		return err
	}
	dir := filepath.Dir(f.Path)
	tmp, err := os.CreateTemp(dir, ".tenant-quotas-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after the rename, nothing
	_, err = tmp.Write(b)
	err = errors.Join(err, tmp.Sync(), tmp.Close())
	if err == nil {
		err = os.Rename(tmp.Name(), f.Path)
	}
	if err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	return errors.Join(d.Sync(), d.Close())
}

// ParseQuota reads a quota: a number of bytes, or one with a unit (KiB,
// MiB, GiB, TiB: powers of 1024; KB, MB, GB, TB: powers of 1000; B).
func ParseQuota(s string) (uint64, error) {
	s = strings.TrimSpace(s)
	units := []struct {
		suffix string
		mul    uint64
	}{
		{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
		{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"B", 1},
	}
	mul := uint64(1)
	for _, u := range units {
		if strings.HasSuffix(s, u.suffix) {
			s, mul = strings.TrimSpace(strings.TrimSuffix(s, u.suffix)), u.mul
			break
		}
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("quota %q: not a byte count", s)
	}
	if n > MaxTenantQuota/mul {
		return 0, fmt.Errorf("quota %q: over 2^63-1 bytes", s)
	}
	return n * mul, nil
}
