package storepb

import (
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
