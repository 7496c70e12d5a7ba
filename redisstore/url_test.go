package redisstore

import (
	"errors"
	"strings"
	"testing"
)

func TestClientOption(t *testing.T) {
	t.Setenv(EnvUsername, "envuser")
	t.Setenv(EnvPassword, "envpass")
	cases := []struct {
		url, mode, user, pass, master string
		addrs                         []string
		tls                           bool
		db                            int
	}{
		{url: "redis://h:1234/2", mode: "standalone", user: "envuser", pass: "envpass", addrs: []string{"h:1234"}, db: 2},
		{url: "rediss://u:p%40ss@h", mode: "standalone", user: "u", pass: "p@ss", addrs: []string{"h:6379"}, tls: true},
		{url: "redis+cluster://a:1,b:2,c", mode: "cluster", user: "envuser", pass: "envpass", addrs: []string{"a:1", "b:2", "c:6379"}},
		{url: "redis-sentinel://s1,s2:5/mymaster?dial_timeout=2s", mode: "sentinel", user: "envuser", pass: "envpass", addrs: []string{"s1:26379", "s2:5"}, master: "mymaster"},
	}
	for _, c := range cases {
		opt, mode, err := clientOption(c.url, "", "")
		if err != nil {
			t.Fatalf("%s: %v", c.url, err)
		}
		if mode != c.mode || opt.Username != c.user || opt.Password != c.pass || strings.Join(opt.InitAddress, " ") != strings.Join(c.addrs, " ") ||
			(opt.TLSConfig != nil) != c.tls || opt.SelectDB != c.db || opt.Sentinel.MasterSet != c.master {
			t.Errorf("%s: mode %s user %q addrs %v tls %v db %d master %q", c.url, mode, opt.Username, opt.InitAddress, opt.TLSConfig != nil, opt.SelectDB, opt.Sentinel.MasterSet)
		}
	}
	for _, bad := range []string{"", "http://h", "redis://a,b", "redis+sentinel://s1", "redis://h/x", "redis+cluster://a/1", "redis://h?dial_timeout=soon", "redis://u:secret@h/zz"} {
		_, _, err := clientOption(bad, "", "")
		if !errors.Is(err, ErrBadURL) {
			t.Errorf("%q: %v, want ErrBadURL", bad, err)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("%q: error leaks the password: %v", bad, err)
		}
	}
}

func TestKeySlot(t *testing.T) {
	// values from CLUSTER KEYSLOT
	for key, want := range map[string]uint16{"foo": 12182, "{user1000}.following": 3443, "{user1000}.followers": 3443} {
		if got := keySlot(key); got != want {
			t.Errorf("keySlot(%q) = %d, want %d", key, got, want)
		}
	}
}
