package chartcheck

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	sigyaml "sigs.k8s.io/yaml"
)

const (
	chartDir  = "../helm/mooncake"
	release   = "mc"
	namespace = "kvcache"
	fullname  = "mc-mooncake"
)

// render renders the chart with a values file as `helm template` would,
// templates referencing a value that does not exist failing (Strict).
func render(t *testing.T, valuesFile string) ([]Object, error) {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	vals, err := chartutil.ReadValuesFile(valuesFile)
	if err != nil {
		t.Fatal(err)
	}
	rv, err := chartutil.ToRenderValues(ch, vals, chartutil.ReleaseOptions{
		Name: release, Namespace: namespace, Revision: 1, IsInstall: true}, chartutil.DefaultCapabilities)
	if err != nil {
		t.Fatal(err)
	}
	out, err := engine.Engine{Strict: true}.Render(ch, rv)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(out))
	for n := range out {
		names = append(names, n)
	}
	sort.Strings(names)
	var objs []Object
	for _, n := range names {
		if strings.HasSuffix(n, "NOTES.txt") {
			continue
		}
		o, err := Decode(n, out[n])
		if err != nil {
			return nil, err
		}
		objs = append(objs, o...)
	}
	return objs, nil
}

func find(objs []Object, kind, name string) Object {
	for _, o := range objs {
		if o.Kind == kind && o.Name == name {
			return o
		}
	}
	return Object{}
}

func container(o Object) *corev1.Container {
	pod, _ := PodSpec(o)
	if pod == nil || len(pod.Spec.Containers) == 0 {
		return nil
	}
	return &pod.Spec.Containers[0]
}

func args(o Object) string {
	if c := container(o); c != nil {
		return strings.Join(c.Args, " ")
	}
	return ""
}

// check is one expectation on a value set's objects.
type check func(objs []Object) error

func has(kind, name string) check {
	return func(objs []Object) error {
		if find(objs, kind, name).Value == nil {
			return fmt.Errorf("no %s %s", kind, name)
		}
		return nil
	}
}

func hasNo(kind, name string) check {
	return func(objs []Object) error {
		if find(objs, kind, name).Value != nil {
			return fmt.Errorf("unexpected %s %s", kind, name)
		}
		return nil
	}
}

func argsHave(kind, name string, want ...string) check {
	return func(objs []Object) error {
		a := " " + args(find(objs, kind, name)) + " "
		for _, w := range want {
			neg := strings.HasPrefix(w, "!")
			if strings.Contains(a, " "+strings.TrimPrefix(w, "!")) == neg {
				return fmt.Errorf("%s %s args %q: want %q", kind, name, a, w)
			}
		}
		return nil
	}
}

func pod(kind, name string, f func(*corev1.PodTemplateSpec) error) check {
	return func(objs []Object) error {
		p, _ := PodSpec(find(objs, kind, name))
		if p == nil {
			return fmt.Errorf("no pod template in %s %s", kind, name)
		}
		if err := f(p); err != nil {
			return fmt.Errorf("%s %s: %w", kind, name, err)
		}
		return nil
	}
}

var (
	master    = fullname + "-master"
	node      = fullname + "-node"
	conductor = fullname + "-conductor"
	etcd      = fullname + "-etcd"
	metadata  = fullname + "-metadata"
	etcd0     = fmt.Sprintf("%s-etcd-0.%s-etcd-peers.%s.svc:2379", fullname, fullname, namespace)
)

func readiness(path string) func(*corev1.PodTemplateSpec) error {
	return func(p *corev1.PodTemplateSpec) error {
		r := p.Spec.Containers[0].ReadinessProbe
		if r == nil || r.HTTPGet == nil || r.HTTPGet.Path != path {
			return fmt.Errorf("readiness probe %+v, want GET %s", r, path)
		}
		return nil
	}
}

func scraped(want bool) func(*corev1.PodTemplateSpec) error {
	return func(p *corev1.PodTemplateSpec) error {
		if (p.Annotations["prometheus.io/scrape"] == "true") != want {
			return fmt.Errorf("annotations %v: scrape want %v", p.Annotations, want)
		}
		return nil
	}
}

