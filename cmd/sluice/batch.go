package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/aiclient"
	"github.com/sluice-io/sluice/guard"
	"github.com/sluice-io/sluice/internal/batch"
	"github.com/sluice-io/sluice/memstore"
	"github.com/sluice-io/sluice/redisstore"
)

// batchFlags are the options of `sluice batch`.
type batchFlags struct {
	input, output, model    string
	maxTokens               int64
	baseURL, apiKeyEnv      string
	api                     string
	rate                    string
	burst                   int64
	tpm, tokenBurst         int64
	concurrency             int
	redisURL, redisPolicy   string
	limitKey                string
	maxRetries              int
	timeout, grace          time.Duration
	retryFailed, noSync     bool
	prices                  []string
	pricesFile              string
	progress                string
	progressInterval        time.Duration
	maxLineBytes, maxIDs    int
	defaultCompletionTokens int64
}

func newBatchCmd() *cobra.Command {
	var f batchFlags
	cmd := &cobra.Command{
		Use:   "batch --input prompts.jsonl --output results.jsonl --model MODEL",
		Short: "Run a file of prompts through an OpenAI-compatible API at a shared, limited pace",
		Long: `batch sends every prompt of --input to an OpenAI-compatible chat completion
API and appends one JSON line per prompt to --output as it completes.

The input is plain text (one prompt per line) or JSONL with "id" and
"messages" or "prompt", plus optional "model", "max_tokens" and parameters.
Rerunning with the same --output skips the ids already there, so nothing is
lost or paid for twice. Calls wait for --rate and --tpm; with --redis, every
process on that Redis shares them. Ctrl-C stops launching, lets calls in
flight finish for up to --grace, and prints the summary.

--api anthropic calls Anthropic's Messages API instead (POST /messages, the
key as x-api-key, base URL https://api.anthropic.com/v1 and key variable
ANTHROPIC_API_KEY unless given), paced by its anthropic-ratelimit-* headers.

The API key is read from the environment variable named by --api-key-env.
The exit code is 1 when any prompt failed for good, 130 when interrupted.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch f.api {
			case aiclient.APIOpenAI:
			case aiclient.APIAnthropic:
				if !cmd.Flags().Changed("base-url") {
					f.baseURL = "https://api.anthropic.com/v1"
				}
				if !cmd.Flags().Changed("api-key-env") {
					f.apiKeyEnv = "ANTHROPIC_API_KEY"
				}
			default:
				return fmt.Errorf("batch: --api %q: want openai or anthropic", f.api)
			}
			return runBatch(cmd.Context(), &f, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.input, "input", "", `prompts file, or "-" for standard input (required)`)
	fl.StringVar(&f.output, "output", "", "results JSONL file, created or resumed (required)")
	fl.StringVar(&f.model, "model", "", "model for prompts that name none")
	fl.Int64Var(&f.maxTokens, "max-tokens", 0, "max_tokens for prompts that set none (0: the server's default)")
	fl.StringVar(&f.baseURL, "base-url", envOr("OPENAI_BASE_URL", "https://api.openai.com/v1"), "API base URL ($OPENAI_BASE_URL)")
	fl.StringVar(&f.apiKeyEnv, "api-key-env", "OPENAI_API_KEY", "environment variable holding the API key (ANTHROPIC_API_KEY with --api anthropic)")
	fl.StringVar(&f.api, "api", aiclient.APIOpenAI, "wire format of the API: openai (chat completions) or anthropic (messages)")
	fl.StringVar(&f.rate, "rate", "", `request limit, such as "3/s" or "500/min" (none when empty)`)
	fl.Int64Var(&f.burst, "burst", 0, "request burst (default: the rate)")
	fl.Int64Var(&f.tpm, "tpm", 0, "token limit per minute (0: none)")
	fl.Int64Var(&f.tokenBurst, "token-burst", 0, "token burst (default: --tpm)")
	fl.IntVar(&f.concurrency, "concurrency", batch.DefaultConcurrency, "calls in flight at most")
	fl.StringVar(&f.redisURL, "redis", "", "Redis URL to share the limits with other processes, such as redis://host:6379")
	fl.StringVar(&f.redisPolicy, "redis-policy", "fail_closed", "when Redis fails: fail_closed (wait), local, fail_open or error")
	fl.StringVar(&f.limitKey, "limit-key", "", "limiter key shared by cooperating processes (default: a hash of the API key)")
	fl.IntVar(&f.maxRetries, "max-retries", 5, "retries per prompt after the first attempt")
	fl.DurationVar(&f.timeout, "timeout", 10*time.Minute, "timeout of one attempt")
	fl.DurationVar(&f.grace, "grace", batch.DefaultGrace, "how long calls in flight may finish after Ctrl-C")
	fl.BoolVar(&f.retryFailed, "retry-failed", false, "on a rerun, call again the prompts recorded as failed")
	fl.BoolVar(&f.noSync, "no-sync", false, "do not fsync the output after each line")
	fl.StringArrayVar(&f.prices, "price", nil, "price override MODEL=USD_PER_MTOK or MODEL=IN/OUT (repeatable)")
	fl.StringVar(&f.pricesFile, "prices", "", `JSON price file {"model":{"input":0.42,"output":0.84}}`)
	fl.StringVar(&f.progress, "progress", "auto", "progress display: auto, bar, log or none")
	fl.DurationVar(&f.progressInterval, "progress-interval", batch.DefaultProgressInterval, "time between progress lines without a terminal")
	fl.IntVar(&f.maxLineBytes, "max-line-bytes", batch.DefaultMaxLineBytes, "longest input line accepted")
	fl.IntVar(&f.maxIDs, "max-ids", batch.DefaultMaxIDs, "most distinct prompt ids remembered")
	fl.Int64Var(&f.defaultCompletionTokens, "completion-estimate", 256, "completion tokens assumed for the token limit when max_tokens is unset")
	_ = cmd.MarkFlagRequired("input")
	_ = cmd.MarkFlagRequired("output")
	return cmd
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func runBatch(ctx context.Context, f *batchFlags, stdout, stderr io.Writer) error {
	tty := false
	if file, ok := stderr.(*os.File); ok {
		tty = term.IsTerminal(int(file.Fd()))
	}
	var progress io.Writer = stderr
	switch f.progress {
	case "auto":
	case "bar":
		tty = true
	case "log":
		tty = false
	case "none":
		progress = nil
	default:
		return fmt.Errorf("batch: --progress %q: want auto, bar, log or none", f.progress)
	}
	logger := slog.New(slog.NewTextHandler(stderr, nil))

	prices := batch.DefaultPrices()
	if f.pricesFile != "" {
		if err := prices.LoadPrices(f.pricesFile); err != nil {
			return err
		}
	}
	for _, p := range f.prices {
		if err := prices.Set(p); err != nil {
			return err
		}
	}

	apiKey := os.Getenv(f.apiKeyEnv)
	if apiKey == "" {
		if !isLocalURL(f.baseURL) {
			return fmt.Errorf("batch: the API key variable %s is empty, so every request to %s would go without a key and fail; "+
				"set %s, or name another variable with --api-key-env (a --base-url on localhost needs no key)", f.apiKeyEnv, f.baseURL, f.apiKeyEnv)
		}
		logger.Info("batch: no API key: the variable is empty, and the API is on this machine", "api_key_env", f.apiKeyEnv, "base_url", f.baseURL)
	}
	store, closeStore, err := batchStore(ctx, f, logger)
	if err != nil {
		return err
	}
	defer closeStore()
	opts := aiclient.Options{
		BaseURL:                 f.baseURL,
		API:                     f.api,
		APIKey:                  apiKey,
		LimitKey:                f.limitKey,
		MaxRetries:              f.maxRetries,
		AttemptTimeout:          f.timeout,
		DefaultCompletionTokens: f.defaultCompletionTokens,
		Logger:                  logger,
	}
	if f.maxRetries == 0 {
		opts.MaxRetries = aiclient.NoRetries
	}
	if f.rate != "" {
		l, err := sluice.ParseLimit(f.rate)
		if err != nil {
			return fmt.Errorf("batch: --rate: %w", err)
		}
		if f.burst > 0 {
			l.Burst = f.burst
		}
		if opts.Requests, err = sluice.NewLimiter(sluice.Options{Store: store, Limit: l, Prefix: "sluice:batch:req:"}); err != nil {
			return fmt.Errorf("batch: --rate/--burst: %w", err)
		}
	}
	if f.tpm > 0 {
		l := sluice.Limit{Rate: f.tpm, Period: time.Minute, Burst: f.tokenBurst}
		if opts.Tokens, err = sluice.NewLimiter(sluice.Options{Store: store, Limit: l, Prefix: "sluice:batch:tok:"}); err != nil {
			return fmt.Errorf("batch: --tpm/--token-burst: %w", err)
		}
	}
	client, err := aiclient.New(opts)
	if err != nil {
		return err
	}

	input, total, closeInput, err := openInput(f.input)
	if err != nil {
		return err
	}
	defer closeInput()
	sum, err := batch.Run(ctx, batch.Config{
		Input: input, Total: total, Output: f.output, NoSync: f.noSync,
		Client: client, Model: f.model, MaxTokens: f.maxTokens,
		Concurrency: f.concurrency, Grace: max(f.grace, 0), RetryFailed: f.retryFailed,
		Prices: prices, Progress: progress, TTY: tty, ProgressInterval: f.progressInterval,
		MaxLineBytes: f.maxLineBytes, MaxIDs: f.maxIDs, Logger: logger,
	})
	if sum != nil {
		if werr := sum.Write(stdout); werr != nil && err == nil {
			err = werr
		}
	}
	switch {
	case err != nil:
		return err
	case sum.Interrupted:
		return &exitError{code: 130, err: fmt.Errorf("batch: interrupted; rerun with the same --output to resume")}
	case sum.FailedForGood() > 0:
		return &exitError{code: 1, err: fmt.Errorf("batch: %d prompts failed; their lines in %s say why", sum.FailedForGood(), f.output)}
	}
	return nil
}

// batchStore returns the store for the limiters: Redis when --redis is
// set, so that processes share the limits, or memory.
func batchStore(ctx context.Context, f *batchFlags, logger *slog.Logger) (sluice.Store, func(), error) {
	if f.redisURL == "" {
		s, err := memstore.New(memstore.Options{MaxKeys: 1024})
		if err != nil {
			return nil, nil, err
		}
		return s, func() { _ = s.Close() }, nil
	}
	policy, err := guard.ParsePolicy(f.redisPolicy)
	if err != nil {
		return nil, nil, fmt.Errorf("batch: --redis-policy: %w", err)
	}
	rs, err := redisstore.New(ctx, redisstore.Options{URL: f.redisURL, Timeout: guard.StoreTimeout(0, 0), Logger: logger})
	if err != nil {
		return nil, nil, fmt.Errorf("batch: --redis: %w", err)
	}
	s, err := guard.New(rs, guard.Options{Policy: policy, Logger: logger, CloseStore: true})
	if err != nil {
		_ = rs.Close()
		return nil, nil, fmt.Errorf("batch: %w", err)
	}
	return s, func() { _ = s.Close() }, nil
}

// openInput opens the prompts and counts them when the input is a regular
// file, for the progress bar.
func openInput(path string) (io.Reader, int64, func(), error) {
	if path == "-" {
		return os.Stdin, 0, func() {}, nil
	}
	file, err := os.Open(path)
	if err != nil {
		return nil, 0, nil, fmt.Errorf("batch: %w", err)
	}
	var total int64
	if st, err := file.Stat(); err == nil && st.Mode().IsRegular() {
		if total, err = batch.CountPrompts(file); err != nil {
			file.Close()
			return nil, 0, nil, err
		}
		if _, err := file.Seek(0, io.SeekStart); err != nil {
			file.Close()
			return nil, 0, nil, fmt.Errorf("batch: %w", err)
		}
	}
	return file, total, func() { _ = file.Close() }, nil
}
