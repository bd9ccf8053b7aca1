package main

import (
	"fmt"
	"log/slog"
	"net"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/mooncake-go/mooncake/engine/metadata"
)

func newMetadataCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "metadata",
		Short: "Run an HTTP metadata server (GET/PUT/DELETE /metadata?key=, /health), as Mooncake's",
		Long: `Serves segment descriptors and rpc_meta records for Transfer Engines started
with metadata server "http://HOST:PORT/metadata", ours and the official ones alike.

Open by default, as Mooncake's. --auth_token (or --auth_token_file,
MC_AUTH_TOKEN) requires "Authorization: Bearer <token>" on every request,
/health included (engines present it with mooncake node --auth_token;
Mooncake's engines cannot). --tls_cert_file and --tls_key_file serve https;
--tls_client_ca_file makes it mutual. Flags also come from MC_METADATA_<FLAG>.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			envs := map[string][]string{}
			cmd.Flags().VisitAll(func(fl *pflag.Flag) {
				envs[fl.Name] = []string{"MC_METADATA_" + strings.ToUpper(fl.Name)}
			})
			s, err := newSettings(cmd, "", withTokenEnvs(envs))
			if err != nil {
				return err
			}
			token, err := readToken(s.str)
			if err != nil {
				return err
			}
			tc, err := serverTLS(s.str).Server()
			if err != nil {
				return err
			}
			ln, err := net.Listen("tcp", net.JoinHostPort(s.str("host"), strconv.Itoa(s.integer("port"))))
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			scheme := "http"
			if tc != nil {
				scheme = "https"
			}
			url := fmt.Sprintf("%s://%s/metadata", scheme, ln.Addr())
			slog.Info("metadata server listening", "url", url, "token", token != "", "mutual_tls", tc != nil && tc.ClientCAs != nil)
			// Tests and scripts read the address from stdout.
			fmt.Fprintln(cmd.OutOrStdout(), url)
			return metadata.NewServer(metadata.ServerToken(token), metadata.ServerTLS(tc)).Serve(ctx, ln)
		},
	}
	f := c.Flags()
	f.String("host", "127.0.0.1", "address to listen on")
	f.Int("port", 8080, "port to listen on (0 picks one)")
	addTokenFlags(f, "server requires")
	addServerTLSFlags(f)
	return c
}
