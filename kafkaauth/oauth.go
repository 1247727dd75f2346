package kafkaauth

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"golang.org/x/oauth2/clientcredentials"
)

// OAuth is an OAuth 2.0 client-credentials grant (RFC 6749 §4.4): the
// client asks the identity provider's token endpoint for an access token
// with its id and secret, and sends that token to Kafka with
// SASL/OAUTHBEARER. Apply fetches a non-zero OAuth's tokens with Fetch and
// keeps each until 80 % of its lifetime has passed. These are the settings Kafka's own Java client calls
// sasl.oauthbearer.token.endpoint.url, clientId, clientSecret and scope.
type OAuth struct {
	// TokenURL is the token endpoint (an absolute http or https URL).
	// Kafka: sasl.oauthbearer.token.endpoint.url.
	TokenURL string
	// ClientID and ClientSecret are the client's credentials, sent with
	// HTTP basic authentication or in the form, whichever the endpoint
	// accepts. Both are required.
	ClientID, ClientSecret string
	// Scopes are the scopes asked for. Default: none (the provider's
	// default scopes).
	Scopes []string
	// Audience, when set, is sent as the "audience" parameter, which some
	// providers (Auth0, Okta custom servers) need to mint a token for the
	// brokers. Default: "" (not sent).
	Audience string
}

// zero reports whether o sets nothing.
func (o OAuth) zero() bool {
	return o.TokenURL == "" && o.ClientID == "" && o.ClientSecret == "" && len(o.Scopes) == 0 && o.Audience == ""
}

// validate names the first setting of o that cannot work.
func (o OAuth) validate() error {
	u, err := url.Parse(o.TokenURL)
	switch {
	case o.TokenURL == "":
		return errors.New("kafkaauth: OAuth.TokenURL is empty: the client-credentials grant needs the token endpoint")
	case err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "":
		return fmt.Errorf("kafkaauth: OAuth.TokenURL %q: want an absolute http or https URL", o.TokenURL)
	case o.ClientID == "":
		return errors.New("kafkaauth: OAuth.ClientID is empty: the client-credentials grant needs a client id")
	case o.ClientSecret == "":
		return errors.New("kafkaauth: OAuth.ClientSecret is empty: the client-credentials grant needs a client secret")
	}
	return nil
}

// Fetch asks the token endpoint for a new access token and returns it with
// the time it expires (the zero time when the endpoint gave no expires_in).
// Each call makes one request; Apply's provider decides when to call it.
func (o OAuth) Fetch(ctx context.Context) (string, time.Time, error) {
	if err := o.validate(); err != nil {
		return "", time.Time{}, err
	}
	cc := clientcredentials.Config{ClientID: o.ClientID, ClientSecret: o.ClientSecret, TokenURL: o.TokenURL, Scopes: o.Scopes}
	if o.Audience != "" {
		cc.EndpointParams = url.Values{"audience": {o.Audience}}
	}
	tok, err := cc.Token(ctx)
	if err != nil {
		return "", time.Time{}, fmt.Errorf("kafkaauth: OAuth token from %s: %w", o.TokenURL, err)
	}
	if tok.AccessToken == "" {
		return "", time.Time{}, fmt.Errorf("kafkaauth: OAuth token from %s: the response holds no access_token", o.TokenURL)
	}
	return tok.AccessToken, tok.Expiry, nil
}

// tokenRefreshFactor is the share of a token's lifetime after which
// refreshing fetches the next one (Kafka's Java client:
// sasl.login.refresh.window.factor, 0.8).
const tokenRefreshFactor = 0.8

// tokenFetchTimeout bounds one call of a fetch function: sarama asks for a
// token while it connects and must not wait for ever.
const tokenFetchTimeout = 30 * time.Second

// refreshing is the sarama.AccessTokenProvider Apply makes of
// Options.FetchToken and Options.OAuth: it keeps the token of its fetch
// function and fetches the next one once 80 % of the token's lifetime has
// passed, so a token is replaced before it expires (sarama asks for a token
// at every connection and at every re-authentication the broker demands,
// connections.max.reauth.ms, KIP-368; it re-authenticates after 85–95 % of
// the session the broker granted, which ends when the token expires at the
// latest). Token calls are serialised: concurrent connections wait for one
// fetch. When a fetch fails, Token returns the kept token while it has not
// expired, and the error once it has. A token without an expiry is kept for
// ever. Each fetch is bounded by 30 s. It is safe for concurrent use.
type refreshing struct {
	fetch func(context.Context) (string, time.Time, error)
	now   func() time.Time

	mu        sync.Mutex
	token     string
	expiry    time.Time // zero: never
	refreshAt time.Time // zero: never
}

// newRefreshing returns a refreshing provider over fetch.
func newRefreshing(fetch func(context.Context) (string, time.Time, error)) *refreshing {
	return &refreshing{fetch: fetch, now: time.Now}
}

