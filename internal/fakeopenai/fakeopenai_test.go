package fakeopenai

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

func post(t *testing.T, url, key, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { res.Body.Close() })
	return res
}

func TestChatJSONUsage(t *testing.T) {
	s := New(t, Options{APIKey: "sk-up", CompletionTokens: 5})
	body := `{"model":"m","messages":[{"role":"user","content":"hello there world"}],"max_tokens":3}`
	res := post(t, s.URL()+"/v1/chat/completions", "sk-up", body)
	var got struct {
		Choices []struct{ Message struct{ Content string } }
		Usage   struct{ PromptTokens, CompletionTokens int } `json:"usage"`
	}
	var raw map[string]json.RawMessage
	b, _ := io.ReadAll(res.Body)
	if err := json.Unmarshal(b, &raw); err != nil || res.StatusCode != 200 {
		t.Fatalf("status %d body %s", res.StatusCode, b)
	}
	_ = json.Unmarshal(b, &got)
	var u struct {
		P int `json:"prompt_tokens"`
		C int `json:"completion_tokens"`
	}
	_ = json.Unmarshal(raw["usage"], &u)
	if u.P != 6 || u.C != 3 || got.Choices[0].Message.Content != "tok tok tok " {
		t.Fatalf("usage %+v content %q", u, got.Choices[0].Message.Content)
	}
	reqs := s.Requests()
	if len(reqs) != 1 || reqs[0].Authorization != "Bearer sk-up" || string(reqs[0].Body) != body {
		t.Fatalf("recorded %+v", reqs)
	}
	if res := post(t, s.URL()+"/v1/chat/completions", "wrong", body); res.StatusCode != 401 {
		t.Fatalf("wrong key: %d", res.StatusCode)
	}
}

func TestStreamUsageAndCut(t *testing.T) {
	s := New(t, Options{CompletionTokens: 4})
	res := post(t, s.URL()+"/v1/chat/completions", "k", `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"a b"}]}`)
	var data []string
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			data = append(data, d)
		}
	}
	// role chunk, 4 tokens, finish, usage, [DONE]
	if len(data) != 8 || data[7] != "[DONE]" || !strings.Contains(data[6], `"completion_tokens":4`) || !strings.Contains(data[6], `"prompt_tokens":5`) {
		t.Fatalf("events %q", data)
	}
	s.Enqueue(Fault{CutAfter: 2})
	res = post(t, s.URL()+"/v1/chat/completions", "k", `{"model":"m","stream":true,"messages":[]}`)
	b, err := io.ReadAll(res.Body)
	if err == nil || strings.Count(string(b), "tok ") != 2 || strings.Contains(string(b), "[DONE]") {
		t.Fatalf("cut stream: err %v body %s", err, b)
	}
}

func TestFaults(t *testing.T) {
	s := New(t, Options{})
	s.Enqueue(Fault{Status: 429, RetryAfter: "2", RetryAfterMS: "1500"}, Fault{Status: 500})
	res := post(t, s.URL()+"/v1/embeddings", "k", `{"model":"e","input":"x"}`)
	if res.StatusCode != 429 || res.Header.Get("Retry-After") != "2" || res.Header.Get("retry-after-ms") != "1500" {
		t.Fatalf("429: %d %v", res.StatusCode, res.Header)
	}
	if res := post(t, s.URL()+"/v1/embeddings", "k", `{"model":"e","input":"x"}`); res.StatusCode != 500 {
		t.Fatalf("500: %d", res.StatusCode)
	}
	if res := post(t, s.URL()+"/v1/responses", "k", `{"model":"e","input":"x y"}`); res.StatusCode != 200 {
		t.Fatalf("responses: %d", res.StatusCode)
	}
	if s.Count() != 3 {
		t.Fatalf("count %d", s.Count())
	}
}
