// Package batch runs a file of prompts through an OpenAI-compatible API
// with an aiclient.Client: streamed input, a JSONL output that doubles as
// the journal a rerun resumes from, a bounded number of calls in flight,
// progress, and a summary with the cost. It is `sluice batch`.
//
// The input is read one line at a time and never held whole. Memory grows
// only with the set of ids seen, at about 40 bytes per id whatever its
// length, bounded by Config.MaxIDs.
//
// Shutdown: when the context is cancelled (Ctrl-C), no new attempt is
// launched, calls already sent run on for up to Config.Grace, and Run
// returns a Summary with Interrupted set. Prompts that did not finish are
// not written, so a rerun does them.
package batch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/sluice-io/sluice/aiclient"
)

// ErrNoModel means a prompt names no model and Config.Model (--model) is
// empty. Run stops at the first such prompt instead of recording every
// prompt as failed: it is the run's setting that is missing, not the
// prompt that is wrong.
var ErrNoModel = errors.New("batch: no model: set --model MODEL, or a \"model\" field on every JSONL line")

// Defaults for Config.
const (
	DefaultConcurrency      = 8
	DefaultGrace            = 30 * time.Second
	DefaultProgressInterval = 10 * time.Second
	DefaultMaxIDs           = 10_000_000
)

// Config configures Run. Input, Output and Client are required.
type Config struct {
	// Input is the prompts, streamed (see Reader).
	Input io.Reader
	// Total is the number of prompts in Input when known (CountPrompts),
	// for the progress bar's percentage and ETA.
	Total int64
	// Output is the path of the JSONL output, created or resumed.
	Output string
	// NoSync skips the fsync after each record. Records are still written
	// whole, one write each.
	NoSync bool
	// Client calls the API.
	Client *aiclient.Client
	// Model and MaxTokens are the defaults for prompts that set none.
	Model     string
	MaxTokens int64
	// Concurrency bounds the calls in flight; DefaultConcurrency when 0.
	Concurrency int
	// Grace is how long calls in flight may finish after cancellation;
	// DefaultGrace when 0, none when negative.
	Grace time.Duration
	// RetryFailed makes a rerun call the prompts whose record says failed;
	// by default a rerun skips every id that has a record.
	RetryFailed bool
	// Prices is the price table for the summary's cost; nil means
	// DefaultPrices.
	Prices Prices
	// Progress receives the progress bar or lines; nil means none.
	Progress io.Writer
	// TTY draws a bar on Progress instead of periodic log lines.
	TTY bool
	// ProgressInterval is the time between progress lines without a TTY;
	// DefaultProgressInterval when 0.
	ProgressInterval time.Duration
	// MaxLineBytes bounds an input line; DefaultMaxLineBytes when 0.
	MaxLineBytes int
	// MaxIDs bounds the distinct ids remembered; DefaultMaxIDs when 0.
	MaxIDs int
	// Logger receives warnings, and progress lines without a TTY. Nil
	// means a text logger on Progress, or nothing.
	Logger *slog.Logger
}

// Summary is the outcome of a run.
type Summary struct {
	// OK and Failed count the prompts answered and failed for good in
	// this run.
	OK, Failed int64
	// SkippedOK and SkippedFailed count the prompts skipped because the
	// output already had them (failed ones only without RetryFailed).
	SkippedOK, SkippedFailed int64
	// Duplicates counts input lines whose id came earlier in the input.
	Duplicates int64
	// Retried counts prompts that needed more than one attempt; Retries
	// counts the retries.
	Retried, Retries int64
	// PromptTokens and CompletionTokens are the usage of this run.
	PromptTokens, CompletionTokens int64
	// Cost is the estimated cost of this run in US dollars, over the
	// models with a price; UnpricedModels names the others.
	Cost           float64
	UnpricedModels []string
	// Interrupted reports that the run was cancelled before the input's
	// end; Unfinished counts the prompts started but not finished, left
	// for a rerun.
	Interrupted bool
	Unfinished  int64
	// Left counts the prompts a rerun would still call: those started but
	// not finished plus those never read, when Config.Total is known
	// (Total minus answered, failed, skipped and duplicate lines), else
	// Unfinished.
	Left int64
	// LinesRead is the number of input lines read; when Total is unknown,
	// the lines after it are left too.
	LinesRead int64
	// Total is Config.Total.
	Total int64
	// RetryFailed is Config.RetryFailed, for the summary's advice.
	RetryFailed bool
	// TornBytes is the size of a torn last line cut from the output.
	TornBytes int64
	// Elapsed is the run's duration.
	Elapsed time.Duration
}

