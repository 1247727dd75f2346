package kafkaauth_test

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/internal/testing/testenv"
	"github.com/idemhq/idem/kafkaauth"
)

func TestApplyZeroChangesNothing(t *testing.T) {
	cfg := sarama.NewConfig()
	if err := kafkaauth.Apply(cfg, kafkaauth.Options{}); err != nil {
		t.Fatal(err)
	}
	if cfg.Net.TLS.Enable || cfg.Net.SASL.Enable {
		t.Fatalf("zero Options turned on TLS %v / SASL %v", cfg.Net.TLS.Enable, cfg.Net.SASL.Enable)
	}
}

func TestApplySASL(t *testing.T) {
	for _, tt := range []struct {
		mechanism string
		want      sarama.SASLMechanism
		scram     bool
	}{
		{"PLAIN", sarama.SASLTypePlaintext, false},
		{"scram-sha-256", sarama.SASLTypeSCRAMSHA256, true},
		{" SCRAM-SHA-512 ", sarama.SASLTypeSCRAMSHA512, true},
	} {
		cfg := sarama.NewConfig()
		if err := kafkaauth.Apply(cfg, kafkaauth.Options{TLS: true, Mechanism: tt.mechanism, User: "u", Password: "p"}); err != nil {
			t.Fatalf("%s: %v", tt.mechanism, err)
		}
		s := cfg.Net.SASL
		if !s.Enable || !s.Handshake || s.Mechanism != tt.want || s.User != "u" || s.Password != "p" || (s.SCRAMClientGeneratorFunc != nil) != tt.scram {
			t.Errorf("%s: SASL config %+v", tt.mechanism, s)
		}
		if !cfg.Net.TLS.Enable || cfg.Net.TLS.Config.MinVersion != tls.VersionTLS12 || cfg.Net.TLS.Config.InsecureSkipVerify {
			t.Errorf("%s: TLS config %+v", tt.mechanism, cfg.Net.TLS)
		}
		if err := cfg.Validate(); err != nil {
			t.Errorf("%s: sarama rejects the config: %v", tt.mechanism, err)
		}
	}
}

// TestSCRAMClientConversation runs the first step of the SCRAM client Apply
// sets: it must produce a client-first message naming the user.
func TestSCRAMClientConversation(t *testing.T) {
	cfg := sarama.NewConfig()
	if err := kafkaauth.Apply(cfg, kafkaauth.Options{TLS: true, Mechanism: "SCRAM-SHA-512", User: "alice", Password: "secret"}); err != nil {
		t.Fatal(err)
	}
	c := cfg.Net.SASL.SCRAMClientGeneratorFunc()
	if c.Done() {
		t.Fatal("done before Begin")
	}
	if err := c.Begin("alice", "secret", ""); err != nil {
		t.Fatal(err)
	}
	first, err := c.Step("")
	if err != nil || !strings.HasPrefix(first, "n,,n=alice,r=") {
		t.Fatalf("client-first %q, %v", first, err)
	}
	if again := cfg.Net.SASL.SCRAMClientGeneratorFunc(); again == c || again.Done() {
		t.Fatal("the generator does not make a new client per authentication")
	}
}

func TestOptionsErrors(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		o    kafkaauth.Options
		want string
	}{
		{"unknown mechanism", kafkaauth.Options{Mechanism: "GSSAPI", User: "u", Password: "p"}, `SASL mechanism "GSSAPI": want PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER`},
		{"the constant's Go name", kafkaauth.Options{Mechanism: "SCRAMSHA512", User: "u", Password: "p"}, "want PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER"},
		{"no user", kafkaauth.Options{Mechanism: "PLAIN", Password: "p"}, "needs a user"},
		{"no password", kafkaauth.Options{Mechanism: "PLAIN", User: "u"}, "needs a password"},
		{"credentials without mechanism", kafkaauth.Options{User: "u"}, "no SASL mechanism"},
		{"cert without key", kafkaauth.Options{CertFile: "c.pem"}, "both CertFile and KeyFile"},
		{"missing CA", kafkaauth.Options{CAFile: filepath.Join(dir, "none.pem")}, "none.pem"},
		{"CA not PEM", kafkaauth.Options{CAFile: notPEM}, "no PEM certificate"},
		{"missing client cert", kafkaauth.Options{CertFile: filepath.Join(dir, "c.pem"), KeyFile: filepath.Join(dir, "k.pem")}, "client certificate"},
	} {
		err := kafkaauth.Apply(sarama.NewConfig(), tt.o)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want an error mentioning %q", tt.name, err, tt.want)
		}
	}
}

