package master

import (
	"context"
	"io"
	"log/slog"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/mooncake-go/mooncake/internal/framerpc"
	"github.com/mooncake-go/mooncake/internal/nettest"
	"github.com/mooncake-go/mooncake/store/storepb"
)

// noGRPC is a gRPC connection no call may reach: every call here must go
// as frames.
type noGRPC struct{}

func (noGRPC) Invoke(context.Context, string, any, any, ...grpc.CallOption) error {
	return status.Error(codes.Internal, "a call went to gRPC")
}

func (noGRPC) NewStream(context.Context, *grpc.StreamDesc, string, ...grpc.CallOption) (grpc.ClientStream, error) {
	return nil, status.Error(codes.Internal, "a stream went to gRPC")
}

// TestFramedCallAtStart: a store client that reaches a master as it
// starts (one restarting, its clients redialing) finds its services
// registered on the framed server before that server takes a connection:
// a call is never Unimplemented (which would turn a client's slots off
// for good), and registering races no call (go test -race).
func TestFramedCallAtStart(t *testing.T) {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(nettest.FreePort(t)))

	// The client polls the port from before Start, as a client whose
	// master restarts does: nothing it does follows Start's work.
	got := make(chan error, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	fc := framerpc.NewConn(framerpc.ConnConfig{Addr: addr, GRPC: noGRPC{}})
	defer fc.Close()
	go func() {
		rpc := storepb.NewMasterClient(fc)
		for {
			_, err := rpc.Ping(ctx, &storepb.PingRequest{ClientId: "c1"})
			if status.Code(err) != codes.Unavailable || ctx.Err() != nil {
				got <- err
				return
			}
			time.Sleep(100 * time.Microsecond) // refused: not listening yet
		}
	}()
	m, err := Start(ServerConfig{Listen: addr, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	defer m.Close()
	err = <-got
	require.NoError(t, err) // not Unimplemented, as a call before the services were registered was
	require.True(t, fc.Framed())
}
