package layering

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/mooncake-go/mooncake/"

// forbidden are the packages no client-side root may depend on, with why
// each is server-side only. A prefix also covers the packages under it.
var forbidden = []struct{ prefix, what string }{
	{module + "store/master", "the master: gRPC service, journal, eviction, admin HTTP"},
	{module + "store/ha", "the masters' leader election in etcd"},
	{module + "store/cluster", "the all-in-one store that starts etcd, masters and nodes"},
	{module + "internal/embedetcd", "the embedded etcd server of tests and the cluster"},
	{"go.etcd.io/etcd/server", "etcd's server"},
}

// roots are the client-side packages: what libmooncake.so links, and what
// every Go client of the store imports.
var roots = []string{
	module + "capi",
	module + "store/client",
}

// graph returns the import graph below pkg, as go list resolves it for
// this module: each package and the packages it imports.
func graph(t *testing.T, pkg string) map[string][]string {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to list dependencies: %v", err)
	}
	cmd := exec.Command(gobin, "list", "-deps", "-f", `{{.ImportPath}} {{join .Imports " "}}`, pkg)
	// capi is cgo only: without cgo go list finds no Go files in it. Listing
	// compiles nothing, so no C compiler is needed.
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v\n%s", pkg, err, stderr.String())
	}
	g := map[string][]string{}
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		g[f[0]] = f[1:]
	}
	if _, ok := g[pkg]; !ok {
		t.Fatalf("go list -deps %s does not list the package itself", pkg)
	}
	return g
}

// chain returns the shortest import chain from root to a package under
// prefix, or nil when root reaches none.
func chain(g map[string][]string, root, prefix string) []string {
	under := func(p string) bool { return p == prefix || strings.HasPrefix(p, prefix+"/") }
	from := map[string]string{root: ""}
	for queue := []string{root}; len(queue) > 0; queue = queue[1:] {
		p := queue[0]
		if under(p) {
			var c []string
			for ; p != ""; p = from[p] {
				c = append([]string{strings.TrimPrefix(p, module)}, c...)
			}
			return c
		}
		for _, q := range g[p] {
			if _, seen := from[q]; !seen {
				from[q] = p
				queue = append(queue, q)
			}
		}
	}
	return nil
}

// TestClientSideLinksNoServer fails when a client-side package reaches a
// server-side one, naming the import chain that does.
func TestClientSideLinksNoServer(t *testing.T) {
	for _, root := range roots {
		t.Run(strings.TrimPrefix(root, module), func(t *testing.T) {
			g := graph(t, root)
			for _, f := range forbidden {
				if c := chain(g, root, f.prefix); c != nil {
					t.Errorf("%s must not link %s (%s): %s",
						strings.TrimPrefix(root, module), strings.TrimPrefix(f.prefix, module), f.what, strings.Join(c, " -> "))
				}
			}
		})
	}
}

// TestForbiddenPackagesExist keeps the check above from passing for a
// wrong reason: the server side (store/cluster) reaches every forbidden
// package, so a renamed or mistyped one fails here.
func TestForbiddenPackagesExist(t *testing.T) {
	root := module + "store/cluster"
	g := graph(t, root)
	for _, f := range forbidden {
		if chain(g, root, f.prefix) == nil {
			t.Errorf("store/cluster reaches no package under %s: is the forbidden list stale?", f.prefix)
		}
	}
}
