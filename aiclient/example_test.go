package aiclient_test

import (
	"context"
	"fmt"
	"time"

	"github.com/sluice-io/sluice"
	"github.com/sluice-io/sluice/aiclient"
	"github.com/sluice-io/sluice/internal/fakeopenai"
	"github.com/sluice-io/sluice/memstore"
)

// A client that waits for 3 requests/s (burst 30) and 60,000 tokens a
// minute, retries a 429 after the server's retry-after-ms, and settles the
// token limit with the usage. With a redisstore.Store instead of memstore,
// every process shares the limits.
func Example() {
	up := fakeopenai.New(nil, fakeopenai.Options{CompletionTokens: 3})
	defer up.Close()
	up.Enqueue(fakeopenai.Fault{Status: 429, RetryAfterMS: "10"})

	store, _ := memstore.New(memstore.Options{})
	defer store.Close()
	reqs, _ := sluice.NewLimiter(sluice.Options{Store: store, Limit: sluice.Limit{Rate: 3, Period: time.Second, Burst: 30}, Prefix: "ai:req:"})
	toks, _ := sluice.NewLimiter(sluice.Options{Store: store, Limit: sluice.PerMinute(60000), Prefix: "ai:tok:"})
	client, err := aiclient.New(aiclient.Options{BaseURL: up.BaseURL(), APIKey: "sk-example", Requests: reqs, Tokens: toks})
	if err != nil {
		fmt.Println(err)
		return
	}
	res, err := client.Chat(context.Background(), &aiclient.ChatRequest{
		Model:    "deepseek-v3.2",
		Messages: []aiclient.Message{{Role: "user", Content: "Explain token buckets"}},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%q after %d attempts, %d tokens\n", res.Response.Text(), res.Attempts, res.Response.Usage.Total())
	// Output: "tok tok tok " after 2 attempts, 9 tokens
}
