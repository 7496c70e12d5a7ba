package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"

	"github.com/sluice-io/sluice/internal/config"
)

// TestKeysHashAdmin: `sluice keys hash --admin NAME` refuses a guessable
// token with how to make one, and prints a strong one's admin_tokens
// entry, which loads and names the operator.
func TestKeysHashAdmin(t *testing.T) {
	var out bytes.Buffer
	err := run(context.Background(), []string{"keys", "hash", "--admin", "alice", "aaaaaaaaaaaaaaaa"}, &out, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "openssl rand -hex 32") || out.Len() != 0 {
		t.Fatalf("a guessable token: %v, printed %q", err, out.String())
	}
	root := newRootCmd()
	root.SetArgs([]string{"keys", "hash", "--admin", "alice"})
	root.SetIn(strings.NewReader("4e7b0c19d2a85f63e1b9c07d\n"))
	root.SetOut(&out)
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse("s.yaml", []byte("policies:\n  p: {limit: 1/s}\nadmin_tokens:\n"+out.String()))
	if err != nil {
		t.Fatalf("%s: %v", out.String(), err)
	}
	if len(cfg.AdminTokens) != 1 || cfg.AdminTokens[0].Name != "alice" || cfg.AdminTokens[0].Hash != config.HashAdminToken("4e7b0c19d2a85f63e1b9c07d") {
		t.Fatalf("%+v", cfg.AdminTokens)
	}
}