func TestTLSImpliedByFiles(t *testing.T) {
	for _, o := range []kafkaauth.Options{{CAFile: "x"}, {CertFile: "c", KeyFile: "k"}, {InsecureSkipVerify: true}, {TLS: true}} {
		if !o.TLSEnabled() {
			t.Errorf("%+v: TLS not enabled", o)
		}
	}
	if (kafkaauth.Options{Mechanism: "PLAIN"}).TLSEnabled() {
		t.Error("SASL alone turned TLS on")
	}
}

func TestApplyOAuthBearer(t *testing.T) {
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("from-file-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	fetch := func(context.Context) (string, time.Time, error) {
		return "from-fetch", time.Now().Add(time.Hour), nil
	}
	for _, tt := range []struct {
		name string
		o    kafkaauth.Options
		want string
	}{
		{"fixed token", kafkaauth.Options{Token: "fixed"}, "fixed"},
		{"token file", kafkaauth.Options{TokenFile: tokenFile}, "from-file-1"},
		{"fetch", kafkaauth.Options{FetchToken: fetch}, "from-fetch"},
	} {
		tt.o.Mechanism = "oauthbearer"
		cfg := sarama.NewConfig()
		if err := kafkaauth.Apply(cfg, tt.o); err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		s := cfg.Net.SASL
		if !s.Enable || !s.Handshake || s.Mechanism != sarama.SASLTypeOAuth || s.TokenProvider == nil || s.User != "" {
			t.Fatalf("%s: SASL config %+v", tt.name, s)
		}
		if err := cfg.Validate(); err != nil {
			t.Errorf("%s: sarama rejects the config: %v", tt.name, err)
		}
		tok, err := s.TokenProvider.Token()
		if err != nil || tok.Token != tt.want || tok.Extensions != nil {
			t.Errorf("%s: token %+v, %v; want %q", tt.name, tok, err, tt.want)
		}
	}

	// The token file is read again at every authentication.
	cfg := sarama.NewConfig()
	if err := kafkaauth.Apply(cfg, kafkaauth.Options{Mechanism: "OAUTHBEARER", TokenFile: tokenFile,
		Extensions: map[string]string{"logicalCluster": "lkc-1", "identityPoolId": "pool-2"}}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tokenFile, []byte("from-file-2"), 0o600); err != nil {
		t.Fatal(err)
	}
	tok, err := cfg.Net.SASL.TokenProvider.Token()
	if err != nil || tok.Token != "from-file-2" || tok.Extensions["logicalCluster"] != "lkc-1" || tok.Extensions["identityPoolId"] != "pool-2" {
		t.Fatalf("token %+v, %v: want the rewritten file with both extensions", tok, err)
	}
	if err := os.WriteFile(tokenFile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := cfg.Net.SASL.TokenProvider.Token(); err == nil || !strings.Contains(err.Error(), "is empty") {
		t.Fatalf("empty token file: %v", err)
	}
}

func TestOAuthBearerErrors(t *testing.T) {
	grant := kafkaauth.OAuth{TokenURL: "https://idp.example/token", ClientID: "id", ClientSecret: "secret"}
	for _, tt := range []struct {
		name string
		o    kafkaauth.Options
		want string
	}{
		{"no token source", kafkaauth.Options{Mechanism: "OAUTHBEARER"}, "needs a token: set FetchToken, OAuth, Token or TokenFile"},
		{"two token sources", kafkaauth.Options{Mechanism: "OAUTHBEARER", Token: "t", TokenFile: "f"}, "one token source, not Token and TokenFile"},
		{"user and password", kafkaauth.Options{Mechanism: "OAUTHBEARER", Token: "t", User: "u", Password: "p"}, "takes no User or Password"},
		{"token without OAUTHBEARER", kafkaauth.Options{Mechanism: "PLAIN", User: "u", Password: "p", Token: "t"}, `the SASL mechanism is "PLAIN", not OAUTHBEARER`},
		{"extensions without a mechanism", kafkaauth.Options{Extensions: map[string]string{"a": "b"}}, "not OAUTHBEARER"},
		{"no token URL", kafkaauth.Options{Mechanism: "OAUTHBEARER", OAuth: kafkaauth.OAuth{ClientID: "id", ClientSecret: "s"}}, "OAuth.TokenURL is empty"},
		{"relative token URL", kafkaauth.Options{Mechanism: "OAUTHBEARER", OAuth: kafkaauth.OAuth{TokenURL: "/token", ClientID: "id", ClientSecret: "s"}}, `OAuth.TokenURL "/token": want an absolute http or https URL`},
		{"no client id", kafkaauth.Options{Mechanism: "OAUTHBEARER", OAuth: kafkaauth.OAuth{TokenURL: grant.TokenURL, ClientSecret: "s"}}, "OAuth.ClientID is empty"},
		{"no client secret", kafkaauth.Options{Mechanism: "OAUTHBEARER", OAuth: kafkaauth.OAuth{TokenURL: grant.TokenURL, ClientID: "id"}}, "OAuth.ClientSecret is empty"},
		{"reserved extension", kafkaauth.Options{Mechanism: "OAUTHBEARER", OAuth: grant, Extensions: map[string]string{"auth": "x"}}, `extension "auth" is reserved`},
		{"bad extension key", kafkaauth.Options{Mechanism: "OAUTHBEARER", OAuth: grant, Extensions: map[string]string{"1st": "x"}}, `extension key "1st"`},
		{"separator in a value", kafkaauth.Options{Mechanism: "OAUTHBEARER", OAuth: grant, Extensions: map[string]string{"k": "a\x01b"}}, "separator byte"},
		{"unknown mechanism", kafkaauth.Options{Mechanism: "GSSAPI", User: "u", Password: "p"}, "want PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER"},
	} {
		err := kafkaauth.Apply(sarama.NewConfig(), tt.o)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want an error mentioning %q", tt.name, err, tt.want)
		}
	}
}

