package console

import (
	"strings"
	"testing"
)

func TestParseTokens(t *testing.T) {
	ts, err := ParseTokens(strings.NewReader("# comment\n\nadmin alice 0123456789abcdef0\n  viewer   ci   fedcba98765432100  \n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(ts) != 2 || ts[0] != (Token{"alice", Admin, "0123456789abcdef0"}) || ts[1] != (Token{"ci", Viewer, "fedcba98765432100"}) {
		t.Fatalf("got %+v", ts)
	}
	for _, bad := range []string{
		"admin alice",                   // fields
		"root alice 0123456789abcdef0",  // role
		"admin alice short",             // secret length
		"admin al|ce 0123456789abcdef0", // name
		"admin a 0123456789abcdef0\nviewer b 0123456789abcdef0", // shared secret
	} {
		if _, err := ParseTokens(strings.NewReader(bad)); err == nil {
			t.Errorf("ParseTokens(%q): no error", bad)
		}
	}
	ts, err = TokensFromEnv("operator:bob:0123456789abcdef0, admin:eve:0123456789abcdef1")
	if err != nil || len(ts) != 2 || ts[0].Role != Operator || ts[1].Name != "eve" {
		t.Fatalf("TokensFromEnv: %+v, %v", ts, err)
	}
	if _, err := TokensFromEnv("operator:bob"); err == nil {
		t.Error("TokensFromEnv without a secret: no error")
	}
}

func TestConfigValidate(t *testing.T) {
	s := offlineServer(t)
	ok := s.cfg
	for name, mut := range map[string]func(*Config){
		"no store":      func(c *Config) { c.Store = nil },
		"no actions":    func(c *Config) { c.Actions = nil },
		"no tokens":     func(c *Config) { c.Tokens = nil },
		"short key":     func(c *Config) { c.SessionKey = []byte("short") },
		"bad mask":      func(c *Config) { c.Mask = []string{"a..b"} },
		"bad base path": func(c *Config) { c.BasePath = "console/" },
	} {
		c := ok
		mut(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: Validate() = nil", name)
		}
	}
	c := ok
	c.Tokens, c.InsecureNoAuth = nil, true
	if err := c.Validate(); err != nil {
		t.Errorf("InsecureNoAuth without tokens: %v", err)
	}
}
