package metadata

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/mooncake-go/mooncake/internal/secure"
)

// MaxValueSize is the largest value the HTTP client reads and our Server
// accepts. Descriptors are a few KiB; the limit only stops a runaway peer.
const MaxValueSize = 16 << 20

const (
	// Mooncake's libcurl client gives a metadata request 3 s in all and
	// 1.5 s to connect; we keep its timing so both fail alike.
	httpTimeout        = 3 * time.Second
	httpConnectTimeout = 1500 * time.Millisecond
	// errSnippet is how much of an error answer's body goes into the error.
	errSnippet = 200
)

// HTTP is a Store behind Mooncake's HTTP metadata protocol:
//
//	GET    {url}?key=<k>   200 and the value, 404 when absent
//	PUT    {url}?key=<k>   the value as an application/json body
//	DELETE {url}?key=<k>
//
// Both Mooncake's servers (mooncake_http_metadata_server, the master's
// embedded one) and ours (Server) speak it.
type HTTP struct {
	base   *url.URL
	client *http.Client
}

var _ Store = (*HTTP)(nil)

// OpenHTTP returns a client for the metadata server at rawURL, e.g.
// "http://10.0.0.1:8080/metadata", presenting the token and TLS
// credentials of opts (an https URL without WithTLS verifies the server
// against the system roots). It does not contact the server.
func OpenHTTP(rawURL string, opts ...OpenOption) (*HTTP, error) {
	o := openOptions(opts)
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("metadata: http url %q: %w", rawURL, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("metadata: http url %q: want http://host:port/path", rawURL)
	}
	tr := &http.Transport{
		// Never the environment's proxy: http_proxy set for pip or model
		// downloads would otherwise route cluster-internal metadata
		// through it, which fails in ways operators rarely guess.
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: httpConnectTimeout, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout: httpConnectTimeout,
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     90 * time.Second,
	}
	if tr.TLSClientConfig, err = o.tls.Client(); err != nil {
		return nil, fmt.Errorf("metadata: http %s: %w", rawURL, err)
	}
	if tr.TLSClientConfig != nil && u.Scheme != "https" {
		return nil, fmt.Errorf("metadata: http url %q: TLS credentials given for a plain http URL (use https://)", rawURL)
	}
	return &HTTP{base: u, client: &http.Client{Transport: secure.Transport(o.token, tr), Timeout: httpTimeout}}, nil
}

// keyURL is the base URL with ?key= set, escaped as Mooncake does ('/'
// becomes %2F).
func (s *HTTP) keyURL(key string) string {
	u := *s.base
	q := u.Query()
	q.Set("key", key)
	u.RawQuery = q.Encode()
	return u.String()
}

// do sends one request and returns the status and at most MaxValueSize+1
// bytes of body, so the caller can tell an oversized answer.
func (s *HTTP) do(ctx context.Context, method, key string, body []byte) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, s.keyURL(key), rd)
	if err != nil {
		return 0, nil, fmt.Errorf("metadata: http %s %s: %w", method, key, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("metadata: http %s %s: %w", method, key, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, MaxValueSize+1))
	if err != nil {
		return 0, nil, fmt.Errorf("metadata: http %s %s: reading answer: %w", method, key, err)
	}
	return resp.StatusCode, b, nil
}

// statusError describes a non-2xx answer by its status and the start of its body.
func statusError(method, key string, code int, body []byte) error {
	snippet := strings.TrimSpace(string(body[:min(len(body), errSnippet)]))
	return fmt.Errorf("metadata: http %s %s: %d %s: %q", method, key, code, http.StatusText(code), snippet)
}

// Get returns the value of key, or an error wrapping ErrNotFound on 404.
func (s *HTTP) Get(ctx context.Context, key string) ([]byte, error) {
	code, body, err := s.do(ctx, http.MethodGet, key, nil)
	switch {
	case err != nil:
		return nil, err
	case code == http.StatusNotFound:
		return nil, fmt.Errorf("%w: %s", ErrNotFound, key)
	case code/100 != 2:
		return nil, statusError(http.MethodGet, key, code, body)
	case len(body) > MaxValueSize:
		return nil, fmt.Errorf("metadata: http GET %s: value over %d bytes", key, MaxValueSize)
	}
	return body, nil
}

// Put sets key to value. Servers may refuse: Mooncake's and ours answer 400
// to an rpc_meta key that already holds a different value.
func (s *HTTP) Put(ctx context.Context, key string, value []byte) error {
	if value == nil {
		value = []byte{} // still a body, with its Content-Type
	}
	code, body, err := s.do(ctx, http.MethodPut, key, value)
	if err != nil {
		return err
	}
	if code/100 != 2 {
		return statusError(http.MethodPut, key, code, body)
	}
	return nil
}

// Delete removes key. An absent key (404) is not an error, as in the other
// backends.
func (s *HTTP) Delete(ctx context.Context, key string) error {
	code, body, err := s.do(ctx, http.MethodDelete, key, nil)
	if err != nil {
		return err
	}
	if code/100 != 2 && code != http.StatusNotFound {
		return statusError(http.MethodDelete, key, code, body)
	}
	return nil
}

// Close drops idle connections. The client holds nothing else, so later
// calls still work; they dial afresh.
func (s *HTTP) Close() error {
	s.client.CloseIdleConnections()
	return nil
}
