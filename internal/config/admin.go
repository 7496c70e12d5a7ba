package config

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/sluice-io/sluice/internal/hostcheck"
)

// Bounds of the admin and host sections.
const (
	// MaxAdminTokens bounds admin_tokens.
	MaxAdminTokens = 64
	// MaxAllowedHosts bounds allowed_hosts.
	MaxAllowedHosts = hostcheck.MaxAllowed
	// LegacyAdminTokenName names the token of admin_token in audit lines.
	LegacyAdminTokenName = "admin_token"
	// EnvAdminTokenName names SLUICE_ADMIN_TOKEN's token in audit lines.
	EnvAdminTokenName = "SLUICE_ADMIN_TOKEN"
)

// reservedNames are the names, folded by foldName, that admin_tokens may
// not use: the built-in tokens' (an operator so named would be taken for
// them in audit lines, and SLUICE_ADMIN_TOKEN replaces admin_token's
// entry by name), and the words the logs write where no operator is named
// (the peer "unknown", the reset sources "api" and "console").
var reservedNames = map[string]bool{
	foldName(LegacyAdminTokenName): true,
	foldName(EnvAdminTokenName):    true,
	"unknown":                      true,
	"api":                          true,
	"console":                      true,
	"none":                         true,
	"anonymous":                    true,
}

// foldName is how admin token names are compared: in lower case, '-' as
// '_'. Two names that fold alike read alike in an audit line.
func foldName(name string) string {
	return strings.ReplaceAll(strings.ToLower(name), "-", "_")
}

// reservedName reports why name may not name an admin token, or "".
func reservedName(name string) string {
	if strings.Trim(name, "._-") == "" {
		return "is reserved: punctuation only names no one"
	}
	if reservedNames[foldName(name)] {
		return "is reserved: the logs use it for a built-in token or for no operator"
	}
	return ""
}

// AdminTokenSection is one entry of admin_tokens: an operator's token,
// known by the SHA-256 of it (sluice keys hash --admin NAME).
type AdminTokenSection struct {
	// Name names the operator in audit lines.
	Name string `yaml:"name"`
	// Hash is the lowercase hex SHA-256 of the token.
	Hash string `yaml:"hash"`
}

// AdminToken is an admin token, known by its SHA-256.
type AdminToken struct {
	// Name names the token's holder in audit lines.
	Name string
	// Hash is the SHA-256 of the token.
	Hash [sha256.Size]byte
}

// HashAdminToken returns the SHA-256 of token, as AdminToken.Hash.
func HashAdminToken(token string) [sha256.Size]byte { return sha256.Sum256([]byte(token)) }

// compileAdmin fills cfg.AdminTokens from admin_token (named
// LegacyAdminTokenName) and admin_tokens, and cfg.AllowedHosts.
func (v *validator) compileAdmin(f *File, cfg *Config) {
	if f.AdminToken != "" {
		if problem := WeakToken(f.AdminToken); problem != "" {
			v.addf("admin_token", "%s (make one with: %s), or none to disable the admin endpoints", problem, MakeAdminToken)
		}
		cfg.AdminTokens = append(cfg.AdminTokens, AdminToken{Name: LegacyAdminTokenName, Hash: HashAdminToken(f.AdminToken)})
	}
	if n := len(f.AdminTokens); n > MaxAdminTokens {
		v.addf("admin_tokens", "%d tokens; at most %d", n, MaxAdminTokens)
	}
	names := map[string]bool{}
	hashes := map[[sha256.Size]byte]string{}
	for _, t := range cfg.AdminTokens {
		hashes[t.Hash] = t.Name
	}
	for i, t := range f.AdminTokens {
		path := fmt.Sprintf("admin_tokens[%d]", i)
		switch {
		case !nameRE.MatchString(t.Name):
			v.addf(path+".name", "a name of 1-64 letters, digits, '_', '-' or '.' is required: it names the operator in audit lines")
		case reservedName(t.Name) != "":
			v.addf(path+".name", "%q %s; name the operator", t.Name, reservedName(t.Name))
		case names[foldName(t.Name)]:
			v.addf(path+".name", "%q is named twice (names are compared ignoring case, and - as _)", t.Name)
		}
		names[foldName(t.Name)] = true
		h := strings.ToLower(strings.TrimSpace(t.Hash))
		var sum [sha256.Size]byte
		if !hashRE.MatchString(h) {
			v.addf(path+".hash", "want the 64 hex digits of the token's SHA-256 (sluice keys hash --admin %s), never the token itself; make a token with: %s", cmpName(t.Name), MakeAdminToken)
			continue
		}
		_, _ = hex.Decode(sum[:], []byte(h))
		if other, ok := hashes[sum]; ok {
			v.addf(path+".hash", "same token as %q: give each operator a token of their own", other)
			continue
		}
		hashes[sum] = t.Name
		cfg.AdminTokens = append(cfg.AdminTokens, AdminToken{Name: t.Name, Hash: sum})
	}

	if n := len(f.AllowedHosts); n > MaxAllowedHosts {
		v.addf("allowed_hosts", "%d hosts; at most %d", n, MaxAllowedHosts)
	}
	for i, h := range f.AllowedHosts {
		norm, err := hostcheck.Normalize(h)
		if err != nil {
			v.addf(fmt.Sprintf("allowed_hosts[%d]", i), "%q: %v", h, err)
			continue
		}
		cfg.AllowedHosts = append(cfg.AllowedHosts, norm)
	}
}

func cmpName(name string) string {
	if name == "" {
		return "NAME"
	}
	return name
}
