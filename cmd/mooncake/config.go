package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/spf13/viper"

	"github.com/mooncake-go/mooncake/internal/size"
)

// settings reads a command's configuration with viper, highest first: its
// flags, the environment, a config file (JSON, YAML or TOML: --config_path
// or the command's config env), then the flags' defaults. Each setting is
// the flag's name; envs maps a flag to the environment variables that set
// it (Mooncake's names where they mean the same, then ours).
type settings struct {
	v *viper.Viper
}

func newSettings(cmd *cobra.Command, configEnv string, envs map[string][]string) (*settings, error) {
	v := viper.New()
	if err := v.BindPFlags(cmd.Flags()); err != nil {
		return nil, err
	}
	for key, names := range envs {
		if err := v.BindEnv(append([]string{key}, names...)...); err != nil {
			return nil, err
		}
	}
	path := v.GetString("config_path")
	if path == "" && configEnv != "" {
		_ = v.BindEnv("config_path", configEnv)
		path = v.GetString("config_path")
	}
	if path != "" {
		v.SetConfigFile(path)
		if err := v.ReadInConfig(); err != nil {
			return nil, fmt.Errorf("config %s: %w", path, err)
		}
	}
	return &settings{v: v}, nil
}

func (s *settings) str(key string) string    { return s.v.GetString(key) }
func (s *settings) boolean(key string) bool  { return s.v.GetBool(key) }
func (s *settings) float(key string) float64 { return s.v.GetFloat64(key) }
func (s *settings) integer(key string) int   { return s.v.GetInt(key) }

// size reads a byte count: "1073741824", "1GiB", "16GB" (every unit
// 1024-based, as Mooncake reads them: 16GB is 16 GiB; see internal/size).
func (s *settings) size(key string) (int64, error) {
	n, err := size.Parse(s.v.GetString(key))
	if err != nil {
		return 0, fmt.Errorf("--%s: %w", key, err)
	}
	return n, nil
}

// duration reads a duration: "10s", "1h", or a bare number in unit.
func (s *settings) duration(key string, unit time.Duration) (time.Duration, error) {
	raw := strings.TrimSpace(s.v.GetString(key))
	if raw == "" {
		return 0, nil
	}
	if d, err := time.ParseDuration(raw); err == nil {
		return d, nil
	}
	var n float64
	if _, err := fmt.Sscanf(raw, "%g", &n); err != nil {
		return 0, fmt.Errorf("--%s %q: want a duration (10s, 1h) or a number of %v", key, raw, unit)
	}
	return time.Duration(n * float64(unit)), nil
}

// addConfigFlag adds --config_path.
func addConfigFlag(fs *pflag.FlagSet, env string) {
	fs.String("config_path", "", "configuration file (JSON, YAML or TOML) whose keys are the flag names (env "+env+")")
}

// parseSize reads a human byte count ("1GiB", "16MB", "4096"; units are
// 1024-based, see internal/size).
func parseSize(s string) (int64, error) { return size.Parse(s) }
