package main

import (
	"bufio"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/internal/config"
)

func newKeysCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "keys",
		Short: "Compute and generate API keys for the service config",
	}
	var admin string
	hash := &cobra.Command{
		Use:   "hash [KEY...]",
		Short: "Print the SHA-256 hash of each API key, for the config's keys[].hash",
		Long: `Print the lowercase hex SHA-256 of each API key, as the config's keys[].hash
wants it. With no arguments, keys are read from standard input, one a line,
which keeps them out of the shell history.

With --admin NAME the keys are admin tokens: each is refused if it is easy
to guess (make one with: ` + config.MakeAdminToken + `), else printed as an
admin_tokens entry named NAME.`,
		Example: "  sluice keys hash sk-free-demo-0001\n  sluice keys hash < keys.txt\n  openssl rand -hex 32 | tee alice.token | sluice keys hash --admin alice",
		RunE: func(cmd *cobra.Command, args []string) error {
			out := cmd.OutOrStdout()
			print := func(k string) error {
				if admin == "" {
					_, err := fmt.Fprintln(out, sluice.HashKey(k))
					return err
				}
				if problem := config.WeakToken(k); problem != "" {
					return fmt.Errorf("keys hash: admin token: %s; make one with: %s", problem, config.MakeAdminToken)
				}
				_, err := fmt.Fprintf(out, "  - {name: %s, hash: %s}\n", admin, sluice.HashKey(k))
				return err
			}
			if len(args) > 0 {
				for _, k := range args {
					if err := print(k); err != nil {
						return err
					}
				}
				return nil
			}
			sc := bufio.NewScanner(cmd.InOrStdin())
			sc.Buffer(make([]byte, 4096), 64<<10)
			for sc.Scan() {
				if k := strings.TrimSpace(sc.Text()); k != "" {
					if err := print(k); err != nil {
						return err
					}
				}
			}
			if err := sc.Err(); err != nil {
				return fmt.Errorf("keys hash: %w", err)
			}
			return nil
		},
	}
	hash.Flags().StringVar(&admin, "admin", "", "the keys are admin tokens of the operator NAME: check their strength and print admin_tokens entries")
	cmd.AddCommand(hash)
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
