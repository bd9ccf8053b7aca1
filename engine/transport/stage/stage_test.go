package stage_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"testing"
	"time"
	"unsafe"

	"github.com/mooncake-go/mooncake/engine/device"
	"github.com/mooncake-go/mooncake/engine/device/devicetest"
	"github.com/mooncake-go/mooncake/engine/transport"
	"github.com/mooncake-go/mooncake/engine/transport/stage"
	"github.com/mooncake-go/mooncake/engine/transport/transporttest"
)

// GPU memory is the CUDA driver test double's; the path after the staging
// path is transporttest's fake, which holds slices until the test settles
// them, so the test sees what is staged while nothing has been sent.
func TestMain(m *testing.M) {
	os.Exit(devicetest.Run(m))
}

const slice = 64 << 10

type rig struct {
	drv    *device.Driver
	fake   *transporttest.Fake
	path   *stage.Transport
	peer   transport.Peer
	gpu    uintptr
	remote []byte
}

func newRig(t *testing.T, buffers int) *rig {
	t.Helper()
	drv, err := devicetest.Driver()
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{drv: drv, fake: &transporttest.Fake{}, remote: make([]byte, 8*slice)}
	if r.gpu, err = drv.AllocDevice(0, 8*slice); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { drv.FreeDevice(0, r.gpu) })
	next, err := r.fake.Open(context.Background(), transport.PeerInfo{Name: "peer"})
	if err != nil {
		t.Fatal(err)
	}
	r.path = stage.New(stage.Config{BufferSize: slice, Buffers: buffers})
	t.Cleanup(func() { r.path.Close() })
	if r.peer, err = r.path.Open(context.Background(), transport.PeerInfo{Name: "peer", Next: next}); err != nil {
		t.Fatal(err)
	}
	return r
}

// submit submits slice i of the GPU buffer (op, to the same offset of
// remote); its outcome arrives on the channel.
func (r *rig) submit(op transport.Op, i int, deadline time.Time) chan error {
	done := make(chan error, 1)
	r.peer.Submit(context.Background(), &transport.Slice{Op: op, Local: r.gpu + uintptr(i*slice),
		Remote: uint64(uintptr(unsafe.Pointer(&r.remote[i*slice]))), Length: slice, Deadline: deadline,
		LocalDevice: 1, Done: func(_ *transport.Slice, err error) { done <- err }})
	return done
}

func (r *rig) take(t *testing.T, n int) []*transport.Slice {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sl, err := r.fake.Take(ctx, n)
	if err != nil {
		t.Fatal(err)
	}
	return sl
}

func calls(t *testing.T) int {
	n, err := devicetest.Calls("cuMemcpy")
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestPipeline: every slice of a write is copied off the GPU as it is
// submitted, while none has gone out yet, so the copies of later slices
// overlap the sending of earlier ones; the bytes the next path sends are
// the GPU's. A read's bytes land on the GPU as each answer arrives.
func TestPipeline(t *testing.T) {
	devicetest.RequireDouble(t)
	r := newRig(t, 8)
	want := make([]byte, 8*slice)
	for i := range want {
		want[i] = byte(i*13 + 5)
	}
	if err := r.drv.Copy(0, r.gpu, uintptr(unsafe.Pointer(&want[0])), uint64(len(want))); err != nil {
		t.Fatal(err)
	}
	before := calls(t)
	deadline := time.Now().Add(10 * time.Second)
	var dones []chan error
	for i := range 8 {
		dones = append(dones, r.submit(transport.Write, i, deadline))
	}
	if got := calls(t) - before; got != 8 {
		t.Fatalf("%d device copies before any slice was sent, want all 8", got)
	}
	held := r.take(t, 8)
	for _, k := range []int{7, 0, 3, 1, 2, 6, 5, 4} { // sent in any order
		transporttest.Move(held[k])
	}
	for i, d := range dones {
		if err := <-d; err != nil {
			t.Fatalf("slice %d: %v", i, err)
		}
	}
	if !bytes.Equal(r.remote, want) {
		t.Fatal("the bytes sent are not the GPU's")
	}

	for i := range r.remote {
		r.remote[i] = byte(i*7 + 1)
	}
	dones = dones[:0]
	for i := range 8 {
		dones = append(dones, r.submit(transport.Read, i, deadline))
	}
	for _, s := range r.take(t, 8) {
		transporttest.Move(s)
	}
	for i, d := range dones {
		if err := <-d; err != nil {
			t.Fatalf("read slice %d: %v", i, err)
		}
	}
	back := make([]byte, 8*slice)
	if err := r.drv.Copy(0, uintptr(unsafe.Pointer(&back[0])), r.gpu, uint64(len(back))); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(back, r.remote) {
		t.Fatal("the bytes read did not land on the GPU")
	}
}

// TestBounded: staging holds at most Buffers slices; one more waits for a
// buffer (until its deadline), and a buffer comes back when its slice is
// done, failed or not.
func TestBounded(t *testing.T) {
	devicetest.RequireDouble(t)
	r := newRig(t, 2)
	far := time.Now().Add(10 * time.Second)
	d0, d1 := r.submit(transport.Write, 0, far), r.submit(transport.Write, 1, far)
	held := r.take(t, 2)
	d2 := r.submit(transport.Write, 2, time.Now().Add(50*time.Millisecond))
	if err := <-d2; !errors.Is(err, transport.ErrTimeout) {
		t.Fatalf("a third slice with two buffers: %v, want ErrTimeout", err)
	}
	transporttest.Fail(held[0], transport.ErrPeer)
	if err := <-d0; !errors.Is(err, transport.ErrPeer) {
		t.Fatalf("slice 0: %v", err)
	}
	d3 := r.submit(transport.Write, 3, far) // takes the buffer slice 0 gave back
	transporttest.Move(held[1])
	transporttest.Move(r.take(t, 1)[0])
	for i, d := range []chan error{d1, d3} {
		if err := <-d; err != nil {
			t.Fatalf("slice %d: %v", i, err)
		}
	}
}

// TestCopyFails: a failed device copy fails its slice with ErrDevice, sends
// nothing, and gives its buffer back.
func TestCopyFails(t *testing.T) {
	devicetest.RequireDouble(t)
	r := newRig(t, 1)
	far := time.Now().Add(10 * time.Second)
	if err := devicetest.Fail("cuMemcpy", 1, 0); err != nil {
		t.Fatal(err)
	}
	if err := <-r.submit(transport.Write, 0, far); !errors.Is(err, stage.ErrDevice) {
		t.Fatalf("write: %v, want ErrDevice", err)
	}
	d := r.submit(transport.Read, 0, far) // the one buffer is free again
	s := r.take(t, 1)[0]
	if err := devicetest.Fail("cuMemcpy", 1, 0); err != nil {
		t.Fatal(err)
	}
	transporttest.Move(s)
	if err := <-d; !errors.Is(err, stage.ErrDevice) {
		t.Fatalf("read: %v, want ErrDevice", err)
	}
	// The buffer came back: a write stages and goes on to the next path.
	d = r.submit(transport.Write, 1, time.Now().Add(time.Second))
	transporttest.Move(r.take(t, 1)[0])
	if err := <-d; err != nil {
		t.Fatalf("a write after the failures: %v", err)
	}
}
