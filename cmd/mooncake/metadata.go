package main

import (
	"fmt"
	"log/slog"
	"net"
	"os/signal"
	"strconv"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/mooncake-go/mooncake/engine/metadata"
)

func newMetadataCmd() *cobra.Command {
	var host string
	var port int
	c := &cobra.Command{
		Use:   "metadata",
		Short: "Run an HTTP metadata server (GET/PUT/DELETE /metadata?key=, /health), as Mooncake's",
		Long: `Serves segment descriptors and rpc_meta records for Transfer Engines started
with metadata server "http://HOST:PORT/metadata", ours and the official ones alike.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			slog.Info("metadata server listening", "url", fmt.Sprintf("http://%s/metadata", ln.Addr()))
			// Tests and scripts read the address from stdout.
			fmt.Fprintf(cmd.OutOrStdout(), "http://%s/metadata\n", ln.Addr())
			return metadata.NewServer().Serve(ctx, ln)
		},
	}
	c.Flags().StringVar(&host, "host", "127.0.0.1", "address to listen on")
	c.Flags().IntVar(&port, "port", 8080, "port to listen on (0 picks one)")
	return c
}
