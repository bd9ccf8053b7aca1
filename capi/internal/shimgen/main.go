// Command shimgen writes and checks the forwarders of libmooncake.so.
//
// libmooncake.so is a small C library in front of the Go one
// (libmooncake_go.so): it starts no runtime when loaded, and loads the Go
// library at its first call (capi/loader.c). Its public functions
// (capi/shim.c) call the Go exports (mcgo*) through forwarders, one per
// export, which this command generates from the header cgo writes for the
// Go library, so a new //export needs no step by hand:
//
//	shimgen forward -o mcgo_forward.c -go libmooncake_go.so libmooncake_go.h
//
// Each forwarder loads the Go library if it is not yet (once per process)
// and calls the export through a pointer dlsym resolved. The file also
// holds the GNU build ID of the Go library, by which the loader tells the
// Go library of its own build from another. When the library
// cannot run in this process (it was started before a fork, or it failed to
// load) the forwarder answers as its API answers a failure instead.
//
//	shimgen check -lib libmooncake.so -go libmooncake_go.so -exports libmooncake_go.h include/*.h
//
// fails when the function symbols libmooncake.so defines are not exactly
// the functions the public headers declare, or when the Go library lacks
// an export the forwarders resolve: scripts/build-capi.sh runs it after
// every build, so a missing forwarder or definition fails the build.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "forward":
		err = forwardCmd(os.Args[2:])
	case "check":
		err = checkCmd(os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "shimgen:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: shimgen forward -o OUT.c -go GO.so CGO_HEADER\n       shimgen check -lib PUBLIC.so -go GO.so -exports CGO_HEADER HEADER.h...")
	os.Exit(2)
}

func forwardCmd(args []string) error {
	fs := flag.NewFlagSet("forward", flag.ExitOnError)
	out := fs.String("o", "", "the C file to write")
	golib := fs.String("go", "", "the Go library, whose build ID the loader checks")
	_ = fs.Parse(args)
	if *out == "" || *golib == "" || fs.NArg() != 1 {
		usage()
	}
	id, err := buildID(*golib)
	if err != nil {
		return err
	}
	src, err := os.ReadFile(fs.Arg(0))
	if err != nil {
		return err
	}
	exports, err := parseExports(string(src))
	if err != nil {
		return fmt.Errorf("%s: %w", fs.Arg(0), err)
	}
	code, err := forwarders(exports, filepath.Base(fs.Arg(0)), id)
	if err != nil {
		return fmt.Errorf("%s: %w", fs.Arg(0), err)
	}
	return os.WriteFile(*out, code, 0o644)
}

func checkCmd(args []string) error {
	fs := flag.NewFlagSet("check", flag.ExitOnError)
	lib := fs.String("lib", "", "the public library (libmooncake.so)")
	golib := fs.String("go", "", "the Go library (libmooncake_go.so)")
	exportsHeader := fs.String("exports", "", "the header cgo wrote for the Go library")
	_ = fs.Parse(args)
	if *lib == "" || *golib == "" || *exportsHeader == "" || fs.NArg() == 0 {
		usage()
	}
	src, err := os.ReadFile(*exportsHeader)
	if err != nil {
		return err
	}
	exports, err := parseExports(string(src))
	if err != nil {
		return fmt.Errorf("%s: %w", *exportsHeader, err)
	}
	declared := map[string]string{} // function -> header
	for _, h := range fs.Args() {
		src, err := os.ReadFile(h)
		if err != nil {
			return err
		}
		for _, name := range declaredFunctions(string(src)) {
			declared[name] = h
		}
	}
	return check(*lib, *golib, exports, declared)
}
