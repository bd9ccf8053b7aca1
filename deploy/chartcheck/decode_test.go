package chartcheck

import (
	"strings"
	"testing"
)

const goodDeployment = `apiVersion: apps/v1
kind: Deployment
metadata:
  name: x
spec:
  replicas: 2
  selector:
    matchLabels: {app: x}
  template:
    metadata:
      labels: {app: x}
    spec:
      containers:
        - name: x
          image: mooncake:latest
          ports:
            - name: http
              containerPort: 8000
`

// The decoder accepts a well-formed object and rejects the mistakes a
// chart makes: the negative controls of TestChartRenders.
func TestDecoderRejectsBrokenManifests(t *testing.T) {
	if _, err := Decode("good", goodDeployment); err != nil {
		t.Fatalf("a valid Deployment: %v", err)
	}
	broken := map[string]string{
		"unknown field in spec":      strings.Replace(goodDeployment, "  replicas: 2", "  replica: 2", 1),
		"unknown field in container": strings.Replace(goodDeployment, "          image:", "          imagePullPolicyy: Always\n          image:", 1),
		"wrong type (string count)":  strings.Replace(goodDeployment, "replicas: 2", `replicas: "two"`, 1),
		"wrong type (port as list)":  strings.Replace(goodDeployment, "containerPort: 8000", "containerPort: [8000]", 1),
		"duplicate key":              strings.Replace(goodDeployment, "  replicas: 2", "  replicas: 2\n  replicas: 3", 1),
		"unknown kind":               strings.Replace(goodDeployment, "kind: Deployment", "kind: Deploymnet", 1),
		"wrong apiVersion":           strings.Replace(goodDeployment, "apps/v1", "apps/v1beta9", 1),
		"field at the wrong level":   strings.Replace(goodDeployment, "  replicas: 2", "  replicas: 2\n  image: mooncake:latest", 1),
		"ServiceMonitor unknown field": `apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata: {name: x}
spec:
  selector: {matchLabels: {a: b}}
  endpoints:
    - port: metrics
      intervall: 15s
`,
	}
	for what, doc := range broken {
		t.Run(what, func(t *testing.T) {
			if _, err := Decode(what, "# a comment\n---\n"+doc); err == nil {
				t.Fatal("decoded without an error")
			} else {
				t.Log(err)
			}
		})
	}
}

// The chart-level checks fail on what they are for: a Service selecting
// no pod, a targetPort no pod has, a flag mooncake does not have.
func TestConsistencyChecksFail(t *testing.T) {
	svc := `---
apiVersion: v1
kind: Service
metadata: {name: s}
spec:
  selector: {app: %s}
  ports:
    - {name: http, port: 80, targetPort: %s}
`
	for what, pair := range map[string][2]string{
		"selects nothing": {"z", "http"},
		"no such port":    {"x", "grpc"},
	} {
		objs, err := Decode(what, goodDeployment+sprintf(svc, pair[0], pair[1]))
		if err != nil {
			t.Fatal(err)
		}
		if err := consistent(objs); err == nil {
			t.Errorf("%s: consistent() passed", what)
		}
	}
	known := map[string]bool{"master": true, "rpc_port": true}
	if err := argsKnown([]string{"--rpc_port=1", "--rpc-port=1"}, known); err == nil {
		t.Error("an unknown flag (--rpc-port) passed")
	}
	if err := argsKnown([]string{"--rpc_port=1"}, known); err != nil {
		t.Error(err)
	}
}

func sprintf(format string, a ...string) string {
	for _, s := range a {
		format = strings.Replace(format, "%s", s, 1)
	}
	return format
}
