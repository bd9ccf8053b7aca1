package cudaipc_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mooncake-go/mooncake/engine/device/devicetest"
	"github.com/mooncake-go/mooncake/engine/metadata"
	"github.com/mooncake-go/mooncake/engine/transport"
	"github.com/mooncake-go/mooncake/engine/transport/cudaipc"
	"github.com/mooncake-go/mooncake/engine/transport/shm"
)

// Transfers through the path need two processes: they are the engine's
// tests (engine/cudaipc_test.go). Here: what the path publishes and what
// descriptors it accepts.

func TestMain(m *testing.M) {
	os.Exit(devicetest.Run(m))
}

var handle = base64.StdEncoding.EncodeToString(make([]byte, metadata.IPCHandleSize))

// desc is a descriptor of another process of this host with one IPC
// buffer; ipc replaces the buffer's fields, host and pid the identity.
func desc(host string, pid int, ipc string) string {
	return fmt.Sprintf(`{"name":"peer","protocol":"tcp","tcp_data_port":1,"buffers":[{"name":"peer","addr":8192,"length":4096,"mcgo_location":"cuda:0"}],`+
		`"mcgo_cuda_ipc":{"host_id":%q,"pid":%d,"buffers":[%s]}}`, host, pid, ipc)
}

func buffer(fields string) string {
	return `{"addr":8192,"length":4096,"base":4096,"size":16384,"device":0,"handle":"` + handle + `"` + fields + `}`
}

// TestDecodeBadBuffers: descriptors whose IPC part makes no sense are
// refused by the parser, before any handle reaches the driver.
func TestDecodeBadBuffers(t *testing.T) {
	host, pid := shm.HostID(), os.Getpid()+1
	for _, c := range []struct{ name, desc string }{
		{"handle not base64", desc(host, pid, buffer(`,"handle":"!!not base64!!"`))},
		{"handle short", desc(host, pid, buffer(`,"handle":"`+base64.StdEncoding.EncodeToString(make([]byte, 63))+`"`))},
		{"handle long", desc(host, pid, buffer(`,"handle":"`+base64.StdEncoding.EncodeToString(make([]byte, 65))+`"`))},
		{"handle missing", desc(host, pid, buffer(`,"handle":null`))},
		{"handle a number", desc(host, pid, buffer(`,"handle":7`))},
		{"before its allocation", desc(host, pid, buffer(`,"base":12288`))},
		{"past its allocation", desc(host, pid, buffer(`,"size":8191`))},
		{"empty", desc(host, pid, buffer(`,"length":0`))},
		{"wraps", desc(host, pid, buffer(`,"addr":18446744073709551615,"base":18446744073709551615`))},
		{"allocation wraps", desc(host, pid, buffer(`,"size":18446744073709551615`))},
		{"negative device", desc(host, pid, buffer(`,"device":-1`))},
		{"no host", desc("", pid, buffer(""))},
		{"no pid", desc(host, 0, buffer(""))},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := metadata.ParseSegmentDesc([]byte(c.desc))
			require.ErrorIs(t, err, metadata.ErrBadDescriptor)
		})
	}
	d, err := metadata.ParseSegmentDesc([]byte(desc(host, pid, buffer(""))))
	require.NoError(t, err, "the good one")
	require.Len(t, d.CudaIPC.Buffers[0].Handle, metadata.IPCHandleSize)
}

// TestOpen: the path opens only a peer in another process of this host
// whose IPC buffers make sense and which publishes its control counter;
// any other is ErrUnavailable, so the next path serves it. (Peers that
// open are the engine's tests: they need a second process.)
func TestOpen(t *testing.T) {
	tr := cudaipc.New(cudaipc.Config{})
	defer tr.Close()
	host, pid := shm.HostID(), os.Getpid()+1
	parse := func(s string) *metadata.SegmentDesc {
		d, err := metadata.ParseSegmentDesc([]byte(s))
		require.NoError(t, err)
		return d
	}
	short := parse(desc(host, pid, buffer("")))
	short.CudaIPC.Buffers[0].Handle = short.CudaIPC.Buffers[0].Handle[:10] // made in-process, not parsed
	for _, c := range []struct {
		name string
		d    *metadata.SegmentDesc
		want string
	}{
		{"no GPU buffers", parse(`{"name":"peer","protocol":"tcp","buffers":[]}`), "no CUDA IPC buffers"},
		{"another host", parse(desc(host+"x", pid, buffer(""))), "another host"},
		{"this process", parse(desc(host, os.Getpid(), buffer(""))), "this process"},
		{"bad handle", short, "bad IPC buffer"},
		// A peer's freed memory could not be told from live memory.
		{"no control counter", parse(desc(host, pid, buffer(""))), "no control counter"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := tr.Open(context.Background(), transport.PeerInfo{Name: "peer", Desc: c.d})
			require.ErrorIs(t, err, transport.ErrUnavailable)
			require.ErrorContains(t, err, c.want)
		})
	}
}

// TestPublish: each GPU region is published with the handle of the
// allocation holding it, host regions are not, and the result parses.
func TestPublish(t *testing.T) {
	devicetest.RequireGPUs(t, 2)
	drv, err := devicetest.Driver()
	require.NoError(t, err)
	const size = 1 << 20
	base, err := drv.AllocDevice(1, size)
	require.NoError(t, err)
	defer drv.FreeDevice(1, base)
	want, err := drv.IPCHandle(1, base)
	require.NoError(t, err)

	tr := cudaipc.New(cudaipc.Config{})
	defer tr.Close()
	d := &metadata.SegmentDesc{Name: "me", Protocol: json.RawMessage(`"tcp"`)}
	tr.Publish(d)([]transport.LocalRegion{
		{Addr: 1 << 40, Length: 4096, FD: -1},                               // host memory
		{Addr: uint64(base) + 4096, Length: 8192, FD: -1, Device: 2},        // cuda:1, a sub-range
		{Addr: uint64(base) + size - 4096, Length: 4096, FD: -1, Device: 2}, // the same allocation
	})
	require.NotNil(t, d.CudaIPC)
	require.Equal(t, shm.HostID(), d.CudaIPC.HostID)
	require.Equal(t, os.Getpid(), d.CudaIPC.PID)
	require.Equal(t, []metadata.IPCBuffer{
		{Addr: uint64(base) + 4096, Length: 8192, Base: uint64(base), Size: size, Device: 1, Handle: want[:]},
		{Addr: uint64(base) + size - 4096, Length: 4096, Base: uint64(base), Size: size, Device: 1, Handle: want[:]},
	}, d.CudaIPC.Buffers)
	b, err := json.Marshal(d)
	require.NoError(t, err)
	require.True(t, strings.Contains(string(b), `"mcgo_cuda_ipc"`))
	back, err := metadata.ParseSegmentDesc(b)
	require.NoError(t, err)
	require.Equal(t, d.CudaIPC, back.CudaIPC)

	// No GPU region: no IPC part at all.
	d = &metadata.SegmentDesc{Name: "me"}
	tr.Publish(d)([]transport.LocalRegion{{Addr: 1 << 40, Length: 4096, FD: -1}})
	require.Nil(t, d.CudaIPC)
}
