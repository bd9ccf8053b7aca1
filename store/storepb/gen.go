// Package storepb holds the protocol of the Mooncake Store master: the
// protobuf messages and the gRPC service in master.proto. The generated
// code is committed; regenerate it with `go generate ./store/storepb`
// (needs protoc, protoc-gen-go and protoc-gen-go-grpc on PATH).
package storepb

//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative master.proto journal.proto tier.proto
