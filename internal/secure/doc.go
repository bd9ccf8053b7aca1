// Package secure holds what mooncake-go's control planes share to close
// their doors: TLS configurations (server, and mutual with client
// certificates) read from PEM files, a bearer token checked in constant
// time on gRPC calls and HTTP requests and presented by clients, and a
// generator of a self-signed CA with server and client certificates for
// tests and for `mooncake up --secure`.
//
// Every control plane is open by default, wire-compatible with Mooncake's
// clients; a zero TLS and an empty token leave a server or client as it
// was. A server with a token answers a call without it, or with another,
// codes.Unauthenticated (gRPC) or 401 (HTTP); one with a client CA refuses
// a TLS handshake without a certificate that CA signed.
//
// The token is one shared secret per cluster: it authenticates "a member of
// this deployment", not a user, and it is sent in clear over a connection
// without TLS. Use both.
package secure
