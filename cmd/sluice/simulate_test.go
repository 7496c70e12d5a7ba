package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSimulateCommand(t *testing.T) {
	chart := filepath.Join(t.TempDir(), "c.svg")
	var out, errOut bytes.Buffer
	if err := run(context.Background(), []string{"simulate", "--duration", "6s", "--chart", chart}, &out, &errOut); err != nil {
		t.Fatalf("simulate: %v\n%s", err, errOut.String())
	}
	if !strings.Contains(out.String(), "token_bucket ok/denied") || !strings.Contains(out.String(), "24/21") {
		t.Fatalf("output:\n%s", out.String())
	}
	if b, err := os.ReadFile(chart); err != nil || !bytes.HasPrefix(b, []byte("<svg")) {
		t.Fatalf("chart: %v", err)
	}
}

func TestSimulateCommandErrors(t *testing.T) {
	for _, args := range [][]string{
		{"simulate", "--limit", "0/s"},
		{"simulate", "--algorithms", "leaky_bucket"},
		{"simulate", "--pattern", "file:/does/not/exist"},
		{"simulate", "--pattern", "zigzag"},
		{"simulate", "--algorithms", "concurrency"},
	} {
		var out bytes.Buffer
		if err := run(context.Background(), args, &out, &out); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}
