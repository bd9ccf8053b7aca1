package engine_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/mooncake-go/mooncake/engine"
)

// The test binary doubles as a target process for tests that kill or stop
// their peer: with MC_TEST_TARGET set it serves a buffer until stdin closes.
func TestMain(m *testing.M) {
	if os.Getenv("MC_TEST_TARGET") != "" {
		os.Exit(runTarget())
	}
	goleak.VerifyTestMain(m)
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
	e, err := engine.New(engine.Config{Host: "127.0.0.1", Transport: os.Getenv("MC_TEST_TARGET"), Secret: os.Getenv("MC_TEST_SECRET")})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer e.Close()
	buf, err := e.AllocateBuffer(64<<20, "cpu:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	anon, err := unix.Mmap(-1, 0, AnonLen, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := e.RegisterMemory(engine.AddrOf(anon), AnonLen, "cpu:0", true); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	json.NewEncoder(os.Stdout).Encode(targetInfo{Name: e.Name(), Addr: uint64(buf.Addr()), Len: buf.Len(), Anon: uint64(engine.AddrOf(anon))})
	// Commands on stdin, until it closes: "unregister" drops the anonymous
	// region and answers "ok".
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		if in.Text() == "unregister" {
			if err := e.UnregisterMemory(engine.AddrOf(anon)); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			fmt.Println("ok")
		}
	}
	return 0
}
