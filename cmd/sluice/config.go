package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/sluice-io/sluice/internal/config"
	"github.com/sluice-io/sluice/internal/envoyrls"
)

func newConfigCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Work with service config files",
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "check FILE|DIR...",
		Short: "Validate config files offline; exit 1 if any is invalid",
		Long: `check validates sluice config files offline, including the envoyproxy/ratelimit
directory that an envoy: section points at. A directory argument is checked as
an envoyproxy/ratelimit config directory.`,
		Example: "  sluice config check examples/sluice.yaml\n  sluice config check deploy/envoy/ratelimit",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			bad := 0
			for _, path := range args {
				if fi, err := os.Stat(path); err == nil && fi.IsDir() {
					n, err := envoyrls.CheckDir(path, false)
					if err != nil {
						bad++
						fmt.Fprintln(cmd.ErrOrStderr(), err)
						continue
					}
					fmt.Fprintf(cmd.OutOrStdout(), "%s: ok: envoyproxy/ratelimit config, %d domains\n", path, n)
					continue
				}
				cfg, err := config.Load(path)
				if err != nil {
					bad++
					fmt.Fprintln(cmd.ErrOrStderr(), err)
					continue
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s: ok: %d policies, %d tiers, %d keys, %d overrides, store %s (%s)\n",
					path, len(cfg.Policies), len(cfg.Tiers), len(cfg.Keys), len(cfg.File.Overrides), storeKind(cfg.Store), cfg.Store.FailurePolicy)
				if sec := cfg.File.Envoy; sec != nil {
					dir := sec.ConfigDir
					if !filepath.IsAbs(dir) {
						dir = filepath.Join(filepath.Dir(path), dir)
					}
					n, err := envoyrls.CheckDir(dir, sec.MergeDomains)
					if err != nil {
						bad++
						fmt.Fprintf(cmd.ErrOrStderr(), "%s: envoy.config_dir: %v\n", path, err)
						continue
					}
					fmt.Fprintf(cmd.OutOrStdout(), "%s: ok: envoy config_dir %s, %d domains\n", path, dir, n)
				}
			}
			if bad > 0 {
				return &exitError{code: 1, err: fmt.Errorf("config check: %d of %d files invalid: %w", bad, len(args), config.ErrInvalid)}
			}
			return nil
		},
	})
	return cmd
}

func storeKind(s config.StoreSection) string {
	if s.IsMemory() {
		return "memory"
	}
	return "redis"
}
