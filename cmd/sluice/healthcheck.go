package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/spf13/cobra"
)

// defaultHealthURL is what `sluice healthcheck` asks without an argument:
// the liveness endpoint of `sluice serve` on its default listen address.
const defaultHealthURL = "http://127.0.0.1:8080/healthz"

// newHealthcheckCmd is a tiny HTTP probe for container HEALTHCHECKs: the
// image has no shell and no curl, so the binary probes itself.
func newHealthcheckCmd() *cobra.Command {
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "healthcheck [URL]",
		Short: "Exit 0 if URL (default " + defaultHealthURL + ") answers 2xx",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			target := defaultHealthURL
			if len(args) == 1 {
				target = args[0]
			}
			return probe(cmd.Context(), target, timeout)
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 2*time.Second, "how long to wait for the answer")
	return cmd
}

// probe GETs target and fails unless it answers 2xx within timeout.
func probe(ctx context.Context, target string, timeout time.Duration) error {
	u, err := url.Parse(target)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("healthcheck: %q is not an http(s) URL", target)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("healthcheck: %s answered %s", u.Redacted(), resp.Status)
	}
	return nil
}
