package indexer

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
)

// Official Mooncake's Conductor reads its static configuration from the
// JSON file CONDUCTOR_CONFIG_PATH names (default
// ~/.mooncake/conductor_config.json):
//
//	{"http_server_port": 13333,
//	 "kvevent_instance": {"<name>": <Registration>, ...}}
const (
	ConfigEnv       = "CONDUCTOR_CONFIG_PATH"
	DefaultHTTPPort = 13333
)

// FileConfig is that file.
type FileConfig struct {
	// HTTPPort is the port of the indexer API.
	HTTPPort int `json:"http_server_port"`
	// Instances are the publishers registered at start, by name.
	Instances map[string]Registration `json:"kvevent_instance"`
}

// DefaultConfigPath is $CONDUCTOR_CONFIG_PATH, else
// ~/.mooncake/conductor_config.json.
func DefaultConfigPath() string {
	if p := os.Getenv(ConfigEnv); p != "" {
		return p
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return ""
	}
	return filepath.Join(home, ".mooncake", "conductor_config.json")
}

// LoadConfig reads path. A missing file is an empty configuration on
// DefaultHTTPPort, as official Mooncake has it; a file without
// http_server_port gets DefaultHTTPPort too (official Mooncake would take
// port 0 there, which no operator means).
func LoadConfig(path string) (FileConfig, error) {
	c := FileConfig{HTTPPort: DefaultHTTPPort}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return c, nil
	}
	if err != nil {
		return c, err
	}
	c.HTTPPort = 0
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("%s: %w", path, err)
	}
	if c.HTTPPort == 0 {
		c.HTTPPort = DefaultHTTPPort
	}
	if c.HTTPPort < 0 || c.HTTPPort > 65535 {
		return c, fmt.Errorf("%w: %s: http_server_port %d out of range", ErrInvalid, path, c.HTTPPort)
	}
	return c, nil
}

// RegisterAll registers c's instances, in name order; the first failure
// is returned, naming the instance.
func (x *Indexer) RegisterAll(c FileConfig) error {
	names := make([]string, 0, len(c.Instances))
	for n := range c.Instances {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		if err := x.Register(c.Instances[n]); err != nil {
			return fmt.Errorf("kvevent_instance %q: %w", n, err)
		}
	}
	return nil
}
