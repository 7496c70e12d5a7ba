package main

import (
	"bufio"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/sluice-io/sluice"
)

func newKeysCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "keys",
		Short: "Compute and generate API keys for the service config",
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "hash [KEY...]",
		Short: "Print the SHA-256 hash of each API key, for the config's keys[].hash",
		Long: `Print the lowercase hex SHA-256 of each API key, as the config's keys[].hash
wants it. With no arguments, keys are read from standard input, one a line,
which keeps them out of the shell history.`,
		Example: "  sluice keys hash sk-free-demo-0001\n  sluice keys hash < keys.txt",
		RunE: func(cmd *cobra.Command, args []string) error {
			out := cmd.OutOrStdout()
			if len(args) > 0 {
				for _, k := range args {
					fmt.Fprintln(out, sluice.HashKey(k))
				}
				return nil
			}
			sc := bufio.NewScanner(cmd.InOrStdin())
			sc.Buffer(make([]byte, 4096), 64<<10)
			for sc.Scan() {
				if k := strings.TrimSpace(sc.Text()); k != "" {
					fmt.Fprintln(out, sluice.HashKey(k))
				}
			}
			if err := sc.Err(); err != nil {
				return fmt.Errorf("keys hash: %w", err)
			}
			return nil
		},
	})
	var prefix, tier, name string
	gen := &cobra.Command{
		Use:   "generate",
		Short: "Generate a random API key and print it with its config entry",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var b [24]byte
			_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
			key := prefix + base64.RawURLEncoding.EncodeToString(b[:])
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "key: %s\n# config entry (the key itself is not stored):\n  - name: %s\n    hash: %s\n    tier: %s\n",
				key, name, sluice.HashKey(key), tier)
			return err
		},
	}
	gen.Flags().StringVar(&prefix, "prefix", "sk-", "key prefix")
	gen.Flags().StringVar(&tier, "tier", "free", "tier of the config entry")
	gen.Flags().StringVar(&name, "name", "new-key", "name of the config entry")
	cmd.AddCommand(gen)
	return cmd
}
