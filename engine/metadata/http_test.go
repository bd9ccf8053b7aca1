package metadata

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// startHTTP serves a fresh Server on a loopback port and returns its base
// URL and a client store opened the way engines open it.
func startHTTP(t *testing.T) (string, Store) {
	t.Helper()
	ts := httptest.NewServer(NewServer())
	t.Cleanup(ts.Close)
	s, err := Open(ts.URL + "/metadata")
	require.NoError(t, err)
	require.IsType(t, (*HTTP)(nil), s)
	t.Cleanup(func() { assert.NoError(t, s.Close()) })
	return ts.URL, s
}

func TestHTTPStore(t *testing.T) {
	t.Parallel()
	_, s := startHTTP(t)
	ctx := t.Context()
	key := SegmentKey("127.0.0.1:15001")

	_, err := s.Get(ctx, key)
	require.ErrorIs(t, err, ErrNotFound)

	require.NoError(t, s.Put(ctx, key, []byte(mooncakeTCPDesc)))
	got, err := s.Get(ctx, key)
	require.NoError(t, err)
	assert.Equal(t, mooncakeTCPDesc, string(got))

	// Descriptors may be replaced: an engine re-publishes after registering memory.
	require.NoError(t, s.Put(ctx, key, []byte(`{"name":"x"}`)))
	got, err = s.Get(ctx, key)
	require.NoError(t, err)
	assert.Equal(t, `{"name":"x"}`, string(got))

	require.NoError(t, s.Delete(ctx, key))
	_, err = s.Get(ctx, key)
	require.ErrorIs(t, err, ErrNotFound)
	// The server answers 404; the client treats a missing key as deleted.
	require.NoError(t, s.Delete(ctx, key))

	// Keys survive query escaping whatever they hold.
	odd := "mooncake/ram/a b&c=d?e#f%20+/é"
	require.NoError(t, s.Put(ctx, odd, []byte(`1`)))
	got, err = s.Get(ctx, odd)
	require.NoError(t, err)
	assert.Equal(t, "1", string(got))

	// An empty value is a value.
	require.NoError(t, s.Put(ctx, "empty", nil))
	got, err = s.Get(ctx, "empty")
	require.NoError(t, err)
	assert.Empty(t, got)
}

func TestHTTPRPCMetaRule(t *testing.T) {
	t.Parallel()
	_, s := startHTTP(t)
	ctx := t.Context()
	key := RPCMetaKey("127.0.0.1:15001")
	mine := []byte(`{"ip_or_host_name":"127.0.0.1","rpc_port":15001}`)
	theirs := []byte(`{"ip_or_host_name":"10.0.0.2","rpc_port":15001}`)

	require.NoError(t, s.Put(ctx, key, mine))
	// The same engine publishing again is fine.
	require.NoError(t, s.Put(ctx, key, mine))
	// Another engine claiming the name is refused, and the first keeps it.
	err := s.Put(ctx, key, theirs)
	require.ErrorContains(t, err, "400")
	require.ErrorContains(t, err, "rpc_meta already registered")
	got, err := s.Get(ctx, key)
	require.NoError(t, err)
	assert.Equal(t, mine, got)

	// Once the owner deletes it, the name is free.
	require.NoError(t, s.Delete(ctx, key))
	require.NoError(t, s.Put(ctx, key, theirs))
}

func TestHTTPTooLarge(t *testing.T) {
	t.Parallel()
	_, s := startHTTP(t)
	err := s.Put(t.Context(), "big", make([]byte, MaxValueSize+1))
	require.ErrorContains(t, err, "413")
	require.ErrorContains(t, err, "over the limit of 16777216 bytes", "the answer names the limit")
	// Exactly the limit is accepted.
	require.NoError(t, s.Put(t.Context(), "big", make([]byte, MaxValueSize)))
}

