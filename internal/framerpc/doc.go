// Package framerpc carries the unary calls of gRPC services over plain
// length-prefixed frames on one TCP connection, for the master's hot
// calls (a put's commit, a batch's replica lists), where gRPC's HTTP/2
// framing and its writer goroutines cost a small call about half its
// latency on loopback.
//
// The services are gRPC's own: a Server takes the generated
// grpc.ServiceDesc and implementation (it is a grpc.ServiceRegistrar) and
// runs the generated method handlers behind the same unary interceptor,
// so a call reaches the same code, with the same metadata, deadline and
// status, as it would over gRPC. A Conn is a grpc.ClientConnInterface: a
// generated client over it sends unary calls as frames and streams over
// the gRPC connection it was given.
//
// Both protocols share a port: Split hands the connections that open with
// the frame protocol's preface to the Server and the others (HTTP/2's
// preface) to the gRPC server. A Conn whose server does not answer the
// preface (a server without framerpc) falls back to gRPC, and tries
// frames again a minute later (ConnConfig.Reprobe).
//
// Over TLS, SplitTLS does each connection's handshake, offering the
// application protocols "h2" (gRPC's) and ALPN ("mcframe1"), and sorts
// the same way inside it; the gRPC server takes the connections
// handshaken (Handshaken credentials), its peers' TLS state as their
// AuthInfo. A Conn with ConnConfig.TLS asks for ALPN: a TLS server
// without framerpc refuses it, and the Conn falls back.
//
// Lifecycle: NewServer, RegisterService for each service, Split the
// listener (or ServeConn each connection), Close. NewConn over a gRPC
// connection; it dials on its first call and again after a connection is
// lost (every call in flight then fails with codes.Unavailable); Close.
//
// The wire (little-endian): the client opens with Preface, which the
// server echoes. A call is
//
//	u32 length of what follows | u64 id | u64 timeout ns (0: none)
//	| u16 len, full method name | u16 metadata pairs, each u16 len, key, u32 len, value
//	| the request message
//
// and its answer
//
//	u32 length of what follows | u64 id | u8 0: the reply message follows, 1: a google.rpc.Status
//
// Answers come in any order; a call whose caller gave up is answered
// anyway and the answer dropped.
package framerpc
