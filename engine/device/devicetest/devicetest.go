// Package devicetest runs tests of GPU memory paths on the CUDA driver test
// double (engine/device/fakecuda): it builds the double, points
// MC_CUDA_DRIVER at it, and drives its hooks (armed failures, call counts).
// Import it from tests only.
package devicetest

// #cgo LDFLAGS: -ldl
// #include <dlfcn.h>
// #include <stdlib.h>
// static void *mc_hook(const char *lib, const char *name) {
//     void *h = dlopen(lib, RTLD_NOW | RTLD_NOLOAD);
//     return h ? dlsym(h, name) : NULL;
// }
// static int mc_call_calls(void *f, const char *name) { return ((int (*)(const char *))f)(name); }
// static void mc_call_fail(void *f, const char *name, int nth, int code) {
//     ((void (*)(const char *, int, int))f)(name, nth, code);
// }
// static void mc_call_reset(void *f) { ((void (*)(void))f)(); }
// static int mc_open_elsewhere(const char *lib) { return dlopen(lib, RTLD_NOW | RTLD_LOCAL) != NULL; }
import "C"

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"unsafe"

	"github.com/mooncake-go/mooncake/engine/device"
)

// Setup builds the double into dir and points MC_CUDA_DRIVER at it (for
// this process and the processes it starts), unless MC_CUDA_DRIVER names a
// driver already. Call it from TestMain before anything loads a driver.
func Setup(dir string) error {
	if os.Getenv("MC_CUDA_DRIVER") != "" {
		return nil
	}
	_, file, _, _ := runtime.Caller(0)
	script := filepath.Join(filepath.Dir(file), "..", "fakecuda", "build.sh")
	if out, err := exec.Command("bash", script, dir).CombinedOutput(); err != nil {
		return fmt.Errorf("devicetest: build the CUDA test double: %v\n%s", err, out)
	}
	return os.Setenv("MC_CUDA_DRIVER", filepath.Join(dir, "libfakecuda.so"))
}

// Run runs a test binary's tests on the double: it builds it into a
// temporary directory (Setup), runs m, removes the directory and returns
// m's exit code. checks run after passing tests (a leak check), each
// failing the run with its error. A TestMain is then
//
//	func TestMain(m *testing.M) { os.Exit(devicetest.Run(m)) }
func Run(m *testing.M, checks ...func() error) int {
	dir, err := os.MkdirTemp("", "mc-fakecuda-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "devicetest:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	if err := Setup(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	code := m.Run()
	for _, check := range checks {
		if code != 0 {
			break
		}
		if err := check(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	return code
}

// Driver loads the driver (the double after Setup).
func Driver() (*device.Driver, error) { return device.Load() }

func hook(name string) (unsafe.Pointer, error) {
	lib := C.CString(os.Getenv("MC_CUDA_DRIVER"))
	defer C.free(unsafe.Pointer(lib))
	n := C.CString(name)
	defer C.free(unsafe.Pointer(n))
	f := C.mc_hook(lib, n)
	if f == nil {
		return nil, fmt.Errorf("devicetest: %s: not the test double, or not loaded (call Driver first)", name)
	}
	return f, nil
}

// Fail arms the nth call from now (1: the next) of the driver entry point
// name (e.g. "cuMemcpy") to fail with code (0: CUDA_ERROR_UNKNOWN).
func Fail(name string, nth, code int) error {
	f, err := hook("fakecuda_fail")
	if err != nil {
		return err
	}
	n := C.CString(name)
	defer C.free(unsafe.Pointer(n))
	C.mc_call_fail(f, n, C.int(nth), C.int(code))
	return nil
}

// Calls counts the calls of entry point name so far.
func Calls(name string) (int, error) {
	f, err := hook("fakecuda_calls")
	if err != nil {
		return 0, err
	}
	n := C.CString(name)
	defer C.free(unsafe.Pointer(n))
	return int(C.mc_call_calls(f, n)), nil
}

// Reset clears the counts and armed failures.
func Reset() error {
	f, err := hook("fakecuda_reset")
	if err != nil {
		return err
	}
	C.mc_call_reset(f)
	return nil
}

// Double reports whether the driver loaded is the test double (its hooks
// answer). On a GPU host with MC_CUDA_DRIVER=libcuda.so.1 it is not.
func Double() bool {
	_, err := hook("fakecuda_calls")
	return err == nil
}

// RequireDouble skips t on a real driver: t arms the double's failures,
// counts its calls or sets its knobs.
func RequireDouble(t testing.TB) {
	t.Helper()
	if _, err := Driver(); err == nil && !Double() {
		t.Skip("needs the CUDA driver test double (failure and call-count hooks); this is a real driver")
	}
}

// RequireGPUs skips t on a driver with fewer than n GPUs (the double has
// 2 unless told otherwise; a GPU host may have 1).
func RequireGPUs(t testing.TB, n int) {
	t.Helper()
	d, err := Driver()
	if err != nil {
		t.Fatalf("devicetest: %v", err)
	}
	if d.Devices() < n {
		t.Skipf("needs %d GPUs; the driver (%s) has %d", n, d.Path(), d.Devices())
	}
}

// LoadElsewhere opens the driver MC_CUDA_DRIVER names as a framework
// that uses CUDA would, not through package device.
func LoadElsewhere() error {
	if os.Getenv("MC_CUDA_DRIVER") == "" {
		return fmt.Errorf("devicetest: MC_CUDA_DRIVER names no driver (Setup)")
	}
	lib := C.CString(os.Getenv("MC_CUDA_DRIVER"))
	defer C.free(unsafe.Pointer(lib))
	if C.mc_open_elsewhere(lib) == 0 {
		return fmt.Errorf("devicetest: dlopen %s failed", os.Getenv("MC_CUDA_DRIVER"))
	}
	return nil
}
