package console

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/idemhq/idem/internal/failidx"
)

// Role is what a token may do. Roles are ordered: each includes the ones
// before it.
type Role int

// The roles, weakest first.
const (
	// Viewer reads everything, with payloads masked.
	Viewer Role = iota + 1
	// Operator also acts on records chosen one by one (replay, resolve,
	// archive, edit and retry), releases parked keys, retries failed outbox
	// rows, and may reveal masked payloads (each reveal is audited).
	Operator
	// Admin also acts on whole failure groups and filters (every record that
	// matches, however many).
	Admin
)

// String returns the role's name as tokens files spell it.
func (r Role) String() string {
	switch r {
	case Viewer:
		return "viewer"
	case Operator:
		return "operator"
	case Admin:
		return "admin"
	}
	return "role(" + strconv.Itoa(int(r)) + ")"
}

// parseRole reads "viewer", "operator" or "admin".
func parseRole(s string) (Role, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "viewer":
		return Viewer, nil
	case "operator":
		return Operator, nil
	case "admin":
		return Admin, nil
	}
	// The value is not repeated: in a line whose fields are out of order
	// it may be the secret.
	return 0, errors.New("the role is not viewer, operator or admin (is the line ROLE NAME SECRET?)")
}

// Token is one accepted bearer token: who presents it and what they may do.
type Token struct {
	// Name identifies the holder in the audit log (letters, digits, . _ @ -).
	Name string
	// Role is what the holder may do.
	Role Role
	// Secret is the token itself, at least 16 characters.
	Secret string
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9._@-]{1,64}$`)

func (t Token) validate() error {
	switch {
	case !nameRE.MatchString(t.Name):
		// The value is not repeated: in a line whose fields are out of
		// order it may be the secret.
		return errors.New("the name is not 1-64 letters, digits, '.', '_', '@' or '-' (is the line ROLE NAME SECRET?)")
	case t.Role < Viewer || t.Role > Admin:
		return fmt.Errorf("token %q: no role", t.Name)
	case len(t.Secret) < 16:
		return fmt.Errorf("token %q: secret has %d characters, want at least 16", t.Name, len(t.Secret))
	case strings.ContainsAny(t.Secret, " \t\r\n,"):
		return fmt.Errorf("token %q: secret contains white space or a comma", t.Name)
	}
	return nil
}

// ParseTokens reads tokens from text, in either of two forms, which may be
// mixed: one token a line as "ROLE NAME SECRET" separated by white space
// (a tokens file, see LoadTokens), or comma-separated "ROLE:NAME:SECRET"
// entries (an environment variable's value, IDEM_CONSOLE_TOKENS for idem
// console, e.g. "admin:alice:6f1c…,viewer:ci:0d9e…"). Blank entries and
// lines starting with # are ignored. An error names the entry at fault,
// never a secret. Token names must be unique, and so must secrets.
func ParseTokens(text string) ([]Token, error) {
	var out []Token
	n := 0
	for _, line := range strings.Split(text, "\n") {
		if line = strings.TrimSpace(line); line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		for _, e := range strings.Split(line, ",") {
			if e = strings.TrimSpace(e); e == "" {
				continue
			}
			n++
			f := strings.Fields(e)
			if len(f) == 1 {
				f = strings.SplitN(e, ":", 3)
			}
			if len(f) != 3 {
				return nil, fmt.Errorf("token entry %d: want \"ROLE NAME SECRET\" or ROLE:NAME:SECRET", n)
			}
			t, err := newToken(f[0], f[1], f[2])
			if err != nil {
				return nil, fmt.Errorf("token entry %d: %w", n, err)
			}
			out = append(out, t)
		}
	}
	return out, checkUnique(out)
}

// LoadTokens reads the tokens file at path (ParseTokens): one token a line,
// "ROLE NAME SECRET" separated by white space; blank lines and lines
// starting with # are ignored. Example:
//
//	# role     name    secret
//	admin      alice   6f1c0e0c5d0a4b8e9d2f
//	operator   oncall  b7e4a1d09c3f44e2a8b1
//	viewer     grafana 0d9e8c7b6a5f4e3d2c1b
//
// A file that its group or others may read or write (mode 0600 is right)
// is refused, and the error names its mode. Errors never repeat a secret.
func LoadTokens(path string) ([]Token, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("tokens file: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("tokens file: %w", err)
	}
	if m := st.Mode().Perm(); m&0o077 != 0 {
		return nil, fmt.Errorf("console: the tokens file %s has mode %04o, open to its group or others: chmod 600 it", path, m)
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return nil, fmt.Errorf("tokens file: %w", err)
	}
	ts, err := ParseTokens(string(b))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return ts, nil
}

func newToken(role, name, secret string) (Token, error) {
	r, err := parseRole(role)
	if err != nil {
		return Token{}, err
	}
	t := Token{Name: name, Role: r, Secret: secret}
	return t, t.validate()
}

// checkUnique reports two tokens with one name (the audit log could not
// tell them apart) or one secret.
func checkUnique(ts []Token) error {
	secrets, names := map[string]string{}, map[string]bool{}
	for _, t := range ts {
		if names[t.Name] {
			return fmt.Errorf("two tokens are named %q: names must be unique (the audit log tells actors apart by name)", t.Name)
		}
		names[t.Name] = true
		if other, ok := secrets[t.Secret]; ok {
			return fmt.Errorf("tokens %q and %q share a secret", other, t.Name)
		}
		secrets[t.Secret] = t.Name
	}
	return nil
}

// identity is who a request acts as.
type identity struct {
	Name string
	Role Role
	// session is the session cookie's value when the request came with one
	// (UI); "" for a bearer token (API). CSRF tokens derive from it.
	session string
	// sessionID is the session's key in the session store (logout).
	sessionID string
}

// auth checks credentials, sessions and CSRF tokens.
type auth struct {
	tokens   []Token
	insecure bool
	key      []byte
	ttl      time.Duration
	secure   bool
	path     string
	now      func() time.Time
	// sessions holds the sessions logins create (nil: none are stored, as
	// for InsecureNoAuth's anonymous sessions and the tests without a
	// database).
	sessions *failidx.Store
	limits   *limiter
}

const (
	sessionCookie = "idem_console_session"
	loginCookie   = "idem_console_login"
	csrfField     = "csrf"
	csrfHeader    = "X-CSRF-Token"
	// hostPrefix marks a cookie the browser accepts only when it is Secure,
	// for path / and no domain (RFC 6265bis): set over TLS.
	hostPrefix = "__Host-"
)

// cookie returns the name of cookie base: with the __Host- prefix when
// cookies are Secure.
func (a *auth) cookie(base string) string {
	if a.secure {
		return hostPrefix + base
	}
	return base
}

// cookiePath is the cookies' path: / for __Host- cookies, else the
// console's base path.
func (a *auth) cookiePath() string {
	if a.secure {
		return "/"
	}
	return a.path
}

var (
	errNoCredentials = errors.New("no credentials")
	// errTooMany is an address that spent its budget of logins or bad
	// tokens.
	errTooMany = errors.New("too many failed logins or bad tokens from this address: wait a minute")
)

// bearer returns the identity of the request's Authorization header, or
// errNoCredentials when it has none. client is the request's address: an
// address that sent too many bad tokens gets errTooMany, whatever it sends.
func (a *auth) bearer(r *http.Request, client string) (identity, error) {
	h := r.Header.Get("Authorization")
	if h == "" {
		return identity{}, errNoCredentials
	}
	if !a.limits.ok(client) {
		return identity{}, errTooMany
	}
	scheme, secret, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return identity{}, errors.New(`the Authorization header must be "Bearer <token>"`)
	}
	t, ok := a.token(strings.TrimSpace(secret))
	if !ok {
		a.limits.spend(client)
		return identity{}, errors.New("unknown token")
	}
	return identity{Name: t.Name, Role: t.Role}, nil
}

// token finds the token whose secret is s, comparing in constant time.
func (a *auth) token(s string) (Token, bool) {
	sum := sha256.Sum256([]byte(s))
	var found Token
	ok := 0
	for _, t := range a.tokens {
		ts := sha256.Sum256([]byte(t.Secret))
		if subtle.ConstantTimeCompare(sum[:], ts[:]) == 1 {
			found, ok = t, 1
		}
	}
	return found, ok == 1
}

// sign returns the base64url HMAC of the parts.
func (a *auth) sign(parts ...string) string {
	m := hmac.New(sha256.New, a.key)
	for _, p := range parts {
		m.Write([]byte(p))
		m.Write([]byte{0})
	}
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// newSession returns a session cookie value for id: NAME|ROLE|EXPIRY|NONCE
// followed by its signature; with a session store, the session is
// recorded there first (a logout revokes it).
func (a *auth) newSession(ctx context.Context, id identity) (string, error) {
	exp := a.now().Add(a.ttl)
	n := nonce()
	if a.sessions != nil {
		if err := a.sessions.CreateSession(ctx, sessionID(n), id.Name, int(id.Role), exp); err != nil {
			return "", err
		}
	}
	body := fmt.Sprintf("%s|%d|%d|%s", id.Name, id.Role, exp.Unix(), n)
	return base64.RawURLEncoding.EncodeToString([]byte(body)) + "." + a.sign("session", body), nil
}

// sessionID is the key of a session in the session store: a digest of its
// nonce, so the table never holds what a cookie needs.
func sessionID(nonce string) string {
	sum := sha256.Sum256([]byte("idem-console-session\x00" + nonce))
	return hex.EncodeToString(sum[:])
}

// session returns the identity of the request's session cookie, or
// errNoCredentials when it has none.
func (a *auth) session(r *http.Request) (identity, error) {
	c, err := r.Cookie(a.cookie(sessionCookie))
	if err != nil || c.Value == "" {
		return identity{}, errNoCredentials
	}
	enc, sig, ok := strings.Cut(c.Value, ".")
	raw, err := base64.RawURLEncoding.DecodeString(enc)
	if !ok || err != nil || !hmac.Equal([]byte(sig), []byte(a.sign("session", string(raw)))) {
		return identity{}, errors.New("invalid session")
	}
	f := strings.Split(string(raw), "|")
	if len(f) != 4 {
		return identity{}, errors.New("invalid session")
	}
	role, err1 := strconv.Atoi(f[1])
	exp, err2 := strconv.ParseInt(f[2], 10, 64)
	if err1 != nil || err2 != nil {
		return identity{}, errors.New("invalid session")
	}
	if a.now().Unix() > exp {
		return identity{}, errors.New("session expired")
	}
	id := identity{Name: f[0], Role: Role(role), session: c.Value, sessionID: sessionID(f[3])}
	if !a.insecure {
		// A token removed from the tokens file ends its sessions at restart;
		// a session never outranks its token.
		if !a.hasName(id.Name, id.Role) {
			return identity{}, errors.New("session's token is gone")
		}
		if a.sessions != nil {
			live, err := a.sessions.SessionLive(r.Context(), id.sessionID)
			if err != nil {
				return identity{}, fmt.Errorf("session: %w", err)
			}
			if !live {
				return identity{}, errors.New("session ended (logged out)")
			}
		}
	}
	return id, nil
}

func (a *auth) hasName(name string, role Role) bool {
	for _, t := range a.tokens {
		if t.Name == name && t.Role >= role {
			return true
		}
	}
	return false
}

// csrf returns the CSRF token of a session.
func (a *auth) csrf(id identity) string {
	if id.session == "" {
		return ""
	}
	return a.sign("csrf", id.session)
}

// checkCSRF reports whether r carries id's CSRF token, in the form field
// csrf or the X-CSRF-Token header. API requests without a session (a bearer
// token, or anonymous with InsecureNoAuth) need none: browsers never send a
// bearer token on their own, and the API takes only application/json
// bodies, which another site cannot post without CORS. A UI request always
// needs one, so a form posted from another site (which carries no
// SameSite=Strict cookie) is refused.
func (a *auth) checkCSRF(r *http.Request, id identity, api bool) bool {
	if id.session == "" {
		return api
	}
	got := r.Header.Get(csrfHeader)
	if got == "" {
		got = r.PostFormValue(csrfField)
	}
	return got != "" && hmac.Equal([]byte(got), []byte(a.csrf(id)))
}

func (a *auth) setSession(w http.ResponseWriter, value string, maxAge int) {
	http.SetCookie(w, &http.Cookie{
		Name: a.cookie(sessionCookie), Value: value, Path: a.cookiePath(), MaxAge: maxAge,
		HttpOnly: true, Secure: a.secure, SameSite: http.SameSiteStrictMode,
	})
}

// loginNonce returns the login form's CSRF token, setting the cookie it is
// checked against when r has none.
func (a *auth) loginNonce(w http.ResponseWriter, r *http.Request) string {
	v := ""
	if c, err := r.Cookie(a.cookie(loginCookie)); err == nil && len(c.Value) >= 16 {
		v = c.Value
	} else {
		v = nonce()
		http.SetCookie(w, &http.Cookie{
			Name: a.cookie(loginCookie), Value: v, Path: a.cookiePath(), MaxAge: 3600,
			HttpOnly: true, Secure: a.secure, SameSite: http.SameSiteStrictMode,
		})
	}
	return a.sign("login", v)
}

// checkLogin reports whether the login form r posted carries the token
// loginNonce gave it.
func (a *auth) checkLogin(r *http.Request) bool {
	c, err := r.Cookie(a.cookie(loginCookie))
	got := r.PostFormValue(csrfField)
	return err == nil && got != "" && hmac.Equal([]byte(got), []byte(a.sign("login", c.Value)))
}

func nonce() string {
	var b [18]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand never fails on supported platforms
	}
	return base64.RawURLEncoding.EncodeToString(b[:])
}
