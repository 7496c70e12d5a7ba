package region_test

import (
	"fmt"
	"testing"

	"github.com/sluice-io/sluice/region"
)

// A key marked by GlobalKey reads back as global with its home; a
// regional key, or one that only looks alike further in, does not.
func TestKeyScope(t *testing.T) {
	for _, c := range []struct {
		key    string
		home   string
		global bool
	}{
		{region.GlobalKey("", "rls:{d}:gcra:1:a=b"), "", true},
		{region.GlobalKey("eu", "{gw:c}:rpm"), "eu", true},
		{region.GlobalPrefix("ap") + "x", "ap", true},
		{"rls:{d}:gcra:1:a=@global=eu:", "", false},
		{"@globalx:k", "", false},
		{"@global=eu", "", false},
		{"@global", "", false},
		{"sluice:{u}:api:gcra", "", false},
	} {
		home, global := region.KeyScope(c.key)
		if home != c.home || global != c.global {
			t.Errorf("KeyScope(%q) = %q, %v; want %q, %v", c.key, home, global, c.home, c.global)
		}
	}
}

// A door marks a key global, homed in eu, and serve's region store (or a
// library's Options.Global and Options.Home) reads the mark back.
func ExampleGlobalKey() {
	key := region.GlobalKey("eu", "rls:{edge}:gcra:1:tenant=acme")
	home, global := region.KeyScope(key)
	fmt.Println(key)
	fmt.Println(home, global)
	_, global = region.KeyScope("rls:{edge}:gcra:1:tenant=acme")
	fmt.Println(global)
	// Output:
	// @global=eu:rls:{edge}:gcra:1:tenant=acme
	// eu true
	// false
}