func TestHTTPHealthAndKeys(t *testing.T) {
	t.Parallel()
	base, s := startHTTP(t)
	ctx := t.Context()

	getJSON := func(path string, v any) {
		t.Helper()
		resp, err := http.Get(base + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
		require.NoError(t, json.NewDecoder(resp.Body).Decode(v))
	}

	var health map[string]string
	getJSON("/health", &health)
	assert.Equal(t, map[string]string{"status": "ok"}, health)

	var keys []string
	getJSON("/metadata/keys", &keys)
	assert.Empty(t, keys)
	assert.NotNil(t, keys, "an empty store lists [], not null")

	for _, k := range []string{"mooncake/rpc_meta/b", "mooncake/ram/b", "mooncake/ram/a"} {
		require.NoError(t, s.Put(ctx, k, []byte("{}")))
	}
	getJSON("/metadata/keys", &keys)
	assert.Equal(t, []string{"mooncake/ram/a", "mooncake/ram/b", "mooncake/rpc_meta/b"}, keys)
	getJSON("/metadata/keys?prefix=mooncake/ram/", &keys)
	assert.Equal(t, []string{"mooncake/ram/a", "mooncake/ram/b"}, keys)
}

func TestHTTPClientErrors(t *testing.T) {
	t.Parallel()
	// A server that fails every request, and one that never answers.
	broken := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "boom: "+strings.Repeat("x", 1000), http.StatusInternalServerError)
	}))
	t.Cleanup(broken.Close)
	stuck := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
	}))
	t.Cleanup(stuck.Close)

	s, err := OpenHTTP(broken.URL + "/metadata")
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	ctx := t.Context()

	// Non-2xx answers name the status and the start of the body, not all of it.
	_, err = s.Get(ctx, "k")
	require.ErrorContains(t, err, "500 Internal Server Error")
	require.ErrorContains(t, err, "boom")
	assert.NotErrorIs(t, err, ErrNotFound)
	assert.Less(t, len(err.Error()), 400)
	require.ErrorContains(t, s.Put(ctx, "k", []byte("{}")), "500")
	require.ErrorContains(t, s.Delete(ctx, "k"), "500")

	// The caller's deadline cuts a request short.
	st, err := OpenHTTP(stuck.URL + "/metadata")
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, err = st.Get(short, "k")
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

func TestOpenHTTP(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		url     string
		wantErr bool
	}{
		// Mooncake's usual form.
		{name: "ok", url: "http://127.0.0.1:8080/metadata"},
		{name: "https", url: "https://meta.example:443/metadata"},
		{name: "no scheme", url: "127.0.0.1:8080/metadata", wantErr: true},
		{name: "other scheme", url: "ftp://h/metadata", wantErr: true},
		{name: "no host", url: "http:///metadata", wantErr: true},
		{name: "unparsable", url: "http://[::1/metadata", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := OpenHTTP(tt.url)
			if tt.wantErr {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			// Mooncake's timings, and never a proxy from the environment.
			assert.Equal(t, httpTimeout, s.client.Timeout)
			assert.Equal(t, 3*time.Second, httpTimeout)
			tr := s.client.Transport.(*http.Transport)
			assert.Nil(t, tr.Proxy)
			require.NoError(t, s.Close())
		})
	}
}

func TestHTTPKeyURL(t *testing.T) {
	t.Parallel()
	s, err := OpenHTTP("http://127.0.0.1:8080/metadata")
	require.NoError(t, err)
	// '/' and ':' are escaped, as libcurl's curl_easy_escape does.
	assert.Equal(t, "http://127.0.0.1:8080/metadata?key=mooncake%2Fram%2F127.0.0.1%3A15001",
		s.keyURL("mooncake/ram/127.0.0.1:15001"))
}