// Token returns the kept token, or a new one from fetch when none is kept
// or 80 % of the kept one's lifetime has passed (see refreshing).
func (p *refreshing) Token() (*sarama.AccessToken, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	if p.token != "" && (p.refreshAt.IsZero() || now.Before(p.refreshAt)) {
		return &sarama.AccessToken{Token: p.token}, nil
	}
	// sarama's provider interface has no ctx: each fetch is bounded by its
	// own timeout only.
	ctx, cancel := context.WithTimeout(context.Background(), tokenFetchTimeout)
	defer cancel()
	tok, exp, err := p.fetch(ctx)
	if err == nil && tok == "" {
		err = errors.New("kafkaauth: the token source returned an empty token")
	}
	if err != nil {
		if p.token != "" && now.Before(p.expiry) {
			return &sarama.AccessToken{Token: p.token}, nil // still valid: the next call tries again
		}
		return nil, err
	}
	p.token, p.expiry, p.refreshAt = tok, exp, time.Time{}
	if !exp.IsZero() {
		p.refreshAt = now.Add(time.Duration(tokenRefreshFactor * float64(exp.Sub(now))))
	}
	return &sarama.AccessToken{Token: tok}, nil
}

var _ sarama.AccessTokenProvider = (*refreshing)(nil)

// staticToken sends one token at every authentication (Options.Token).
type staticToken string

func (t staticToken) Token() (*sarama.AccessToken, error) {
	return &sarama.AccessToken{Token: string(t)}, nil
}

// fileToken reads its file at every authentication (Options.TokenFile).
type fileToken string

func (f fileToken) Token() (*sarama.AccessToken, error) {
	b, err := os.ReadFile(string(f))
	if err != nil {
		return nil, fmt.Errorf("kafkaauth: token file: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return nil, fmt.Errorf("kafkaauth: token file %s is empty", string(f))
	}
	return &sarama.AccessToken{Token: tok}, nil
}

// withExtensions adds SASL extensions (Options.Extensions) to every token
// of p.
type withExtensions struct {
	p   sarama.AccessTokenProvider
	ext map[string]string
}

func (w withExtensions) Token() (*sarama.AccessToken, error) {
	t, err := w.p.Token()
	if err != nil || t == nil {
		return t, err
	}
	out := *t
	out.Extensions = make(map[string]string, len(t.Extensions)+len(w.ext))
	for k, v := range t.Extensions {
		out.Extensions[k] = v
	}
	for k, v := range w.ext {
		out.Extensions[k] = v
	}
	return &out, nil
}

// extensionKey is the syntax of a SASL extension key (RFC 7628 §3.1:
// key = 1*(ALPHA)); Kafka's client also allows digits, '.', '_' and '-'
// after the first letter.
var extensionKey = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9._-]*$`)

// validateOAuthBearer checks the OAUTHBEARER settings of o: exactly one
// token source, no user or password, well-formed extensions.
func (o Options) validateOAuthBearer() error {
	var sources []string
	if o.FetchToken != nil {
		sources = append(sources, "FetchToken")
	}
	if !o.OAuth.zero() {
		sources = append(sources, "OAuth")
	}
	if o.Token != "" {
		sources = append(sources, "Token")
	}
	if o.TokenFile != "" {
		sources = append(sources, "TokenFile")
	}
	switch {
	case len(sources) == 0:
		return fmt.Errorf("kafkaauth: SASL %s needs a token: set FetchToken, OAuth, Token or TokenFile", sarama.SASLTypeOAuth)
	case len(sources) > 1:
		return fmt.Errorf("kafkaauth: SASL %s takes one token source, not %s", sarama.SASLTypeOAuth, strings.Join(sources, " and "))
	case o.User != "" || o.Password != "":
		return fmt.Errorf("kafkaauth: SASL %s takes no User or Password (a client id and secret go in OAuth)", sarama.SASLTypeOAuth)
	}
	if !o.OAuth.zero() {
		if err := o.OAuth.validate(); err != nil {
			return err
		}
	}
	for k, v := range o.Extensions {
		switch {
		case k == sarama.SASLExtKeyAuth:
			return fmt.Errorf("kafkaauth: SASL extension %q is reserved for the token", k)
		case !extensionKey.MatchString(k):
			return fmt.Errorf("kafkaauth: SASL extension key %q: want a letter, then letters, digits, '.', '_' or '-'", k)
		case strings.ContainsAny(v, "\x01"):
			return fmt.Errorf("kafkaauth: SASL extension %q: the value holds the separator byte 0x01", k)
		}
	}
	return nil
}

// hasToken reports whether o sets any OAUTHBEARER-only setting.
func (o Options) hasToken() bool {
	return o.FetchToken != nil || !o.OAuth.zero() || o.Token != "" || o.TokenFile != "" || len(o.Extensions) > 0
}

// tokenProvider returns the sarama.AccessTokenProvider o describes (after
// validateOAuthBearer).
func (o Options) tokenProvider() sarama.AccessTokenProvider {
	var p sarama.AccessTokenProvider
	switch {
	case o.FetchToken != nil:
		p = newRefreshing(o.FetchToken)
	case o.Token != "":
		p = staticToken(o.Token)
	case o.TokenFile != "":
		p = fileToken(o.TokenFile)
	default:
		p = newRefreshing(o.OAuth.Fetch)
	}
	if len(o.Extensions) > 0 {
		p = withExtensions{p: p, ext: o.Extensions}
	}
	return p
}
