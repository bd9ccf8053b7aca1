package realclient

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzDecodeRequest: no input makes the request decoder panic or allocate
// beyond the frame, and what it accepts encodes back to the same frame.
func FuzzDecodeRequest(f *testing.F) {
	for _, r := range []*Request{
		{Op: OpHello, Arg0: 1 << 30, Arg1: 1 << 20, Replicas: 42},
		{Op: OpPut, Flags: FlagUpsert | FlagSoftPin, Replicas: 2, PinTTLms: 5, Preferred: []string{"seg"},
			Items: []Item{{Key: "a", Off: 1, Len: 2}, {Key: "", Off: 0, Len: 0}}},
		{Op: OpRemoveAll, Flags: FlagForce},
	} {
		b, err := AppendRequest(nil, r)
		require.NoError(f, err)
		f.Add(b)
	}
	f.Add([]byte{8, 0, 0, 0, 1, 2, 0, 0, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		q, err := DecodeRequest(b)
		if err != nil {
			return
		}
		again, err := AppendRequest(nil, q)
		require.NoError(t, err)
		require.Equal(t, b, again)
	})
}

// FuzzDecodeResponse, as FuzzDecodeRequest for responses.
func FuzzDecodeResponse(f *testing.F) {
	for _, r := range []*Response{
		{Op: OpHello, Value: 1 << 21},
		{Op: OpGet, Msg: "key \"x\": not found", Results: []Result{{Code: -704}, {N: 10}}},
		{Op: OpRemoveAll, Code: -600, Msg: "bad"},
	} {
		b, err := AppendResponse(nil, r)
		require.NoError(f, err)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeResponse(b)
		if err != nil {
			return
		}
		again, err := AppendResponse(nil, r)
		require.NoError(t, err)
		require.Equal(t, b, again)
	})
}
