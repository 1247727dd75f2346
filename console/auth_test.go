package console

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/internal/failidx"
)

func TestParseTokens(t *testing.T) {
	ts, err := ParseTokens("# comment\n\nadmin alice 0123456789abcdef0\n  viewer   ci   fedcba98765432100  \n")
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
		"admin a 0123456789abcdef0\nviewer a 0123456789abcdef1", // one name twice (issue 29, item 11: names are unique)
	} {
		if _, err := ParseTokens(bad); err == nil {
			t.Errorf("ParseTokens(%q): no error", bad)
		}
	}
	if _, err := ParseTokens("admin a 0123456789abcdef0\nviewer a 0123456789abcdef1"); err == nil || !strings.Contains(err.Error(), `two tokens are named "a"`) {
		t.Errorf("ParseTokens of one name twice: %v, want the name named", err)
	}
	// The environment's form, and both mixed.
	ts, err = ParseTokens("operator:bob:0123456789abcdef0, admin:eve:0123456789abcdef1")
	if err != nil || len(ts) != 2 || ts[0].Role != Operator || ts[1].Name != "eve" {
		t.Fatalf("ParseTokens of ROLE:NAME:SECRET entries: %+v, %v", ts, err)
	}
	ts, err = ParseTokens("viewer ci fedcba98765432100\noperator:bob:0123456789abcdef0")
	if err != nil || len(ts) != 2 || ts[0].Name != "ci" || ts[1].Name != "bob" {
		t.Fatalf("ParseTokens of both forms: %+v, %v", ts, err)
	}
	for _, bad := range []string{"operator:bob", "operator bob:0123456789abcdef0"} {
		if _, err := ParseTokens(bad); err == nil {
			t.Errorf("ParseTokens(%q): no error", bad)
		}
	}
}

// configOnly is a Kafka client of which Validate reads only the config.
type configOnly struct {
	sarama.Client
	cfg *sarama.Config
}

func (c configOnly) Config() *sarama.Config { return c.cfg }

func TestConfigValidate(t *testing.T) {
	ok := Config{Pool: &pgxpool.Pool{}, Client: configOnly{cfg: failidx.ProducerConfig(nil)},
		Tokens: []Token{{Name: "v", Role: Viewer, Secret: "viewer-secret-0123456789"}}}
	if err := ok.Validate(); err != nil {
		t.Fatalf("a valid Config: %v", err)
	}
	for name, mut := range map[string]func(*Config){
		"no pool":   func(c *Config) { c.Pool = nil },
		"no client": func(c *Config) { c.Client = nil },
		"a client that does not wait for acks": func(c *Config) {
			c.Client = configOnly{cfg: sarama.NewConfig()} // Producer.Return.Successes false
		},
		"a client that may create topics": func(c *Config) {
			cfg := failidx.ProducerConfig(nil)
			cfg.Metadata.AllowAutoTopicCreation = true
			c.Client = configOnly{cfg: cfg}
		},
		"no tokens":     func(c *Config) { c.Tokens = nil },
		"short key":     func(c *Config) { c.SessionKey = []byte("short") },
		"bad mask":      func(c *Config) { c.Mask = []string{"a..b"} },
		"bad base path": func(c *Config) { c.BasePath = "console/" },
	} {
		c := ok
		mut(&c)
		err := c.Validate()
		if err == nil {
			t.Errorf("%s: Validate() = nil", name)
			continue
		}
		if _, nerr := New(c); nerr == nil {
			t.Errorf("%s: New accepted it", name)
		}
		t.Logf("%s: %v", name, err)
	}
	c := ok
	c.Tokens, c.InsecureNoAuth = nil, true
	if err := c.Validate(); err != nil {
		t.Errorf("InsecureNoAuth without tokens: %v", err)
	}
}

func TestBackStaysLocal(t *testing.T) {
	s := offlineServer(t)
	for in, want := range map[string]string{
		"/records?status=unresolved": "/records?status=unresolved",
		"//evil.example/x":           "/",
		"https://evil.example/":      "/",
		"/\\evil.example":            "/",
		"javascript:alert(1)":        "/",
		"":                           "/",
	} {
		if got := s.back(in); got != want {
			t.Errorf("back(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestInsecureNoAuth: without authentication the console still refuses
// forms without a session's CSRF token (a cross-site form carries no
// SameSite=Strict cookie) and requests for a host that is not loopback
// (DNS rebinding).
func TestInsecureNoAuth(t *testing.T) {
	st := failidx.NewStore(nil)
	h, err := newServer(Config{InsecureNoAuth: true}, st, failidx.NewActions(st, nil))
	if err != nil {
		t.Fatal(err)
	}
	do := func(method, target, host, ctype, body string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, target, strings.NewReader(body))
		req.Host, req.RemoteAddr = host, "127.0.0.1:50000"
		if ctype != "" {
			req.Header.Set("Content-Type", ctype)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	if rec := do("GET", "/api/whoami", "127.0.0.1:8088", "", ""); rec.Code != 200 || !strings.Contains(rec.Body.String(), `"anonymous"`) || !strings.Contains(rec.Body.String(), `"admin"`) {
		t.Errorf("whoami: %d %s", rec.Code, rec.Body)
	}
	if rec := do("GET", "/api/whoami", "localhost:8088", "", ""); rec.Code != 200 {
		t.Errorf("whoami on localhost: %d", rec.Code)
	}
	if rec := do("GET", "/api/whoami", "rebind.example:8088", "", ""); rec.Code != http.StatusMisdirectedRequest {
		t.Errorf("whoami for another host: %d, want 421", rec.Code)
	}
	if rec := do("POST", "/actions", "127.0.0.1:8088", "application/x-www-form-urlencoded", "action=resolve&ids=1"); rec.Code != http.StatusForbidden {
		t.Errorf("form without a session: %d, want 403", rec.Code)
	}
	if rec := do("POST", "/api/actions/resolve", "127.0.0.1:8088", "text/plain", `{"ids":[1]}`); rec.Code != http.StatusUnsupportedMediaType {
		t.Errorf("API POST as text/plain: %d, want 415", rec.Code)
	}
}

// TestLoadTokens reads a tokens file as docs/console.md shows one, and
// names the file when it cannot.
func TestLoadTokens(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens")
	file := "# role     name     secret\nadmin      alice    6f1c0e0c5d0a4b8e9d2f7a11\noperator   oncall   b7e4a1d09c3f44e2a8b1c2d3\nviewer     grafana  0d9e8c7b6a5f4e3d2c1b0a99\n"
	if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}
	ts, err := LoadTokens(path)
	if err != nil || len(ts) != 3 || ts[0] != (Token{Name: "alice", Role: Admin, Secret: "6f1c0e0c5d0a4b8e9d2f7a11"}) ||
		ts[1].Role != Operator || ts[2].Role != Viewer || ts[2].Name != "grafana" {
		t.Fatalf("LoadTokens = %+v, %v", ts, err)
	}
	if err := os.WriteFile(path, []byte("root alice 6f1c0e0c5d0a4b8e9d2f7a11\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadTokens(path); err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("LoadTokens with an unknown role: %v, want an error naming %s", err, path)
	}
}