// FailedForGood counts prompts whose latest record is a failure: those of
// this run and those skipped as failed.
func (s *Summary) FailedForGood() int64 { return s.Failed + s.SkippedFailed }

// Write prints the summary as a few lines of text.
func (s *Summary) Write(w io.Writer) error {
	state := "done"
	if s.Interrupted {
		state = "interrupted"
	}
	rate := 0.0
	if sec := s.Elapsed.Seconds(); sec > 0 {
		rate = float64(s.OK+s.Failed) / sec
	}
	cost := fmt.Sprintf("$%.4f", s.Cost)
	if len(s.UnpricedModels) > 0 {
		cost += fmt.Sprintf(" (no price for %v; add --price MODEL=USD_PER_MTOK)", s.UnpricedModels)
	}
	skippedFailed := fmt.Sprintf("%d already failed", s.SkippedFailed)
	if s.SkippedFailed > 0 && !s.RetryFailed {
		skippedFailed += " (not called again: rerun with --retry-failed to retry them)"
	}
	left := ""
	switch {
	case s.Total == 0 && s.Interrupted:
		left = fmt.Sprintf("  left for a rerun with the same --output: %d in flight when stopped, and every line after line %d\n", s.Unfinished, s.LinesRead)
	case s.Left > 0 || s.Interrupted:
		left = fmt.Sprintf("  %d left for a rerun with the same --output (%d were in flight when stopped)\n", s.Left, s.Unfinished)
	}
	_, err := fmt.Fprintf(w, "batch %s in %s (%.2f prompts/s)\n"+
		"  succeeded %d, failed %d, retried %d (%d retries)\n"+
		"  skipped %d already done, %s, %d duplicate ids\n"+
		"%s"+
		"  tokens %d prompt + %d completion = %d\n"+
		"  estimated cost %s\n",
		state, s.Elapsed.Round(time.Millisecond), rate,
		s.OK, s.Failed, s.Retried, s.Retries,
		s.SkippedOK, skippedFailed, s.Duplicates,
		left,
		s.PromptTokens, s.CompletionTokens, s.PromptTokens+s.CompletionTokens,
		cost)
	return err
}

// Run processes the input as Config describes. It returns an error only
// when the run itself cannot go on (bad options, unreadable input, an
// unwritable output); prompts that fail are counted in the Summary. After
// ctx is cancelled it returns even while a read of Input blocks (a stalled
// pipe); the goroutine in that read stays until it returns.
func Run(ctx context.Context, cfg Config) (*Summary, error) {
	if cfg.Input == nil || cfg.Output == "" || cfg.Client == nil {
		return nil, errors.New("batch: Input, Output and Client are required")
	}
	if cfg.Concurrency < 0 || cfg.MaxIDs < 0 || cfg.MaxLineBytes < 0 {
		return nil, errors.New("batch: negative option")
	}
	cfg.Concurrency = cmpOr(cfg.Concurrency, DefaultConcurrency)
	cfg.MaxIDs = cmpOr(cfg.MaxIDs, DefaultMaxIDs)
	cfg.Grace = cmpOr(cfg.Grace, DefaultGrace)
	cfg.ProgressInterval = cmpOr(cfg.ProgressInterval, DefaultProgressInterval)
	if cfg.Prices == nil {
		cfg.Prices = DefaultPrices()
	}
	if cfg.Logger == nil {
		if cfg.Progress != nil {
			cfg.Logger = slog.New(slog.NewTextHandler(cfg.Progress, nil))
		} else {
			cfg.Logger = slog.New(slog.DiscardHandler)
		}
	}
	start := time.Now()
	out, resumed, err := OpenOutput(cfg.Output, !cfg.NoSync, cfg.MaxIDs, cfg.Logger)
	if err != nil {
		return nil, err
	}
	r := &runner{cfg: cfg, out: out, ids: resumed.done, sum: &Summary{TornBytes: resumed.TornBytes, RetryFailed: cfg.RetryFailed, Total: cfg.Total}}
	err = r.run(ctx)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	r.finish(time.Since(start))
	return r.sum, err
}

func cmpOr[T int | time.Duration](v, def T) T {
	if v == 0 {
		return def
	}
	return max(v, 0)
}

