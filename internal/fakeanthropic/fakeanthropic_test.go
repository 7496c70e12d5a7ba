package fakeanthropic

import (
	"bufio"
	"io"
	"net/http"
	"strings"
	"testing"
)

func post(t *testing.T, s *Server, path, key, body string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, s.URL()+path, strings.NewReader(body))
	req.Header.Set("x-api-key", key)
	req.Header.Set("anthropic-version", "2023-06-01")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { res.Body.Close() })
	return res
}

// TestFake: the fake checks the key and version, answers JSON, streams
// the events in Anthropic's order, counts tokens and plays faults.
func TestFake(t *testing.T) {
	s := New(t, Options{APIKey: "k", OutputTokens: 3})
	body := `{"model":"m","max_tokens":2,"system":"one two","messages":[{"role":"user","content":[{"type":"text","text":"a b c"}]}]}`
	if res := post(t, s, "/v1/messages", "bad", body); res.StatusCode != 401 {
		t.Fatalf("bad key: %d", res.StatusCode)
	}
	res := post(t, s, "/v1/messages", "k", body)
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != 200 || !strings.Contains(string(b), `"input_tokens":8`) || !strings.Contains(string(b), `"output_tokens":2`) {
		t.Fatalf("%d %s", res.StatusCode, b)
	}
	res = post(t, s, "/v1/messages/count_tokens", "k", body)
	b, _ = io.ReadAll(res.Body)
	if string(b) != `{"input_tokens":8}` {
		t.Fatalf("count_tokens %s", b)
	}
	res = post(t, s, "/v1/messages", "k", strings.Replace(body, `"max_tokens":2`, `"max_tokens":9,"stream":true`, 1))
	var events []string
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		if e, ok := strings.CutPrefix(sc.Text(), "event: "); ok {
			events = append(events, e)
		}
	}
	want := "message_start,content_block_start,ping,content_block_delta,content_block_delta,content_block_delta,content_block_stop,message_delta,message_stop"
	if strings.Join(events, ",") != want || s.StreamedTokens() != 3 {
		t.Fatalf("events %v, streamed %d", events, s.StreamedTokens())
	}
	s.Enqueue(Fault{Status: 529, RetryAfter: "3"})
	res = post(t, s, "/v1/messages", "k", body)
	b, _ = io.ReadAll(res.Body)
	if res.StatusCode != 529 || res.Header.Get("Retry-After") != "3" || !strings.Contains(string(b), `"overloaded_error"`) {
		t.Fatalf("%d %s", res.StatusCode, b)
	}
	if s.Count() != 5 || len(s.Requests()) != 5 {
		t.Fatalf("count %d", s.Count())
	}
}
