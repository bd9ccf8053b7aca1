package engine_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

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
	Addr uint64 `json:"addr"`
	Len  int    `json:"len"`
}

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
	json.NewEncoder(os.Stdout).Encode(targetInfo{Name: e.Name(), Addr: uint64(buf.Addr()), Len: buf.Len()})
	bufio.NewReader(os.Stdin).ReadString('\n') // until stdin closes
	return 0
}
