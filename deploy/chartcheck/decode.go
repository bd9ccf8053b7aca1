// Package chartcheck renders the mooncake Helm chart (deploy/helm/mooncake)
// with Helm's own engine and decodes every object strictly into the
// Kubernetes API types, so that a typo'd field, a wrong type or a kind the
// API server would not know fails here, without a cluster.
package chartcheck

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// Object is one rendered manifest, decoded.
type Object struct {
	Source string // the template it came from
	Kind   string
	Name   string
	Value  any // *appsv1.Deployment, *corev1.Service, *ServiceMonitor, ...
}

// ServiceMonitor is prometheus-operator's CRD (monitoring.coreos.com/v1),
// the fields this chart may use: anything else is rejected as unknown.
type ServiceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Selector          metav1.LabelSelector `json:"selector"`
		NamespaceSelector *struct {
			Any        bool     `json:"any,omitempty"`
			MatchNames []string `json:"matchNames,omitempty"`
		} `json:"namespaceSelector,omitempty"`
		JobLabel  string `json:"jobLabel,omitempty"`
		Endpoints []struct {
			Port          string `json:"port,omitempty"`
			Path          string `json:"path,omitempty"`
			Scheme        string `json:"scheme,omitempty"`
			Interval      string `json:"interval,omitempty"`
			ScrapeTimeout string `json:"scrapeTimeout,omitempty"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// newTyped is the Go type of an apiVersion and kind.
func newTyped(apiVersion, kind string) (any, error) {
	switch apiVersion + " " + kind {
	case "v1 Service":
		return &corev1.Service{}, nil
	case "v1 ConfigMap":
		return &corev1.ConfigMap{}, nil
	case "v1 Secret":
		return &corev1.Secret{}, nil
	case "apps/v1 Deployment":
		return &appsv1.Deployment{}, nil
	case "apps/v1 DaemonSet":
		return &appsv1.DaemonSet{}, nil
	case "apps/v1 StatefulSet":
		return &appsv1.StatefulSet{}, nil
	case "monitoring.coreos.com/v1 ServiceMonitor":
		return &ServiceMonitor{}, nil
	}
	return nil, fmt.Errorf("no API type known for apiVersion %q kind %q", apiVersion, kind)
}

var docSep = regexp.MustCompile(`(?m)^---\s*$`)

// Decode splits a rendered template into its YAML documents and decodes
// each strictly: duplicate keys are an error (YAML to JSON), and so is a
// field the typed object does not have, or a value of the wrong type.
func Decode(source, manifest string) ([]Object, error) {
	var objs []Object
	for i, doc := range docSep.Split(manifest, -1) {
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		js, err := yaml.YAMLToJSONStrict([]byte(doc))
		if err != nil {
			return nil, fmt.Errorf("%s, document %d: YAML: %w", source, i, err)
		}
		var tm metav1.TypeMeta
		if err := json.Unmarshal(js, &tm); err != nil {
			return nil, fmt.Errorf("%s, document %d: %w", source, i, err)
		}
		v, err := newTyped(tm.APIVersion, tm.Kind)
		if err != nil {
			return nil, fmt.Errorf("%s, document %d: %w", source, i, err)
		}
		d := json.NewDecoder(bytes.NewReader(js))
		d.DisallowUnknownFields()
		if err := d.Decode(v); err != nil {
			return nil, fmt.Errorf("%s, document %d (%s): %w", source, i, tm.Kind, err)
		}
		objs = append(objs, Object{Source: source, Kind: tm.Kind, Name: nameOf(v), Value: v})
	}
	return objs, nil
}

func nameOf(v any) string {
	if o, ok := v.(interface{ GetName() string }); ok {
		return o.GetName()
	}
	return ""
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l)
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// PodSpec is the pod template of a workload, nil for other objects.
func PodSpec(o Object) (*corev1.PodTemplateSpec, *metav1.LabelSelector) {
	switch v := o.Value.(type) {
	case *appsv1.Deployment:
		return &v.Spec.Template, v.Spec.Selector
	case *appsv1.DaemonSet:
		return &v.Spec.Template, v.Spec.Selector
	case *appsv1.StatefulSet:
		return &v.Spec.Template, v.Spec.Selector
	}
	return nil, nil
}