// TestServerHandler walks one Server through a sequence of requests and
// checks each answer's status (and body where it matters).
func TestServerHandler(t *testing.T) {
	t.Parallel()
	srv := NewServer()
	const meta = `{"ip_or_host_name":"h","rpc_port":1}`
	steps := []struct {
		name     string
		method   string
		target   string
		body     string
		wantCode int
		wantBody string // exact body when set
	}{
		// Every key route needs a key.
		{"get no key", "GET", "/metadata", "", 400, ""},
		{"get empty key", "GET", "/metadata?key=", "", 400, ""},
		{"put no key", "PUT", "/metadata", "{}", 400, ""},
		{"delete no key", "DELETE", "/metadata", "", 400, ""},
		// Absent keys.
		{"get missing", "GET", "/metadata?key=a", "", 404, ""},
		{"delete missing", "DELETE", "/metadata?key=a", "", 404, ""},
		// Store and read back byte for byte, including whitespace.
		{"put", "PUT", "/metadata?key=a", "{ \"x\" : 1 }\n", 200, ""},
		{"get", "GET", "/metadata?key=a", "", 200, "{ \"x\" : 1 }\n"},
		// Ordinary keys may be overwritten with anything.
		{"overwrite", "PUT", "/metadata?key=a", "{}", 200, ""},
		{"get overwritten", "GET", "/metadata?key=a", "", 200, "{}"},
		{"delete", "DELETE", "/metadata?key=a", "", 200, ""},
		{"get deleted", "GET", "/metadata?key=a", "", 404, ""},
		// rpc_meta: first claim wins, the same claim again is a no-op.
		{"rpc put", "PUT", "/metadata?key=mooncake/rpc_meta/n", meta, 200, "metadata updated"},
		{"rpc same", "PUT", "/metadata?key=mooncake/rpc_meta/n", meta, 200, "metadata unchanged"},
		{"rpc different", "PUT", "/metadata?key=mooncake/rpc_meta/n", `{"ip_or_host_name":"g","rpc_port":1}`, 400, ""},
		{"rpc kept", "GET", "/metadata?key=mooncake/rpc_meta/n", "", 200, meta},
		// The rule holds under a cluster id too, and for a bare rpc_meta/ key.
		{"rpc cluster put", "PUT", "/metadata?key=mooncake/c1/rpc_meta/n", meta, 200, ""},
		{"rpc cluster different", "PUT", "/metadata?key=mooncake/c1/rpc_meta/n", "{}", 400, ""},
		{"rpc bare put", "PUT", "/metadata?key=rpc_meta/n", meta, 200, ""},
		{"rpc bare different", "PUT", "/metadata?key=rpc_meta/n", "{}", 400, ""},
		// A name that merely contains rpc_meta is an ordinary key.
		{"not rpc put", "PUT", "/metadata?key=mooncake/ram/my_rpc_meta", meta, 200, ""},
		{"not rpc overwrite", "PUT", "/metadata?key=mooncake/ram/my_rpc_meta", "{}", 200, ""},
		// Too large, by declared length.
		{"too large", "PUT", "/metadata?key=big", strings.Repeat("x", MaxValueSize+1), 413, ""},
		{"too large not stored", "GET", "/metadata?key=big", "", 404, ""},
		// Other methods and paths.
		{"post", "POST", "/metadata?key=a", "{}", 405, ""},
		{"unknown path", "GET", "/other", "", 404, ""},
		{"health", "GET", "/health", "", 200, "{\"status\":\"ok\"}\n"},
		{"health head", "HEAD", "/health", "", 200, ""},
	}
	for _, st := range steps {
		// Steps share the server, so they run in order, not as subtests.
		r := httptest.NewRequest(st.method, st.target, strings.NewReader(st.body))
		w := httptest.NewRecorder()
		srv.ServeHTTP(w, r)
		assert.Equal(t, st.wantCode, w.Code, "%s: body %q", st.name, w.Body.String())
		if st.wantBody != "" {
			assert.Equal(t, st.wantBody, w.Body.String(), st.name)
		}
	}
}

// TestServerTooLargeChunked sends an oversized body without a length, so
// only the reader's limit can catch it.
func TestServerTooLargeChunked(t *testing.T) {
	t.Parallel()
	srv := NewServer()
	body := io.MultiReader(bytes.NewReader(make([]byte, MaxValueSize)), strings.NewReader("x"))
	r := httptest.NewRequest("PUT", "/metadata?key=big", body)
	r.ContentLength = -1
	w := httptest.NewRecorder()
	srv.ServeHTTP(w, r)
	assert.Equal(t, http.StatusRequestEntityTooLarge, w.Code)
	assert.Equal(t, "metadata value over the limit of 16777216 bytes\n", w.Body.String())
}

func TestServerServe(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- NewServer().Serve(ctx, ln) }()

	// The listener is open before Serve starts, so no wait is needed.
	s, err := OpenHTTP("http://" + ln.Addr().String() + "/metadata")
	require.NoError(t, err)
	require.NoError(t, s.Put(t.Context(), "k", []byte("{}")))
	got, err := s.Get(t.Context(), "k")
	require.NoError(t, err)
	assert.Equal(t, "{}", string(got))
	require.NoError(t, s.Close())

	// Cancelling stops it cleanly and closes the listener.
	cancel()
	require.NoError(t, <-done)
	require.ErrorIs(t, ln.Close(), net.ErrClosed)
}
