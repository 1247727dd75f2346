package testenv

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
)

// OIDCIssuer is an OAuth 2.0 authorization server of a test's own, on a
// loopback port: a client-credentials token endpoint (TokenURL) and the
// JSON Web Key Set of its RS256 signing key (JWKSURL), as an identity
// provider (Keycloak, Entra ID, Okta, Auth0) serves them. Its tokens are
// JWTs with iss (URL), sub (the client id), aud (the "audience" parameter
// of the request, else Audience), iat, exp (Lifetime after issue) and scope.
// Mint makes tokens of any claims, for the tests of refused tokens.
type OIDCIssuer struct {
	// URL is the issuer: the iss claim of its tokens.
	URL string
	// TokenURL is the client-credentials token endpoint, JWKSURL the key
	// set's.
	TokenURL, JWKSURL string
	// ClientID and ClientSecret are the one client it knows.
	ClientID, ClientSecret string
	// Audience is the aud claim of tokens requested without an audience
	// parameter: "kafka".
	Audience string

	key      *rsa.PrivateKey
	kid      string
	lifetime atomic.Int64 // time.Duration
	issued   atomic.Int64
}

// NewOIDCIssuer starts an OIDCIssuer on a free loopback port, issuing
// tokens that live lifetime; it stops when the test ends.
func NewOIDCIssuer(tb testing.TB, lifetime time.Duration) *OIDCIssuer {
	tb.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		tb.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	url := "http://" + ln.Addr().String()
	i := &OIDCIssuer{URL: url, TokenURL: url + "/token", JWKSURL: url + "/jwks", ClientID: "idem-test-client",
		ClientSecret: randomToken(18), Audience: "kafka", key: key, kid: randomToken(6)}
	i.SetLifetime(lifetime)
	mux := http.NewServeMux()
	mux.HandleFunc("POST /token", i.serveToken)
	mux.HandleFunc("GET /jwks", i.serveJWKS)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.Serve(ln) })
	tb.Cleanup(func() {
		_ = srv.Close()
		wg.Wait()
	})
	return i
}

// SetLifetime sets the lifetime of the tokens issued from now on.
func (i *OIDCIssuer) SetLifetime(d time.Duration) { i.lifetime.Store(int64(d)) }

// Issued returns how many tokens the token endpoint has issued.
func (i *OIDCIssuer) Issued() int64 { return i.issued.Load() }

// Claims are the claims of a token Mint makes; zero fields are left out.
type Claims struct {
	Issuer, Subject, Audience, Scope string
	IssuedAt, Expiry                 time.Time
}

// Claims returns the claims of a token the token endpoint would issue now
// for audience ("" : Audience).
func (i *OIDCIssuer) Claims(audience string) Claims {
	if audience == "" {
		audience = i.Audience
	}
	now := time.Now()
	return Claims{Issuer: i.URL, Subject: i.ClientID, Audience: audience, IssuedAt: now,
		Expiry: now.Add(time.Duration(i.lifetime.Load()))}
}

// Mint returns a JWT of c signed with the issuer's key.
func (i *OIDCIssuer) Mint(c Claims) string { return i.sign(c, i.key) }

// MintForeign returns a JWT of c signed with a key the issuer's JWKS does
// not hold (under the issuer's key id): a forged token.
func (i *OIDCIssuer) MintForeign(tb testing.TB, c Claims) string {
	tb.Helper()
	other, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		tb.Fatal(err)
	}
	return i.sign(c, other)
}

func (i *OIDCIssuer) sign(c Claims, key *rsa.PrivateKey) string {
	enc := func(v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			panic(err)
		}
		return base64.RawURLEncoding.EncodeToString(b)
	}
	claims := map[string]any{}
	for k, v := range map[string]string{"iss": c.Issuer, "sub": c.Subject, "aud": c.Audience, "scope": c.Scope} {
		if v != "" {
			claims[k] = v
		}
	}
	if !c.IssuedAt.IsZero() {
		claims["iat"] = c.IssuedAt.Unix()
	}
	if !c.Expiry.IsZero() {
		claims["exp"] = c.Expiry.Unix()
	}
	signing := enc(map[string]string{"alg": "RS256", "typ": "JWT", "kid": i.kid}) + "." + enc(claims)
	digest := sha256.Sum256([]byte(signing))
	sig, err := rsa.SignPKCS1v15(rand.Reader, key, crypto.SHA256, digest[:])
	if err != nil {
		panic(err)
	}
	return signing + "." + base64.RawURLEncoding.EncodeToString(sig)
}

// serveToken is the client-credentials grant (RFC 6749 §4.4): client
// authentication by HTTP basic or in the form.
func (i *OIDCIssuer) serveToken(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		oauthError(w, http.StatusBadRequest, "invalid_request")
		return
	}
	id, secret, ok := r.BasicAuth()
	if !ok {
		id, secret = r.PostForm.Get("client_id"), r.PostForm.Get("client_secret")
	}
	if r.PostForm.Get("grant_type") != "client_credentials" {
		oauthError(w, http.StatusBadRequest, "unsupported_grant_type")
		return
	}
	if id != i.ClientID || subtle.ConstantTimeCompare([]byte(secret), []byte(i.ClientSecret)) != 1 {
		oauthError(w, http.StatusUnauthorized, "invalid_client")
		return
	}
	c := i.Claims(r.PostForm.Get("audience"))
	c.Scope = r.PostForm.Get("scope")
	i.issued.Add(1)
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"access_token": i.Mint(c), "token_type": "Bearer",
		"expires_in": int64(c.Expiry.Sub(c.IssuedAt).Round(time.Second) / time.Second)})
}