type runner struct {
	cfg Config
	out *Output
	ids *idSet // marks of the output's records and this run's launches
	c   counters
	sum *Summary

	errOnce sync.Once
	err     error
}

// fail records the first fatal error.
func (r *runner) fail(err error, stop context.CancelFunc) {
	r.errOnce.Do(func() { r.err = err })
	stop()
}

func (r *runner) run(ctx context.Context) error {
	// runCtx ends launching: on the caller's cancel or a fatal error.
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	// workCtx bounds calls in flight: it ends Grace after runCtx does.
	workCtx, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	finished := make(chan struct{})
	go func() {
		select {
		case <-runCtx.Done():
			t := time.NewTimer(r.cfg.Grace)
			defer t.Stop()
			select {
			case <-t.C:
				cancelWork()
			case <-finished:
			}
		case <-finished:
		}
	}()
	defer close(finished)

	progDone := make(chan struct{})
	progStop := make(chan struct{})
	if r.cfg.Progress != nil {
		p := &progress{w: r.cfg.Progress, tty: r.cfg.TTY, interval: r.cfg.ProgressInterval, total: r.cfg.Total, start: time.Now(), c: &r.c, log: r.cfg.Logger}
		go p.run(progStop, progDone)
	} else {
		close(progDone)
	}
	defer func() { close(progStop); <-progDone }()

	jobs := make(chan Prompt)
	var wg sync.WaitGroup
	for range r.cfg.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-runCtx.Done():
					return
				case p, ok := <-jobs:
					if !ok {
						return
					}
					r.handle(runCtx, workCtx, stop, p)
				}
			}
		}()
	}
	inputDone := r.produce(runCtx, stop, jobs)
	wg.Wait()
	r.sum.Interrupted = ctx.Err() != nil && (!inputDone || r.c.interrupted.Load() > 0)
	return r.err
}

// read is one Reader.Next, with the line count after it.
type read struct {
	p    Prompt
	err  error
	line int64
}

