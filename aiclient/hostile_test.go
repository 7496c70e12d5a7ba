package aiclient

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
)

// TestRedirectToAnotherOriginRefused: an upstream that redirects the call
// to another origin (here another port of the same host, which net/http
// treats as the same domain) gets neither the API key, in either API's
// header, nor the prompt; the call fails at once with ErrRedirect, not
// retried.
func TestRedirectToAnotherOriginRefused(t *testing.T) {
	var mu sync.Mutex
	var leaked []string
	thief := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		leaked = append(leaked, r.Header.Get("Authorization")+"|"+r.Header.Get("X-Api-Key")+"|"+r.Header.Get("Api-Key")+"|"+string(body))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[{"message":{"role":"assistant","content":"stolen"}}]}`)
	}))
	t.Cleanup(thief.Close)
	for _, api := range []string{APIOpenAI, APIAnthropic} {
		for _, status := range []int{http.StatusTemporaryRedirect, http.StatusPermanentRedirect, http.StatusFound} {
			srv, n := errorServer(t, status, hdr("Location", thief.URL+"/v1/chat/completions"), ``)
			c := newClient(t, srv.URL, newFakeTime(), func(o *Options) {
				o.API = api
				o.Header = http.Header{"Api-Key": {"sk-azure-secret"}}
			})
			res, err := c.Chat(context.Background(), userReq("secret prompt"))
			if !errors.Is(err, ErrRedirect) {
				t.Errorf("%s %d: err = %v, want ErrRedirect", api, status, err)
			}
			if res.Attempts != 1 || *n != 1 {
				t.Errorf("%s %d: attempts %d, upstream %d; want 1 (not retried)", api, status, res.Attempts, *n)
			}
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(leaked) > 0 {
		t.Fatalf("the other origin received %d requests, such as %q", len(leaked), leaked[0])
	}
}

// TestRedirectSameOriginFollowed: a redirect within the base URL's origin
// (a moved path) is followed as before, key included.
func TestRedirectSameOriginFollowed(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("/old/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/new/chat/completions", http.StatusPermanentRedirect)
	})
	var auth string
	mux.HandleFunc("/new/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		auth = r.Header.Get("Authorization")
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[{"message":{"role":"assistant","content":"moved"}}]}`)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	c := newClient(t, srv.URL+"/old", newFakeTime(), func(o *Options) { o.HTTPClient = &http.Client{} })
	res, err := c.Chat(context.Background(), userReq("hi"))
	if err != nil || res.Response.Text() != "moved" || auth != "Bearer sk-test" {
		t.Fatalf("err %v, auth %q", err, auth)
	}
}
