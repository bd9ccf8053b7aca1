// Package grafana checks the dashboard (mooncake.json) against a running
// cluster: every metric its queries name must be one the processes export.
package grafana

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"
)

// dashboardExprs are the PromQL expressions of every panel's targets.
func dashboardExprs(t *testing.T) []string {
	t.Helper()
	raw, err := os.ReadFile("mooncake.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	var exprs []string
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			if strings.TrimSpace(tg.Expr) == "" {
				t.Fatalf("panel %q has a target without an expression", p.Title)
			}
			exprs = append(exprs, tg.Expr)
		}
	}
	return exprs
}

var (
	strLit    = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'`)
	matchers  = regexp.MustCompile(`\{[^}]*\}`)
	ranges    = regexp.MustCompile(`\[[^\]]*\]`)
	grouping  = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	ident     = regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*`)
	promWords = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true,
		"group_right": true, "and": true, "or": true, "unless": true, "bool": true, "offset": true, "inf": true, "nan": true}
)

// metricNames are the metric names a PromQL expression selects: the
// identifiers left once strings, label matchers, ranges and grouping
// clauses are removed, less functions (an identifier before "(") and
// keywords.
func metricNames(expr string) []string {
	e := strLit.ReplaceAllString(expr, `""`)
	e = matchers.ReplaceAllString(e, " ")
	e = ranges.ReplaceAllString(e, " ")
	e = grouping.ReplaceAllString(e, " ")
	var names []string
	for _, loc := range ident.FindAllStringIndex(e, -1) {
		name := e[loc[0]:loc[1]]
		rest := strings.TrimLeft(e[loc[1]:], " \t\n")
		if strings.HasPrefix(rest, "(") || promWords[strings.ToLower(name)] {
			continue
		}
		if loc[0] > 0 && (e[loc[0]-1] >= '0' && e[loc[0]-1] <= '9' || e[loc[0]-1] == '.') {
			continue // the exponent or unit of a number (1e3)
		}
		names = append(names, name)
	}
	return names
}

func TestMetricNamesExtraction(t *testing.T) {
	got := metricNames(`sum by (instance, op) (rate(a_total{job=~"x|y", le="0.5"}[5m])) / on (instance) group_left b_bytes * 1e3 + histogram_quantile(0.99, sum by (le) (rate(c_bucket[$__rate_interval]))) and bool d`)
	want := []string{"a_total", "b_bytes", "c_bucket", "d"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("metricNames: %q, want %q", got, want)
	}
}

// missing are the dashboard's metric names no endpoint exports.
func missing(exprs []string, exported map[string]bool) []string {
	seen := map[string]bool{}
	var out []string
	for _, e := range exprs {
		for _, n := range metricNames(e) {
			if !exported[n] && !seen[n] {
				seen[n] = true
				out = append(out, n)
			}
		}
	}
	sort.Strings(out)
	return out
}

// proc is a started mooncake process whose stdout lines are read as they
// come.
type proc struct {
	cmd   *exec.Cmd
	lines chan string
}

func start(t *testing.T, bin string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, lines: make(chan string, 64)}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
	}()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("mooncake %s stderr:\n%s", args[0], tail(string(b), 3000))
		}
	})
	return p
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// until reads lines until one starts with prefix (collecting all of them).
func (p *proc) until(t *testing.T, prefix string) []string {
	t.Helper()
	var got []string
	deadline := time.After(60 * time.Second)
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				t.Fatalf("%s exited before %q; its output: %q", p.cmd.Args[1], prefix, got)
			}
			got = append(got, l)
			if strings.HasPrefix(l, prefix) {
				return got
			}
		case <-deadline:
			t.Fatalf("%s: no %q within 60s; output: %q", p.cmd.Args[1], prefix, got)
		}
	}
}

func field(line, key string) string {
	for _, f := range strings.Fields(line) {
		if v, ok := strings.CutPrefix(f, key+"="); ok {
			return v
		}
	}
	return ""
}

// scrape returns the metric names of a /metrics page (series names, so a
// histogram's _bucket, _sum and _count).
func scrape(t *testing.T, url string, into map[string]bool) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	n := 0
	for _, l := range strings.Split(string(body), "\n") {
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		name := l[:strings.IndexAny(l, "{ ")]
		into[name] = true
		n++
	}
	if n == 0 {
		t.Fatalf("GET %s: no series", url)
	}
}

func status(t *testing.T, url string) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func build(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "mooncake")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/mooncake")
	cmd.Dir = "../.."
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building mooncake: %v\n%s", err, out)
	}
	return bin
}

// A cluster of real processes (mooncake up: etcd, a leader and a standby
// master, a node; a storage node with its HTTP server; the Conductor
// following the store), some traffic (a store benchmark's puts and gets, a
// completion the Conductor refuses for want of instances), then every
// metric the dashboard queries must be on one of their /metrics pages.
// It also checks what the Helm chart's master readiness probe relies on:
// /readyz is 200 on the leader, 503 on the standby.
func TestDashboardMetricsExported(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster")
	}
	exprs := dashboardExprs(t)
	bin := build(t)

	up := start(t, bin, "up", "--etcd", "127.0.0.1:0", "--rpc_port", "0", "--metrics_port", "0",
		"--masters", "2", "--nodes", "1", "--global_segment_size", "64MiB")
	var leaderRPC, etcdMaster string
	admins := map[string]string{} // role -> admin address
	for _, l := range up.until(t, "ready") {
		f := strings.Fields(l)
		switch {
		case len(f) > 0 && f[0] == "master":
			role := strings.Trim(f[len(f)-1], "()")
			if a := field(l, "admin"); a != "" && a != "none" {
				admins[role] = a
			}
			if role == "leader" {
				leaderRPC = field(l, "rpc")
			}
		case len(f) > 2 && f[0] == "clients" && f[1] == "--master":
			etcdMaster = f[2]
		}
	}
	if leaderRPC == "" || etcdMaster == "" || admins["leader"] == "" {
		t.Fatalf("mooncake up: leader rpc %q, clients' master %q, admin addresses %v", leaderRPC, etcdMaster, admins)
	}

	node := start(t, bin, "node", "--master", etcdMaster, "--enable_http_server", "--http_port", "0",
		"--local_hostname", "127.0.0.1", "--global_segment_size", "256MiB")
	var nodeHTTP string
	for _, l := range node.until(t, "node ready") {
		if a, ok := strings.CutPrefix(l, "node http addr="); ok {
			nodeHTTP = a
		}
	}
	cond := start(t, bin, "conductor", "--listen", "127.0.0.1:0", "--store-master", leaderRPC)
	lines := cond.until(t, "conductor listening")
	condURL := strings.Fields(strings.TrimPrefix(lines[len(lines)-1], "conductor listening "))[0]

	// Traffic: puts and gets through the store (the benchmark's client).
	bench := exec.Command(bin, "bench", "store", "--master", etcdMaster, "--systems", "ours", "--op", "get",
		"--value-size", "64KiB", "--duration", "1s", "--warmup", "0s", "--repeat", "1", "--topology", "remote")
	if out, err := bench.CombinedOutput(); err != nil {
		t.Fatalf("mooncake bench store: %v\n%s", err, tail(string(out), 3000))
	}
	// A completion the Conductor answers 503 (no instance): its request
	// counter and end-to-end histogram get their first series.
	resp, err := http.Post(condURL+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"m","prompt":"hello","max_tokens":1}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()

	exported := map[string]bool{}
	for _, a := range admins {
		scrape(t, "http://"+a+"/metrics", exported)
	}
	scrape(t, "http://"+nodeHTTP+"/metrics", exported)
	scrape(t, condURL+"/metrics", exported)

	if m := missing(exprs, exported); len(m) > 0 {
		t.Errorf("the dashboard queries metrics no process exports: %q", m)
	}
	// The negative control: a name nothing exports is reported.
	if m := missing([]string{`rate(mooncake_no_such_metric_total[1m])`}, exported); len(m) != 1 {
		t.Errorf("missing() did not report an unexported metric: %q", m)
	}
	n := 0
	for _, e := range exprs {
		n += len(metricNames(e))
	}
	if n < 20 {
		t.Errorf("only %d metric references found in %d expressions: the extractor is broken", n, len(exprs))
	}

	if got := status(t, "http://"+admins["leader"]+"/readyz"); got != http.StatusOK {
		t.Errorf("leader /readyz: %d, want 200 (the chart's readiness probe)", got)
	}
	if a := admins["standby"]; a != "" {
		if got := status(t, "http://"+a+"/readyz"); got != http.StatusServiceUnavailable {
			t.Errorf("standby /readyz: %d, want 503 (the chart's readiness probe)", got)
		}
	} else {
		t.Errorf("mooncake up printed no standby admin address: %v", admins)
	}
}
