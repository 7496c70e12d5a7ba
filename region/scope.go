package region

import "strings"

// Global keys by their name
//
// A door whose keys are not a serve policy's (the Envoy rate limit
// service, the AI gateway) says that a key is global by its name: it puts
// GlobalKey's mark before the key it would use for a regional limit, and
// KeyScope reads the mark back in Options.Global and Options.Home. The
// mark starts the key, before any part a client sends, so no client can
// spell it or make its own key global; it holds no '{' or '}', so a Redis
// Cluster hash tag later in the key still decides the slot. A limit whose
// scope or home changes is thus a new key with fresh state (as a change
// of algorithm is in the doors' keys): a regional key's counts are never
// read as a global key's.
//
//	@global:<key>          home by HashHome over the regions
//	@global=<home>:<key>   home named by the configuration

// globalMark starts every key GlobalKey makes.
const globalMark = "@global"

// GlobalKey returns key marked as global, with home its home region (""
// for a home chosen by a hash of the key). home must hold no ':'.
func GlobalKey(home, key string) string {
	if home == "" {
		return globalMark + ":" + key
	}
	return globalMark + "=" + home + ":" + key
}

// GlobalPrefix returns the mark GlobalKey puts before a key, for a door
// that builds its keys in a buffer.
func GlobalPrefix(home string) string { return GlobalKey(home, "") }

// KeyScope reports whether key was made by GlobalKey, and its home (""
// when the home is chosen by a hash of the key).
func KeyScope(key string) (home string, global bool) {
	rest, ok := strings.CutPrefix(key, globalMark)
	if !ok || rest == "" {
		return "", false
	}
	switch rest[0] {
	case ':':
		return "", true
	case '=':
		i := strings.IndexByte(rest, ':')
		if i < 0 {
			return "", false
		}
		return rest[1:i], true
	}
	return "", false
}
