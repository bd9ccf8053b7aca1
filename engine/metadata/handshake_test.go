package metadata

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func echo(typ byte, body []byte, _ net.Addr) ([]byte, error) {
	if typ == TypeConnection {
		return nil, errors.New("no RDMA here")
	}
	return append([]byte(`{"echo":`), append(body, '}')...), nil
}

func TestHandshakeCall(t *testing.T) {
	for _, tc := range []struct {
		name      string
		srv, cli  string
		wantError bool
	}{
		{"no secret", "", "", false},
		{"matching secret", "k", "k", false},
		{"client lacks secret", "k", "", true},
		{"wrong secret", "k", "x", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := ServeHandshake("127.0.0.1:0", echo, []byte(tc.srv), nil)
			require.NoError(t, err)
			defer s.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			reply, err := Call(ctx, s.Addr().String(), TypeProbe, []byte(`{}`), []byte(tc.cli))
			if tc.wantError {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, `{"echo":{}}`, string(reply))
		})
	}
}

func TestFrameLayout(t *testing.T) {
	var b bytes.Buffer
	require.NoError(t, WriteFrame(&b, TypeNotify, []byte(`{"a":1}`)))
	require.Equal(t, append([]byte{8, 0, 0, 0, 0, 0, 0, 0, 2}, `{"a":1}`...), b.Bytes())

	// Legacy frames have no type byte: the JSON follows the length.
	var legacy bytes.Buffer
	binary.Write(&legacy, binary.LittleEndian, uint64(2))
	legacy.WriteString("{}")
	typ, body, err := ReadFrame(&legacy, DefaultMaxFrame)
	require.NoError(t, err)
	require.Equal(t, TypeConnection, typ)
	require.Equal(t, "{}", string(body))
}

func TestHandshakeServerHostileInput(t *testing.T) {
	s, err := ServeHandshake("127.0.0.1:0", echo, nil, nil)
	require.NoError(t, err)
	defer s.Close()
	huge := make([]byte, 8)
	binary.LittleEndian.PutUint64(huge, DefaultMaxFrame+1)
	for _, tc := range []struct {
		name string
		send []byte
	}{
		{"zero length", make([]byte, 8)},
		{"over the limit", huge},
		{"truncated body", append([]byte{50, 0, 0, 0, 0, 0, 0, 0, 1}, "{"...)},
		{"handler refuses", append([]byte{3, 0, 0, 0, 0, 0, 0, 0, 0}, "{}"...)},
		{"garbage", []byte("GET / HTTP/1.1\r\n\r\n")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", s.Addr().String())
			require.NoError(t, err)
			defer c.Close()
			c.Write(tc.send)
			c.(*net.TCPConn).CloseWrite()
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			got, _ := io.ReadAll(c)
			require.Empty(t, got, "the server hangs up without a reply")
		})
	}
	// Still serving.
	_, err = Call(context.Background(), s.Addr().String(), TypeProbe, []byte(`{}`), nil)
	require.NoError(t, err)
}

func FuzzReadFrame(f *testing.F) {
	var b bytes.Buffer
	WriteFrame(&b, TypeMetadata, []byte(`{"name":"127.0.0.1:15001"}`))
	f.Add(b.Bytes())
	f.Add([]byte{2, 0, 0, 0, 0, 0, 0, 0, '{', '}'})
	f.Fuzz(func(t *testing.T, in []byte) {
		typ, body, err := ReadFrame(bytes.NewReader(in), 4096)
		if err != nil {
			return
		}
		if typ > TypeProbe || len(body) > 4096 {
			t.Fatalf("type %d body %d", typ, len(body))
		}
	})
}
