// Package fakecuda holds the CUDA driver test double (fakecuda.c), a C
// library that implements the driver entry points the engine uses over
// host memory, and its self-test (selftest.c). There is no Go code here
// beyond this test, which builds both with gcc and runs every case of the
// self-test, each in a fresh process; see README.md.
package fakecuda

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// build compiles the double from src (a path to fakecuda.c or a variant
// of it) with build.sh's flags, and the self-test, into a temporary
// directory; it returns their paths.
func build(t *testing.T, src string) (lib, selftest string) {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Fatalf("the CUDA driver double needs gcc: %v", err)
	}
	here, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	lib = filepath.Join(dir, "libfakecuda.so")
	if src == "" {
		run(t, "bash", filepath.Join(here, "build.sh"), dir)
	} else {
		// A variant lives elsewhere: -I lets its "../cudaabi.h" resolve.
		run(t, "gcc", "-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-fvisibility=hidden", "-pthread",
			"-I", here, "-o", lib, src)
	}
	selftest = filepath.Join(dir, "selftest")
	run(t, "gcc", "-O2", "-Wall", "-Wextra", "-Werror", "-pthread", "-o", selftest,
		filepath.Join(here, "selftest.c"), "-ldl")
	return lib, selftest
}

func run(t *testing.T, name string, args ...string) []byte {
	t.Helper()
	out, err := exec.CommandContext(t.Context(), name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return out
}

// cases lists the self-test's cases.
func cases(t *testing.T, lib, selftest string) []string {
	t.Helper()
	names := strings.Fields(string(run(t, selftest, lib, "-list")))
	if len(names) == 0 {
		t.Fatal("the self-test lists no cases")
	}
	return names
}

// TestSelftest runs every rule of the double (README.md) as a subtest:
// devices and contexts, copies and their bounds, CPU faults on device
// memory, IPC between two processes, failure injection, threads.
func TestSelftest(t *testing.T) {
	lib, selftest := build(t, "")
	for _, name := range cases(t, lib, selftest) {
		t.Run(name, func(t *testing.T) {
			cmd := exec.CommandContext(t.Context(), selftest, lib, name)
			// The self-test sets each case's knobs itself; none leak in.
			cmd.Env = withoutKnobs(os.Environ())
			out, err := cmd.CombinedOutput()
			if err != nil || !bytes.Contains(out, []byte("ok   "+name)) {
				t.Fatalf("selftest %s: %v\n%s", name, err, out)
			}
		})
	}
}

// TestSelftestCatchesBrokenRules builds variants of the double that each
// break one rule and checks that the self-test fails the case guarding it,
// so that a regression in the double cannot pass unseen.
func TestSelftestCatchesBrokenRules(t *testing.T) {
	src, err := os.ReadFile("fakecuda.c")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		old, new string // the edit that breaks the rule
		fails    string // the case that must catch it
	}{
		// Device memory readable and writable by the CPU.
		{"cpu can touch device memory", "mmap(NULL, mapped, PROT_NONE, MAP_SHARED", "mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_SHARED", "cpu_faults"},
		// A copy may run past the end of its allocation.
		{"no bounds on copies", " || n > g->size - (p - g->base)", "", "copies"},
		// A handle opens in the process that made it.
		{"own handle opens", "if (w.pid == getpid())", "if (0)", "ipc"},
		// Armed failures never fire.
		{"no injected failures", "r = armed[i].code;", "r = MC_CUDA_SUCCESS;", "fail_env"},
		// Copies into device memory complete on return (the real driver's
		// may still be running).
		{"device copies synchronous", "if (to_device && !from_pinned)", "if (0 && to_device && !from_pinned)", "legacy_stream"},
		// A queued copy reads a pageable source when it lands, not at the call.
		{"pageable source not staged", "queue_locked(d, s, n, !from_device);", "queue_locked(d, s, n, 0 && !from_device);", "legacy_stream"},
		// One current context for all threads.
		{"context not per thread", "static __thread CUcontext current;", "static CUcontext current;", "contexts"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			broken := strings.Replace(string(src), tc.old, tc.new, 1)
			if broken == string(src) {
				t.Fatalf("the edit %q no longer applies to fakecuda.c", tc.old)
			}
			path := filepath.Join(t.TempDir(), "fakecuda.c")
			if err := os.WriteFile(path, []byte(broken), 0o644); err != nil {
				t.Fatal(err)
			}
			lib, selftest := build(t, path)
			cmd := exec.CommandContext(t.Context(), selftest, lib, tc.fails)
			cmd.Env = withoutKnobs(os.Environ())
			out, err := cmd.CombinedOutput()
			if err == nil || !bytes.Contains(out, []byte("FAIL "+tc.fails)) {
				t.Fatalf("selftest %s passed a double with %s: %v\n%s", tc.fails, tc.name, err, out)
			}
		})
	}
}

func withoutKnobs(env []string) []string {
	var kept []string
	for _, kv := range env {
		if !strings.HasPrefix(kv, "MC_FAKECUDA_") {
			kept = append(kept, kv)
		}
	}
	return kept
}
