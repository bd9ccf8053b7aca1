package engine_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/mooncake-go/mooncake/engine"
	"github.com/mooncake-go/mooncake/engine/device/devicetest"
	"github.com/mooncake-go/mooncake/engine/transport"
	"github.com/mooncake-go/mooncake/internal/crc32c"
)

// The test binary doubles as a target process for tests that kill or stop
// their peer: with MC_TEST_TARGET set it serves a buffer until stdin closes.
//
// GPU memory is the CUDA driver test double's (devicetest), built for the
// run; a child of the run finds it through MC_CUDA_DRIVER.
func TestMain(m *testing.M) {
	if os.Getenv("MC_TEST_TARGET") != "" {
		os.Exit(runTarget())
	}
	if os.Getenv("MC_TEST_NODRIVER") != "" {
		os.Exit(registerWithoutDriver())
	}
	os.Exit(devicetest.Run(m, func() error { return goleak.Find() }))
}

// targetInfo is what a target process prints on its first stdout line.
type targetInfo struct {
	Name string `json:"name"`
	Addr uint64 `json:"addr"` // memfd buffer from AllocateBuffer
	Len  int    `json:"len"`
	Anon uint64 `json:"anon"` // plain anonymous mapping, AnonLen bytes
}

// AnonLen is the size of the target's anonymous registered region.
const AnonLen = 1 << 20

func runTarget() int {
	targetMetrics = prometheus.NewRegistry()
	e, err := engine.New(context.Background(), engine.Config{Host: "127.0.0.1", Transport: os.Getenv("MC_TEST_TARGET"),
		Secret: os.Getenv("MC_TEST_SECRET"), Registerer: targetMetrics})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer e.Close()
	buf, err := e.AllocateBuffer(context.Background(), 64<<20, "cpu:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	anon, err := unix.Mmap(-1, 0, AnonLen, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := e.RegisterMemory(context.Background(), engine.AddrOf(anon), AnonLen, "cpu:0", true); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	json.NewEncoder(os.Stdout).Encode(targetInfo{Name: e.Name(), Addr: uint64(buf.Addr()), Len: buf.Len(), Anon: uint64(engine.AddrOf(anon))})
	// Commands on stdin, until it closes, each answered with one line:
	//   unregister        drops the anonymous region -> ok
	//   alloc N           AllocateBuffer(N) -> its address
	//   register N        maps N anonymous bytes and registers them -> address
	//   free ADDR         frees or unregisters what alloc/register made -> ok
	//   sum ADDR N        CRC-32C of the target's own bytes there -> hex
	//   gpu DEV N [OFF]   allocates OFF+N bytes on GPU DEV and registers
	//                     the N from OFF on -> address
	//   gpufill DEV ADDR N SEED  writes pattern(N, SEED) there -> ok
	//   gpusum DEV ADDR N CRC-32C of GPU bytes there -> hex
	//   gpufree DEV ADDR  unregisters ADDR and frees its allocation -> ok
	//   served            bytes served to peers over TCP so far -> decimal
	// Freed anonymous memory stays mapped, so an initiator that wrote into
	// it through a stale view would be caught by sum.
	bufs := map[uint64]*engine.Buffer{}
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) == 0 {
			continue
		}
		answer, err := targetCommand(e, bufs, anon, f)
		if err != nil {
			fmt.Fprintln(os.Stderr, in.Text()+":", err)
			return 1
		}
		fmt.Println(answer)
	}
	return 0
}

func targetCommand(e *engine.Engine, bufs map[uint64]*engine.Buffer, anon []byte, f []string) (string, error) {
	arg := func(i int) uint64 {
		if i >= len(f) {
			return 0
		}
		v, _ := strconv.ParseUint(f[i], 0, 64)
		return v
	}
	switch f[0] {
	case "unregister":
		return "ok", e.UnregisterMemory(context.Background(), engine.AddrOf(anon))
	case "alloc":
		b, err := e.AllocateBuffer(context.Background(), int(arg(1)), "cpu:0")
		if err != nil {
			return "", err
		}
		bufs[uint64(b.Addr())] = b
		return fmt.Sprintf("%#x", b.Addr()), nil
	case "register":
		m, err := unix.Mmap(-1, 0, int(arg(1)), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("%#x", engine.AddrOf(m)), e.RegisterMemory(context.Background(), engine.AddrOf(m), uint64(len(m)), "cpu:0", true)
	case "free":
		if b := bufs[arg(1)]; b != nil {
			delete(bufs, arg(1))
			return "ok", b.Free()
		}
		return "ok", e.UnregisterMemory(context.Background(), uintptr(arg(1)))
	case "sum":
		return fmt.Sprintf("%#x", crc32c.Checksum(transport.Bytes(uintptr(arg(1)), arg(2)))), nil
	case "gpu", "gpufill", "gpusum", "gpufree":
		return gpuCommand(e, f[0], int(arg(1)), arg)
	case "served":
		return servedBytes()
	}
	return "", fmt.Errorf("unknown command")
}

// targetMetrics is the target process's engine's registry.
var targetMetrics *prometheus.Registry

// gpuCommand runs a target's command on GPU dev's memory (the driver test
// double's).
func gpuCommand(e *engine.Engine, cmd string, dev int, arg func(int) uint64) (string, error) {
	drv, err := devicetest.Driver()
	if err != nil {
		return "", err
	}
	switch cmd {
	case "gpu":
		base, err := drv.AllocDevice(dev, arg(3)+arg(2))
		if err != nil {
			return "", err
		}
		p := base + uintptr(arg(3))
		return fmt.Sprintf("%#x", p), e.RegisterMemory(context.Background(), p, arg(2), fmt.Sprintf("cuda:%d", dev), true)
	case "gpufill":
		b := pattern(int(arg(3)), byte(arg(4)))
		return "ok", drv.Copy(dev, uintptr(arg(2)), engine.AddrOf(b), arg(3))
	case "gpusum":
		b := make([]byte, arg(3))
		if err := drv.Copy(dev, engine.AddrOf(b), uintptr(arg(2)), arg(3)); err != nil {
			return "", err
		}
		return fmt.Sprintf("%#x", crc32c.Checksum(b)), nil
	}
	base, _, err := drv.Range(dev, uintptr(arg(2)))
	if err != nil {
		return "", err
	}
	if err := e.UnregisterMemory(context.Background(), uintptr(arg(2))); err != nil {
		return "", err
	}
	return "ok", drv.FreeDevice(dev, base)
}

// servedBytes sums the target's mooncake_te_served_bytes_total.
func servedBytes() (string, error) {
	mfs, err := targetMetrics.Gather()
	if err != nil {
		return "", err
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() != "mooncake_te_served_bytes_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			n += m.GetCounter().GetValue()
		}
	}
	return fmt.Sprint(uint64(n)), nil
}
