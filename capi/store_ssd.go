package main

/*
#include <stdlib.h>
*/
import "C"

import (
	"fmt"
	"strconv"
	"strings"
	"unsafe"

	"github.com/mooncake-go/mooncake/store/client"
)

// The SSD tier of a store made through the C ABI comes from the
// environment, as Mooncake's client takes its offload settings from
// MOONCAKE_OFFLOAD_*: read when the store is made, from the process's
// environment as it is then (getenv, so a host's setenv or Python's
// os.environ after the library loaded counts; Go's own copy of the
// environment would not see them).
//
//	MOONCAKE_ENABLE_SSD_OFFLOAD (or MOONCAKE_OFFLOAD_ENABLED)  true/1/yes: a tier
//	MOONCAKE_OFFLOAD_FILE_STORAGE_PATH                         its directory (required then)
//	MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES                    its size; default 16 GiB
const defaultSSDSize = 16 << 30

// liveEnv is getenv(name): the environment as it is now.
func liveEnv(name string) string {
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	return C.GoString(C.getenv(cs))
}

func envTrue(v string) bool {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "1", "true", "yes", "on":
		return true
	}
	return false
}

// ssdFromEnv sets cfg's SSD tier from the environment (see above).
func ssdFromEnv(cfg *client.Config) error {
	if !envTrue(liveEnv("MOONCAKE_ENABLE_SSD_OFFLOAD")) && !envTrue(liveEnv("MOONCAKE_OFFLOAD_ENABLED")) {
		return nil
	}
	dir := liveEnv("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH")
	if dir == "" {
		return invalidParams("SSD offload is enabled but MOONCAKE_OFFLOAD_FILE_STORAGE_PATH names no directory")
	}
	size := int64(defaultSSDSize)
	if v := liveEnv("MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES"); v != "" {
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil || n <= 0 {
			return invalidParams("%s", fmt.Sprintf("MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES %q: want a positive byte count", v))
		}
		size = n
	}
	cfg.SSDDir, cfg.SSDSize = dir, size
	return nil
}