// readInput reads prompts into a channel in its own goroutine, so that a
// read that blocks (a pipe whose writer stalls) cannot hold the run after
// runCtx ends: that goroutine alone stays in Read until it returns.
func (r *runner) readInput(runCtx context.Context) <-chan read {
	rd := NewReader(r.cfg.Input, r.cfg.Model, r.cfg.MaxTokens, r.cfg.MaxLineBytes)
	reads := make(chan read)
	go func() {
		for {
			p, err := rd.Next()
			select {
			case reads <- read{p: p, err: err, line: rd.Line()}:
			case <-runCtx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	return reads
}

// produce feeds the workers until the input ends or runCtx does, and
// reports whether the input was read to its end.
func (r *runner) produce(runCtx context.Context, stop context.CancelFunc, jobs chan<- Prompt) bool {
	defer close(jobs)
	reads := r.readInput(runCtx)
	for {
		var next read
		select {
		case next = <-reads:
		case <-runCtx.Done():
			return false
		}
		r.sum.LinesRead = next.line
		p, err := next.p, next.err
		if errors.Is(err, io.EOF) {
			return true
		}
		if err != nil {
			r.fail(err, stop)
			return false
		}
		if errors.Is(p.Err, ErrNoModel) {
			r.fail(p.Err, stop)
			return false
		}
		marks := r.ids.get(p.ID)
		switch {
		case marks&markRun != 0:
			r.c.skipped.Add(1)
			r.sum.Duplicates++
			r.cfg.Logger.Warn("batch: duplicate id skipped", "id", p.ID, "line", p.Line)
			continue
		case marks&markOK != 0:
			r.c.skipped.Add(1)
			r.sum.SkippedOK++
			continue
		case marks&markFailed != 0 && !r.cfg.RetryFailed:
			r.c.skipped.Add(1)
			if r.sum.SkippedFailed == 0 {
				r.cfg.Logger.Warn("batch: skipping prompts that failed in an earlier run; rerun with --retry-failed to call them again", "first_id", p.ID)
			}
			r.sum.SkippedFailed++
			continue
		}
		if err := r.ids.mark(p.ID, markRun); err != nil {
			r.fail(err, stop)
			return false
		}
		select {
		case jobs <- p:
		case <-runCtx.Done():
			return false
		}
	}
}

// handle runs one prompt and writes its record.
func (r *runner) handle(runCtx, workCtx context.Context, stop context.CancelFunc, p Prompt) {
	start := time.Now()
	rec := &Record{ID: p.ID, Line: p.Line, Model: p.Request.Model}
	var res *aiclient.Result
	err := p.Err
	if err == nil {
		retrying := false
		res, err = r.cfg.Client.ChatWith(workCtx, &p.Request, aiclient.CallOptions{
			Stop: runCtx.Done(),
			OnRetry: func(_ int, err error, wait time.Duration) {
				if !retrying {
					retrying = true
					r.c.retrying.Add(1)
				}
				r.c.retries.Add(1)
				r.c.waiting(time.Now().Add(wait), isRateLimit(err))
			},
		})
		if retrying {
			r.c.retrying.Add(-1)
			r.c.retried.Add(1)
		}
		rec.Attempts = res.Attempts
		if err != nil && (errors.Is(err, aiclient.ErrStopped) || workCtx.Err() != nil) {
			// Not finished: no record, so that a rerun does it.
			r.c.interrupted.Add(1)
			return
		}
		if errors.Is(err, aiclient.ErrLimiter) {
			// The limiter's store failed (Redis down, under the policy
			// "error"): the run's trouble, not the prompt's, which was not
			// sent. Stop, and leave it without a record for a rerun,
			// rather than record every prompt left as failed for good.
			r.c.interrupted.Add(1)
			r.fail(fmt.Errorf("batch: stopped, the limiter failed (rerun with the same --output to resume): %w", err), stop)
			return
		}
	}
	rec.DurationMS = time.Since(start).Milliseconds()
	if err != nil {
		rec.Status, rec.Error = StatusFailed, err.Error()
		var apiErr *aiclient.APIError
		if errors.As(err, &apiErr) {
			rec.HTTPStatus = apiErr.StatusCode
		}
	} else {
		resp := res.Response
		rec.Status, rec.Response, rec.Usage = StatusOK, resp.Text(), &resp.Usage
		if resp.Model != "" {
			rec.Model = resp.Model
		}
		if len(resp.Choices) > 0 {
			c := &resp.Choices[0]
			rec.FinishReason, rec.ToolCalls, rec.Refusal = c.FinishReason, c.Message.ToolCalls, c.Message.Refusal
		}
		if len(resp.Choices) > 1 { // paid for too: keep them
			for i := 1; i < len(resp.Choices); i++ {
				c := &resp.Choices[i]
				rec.OtherChoices = append(rec.OtherChoices, Choice{Response: c.Message.Content, ToolCalls: c.Message.ToolCalls, Refusal: c.Message.Refusal, FinishReason: c.FinishReason})
			}
		}
		r.c.addUsage(p.Request.Model, resp.Usage.PromptTokens, resp.Usage.CompletionTokens)
	}
	if werr := r.out.Write(rec); werr != nil {
		r.fail(werr, stop)
		return
	}
	if err != nil {
		r.c.failed.Add(1)
		r.cfg.Logger.Warn("batch: prompt failed", "id", p.ID, "line", p.Line, "attempts", rec.Attempts, "err", err)
	} else {
		r.c.ok.Add(1)
	}
}

// isRateLimit reports whether err is the server's 429.
func isRateLimit(err error) bool {
	var apiErr *aiclient.APIError
	return errors.As(err, &apiErr) && apiErr.StatusCode == 429
}

// finish fills the summary from the counters.
func (r *runner) finish(elapsed time.Duration) {
	s := r.sum
	s.OK, s.Failed = r.c.ok.Load(), r.c.failed.Load()
	s.Retried, s.Retries = r.c.retried.Load(), r.c.retries.Load()
	s.PromptTokens, s.CompletionTokens = r.c.promptTokens.Load(), r.c.completionTokens.Load()
	s.Unfinished = r.c.interrupted.Load()
	s.Left = s.Unfinished
	if t := r.cfg.Total; t > 0 {
		s.Left = max(t-s.OK-s.Failed-r.c.skipped.Load(), s.Unfinished)
	}
	s.Elapsed = elapsed
	r.c.mu.Lock()
	defer r.c.mu.Unlock()
	for model, t := range r.c.byModel {
		if cost, ok := r.cfg.Prices.Cost(model, t[0], t[1]); ok {
			s.Cost += cost
		} else {
			s.UnpricedModels = append(s.UnpricedModels, model)
		}
	}
	sort.Strings(s.UnpricedModels)
}
