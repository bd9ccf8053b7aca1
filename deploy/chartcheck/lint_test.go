package chartcheck

import (
	"path/filepath"
	"testing"

	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
)

// `helm lint` for each value set: Chart.yaml, values, templates (YAML,
// resource names, deprecated APIs); warnings count as failures.
func TestHelmLint(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join(chartDir, "ci", "*.yaml"))
	for _, f := range files {
		vals, err := chartutil.ReadValuesFile(f)
		if err != nil {
			t.Fatal(err)
		}
		l := lint.All(chartDir, vals, namespace, false)
		for _, m := range l.Messages {
			if m.Severity >= support.WarningSev {
				t.Errorf("%s: %s", filepath.Base(f), m)
			} else {
				t.Logf("%s: %s", filepath.Base(f), m)
			}
		}
	}
}
