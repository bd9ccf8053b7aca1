package storepb

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
)

func TestResultRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want Code
	}{
		{"nil is OK", nil, OK},
		{"typed error keeps its code", &Error{Code: ObjectHasLease, Msg: "key k"}, ObjectHasLease},
		{"wrapped typed error keeps its code", fmt.Errorf("ctx: %w", ErrObjectNotFound), ObjectNotFound},
		{"foreign error is INTERNAL", errors.New("boom"), Internal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := NewResult(tc.err)
			// Through the wire format and back.
			b, err := proto.Marshal(r)
			require.NoError(t, err)
			var got Result
			require.NoError(t, proto.Unmarshal(b, &got))
			require.Equal(t, int32(tc.want), got.Code)
			back := got.AsError()
			if tc.want == OK {
				require.NoError(t, back)
				return
			}
			require.ErrorIs(t, back, &Error{Code: tc.want})
		})
	}
}

func TestCodeNames(t *testing.T) {
	require.Equal(t, "NO_AVAILABLE_HANDLE", NoAvailableHandle.String())
	require.Equal(t, int32(-200), int32(NoAvailableHandle))
	require.Equal(t, "ERROR_-12345", Code(-12345).String())
	require.Equal(t, "store: OBJECT_NOT_FOUND: k", (&Error{Code: ObjectNotFound, Msg: "k"}).Error())
}

// TestErrorKeepsCause: an *Error matches its code's sentinel and its
// cause; the cause's text follows the message in Error and in the Result
// that carries the error over the wire, where the cause itself is lost.
func TestErrorKeepsCause(t *testing.T) {
	cause := fmt.Errorf("dial: %w", context.Canceled)
	err := error(&Error{Code: RPCFail, Msg: "put k", Err: cause})
	require.ErrorIs(t, err, ErrRPCFail)
	require.ErrorIs(t, err, context.Canceled)
	require.NotErrorIs(t, err, ErrRPCTimeout)
	require.Equal(t, cause, errors.Unwrap(err))
	require.Equal(t, "store: RPC_FAIL: put k: dial: context canceled", err.Error())
	require.Equal(t, "store: RPC_FAIL: dial: context canceled", (&Error{Code: RPCFail, Err: cause}).Error())
	require.Equal(t, "store: RPC_FAIL", ErrRPCFail.Error())
	require.Nil(t, errors.Unwrap(ErrRPCFail))

	r := NewResult(err)
	require.Equal(t, int32(RPCFail), r.Code)
	require.Equal(t, "put k: dial: context canceled", r.Message)
	back := r.AsError()
	require.ErrorIs(t, back, ErrRPCFail)
	require.NotErrorIs(t, back, context.Canceled, "a cause does not cross the wire")
	require.Equal(t, err.Error(), back.Error())
}

// FuzzUnmarshal: messages from the network never panic the decoder.
func FuzzUnmarshal(f *testing.F) {
	b, _ := proto.Marshal(&PutStartRequest{ClientId: "c", Key: "k", ValueLength: 4096, Config: &ReplicateConfig{ReplicaNum: 2}})
	f.Add(b)
	f.Fuzz(func(t *testing.T, in []byte) {
		var m PutStartRequest
		if proto.Unmarshal(in, &m) != nil {
			return
		}
		if _, err := proto.Marshal(&m); err != nil {
			t.Fatal(err)
		}
	})
}
