package store

import (
	"bufio"
	"bytes"
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func reader(s string) *bufio.Reader { return bufio.NewReaderSize(strings.NewReader(s), 64) }

func TestReadReplies(t *testing.T) {
	for _, tc := range []struct {
		name  string
		reply string
		size  int    // bulk: the destination's size; 0: a status reply
		want  string // bulk: the value read
		err   error  // errors.Is; nil with errText empty: success
		text  string // substring of the error
		rest  string // what a well-formed reply leaves unread
	}{
		{name: "ok", reply: "+OK\r\n+next", rest: "+next"},
		{name: "server error", reply: "-ERR wrong number of arguments\r\n", text: "store: redis: ERR wrong number"},
		{name: "status not bulk", reply: "$3\r\nabc\r\n", err: errProtocol},
		{name: "bare LF", reply: "+OK\n", err: errProtocol},
		{name: "empty line", reply: "\r\n", err: errProtocol},
		{name: "truncated", reply: "+OK", text: "EOF"},
		{name: "bulk", reply: "$3\r\nabc\r\n:1", size: 3, want: "abc", rest: ":1"},
		// A value longer than the reader's buffer goes straight into dst.
		{name: "bulk large", reply: "$100\r\n" + strings.Repeat("x", 100) + "\r\n", size: 100, want: strings.Repeat("x", 100)},
		{name: "nil", reply: "$-1\r\n$1\r\n", size: 3, err: errNil, rest: "$1\r\n"},
		// The stream stays in step past a value of the wrong size.
		{name: "bad size", reply: "$2\r\nab\r\n+", size: 3, err: errBadSize, rest: "+"},
		{name: "bulk error", reply: "-WRONGTYPE nope\r\n", size: 3, text: "WRONGTYPE"},
		{name: "bulk no CRLF", reply: "$3\r\nabcde", size: 3, err: errProtocol},
		{name: "bulk short", reply: "$3\r\nab", size: 3, text: "EOF"},
		{name: "bulk bad length", reply: "$x\r\n", size: 3, err: errProtocol},
		{name: "bulk negative", reply: "$-2\r\n", size: 3, err: errProtocol},
		{name: "array for bulk", reply: "*1\r\n", size: 3, err: errProtocol},
		{name: "long line", reply: "+" + strings.Repeat("o", 100) + "\r\n", err: errProtocol},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := reader(tc.reply)
			var err error
			dst := make([]byte, tc.size)
			if tc.size == 0 {
				err = readStatus(r)
			} else {
				err = readBulk(r, dst)
			}
			switch {
			case tc.err != nil:
				require.ErrorIs(t, err, tc.err)
			case tc.text != "":
				require.ErrorContains(t, err, tc.text)
			default:
				require.NoError(t, err)
				assert.Equal(t, tc.want, string(dst[:len(tc.want)]))
			}
			if tc.rest != "" {
				rest, _ := r.Peek(r.Buffered())
				assert.Equal(t, tc.rest, string(rest))
			}
		})
	}
}

// TestRespConn checks the bytes of each command and the reading of the
// replies against a scripted server.
func TestRespConn(t *testing.T) {
	client, server := net.Pipe()
	defer client.Close()
	rc := newRespConn(client)
	sent := make(chan string, 1)
	serve := func(n int, reply string) {
		go func() {
			b := make([]byte, n)
			_, err := readFull(server, b)
			if err == nil {
				_, err = server.Write([]byte(reply))
			}
			if err != nil {
				sent <- "error: " + err.Error()
				return
			}
			sent <- string(b)
		}()
	}
	values := []byte("aaabbb")

	want := "*5\r\n$4\r\nMSET\r\n$2\r\nk1\r\n$3\r\naaa\r\n$2\r\nk2\r\n$3\r\nbbb\r\n"
	serve(len(want), "+OK\r\n")
	require.NoError(t, rc.set([]string{"k1", "k2"}, values, 3))
	assert.Equal(t, want, <-sent)

	want = "*3\r\n$3\r\nSET\r\n$2\r\nk1\r\n$3\r\naaa\r\n"
	serve(len(want), "+OK\r\n")
	require.NoError(t, rc.set([]string{"k1"}, values, 3))
	assert.Equal(t, want, <-sent)

	into := make([]byte, 6)
	want = "*3\r\n$4\r\nMGET\r\n$2\r\nk1\r\n$2\r\nk2\r\n"
	serve(len(want), "*2\r\n$3\r\nxyz\r\n$3\r\nuvw\r\n")
	require.NoError(t, rc.get([]string{"k1", "k2"}, into, 3))
	assert.Equal(t, want, <-sent)
	assert.Equal(t, "xyzuvw", string(into))

	// A missing key fails the call, naming the first one, and leaves the
	// connection in step for the next.
	serve(len(want), "*2\r\n$-1\r\n$3\r\nuvw\r\n")
	err := rc.get([]string{"k1", "k2"}, into, 3)
	require.ErrorIs(t, err, errNil)
	assert.Contains(t, err.Error(), ": k1")
	<-sent
	want = "*2\r\n$3\r\nGET\r\n$2\r\nk2\r\n"
	serve(len(want), "$3\r\nqrs\r\n")
	require.NoError(t, rc.get([]string{"k2"}, into, 3))
	assert.Equal(t, want, <-sent)
	assert.Equal(t, "qrs", string(into[:3]))

	serve(len("*1\r\n$4\r\nPING\r\n"), "+PONG\r\n")
	require.NoError(t, rc.ping())
	<-sent

	// MGET answered with the wrong count.
	serve(len("*3\r\n$4\r\nMGET\r\n$2\r\nk1\r\n$2\r\nk2\r\n"), "*1\r\n")
	require.ErrorContains(t, rc.get([]string{"k1", "k2"}, into, 3), "MGET of 2 keys answered 1 values")
	<-sent
}

func readFull(c net.Conn, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		k, err := c.Read(b[n:])
		n += k
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// FuzzReadReply feeds arbitrary server bytes to the reply decoders: they
// must fail cleanly, never panic, and never fill dst partially on success.
func FuzzReadReply(f *testing.F) {
	for _, s := range []string{"+OK\r\n", "-ERR x\r\n", "$3\r\nabc\r\n", "$-1\r\n", "*2\r\n$1\r\na\r\n$-1\r\n",
		"$99999999999999999999\r\n", "$3\r\nab\r\n", ":1\r\n"} {
		f.Add([]byte(s), 3)
	}
	f.Fuzz(func(t *testing.T, b []byte, size int) {
		size = min(max(size, 0), 1<<10)
		r := bufio.NewReaderSize(bytes.NewReader(b), 16)
		readStatus(r)
		r = bufio.NewReaderSize(bytes.NewReader(b), 16)
		if n, err := readHeader(r, '*'); err == nil && n < -1 {
			t.Fatalf("array length %d", n)
		}
		r = bufio.NewReaderSize(bytes.NewReader(b), 16)
		dst := make([]byte, size)
		if err := readBulk(r, dst); err == nil && !bytes.Contains(b, dst) {
			t.Fatalf("read %q, which the input does not hold", dst)
		} else if err != nil && errors.Is(err, errNil) && !bytes.HasPrefix(b, []byte("$-1\r\n")) {
			t.Fatalf("nil reply from %q", b)
		}
	})
}
