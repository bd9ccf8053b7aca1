package main

import (
	"os"
	"testing"
)

// envRunAsCLI makes the test binary run as the mooncake command itself, so
// fault tests start real master and node processes (and kill them) without
// building anything first.
const envRunAsCLI = "MC_TEST_RUN_AS_CLI"

func TestMain(m *testing.M) {
	if os.Getenv(envRunAsCLI) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}
