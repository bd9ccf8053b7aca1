package shm

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// TestCloseTwice: a second Close releases nothing: the control page's
// descriptor number may belong to another file by then (the engine closes
// its paths early in its Close and again at the end).
func TestCloseTwice(t *testing.T) {
	tr, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	fd := tr.ctrl.FD()
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(os.DevNull) // likely takes the freed number
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if int(f.Fd()) != fd {
		t.Logf("the freed number %d went elsewhere (got %d); checking that one", fd, f.Fd())
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatalf("a second Close closed someone else's file: %v", err)
	}
}
