package device_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"unsafe"

	"github.com/mooncake-go/mooncake/engine/device"
	"github.com/mooncake-go/mooncake/engine/device/devicetest"
)

// With MC_DEVICE_CHILD set the test binary checks one thing about loading
// in a fresh process (a driver is loaded once per process) and exits.
func TestMain(m *testing.M) {
	if mode := os.Getenv("MC_DEVICE_CHILD"); mode != "" {
		if err := child(mode); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(devicetest.Run(m))
}

func child(mode string) error {
	switch mode {
	case "nodriver":
		for range 2 { // the failure is remembered, and said the same way
			d, err := device.Load()
			if d != nil || !errors.Is(err, device.ErrNoDriver) {
				return fmt.Errorf("Load without a driver: %v, %v", d, err)
			}
		}
		if device.Present() != nil {
			return errors.New("Present without a driver found one")
		}
	case "present":
		if device.Present() != nil {
			return errors.New("Present loaded the driver")
		}
		if _, err := device.Load(); err != nil {
			return err
		}
		if device.Present() == nil {
			return errors.New("Present did not find the loaded driver")
		}
	case "later":
		// Nothing new loaded: Present does not look again; the driver
		// loaded by another (a framework) is found at the next call.
		if device.Present() != nil {
			return errors.New("Present found a driver nobody loaded")
		}
		n := device.Probes()
		for range 3 {
			if device.Present() != nil {
				return errors.New("Present found a driver nobody loaded")
			}
		}
		if device.Probes() != n {
			return fmt.Errorf("Present looked %d more times with nothing loaded since", device.Probes()-n)
		}
		// Another driver named: looked for once.
		drv := os.Getenv("MC_CUDA_DRIVER")
		os.Setenv("MC_CUDA_DRIVER", "/nonexistent/libcuda.so.1")
		for range 2 {
			if device.Present() != nil {
				return errors.New("Present found a driver that does not exist")
			}
		}
		if device.Probes() != n+1 {
			return fmt.Errorf("another driver named: %d looks, want 1", device.Probes()-n)
		}
		os.Setenv("MC_CUDA_DRIVER", drv)
		if err := devicetest.LoadElsewhere(); err != nil {
			return err
		}
		if device.Present() == nil {
			return errors.New("Present did not find the driver another loaded")
		}
	default:
		return fmt.Errorf("unknown mode %q", mode)
	}
	return nil
}

func runChild(t *testing.T, mode string, env ...string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), "MC_DEVICE_CHILD="+mode), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", mode, err, out)
	}
}

// TestLoading: no driver is a clear, remembered error; Present never loads
// a driver, and finds one that is loaded, by Load or by another (looking
// again only once the process has loaded a library since it last looked).
func TestLoading(t *testing.T) {
	devicetest.RequireDouble(t)
	runChild(t, "nodriver", "MC_CUDA_DRIVER=/nonexistent/libcuda.so.1")
	runChild(t, "nodriver", "MC_CUDA_DRIVER=none")
	runChild(t, "nodriver", "MC_CUDA_DRIVER="+os.Getenv("MC_CUDA_DRIVER"), "MC_FAKECUDA_DEVICES=0")
	runChild(t, "present")
	runChild(t, "later")
}

func addr(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

// TestDriver: device memory is found where it is, copied to and from, and
// bad devices and pointers are errors, not crashes.
func TestDriver(t *testing.T) {
	devicetest.RequireDouble(t)
	d, err := device.Load()
	if err != nil {
		t.Fatal(err)
	}
	if d.Devices() != 2 {
		t.Fatalf("%d devices, want the double's 2", d.Devices())
	}
	p, err := d.AllocDevice(1, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer d.FreeDevice(1, p)
	if dev, on, err := d.Locate(p + 4096); err != nil || !on || dev != 1 {
		t.Fatalf("Locate(device) = %d, %v, %v", dev, on, err)
	}
	host := make([]byte, 1<<20)
	if _, on, err := d.Locate(addr(host)); err != nil || on {
		t.Fatalf("Locate(host) = %v, %v", on, err)
	}
	if base, size, err := d.Range(1, p+100); err != nil || base != p || size != 1<<20 {
		t.Fatalf("Range = %#x, %d, %v", base, size, err)
	}
	for i := range host {
		host[i] = byte(i * 7)
	}
	if err := d.Copy(1, p, addr(host), 1<<20); err != nil {
		t.Fatal(err)
	}
	back := make([]byte, 1<<20)
	if err := d.Copy(1, addr(back), p, 1<<20); err != nil {
		t.Fatal(err)
	}
	for i := range back {
		if back[i] != host[i] {
			t.Fatalf("byte %d: %d, want %d", i, back[i], host[i])
		}
	}
	var de *device.Error
	if err := d.Copy(1, addr(back), p, 2<<20); !errors.As(err, &de) || de.Code != 1 {
		t.Fatalf("a copy past the allocation: %v, want CUDA_ERROR_INVALID_VALUE", err)
	}
	if err := d.Copy(2, addr(back), p, 16); !errors.Is(err, device.ErrNoDevice) {
		t.Fatalf("a copy on cuda:2: %v, want ErrNoDevice", err)
	}
	h, err := d.IPCHandle(1, p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.OpenIPC(1, h); !errors.As(err, &de) {
		t.Fatalf("opening one's own IPC handle: %v, want the driver's refusal", err)
	}
}

func TestParseLocation(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want device.Location
		bad  bool
	}{
		{"cuda:0", device.Location{Device: 0, Cuda: true}, false},
		{"cuda:13", device.Location{Device: 13, Cuda: true}, false},
		{"cpu:0", device.Location{}, false},
		{"*", device.Location{}, false},
		{"", device.Location{}, false},
		{"cuda:", device.Location{}, true},
		{"cuda:-1", device.Location{}, true},
		{"cuda:01", device.Location{}, true},
		{"cuda:1x", device.Location{}, true},
	} {
		got, err := device.ParseLocation(tc.in)
		if (err != nil) != tc.bad || got != tc.want {
			t.Errorf("ParseLocation(%q) = %+v, %v", tc.in, got, err)
		}
	}
}
