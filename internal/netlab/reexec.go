package netlab

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
)

// envChild marks the process Reexec started in a namespace of its own.
const envChild = "MC_NETLAB_CHILD"

// InOwnNamespace reports whether this process is one Reexec started: it
// runs in a network namespace of its own, where a Lab's local host may
// take its address without touching the machine's network. The mark is in
// the environment, which children inherit: the namespace must also differ
// from init's, so that a process started on the machine's network by one
// that was marked is not taken for one.
func InOwnNamespace() bool {
	if os.Getenv(envChild) != "1" {
		return false
	}
	self, err1 := os.Readlink("/proc/self/ns/net")
	init, err2 := os.Readlink("/proc/1/ns/net")
	return err1 != nil || err2 != nil || self != init
}

// Reexec runs this program again, with the same arguments and standard
// streams, in a new network namespace, and returns its exit status. The
// child finds InOwnNamespace true and calls UpLoopback first. It dies with
// this process.
func Reexec() (int, error) {
	exe, err := os.Executable()
	if err != nil {
		return 2, fmt.Errorf("netlab: %w", err)
	}
	cmd := exec.Command(exe, os.Args[1:]...)
	cmd.Env = append(os.Environ(), envChild+"=1")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL}
	err = cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, nil
	case errors.As(err, &ee) && ee.ExitCode() >= 0:
		return ee.ExitCode(), nil
	default:
		return 2, fmt.Errorf("netlab: run in a new network namespace: %w", err)
	}
}

// UpLoopback brings the loopback interface of this process's namespace up
// (a new namespace starts with it down).
func UpLoopback() error {
	if out, err := exec.Command("ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
		return fmt.Errorf("netlab: loopback up: %w: %s", err, out)
	}
	return nil
}
