package master

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"

	"google.golang.org/grpc"
)

// ServerConfig configures a Server.
type ServerConfig struct {
	// Service configures the metadata service.
	Service ServiceConfig
	// Listen is the gRPC address. Zero: ":50051", Mooncake's port.
	Listen string
	// Logger receives the server's logs. Zero: slog.Default().
	Logger *slog.Logger
}

// DefaultListen is the master's default gRPC address.
const DefaultListen = ":50051"

// Server is a running master: the Service, its background loop and its
// gRPC front on one listener.
type Server struct {
	svc  *Service
	lis  net.Listener
	grpc *grpc.Server
	log  *slog.Logger

	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
}

// Start starts a master serving on cfg.Listen.
func Start(cfg ServerConfig) (*Server, error) {
	svc, err := NewService(cfg.Service)
	if err != nil {
		return nil, err
	}
	if cfg.Listen == "" {
		cfg.Listen = DefaultListen
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	lis, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("master: listen %s: %w", cfg.Listen, err)
	}
	s := &Server{svc: svc, lis: lis, log: cfg.Logger,
		grpc: grpc.NewServer(grpc.MaxRecvMsgSize(256<<20), grpc.MaxSendMsgSize(256<<20))}
	NewGRPCServer(svc).Register(s.grpc)
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		_ = svc.Run(ctx)
	}()
	go func() {
		defer s.wg.Done()
		if err := s.grpc.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			s.log.Error("master: gRPC server stopped", "err", err)
		}
	}()
	s.log.Info("master: serving", "addr", lis.Addr().String())
	return s, nil
}

// Addr is the address the master listens on.
func (s *Server) Addr() string { return s.lis.Addr().String() }

// Service is the metadata service the server fronts.
func (s *Server) Service() *Service { return s.svc }

// Close stops serving (calls in progress are cut) and waits for the
// server's goroutines. It is idempotent.
func (s *Server) Close() error {
	s.once.Do(func() {
		s.grpc.Stop()
		s.cancel()
		s.wg.Wait()
	})
	return nil
}
