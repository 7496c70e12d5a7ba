package ratelimittest

import (
	"errors"
	"net/http"
	"testing"
)

func TestParseAcceptsTheDraftsExamples(t *testing.T) {
	for _, c := range []struct{ policy, limit string }{
		{`"default";q=100;w=10`, `"default";r=50;t=30`},
		{`"permin";q=50;w=60,"perhr";q=1000;w=3600`, `"permin";r=1;t=7, "perhr";r=999`},
		{`"peruser";q=65535;qu="content-bytes";w=10;pk=:sdfjLJUOUH==:`, `"peruser";r=300000000;t=60;pk=:QXBwLTk5OQ==:`},
		{`"api";q=10;w=1;sluice-burst=30`, `"api";r=30;t=0`},
		{`"tpm";q=1000;sluice-qu="tokens";w=60;sluice-burst=1000`, `"tpm";r=0;t=1`},
		{`"c";q=4;qu="concurrent-requests"`, `"c";r=3`},
	} {
		h := http.Header{"Ratelimit-Policy": {c.policy}, "Ratelimit": {c.limit}, "Retry-After": {"3"}}
		if _, _, err := Parse(h); err != nil {
			t.Errorf("%q / %q: %v", c.policy, c.limit, err)
		}
	}
}

func TestParseRejects(t *testing.T) {
	for _, h := range []http.Header{
		{"Ratelimit-Policy": {`"a";w=1`}},                           // no q
		{"Ratelimit-Policy": {`"a";q=-1`}},                          // negative
		{"Ratelimit-Policy": {`"a";q=1;w=0`}},                       // zero window
		{"Ratelimit-Policy": {`"a";q=1.5`}},                         // not an Integer
		{"Ratelimit-Policy": {`"a";q=1;qu="tokens"`}},               // unregistered unit
		{"Ratelimit-Policy": {`"a";q=1;burst=3`}},                   // unprefixed extension
		{"Ratelimit-Policy": {`"a";q=1, "a";q=2`}},                  // twice
		{"Ratelimit-Policy": {`("a");q=1`}},                         // inner list
		{"Ratelimit-Policy": {`1;q=1`}},                             // not a String
		{"Ratelimit-Policy": {`"é";q=1`}},                           // not ASCII
		{"Ratelimit-Policy": {`"a\n";q=1`}},                         // Go escape
		{"Ratelimit-Policy": {`"a";q=1;w=1;`}},                      // trailing ;
		{"Ratelimit": {`"a";t=1`}},                                  // no r
		{"Ratelimit": {`"a";r=1;t=-1`}},                             // negative t
		{"Ratelimit": {`"a";r=1;q=3`}},                              // policy parameter
		{"Ratelimit-Policy": {`"a";q=1`}, "Ratelimit": {`"b";r=1`}}, // names differ
		{"Ratelimit-Policy": {`"a";q=1`}, "Ratelimit": {`"a";r=1`}, "Retry-After": {"1.5"}},
		{"Ratelimit": {`"a";r=1000000000000000`}}, // beyond RFC 9651's Integer
	} {
		if _, _, err := Parse(h); !errors.Is(err, ErrInvalid) {
			t.Errorf("%v: err %v, want ErrInvalid", h, err)
		}
	}
}