// TestOAuthFetch runs the client-credentials grant against an issuer of the
// test's own (no broker): the secret, the scopes and the audience reach the
// token endpoint, and the expiry comes back; a wrong secret is an error
// naming the endpoint and the provider's error code.
func TestOAuthFetch(t *testing.T) {
	iss := testenv.NewOIDCIssuer(t, 5*time.Minute)
	grant := kafkaauth.OAuth{TokenURL: iss.TokenURL, ClientID: iss.ClientID, ClientSecret: iss.ClientSecret, Scopes: []string{"a", "b"}, Audience: "billing"}
	before := time.Now()
	tok, exp, err := grant.Fetch(testenv.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	if exp.Before(before.Add(4*time.Minute)) || exp.After(time.Now().Add(6*time.Minute)) {
		t.Errorf("expiry %s, want about 5 minutes from now", exp)
	}
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		t.Fatalf("token %q is not a JWS", tok)
	}
	claims, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Sub, Aud, Scope string
	}
	if err := json.Unmarshal(claims, &c); err != nil || c.Sub != iss.ClientID || c.Aud != "billing" || c.Scope != "a b" {
		t.Fatalf("claims %s (%v)", claims, err)
	}
	grant.ClientSecret = "wrong"
	if _, _, err := grant.Fetch(testenv.Context(t)); err == nil || !strings.Contains(err.Error(), iss.TokenURL) || !strings.Contains(err.Error(), "invalid_client") {
		t.Fatalf("wrong secret: %v", err)
	}
}
