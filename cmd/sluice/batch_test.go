package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-io/sluice/internal/fakeanthropic"
	"github.com/sluice-io/sluice/internal/fakeopenai"
)

func TestBatchCommand(t *testing.T) {
	up := fakeopenai.New(t, fakeopenai.Options{APIKey: "sk-cmd"})
	up.Enqueue(fakeopenai.Fault{Status: 400}) // the first prompt fails for good
	t.Setenv("SLUICE_TEST_KEY", "sk-cmd")
	dir := t.TempDir()
	in, out := filepath.Join(dir, "in.txt"), filepath.Join(dir, "out.jsonl")
	if err := os.WriteFile(in, []byte("first\nsecond\nthird\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"batch", "--input", in, "--output", out, "--model", "deepseek-v3.2", "--base-url", up.BaseURL(),
		"--api-key-env", "SLUICE_TEST_KEY", "--rate", "1000/s", "--tpm", "1000000", "--concurrency", "1", "--progress", "none",
		"--price", "deepseek-v3.2=1000000"}
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), args, &stdout, &stderr)
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != 1 {
		t.Fatalf("err = %v, want exit code 1\n%s", err, stderr.String())
	}
	for _, want := range []string{"succeeded 2, failed 1", "estimated cost $"} {
		if !strings.Contains(stdout.String(), want) {
			t.Fatalf("summary lacks %q:\n%s", want, stdout.String())
		}
	}
	if strings.Contains(stdout.String()+stderr.String(), "sk-cmd") {
		t.Fatal("the API key was printed")
	}
	// The rerun skips all three and still reports the failure.
	stdout.Reset()
	err = run(context.Background(), args, &stdout, &stderr)
	if !errors.As(err, &ee) || ee.code != 1 || !strings.Contains(stdout.String(), "skipped 2 already done, 1 already failed") || up.Count() != 3 {
		t.Fatalf("rerun: %v, %d requests\n%s", err, up.Count(), stdout.String())
	}
	// An interrupted run exits 130.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	in2 := filepath.Join(dir, "in2.txt")
	if err := os.WriteFile(in2, []byte("x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	args[2], args[4] = in2, filepath.Join(dir, "out2.jsonl")
	if err := run(ctx, args, &stdout, &stderr); !errors.As(err, &ee) || ee.code != 130 {
		t.Fatalf("interrupted: %v", err)
	}
}

func TestBatchCommandErrors(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "in.txt")
	_ = os.WriteFile(in, []byte("x\n"), 0o644)
	for _, args := range [][]string{
		{"batch", "--output", "o"},
		{"batch", "--input", in, "--output", filepath.Join(dir, "o"), "--rate", "fast"},
		{"batch", "--input", in, "--output", filepath.Join(dir, "o"), "--progress", "loud"},
		{"batch", "--input", in, "--output", filepath.Join(dir, "o"), "--price", "m=cheap"},
		{"batch", "--input", in, "--output", filepath.Join(dir, "o"), "--base-url", "not a url"},
		{"batch", "--input", filepath.Join(dir, "missing"), "--output", filepath.Join(dir, "o")},
		{"batch", "--input", in, "--output", filepath.Join(dir, "o"), "--redis", "mongodb://x"},
	} {
		var stdout, stderr bytes.Buffer
		if err := run(context.Background(), args, &stdout, &stderr); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}

// TestBatchRefusesEmptyKeyAndModel: an empty key variable for a remote API,
// or prompts without a model and no --model, stop the run before any
// request or output line; a local API needs no key.
func TestBatchRefusesEmptyKeyAndModel(t *testing.T) {
	up := fakeopenai.New(t, fakeopenai.Options{})
	dir := t.TempDir()
	in := filepath.Join(dir, "in.txt")
	if err := os.WriteFile(in, []byte("first\nsecond\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SLUICE_TEST_EMPTY_KEY", "")
	out := filepath.Join(dir, "out.jsonl")
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"batch", "--input", in, "--output", out, "--model", "gpt-4o-mini",
		"--base-url", "https://api.openai.com/v1", "--api-key-env", "SLUICE_TEST_EMPTY_KEY", "--progress", "none"}, &stdout, &stderr)
	if err == nil || !strings.Contains(err.Error(), "SLUICE_TEST_EMPTY_KEY is empty") || !strings.Contains(err.Error(), "--api-key-env") {
		t.Fatalf("remote API without a key: %v", err)
	}
	if _, serr := os.Stat(out); !os.IsNotExist(serr) {
		t.Fatalf("output written: %v", serr)
	}
	// Local: allowed, and said so; but no --model stops at the first prompt.
	stderr.Reset()
	err = run(context.Background(), []string{"batch", "--input", in, "--output", out,
		"--base-url", up.BaseURL(), "--api-key-env", "SLUICE_TEST_EMPTY_KEY", "--progress", "none"}, &stdout, &stderr)
	if err == nil || !strings.Contains(err.Error(), "--model") || up.Count() != 0 {
		t.Fatalf("no model: %v, %d requests", err, up.Count())
	}
	if !strings.Contains(stderr.String(), "no API key") {
		t.Errorf("stderr does not say no key is sent:\n%s", stderr.String())
	}
	// The rerun with --model does every prompt: none was recorded failed.
	stdout.Reset()
	err = run(context.Background(), []string{"batch", "--input", in, "--output", out, "--model", "gpt-4o-mini",
		"--base-url", up.BaseURL(), "--api-key-env", "SLUICE_TEST_EMPTY_KEY", "--progress", "none"}, &stdout, &stderr)
	if err != nil || !strings.Contains(stdout.String(), "succeeded 2, failed 0") || strings.Contains(stdout.String(), "no price") {
		t.Fatalf("rerun: %v\n%s", err, stdout.String())
	}
}