// expectations of each documented value set (ci/*.yaml): what its values
// must have changed in the rendered objects.
var expectations = map[string][]check{
	"default-values.yaml": {
		has("StatefulSet", etcd), has("Deployment", conductor), hasNo("ServiceMonitor", fullname),
		hasNo("Deployment", metadata),
		argsHave("Deployment", master, "--enable_ha", "--etcd_endpoints="+etcd0, "--rpc_address=$(POD_IP)"),
		argsHave("DaemonSet", node, "--master=etcd://"+etcd0, "!--ssd_dir", "--metadata_server=P2PHANDSHAKE"),
		argsHave("Deployment", conductor, "--store-master="+master+"."+namespace+".svc:50051", "!--store-kv-events"),
		pod("Deployment", master, readiness("/readyz")),
		pod("Deployment", master, scraped(true)),
		pod("DaemonSet", node, scraped(true)),
		pod("Deployment", conductor, readiness("/health")),
		func(objs []Object) error {
			if d := find(objs, "Deployment", master).Value.(*appsv1.Deployment); *d.Spec.Replicas != 2 {
				return fmt.Errorf("master replicas %d, want 2", *d.Spec.Replicas)
			}
			if s := find(objs, "Service", master).Value.(*corev1.Service); s.Spec.PublishNotReadyAddresses {
				return fmt.Errorf("the leader's Service publishes standbys (not ready) too")
			}
			return nil
		},
	},
	"external-etcd-values.yaml": {
		hasNo("StatefulSet", etcd), hasNo("Deployment", conductor), has("Deployment", metadata),
		argsHave("Deployment", master, "--enable_ha", "--enable_kv_events",
			"--etcd_endpoints=etcd-0.etcd.infra.svc:2379;etcd-1.etcd.infra.svc:2379;etcd-2.etcd.infra.svc:2379"),
		argsHave("DaemonSet", node, "--te_secret_file=/etc/mooncake/te/secret"),
		pod("DaemonSet", node, func(p *corev1.PodTemplateSpec) error {
			v, m := p.Spec.Volumes, p.Spec.Containers[0].VolumeMounts
			if len(v) != 2 || v[1].Secret == nil || v[1].Secret.SecretName != "mooncake-te-secret" ||
				len(m) != 2 || m[1].MountPath != "/etc/mooncake/te" {
				return fmt.Errorf("volumes %+v mounts %+v: want /tmp and the secret", v, m)
			}
			return nil
		}),
		argsHave("DaemonSet", node, "--master=etcd://etcd-0.etcd.infra.svc:2379;",
			"--metadata_server=http://"+metadata+"."+namespace+".svc:8080/metadata"),
		func(objs []Object) error {
			if d := find(objs, "Deployment", master).Value.(*appsv1.Deployment); *d.Spec.Replicas != 3 {
				return fmt.Errorf("master replicas %d, want 3", *d.Spec.Replicas)
			}
			return nil
		},
	},
	"hostnetwork-ssd-values.yaml": {
		argsHave("DaemonSet", node, "--ssd_dir=/var/lib/mooncake/ssd", "--ssd_size=200GiB",
			"--global_segment_size=32GiB", "--transport=auto"),
		argsHave("StatefulSet", etcd, "--initial-cluster="+fullname+"-etcd-0=http://"),
		func(objs []Object) error {
			if a := args(find(objs, "StatefulSet", etcd)); !strings.Contains(a, ","+fullname+"-etcd-2=http://") {
				return fmt.Errorf("etcd args %q: want three members in --initial-cluster", a)
			}
			return nil
		},
		pod("DaemonSet", node, func(p *corev1.PodTemplateSpec) error {
			s := p.Spec
			if !s.HostNetwork || !s.HostIPC || s.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
				return fmt.Errorf("hostNetwork %v hostIPC %v dnsPolicy %q", s.HostNetwork, s.HostIPC, s.DNSPolicy)
			}
			if len(s.Volumes) != 2 || s.Volumes[1].HostPath == nil || s.Volumes[1].HostPath.Path != "/mnt/nvme0/mooncake" {
				return fmt.Errorf("volumes %+v, want /tmp and the SSD hostPath", s.Volumes)
			}
			if s.SecurityContext.RunAsUser == nil || *s.SecurityContext.RunAsUser != 0 {
				return fmt.Errorf("node pod security context %+v, want runAsUser 0", s.SecurityContext)
			}
			if m := s.Containers[0].Resources.Limits.Memory(); m.String() != "34Gi" {
				return fmt.Errorf("memory limit %s", m)
			}
			return nil
		}),
		func(objs []Object) error {
			st := find(objs, "StatefulSet", etcd).Value.(*appsv1.StatefulSet)
			if *st.Spec.Replicas != 3 || len(st.Spec.VolumeClaimTemplates) != 1 ||
				*st.Spec.VolumeClaimTemplates[0].Spec.StorageClassName != "fast-ssd" {
				return fmt.Errorf("etcd: %d replicas, claims %+v", *st.Spec.Replicas, st.Spec.VolumeClaimTemplates)
			}
			return nil
		},
	},
	"servicemonitor-values.yaml": {
		has("ServiceMonitor", fullname),
		pod("Deployment", master, scraped(false)),
		pod("Deployment", conductor, readiness("/v1/models")),
		argsHave("Deployment", conductor, "--prefill=p0=http://vllm-prefill-0:8100,cache_blocks=4096",
			"--decode=d0=http://vllm-decode-0:8200", "--block-hash=vllm:sha256", "--block-size=16",
			"--store-kv-events=tcp://"+master+"."+namespace+".svc:5557", "--tbt-slo=50ms"),
		func(objs []Object) error {
			sm := find(objs, "ServiceMonitor", fullname).Value.(*ServiceMonitor)
			if sm.Labels["release"] != "prometheus" || sm.Spec.Endpoints[0].Interval != "30s" {
				return fmt.Errorf("ServiceMonitor labels %v endpoints %+v", sm.Labels, sm.Spec.Endpoints)
			}
			// it selects every Service carrying /metrics: masters, nodes, Conductor
			sel := labels.SelectorFromSet(sm.Spec.Selector.MatchLabels)
			n := 0
			for _, o := range objs {
				if s, ok := o.Value.(*corev1.Service); ok && sel.Matches(labels.Set(s.Labels)) {
					n++
				}
			}
			if n != 3 {
				return fmt.Errorf("the ServiceMonitor selects %d Services, want 3", n)
			}
			return nil
		},
	},
	"no-ha-values.yaml": {
		hasNo("StatefulSet", etcd),
		argsHave("Deployment", master, "!--enable_ha", "!--etcd_endpoints"),
		argsHave("DaemonSet", node, "--master="+master+"."+namespace+".svc:50051"),
	},
}

