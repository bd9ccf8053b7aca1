package secure

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// ReadToken is the token a command uses: token itself, else the first
// line of file (so that it need not be on a command line), else "".
func ReadToken(token, file string) (string, error) {
	if token != "" || file == "" {
		return token, nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("secure: token file: %w", err)
	}
	t, _, _ := strings.Cut(string(b), "\n")
	t = strings.TrimSpace(t)
	if t == "" {
		return "", fmt.Errorf("secure: token file %s is empty", file)
	}
	return t, nil
}

// NewToken is a random token of 32 bytes, in hex.
func NewToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return hex.EncodeToString(b)
}

// The reasons a request is refused; the same words on gRPC and HTTP.
const (
	msgMissing = "missing bearer token (authorization: Bearer <token>)"
	msgWrong   = "wrong bearer token"
)

// check tells whether the header value (authorization's) carries token,
// in constant time; "" when it does, else why not.
func check(header, token string) string {
	got, ok := strings.CutPrefix(header, "Bearer ")
	if !ok {
		// Schemes are case-insensitive (RFC 9110 11.1).
		if len(header) > 7 && strings.EqualFold(header[:7], "bearer ") {
			got, ok = header[7:], true
		}
	}
	if !ok || got == "" {
		return msgMissing
	}
	// Digests, compared in constant time: equal lengths, so that not even
	// the token's length shows in the time a refusal takes.
	g, w := sha256.Sum256([]byte(got)), sha256.Sum256([]byte(token))
	if subtle.ConstantTimeCompare(g[:], w[:]) != 1 {
		return msgWrong
	}
	return ""
}

// UnaryServerInterceptor refuses, with codes.Unauthenticated, every call
// whose "authorization" metadata is not "Bearer " + token.
func UnaryServerInterceptor(token string) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if err := checkGRPC(ctx, token); err != nil {
			return nil, err
		}
		return h(ctx, req)
	}
}

// StreamServerInterceptor is UnaryServerInterceptor for streams.
func StreamServerInterceptor(token string) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		if err := checkGRPC(ss.Context(), token); err != nil {
			return err
		}
		return h(srv, ss)
	}
}

func checkGRPC(ctx context.Context, token string) error {
	md, _ := metadata.FromIncomingContext(ctx)
	var header string
	if v := md.Get("authorization"); len(v) > 0 {
		header = v[0]
	}
	if why := check(header, token); why != "" {
		return status.Error(codes.Unauthenticated, why)
	}
	return nil
}

// PerRPC presents token on every call of a gRPC connection. It does not
// require TLS: a deployment may secure its network otherwise, and the
// token is then sent in clear.
func PerRPC(token string) credentials.PerRPCCredentials { return bearer(token) }

type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

func (bearer) RequireTransportSecurity() bool { return false }

// RequireHTTP answers 401 to a request to h without "Authorization:
// Bearer " + token, except those open says may pass (nil: none). An empty
// token returns h itself.
func RequireHTTP(token string, open func(*http.Request) bool, h http.Handler) http.Handler {
	if token == "" {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if open != nil && open(r) {
			h.ServeHTTP(w, r)
			return
		}
		if why := check(r.Header.Get("Authorization"), token); why != "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="mooncake"`)
			http.Error(w, why, http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// Transport presents token on every request through base (nil:
// http.DefaultTransport). An empty token returns base.
func Transport(token string, base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	if token == "" {
		return base
	}
	return &tokenTransport{token: token, base: base}
}

type tokenTransport struct {
	token string
	base  http.RoundTripper
}

func (t *tokenTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context()) // a RoundTripper must not change the request
	r.Header.Set("Authorization", "Bearer "+t.token)
	return t.base.RoundTrip(r)
}
