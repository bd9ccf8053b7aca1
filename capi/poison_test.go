package main

import (
	"errors"
	"strings"
	"testing"
)

// A panic in a call on a handle poisons that handle: the call fails with
// MC_ERR_PANIC, every later call on the handle is refused with
// MC_ERR_PANIC without running, other handles carry on, and the handle can
// still be destroyed. The panic is injected through onEngine, the body of
// every engine export, which C cannot reach with a function of its own.
func TestPanicPoisonsItsHandle(t *testing.T) {
	h, err := createEngine(nil)
	if err != nil {
		t.Fatalf("createEngine: %v", err)
	}
	other, err := createEngine(nil)
	if err != nil {
		t.Fatalf("createEngine: %v", err)
	}
	defer func() { _ = engines.destroy(other) }()

	st := guard(nil, domainEngine, func() error {
		return onEngine(h, func(*engineObj) error { panic("torn state") })
	})
	if st != statusPanic {
		t.Fatalf("panicking call: status %d, want MC_ERR_PANIC (%d)", st, statusPanic)
	}

	for i := range 2 { // refused every time, not only the first
		ran := false
		err := onEngine(h, func(*engineObj) error { ran = true; return nil })
		var ae *abiError
		if !errors.As(err, &ae) || ae.code != statusPanic {
			t.Fatalf("call %d after the panic: %v, want an MC_ERR_PANIC abiError", i, err)
		}
		if ran {
			t.Fatalf("call %d after the panic ran on the poisoned engine", i)
		}
		if msg := err.Error(); !strings.Contains(msg, "poisoned") || !strings.Contains(msg, "torn state") {
			t.Fatalf("call %d after the panic: message %q does not say the handle is poisoned by the first panic", i, msg)
		}
	}

	if _, err := storeEngine(h); err == nil || !strings.Contains(err.Error(), "poisoned") {
		t.Fatalf("a store over the poisoned engine: %v, want refused as poisoned", err)
	}
	if _, err := storeEngine(other); err != nil {
		t.Fatalf("a store over another engine: %v", err)
	}
	if err := onEngine(other, func(*engineObj) error { return nil }); err != nil {
		t.Fatalf("a call on another engine: %v", err)
	}
	if err := engines.destroy(h); err != nil {
		t.Fatalf("destroying the poisoned engine: %v", err)
	}
	if _, err := engines.of(h); err == nil {
		t.Fatalf("the poisoned engine's handle is still live after its destroy")
	}
}