// Every documented value set renders, every object decodes strictly into
// its API type, Services and selectors fit the pods, every mooncake flag
// exists, and the set's values show in the objects.
func TestChartRenders(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(chartDir, "ci", "*.yaml"))
	if err != nil || len(files) < 5 {
		t.Fatalf("value sets %v (%v): want ci/*.yaml", files, err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			checks, ok := expectations[filepath.Base(f)]
			if !ok {
				t.Fatalf("no expectations for %s: add them to this test", f)
			}
			objs, err := render(t, f)
			if err != nil {
				t.Fatal(err)
			}
			if err := consistent(objs); err != nil {
				t.Fatal(err)
			}
			if err := flagsExist(t, objs); err != nil {
				t.Fatal(err)
			}
			for _, c := range checks {
				if err := c(objs); err != nil {
					t.Error(err)
				}
			}
		})
	}
}

// Value combinations the chart refuses, with the reason.
func TestChartRefusesBadCombinations(t *testing.T) {
	for values, want := range map[string]string{
		"etcd: {enabled: false}\nmaster: {replicas: 2}\n": "needs etcd",
		"conductor: {storeKVEvents: true}\n":              "needs master.kvEvents.enabled",
		"node: {metadataServer: metadata}\n":              "needs metadata.enabled",
	} {
		f := filepath.Join(t.TempDir(), "bad.yaml")
		if err := os.WriteFile(f, []byte(values), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := render(t, f); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("values %q: render: %v, want the chart's refusal %q", values, err, want)
		}
	}
}

// consistent checks what the API server would not: each workload's selector
// matches its pods, each Service selects some pods, and each named
// targetPort is a port of every pod it selects.
func consistent(objs []Object) error {
	var pods []*corev1.PodTemplateSpec
	for _, o := range objs {
		p, sel := PodSpec(o)
		if p == nil {
			continue
		}
		if sel == nil || !labels.SelectorFromSet(sel.MatchLabels).Matches(labels.Set(p.Labels)) {
			return fmt.Errorf("%s %s: selector %v does not match its pods %v", o.Kind, o.Name, sel, p.Labels)
		}
		pods = append(pods, p)
	}
	for _, o := range objs {
		s, ok := o.Value.(*corev1.Service)
		if !ok {
			continue
		}
		sel := labels.SelectorFromSet(s.Spec.Selector)
		n := 0
		for _, p := range pods {
			if !sel.Matches(labels.Set(p.Labels)) {
				continue
			}
			n++
			for _, sp := range s.Spec.Ports {
				if sp.TargetPort.Type != intstr.String {
					continue
				}
				if !portNamed(p, sp.TargetPort.StrVal) {
					return fmt.Errorf("Service %s: targetPort %q is no port of the pods it selects", s.Name, sp.TargetPort.StrVal)
				}
			}
		}
		if n == 0 {
			return fmt.Errorf("Service %s selects no pods (%v)", s.Name, s.Spec.Selector)
		}
	}
	return nil
}