func oauthError(w http.ResponseWriter, status int, code string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": code})
}

// serveJWKS serves the public half of the signing key (RFC 7517).
func (i *OIDCIssuer) serveJWKS(w http.ResponseWriter, _ *http.Request) {
	pub := i.key.PublicKey
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"keys": []map[string]string{{
		"kty": "RSA", "use": "sig", "alg": "RS256", "kid": i.kid,
		"n": base64.RawURLEncoding.EncodeToString(pub.N.Bytes()),
		"e": base64.RawURLEncoding.EncodeToString(big.NewInt(int64(pub.E)).Bytes()),
	}}})
}

// OAuthKafka is a broker of its own, started for one test, with a
// SASL_PLAINTEXT listener that takes only OAUTHBEARER and validates tokens
// with Kafka's OAuthBearerValidatorCallbackHandler against the JWKS of an
// OIDCIssuer (signature, exp, sub, iss = Issuer.URL, aud = "kafka"), and
// makes clients re-authenticate before their token expires
// (connections.max.reauth.ms, KIP-368).
//
// Its embedded *Kafka (Topic, Producer, Admin, …) talks to a PLAINTEXT
// listener of the same broker, so a test's set-up does not depend on the
// authentication under test; OAuthBrokers is the OAUTHBEARER listener.
type OAuthKafka struct {
	*Kafka
	// Issuer is the identity provider the broker trusts.
	Issuer *OIDCIssuer
	// OAuthBrokers is the SASL_PLAINTEXT OAUTHBEARER listener.
	OAuthBrokers []string
	// Dir holds the broker's configuration, data and logs.
	Dir string
}

// NewOAuthKafka starts an OIDCIssuer whose tokens live tokenLifetime and an
// OAuthKafka trusting it, in a temporary folder on free ports; both stop
// when the test ends. Kafka 4 reads a JWKS only from URLs listed in the
// system property org.apache.kafka.sasl.oauthbearer.allowed.urls, which it
// is given. The broker's maximum session is one minute
// (connections.max.reauth.ms) and it allows no clock skew, so a token is
// refused the second it expires. It needs java on PATH.
func NewOAuthKafka(tb testing.TB, tokenLifetime time.Duration) *OAuthKafka {
	tb.Helper()
	SkipIfShort(tb)
	libs := KafkaLibs(tb)
	iss := NewOIDCIssuer(tb, tokenLifetime)
	dir := tb.TempDir()
	ports := freePorts(tb, 3)
	plain, oauth, ctrl := ports[0], ports[1], ports[2]
	plainAddr, oauthAddr := "127.0.0.1:"+strconv.Itoa(plain), "127.0.0.1:"+strconv.Itoa(oauth)
	const l = "listener.name.sasl_plaintext.oauthbearer."
	props := oneNodeProps(dir, plain, ctrl, "SASL_PLAINTEXT", oauthAddr)
	for key, v := range map[string]string{
		"sasl.enabled.mechanisms":                "OAUTHBEARER",
		l + "sasl.jaas.config":                   "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;",
		l + "sasl.server.callback.handler.class": "org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler",
		// Kafka 4.1's default, DefaultJwtValidator, made by the callback
		// handler without a key resolver, falls back to ClientJwtValidator,
		// which checks no signature (a forged token is accepted);
		// BrokerJwtValidator reads the JWKS of the URL below.
		"sasl.oauthbearer.jwt.validator.class": "org.apache.kafka.common.security.oauthbearer.BrokerJwtValidator",
		"sasl.oauthbearer.jwks.endpoint.url":   iss.JWKSURL,
		"sasl.oauthbearer.expected.audience":   iss.Audience,
		"sasl.oauthbearer.expected.issuer":     iss.URL,
		"sasl.oauthbearer.clock.skew.seconds":  "0",
		"connections.max.reauth.ms":            "60000",
	} {
		props[key] = v
	}
	jvm := []string{"-Dorg.apache.kafka.sasl.oauthbearer.allowed.urls=" + iss.JWKSURL}
	exited := startBroker(tb, dir, libs, props, jvm)
	k := &OAuthKafka{Kafka: &Kafka{Brokers: []string{plainAddr}, Kind: "oauth"}, Issuer: iss,
		OAuthBrokers: []string{oauthAddr}, Dir: dir}
	Eventually(tb, 3*time.Minute, func() error {
		brokerAlive(tb, dir, exited)
		return k.ready()
	})
	tb.Logf("testenv: kafka with an OAUTHBEARER listener on %s (issuer %s), files in %s", oauthAddr, iss.URL, dir)
	return k
}

// ready reports whether the broker answers a metadata request on its
// PLAINTEXT listener with itself and a controller, and one on its
// OAUTHBEARER listener with a token of the issuer's.
func (k *OAuthKafka) ready() error {
	if err := brokerReady(k.Brokers, k.SaramaConfig()); err != nil {
		return err
	}
	cfg := k.SaramaConfig()
	cfg.Net.SASL.Enable, cfg.Net.SASL.Mechanism = true, sarama.SASLTypeOAuth
	cfg.Net.SASL.TokenProvider = staticProvider(k.Issuer.Mint(k.Issuer.Claims("")))
	oc, err := sarama.NewClient(k.OAuthBrokers, cfg)
	if err != nil {
		return fmt.Errorf("OAUTHBEARER listener: %w", err)
	}
	return oc.Close()
}

// staticProvider is a sarama.AccessTokenProvider of one token.
type staticProvider string

func (p staticProvider) Token() (*sarama.AccessToken, error) {
	return &sarama.AccessToken{Token: string(p)}, nil
}