// TestBatchCommandAnthropic: --api anthropic runs the prompts through a
// Messages API (key as x-api-key), records the answers and resumes.
func TestBatchCommandAnthropic(t *testing.T) {
	up := fakeanthropic.New(t, fakeanthropic.Options{APIKey: "sk-ant-cmd", OutputTokens: 3})
	up.Enqueue(fakeanthropic.Fault{Status: 529}) // retried
	t.Setenv("SLUICE_TEST_KEY", "sk-ant-cmd")
	dir := t.TempDir()
	in, out := filepath.Join(dir, "in.txt"), filepath.Join(dir, "out.jsonl")
	if err := os.WriteFile(in, []byte("first\nsecond\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"batch", "--api", "anthropic", "--input", in, "--output", out, "--model", "claude-test", "--base-url", up.URL() + "/v1",
		"--api-key-env", "SLUICE_TEST_KEY", "--rate", "1000/s", "--tpm", "1000000", "--concurrency", "1", "--progress", "none", "--max-retries", "2"}
	var stdout, stderr bytes.Buffer
	if err := run(context.Background(), args, &stdout, &stderr); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	if !strings.Contains(stdout.String(), "succeeded 2, failed 0") || up.Count() != 3 {
		t.Fatalf("%d requests:\n%s", up.Count(), stdout.String())
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Count(string(data), `"response":"tok tok tok "`) != 2 {
		t.Fatalf("output:\n%s", data)
	}
	for _, r := range up.Requests() {
		if r.Path != "/v1/messages" || r.Header.Get("X-Api-Key") != "sk-ant-cmd" {
			t.Fatalf("request %s %v", r.Path, r.Header)
		}
	}
	stdout.Reset()
	if err := run(context.Background(), args, &stdout, &stderr); err != nil || up.Count() != 3 {
		t.Fatalf("rerun: %v, %d requests\n%s", err, up.Count(), stdout.String())
	}
	args[2] = "gemini"
	if err := run(context.Background(), args, &stdout, &stderr); err == nil || !strings.Contains(err.Error(), "--api") {
		t.Fatalf("--api gemini: %v", err)
	}
}