func portNamed(p *corev1.PodTemplateSpec, name string) bool {
	for _, c := range p.Spec.Containers {
		for _, cp := range c.Ports {
			if cp.Name == name {
				return true
			}
		}
	}
	return false
}

var (
	binOnce sync.Once
	binPath string
	binErr  error
	helpMu  sync.Mutex
	helps   = map[string]map[string]bool{}
	flagRe  = regexp.MustCompile(`--([a-z0-9][a-z0-9_-]*)`)
)

// TestMain removes the binary mooncakeFlags built.
func TestMain(m *testing.M) {
	code := m.Run()
	if binPath != "" {
		_ = os.RemoveAll(filepath.Dir(binPath))
	}
	os.Exit(code)
}

// mooncakeFlags are the flags `mooncake <sub> --help` lists, from a binary
// built from this checkout.
func mooncakeFlags(t *testing.T, sub string) map[string]bool {
	binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "chartcheck")
		if err != nil {
			binErr = err
			return
		}
		binPath = filepath.Join(dir, "mooncake")
		cmd := exec.Command("go", "build", "-o", binPath, "./cmd/mooncake")
		cmd.Dir = "../.."
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("building mooncake: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	helpMu.Lock()
	defer helpMu.Unlock()
	if f, ok := helps[sub]; ok {
		return f
	}
	out, err := exec.Command(binPath, sub, "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("mooncake %s --help: %v\n%s", sub, err, out)
	}
	f := map[string]bool{}
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "-") {
			if m := flagRe.FindStringSubmatch(l); m != nil {
				f[m[1]] = true
			}
		}
	}
	helps[sub] = f
	return f
}

// flagsExist checks every --flag the chart passes to /mooncake against
// the subcommand's --help.
func flagsExist(t *testing.T, objs []Object) error {
	for _, o := range objs {
		c := container(o)
		if c == nil || len(c.Command) == 0 || c.Command[0] != "/mooncake" {
			continue
		}
		if len(c.Args) == 0 {
			return fmt.Errorf("%s %s: no subcommand", o.Kind, o.Name)
		}
		if err := argsKnown(c.Args[1:], mooncakeFlags(t, c.Args[0])); err != nil {
			return fmt.Errorf("%s %s: mooncake %s: %w", o.Kind, o.Name, c.Args[0], err)
		}
	}
	return nil
}

func argsKnown(args []string, known map[string]bool) error {
	for _, a := range args {
		name, ok := strings.CutPrefix(a, "--")
		if !ok {
			return fmt.Errorf("argument %q is not --flag=value", a)
		}
		name, _, _ = strings.Cut(name, "=")
		if !known[name] {
			return fmt.Errorf("unknown flag --%s", name)
		}
	}
	return nil
}

// Every value in values.yaml is documented: a comment right above it, and
// its dotted path in README.md.
func TestValuesDocumented(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(chartDir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var vals map[string]any
	if err := sigyaml.Unmarshal(raw, &vals); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(raw), "\n")
	for _, path := range leaves("", vals) {
		if !strings.Contains(string(readme), "`"+path+"`") {
			t.Errorf("README.md does not document `%s`", path)
		}
		if !commented(lines, path) {
			t.Errorf("values.yaml: %s has no comment above it", path)
		}
	}
}

func leaves(prefix string, m map[string]any) []string {
	var out []string
	for k, v := range m {
		p := strings.TrimPrefix(prefix+"."+k, ".")
		if sub, ok := v.(map[string]any); ok && len(sub) > 0 {
			out = append(out, leaves(p, sub)...)
			continue
		}
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}

// commented finds the key path's last element in values.yaml at the
// indentation of its depth with a "# " comment on the line before.
func commented(lines []string, path string) bool {
	parts := strings.Split(path, ".")
	key := strings.Repeat("  ", len(parts)-1) + parts[len(parts)-1] + ":"
	for i, l := range lines {
		if strings.HasPrefix(l, key) && i > 0 && strings.HasPrefix(strings.TrimSpace(lines[i-1]), "#") {
			return true
		}
	}
	return false
}
