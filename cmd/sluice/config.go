package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/sluice-io/sluice/internal/config"
)

func newConfigCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Work with service config files",
	}
	cmd.AddCommand(&cobra.Command{
		Use:     "check FILE...",
		Short:   "Validate config files offline; exit 1 if any is invalid",
		Example: "  sluice config check examples/sluice.yaml",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			bad := 0
			for _, path := range args {
				cfg, err := config.Load(path)
				if err != nil {
					bad++
					fmt.Fprintln(cmd.ErrOrStderr(), err)
					continue
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s: ok: %d policies, %d tiers, %d keys, %d overrides, store %s (%s)\n",
					path, len(cfg.Policies), len(cfg.Tiers), len(cfg.Keys), len(cfg.File.Overrides), storeKind(cfg.Store), cfg.Store.FailurePolicy)
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
