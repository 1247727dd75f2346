package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemhq/idem/internal/testing/testenv"
)

// TestOAuthSettings: the OAUTHBEARER flags and environment variables fail
// before any connection when a secret or a token is missing or a setting
// cannot work.
func TestOAuthSettings(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"no token source", nil, []string{"--sasl-mechanism", "OAUTHBEARER"}, "needs a token: give --sasl-oauth-token-url"},
		{"token URL without secret", map[string]string{"IDEM_SASL_OAUTH_TOKEN_URL": "https://idp.example/token"},
			[]string{"--sasl-mechanism", "oauthbearer", "--sasl-oauth-client-id", "c"}, "set IDEM_SASL_OAUTH_CLIENT_SECRET"},
		{"no client id", map[string]string{"IDEM_SASL_OAUTH_CLIENT_SECRET": "s", "IDEM_SASL_MECHANISM": "OAUTHBEARER"},
			[]string{"--sasl-oauth-token-url", "https://idp.example/token"}, "OAuth.ClientID is empty"},
		{"relative token URL", map[string]string{"IDEM_SASL_OAUTH_CLIENT_SECRET": "s"},
			[]string{"--sasl-mechanism", "OAUTHBEARER", "--sasl-oauth-token-url", "idp/token", "--sasl-oauth-client-id", "c"}, "want an absolute http or https URL"},
		{"OAuth flags with PLAIN", map[string]string{"IDEM_SASL_PASSWORD": "p"},
			[]string{"--sasl-mechanism", "PLAIN", "--sasl-user", "u", "--sasl-oauth-token-file", "t"}, "not OAUTHBEARER"},
		{"reserved extension", map[string]string{"IDEM_SASL_OAUTH_TOKEN": "tok", "IDEM_SASL_OAUTH_EXTENSIONS": "auth=x"},
			[]string{"--sasl-mechanism", "OAUTHBEARER"}, `extension "auth" is reserved`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"dlq", "depth", "-t", "x", "-b", "127.0.0.1:1"}, tt.args...)
			code, out, errOut := idemEnv(t, tt.env, args...)
			if code != 1 || out != "" || !strings.Contains(errOut, tt.want) {
				t.Fatalf("code %d, stderr %q: want exit 1 mentioning %q", code, errOut, tt.want)
			}
		})
	}
}

// TestOAuthCluster runs idem topic create, produce and dlq depth through the
// OAUTHBEARER listener of a broker of the test's own that validates tokens
// against the JWKS of an OIDC issuer the test runs
// (testenv.NewOAuthKafka): with a client-credentials grant from flags, from
// environment variables, with a token file and a fixed token; a wrong client
// secret and a token for another audience are refused.
func TestOAuthCluster(t *testing.T) {
	t.Parallel()
	k := testenv.NewOAuthKafka(t, time.Minute)
	iss := k.Issuer
	topic := testenv.Unique("t_oauth_cli")
	t.Cleanup(func() { k.DeleteTopics(t, topic) })
	grant := []string{"-b", strings.Join(k.OAuthBrokers, ","), "--sasl-mechanism", "OAUTHBEARER",
		"--sasl-oauth-token-url", iss.TokenURL, "--sasl-oauth-client-id", iss.ClientID, "--sasl-oauth-scope", "kafka.write,kafka.read"}
	secret := map[string]string{"IDEM_SASL_OAUTH_CLIENT_SECRET": iss.ClientSecret}

	if code, _, errOut := idemEnv(t, secret, append([]string{"topic", "create", topic, "--partitions", "1"}, grant...)...); code != 0 {
		t.Fatalf("topic create: %d %s", code, errOut)
	}
	var out, errOut bytes.Buffer
	code := runEnv(append([]string{"produce", topic, "--key-sep", ":", "--key-header", "idempotency-key"}, grant...),
		func(k string) string { return secret[k] }, strings.NewReader("a:1\nb:2\nc:3\n"), &out, &errOut)
	if code != 0 || !strings.Contains(out.String(), "produced 3") {
		t.Fatalf("produce: %d\n%s%s", code, out.String(), errOut.String())
	}
	depth := func(t *testing.T, env map[string]string, args ...string) (int, string, string) {
		t.Helper()
		return idemEnv(t, env, append([]string{"dlq", "depth", "-t", topic}, args...)...)
	}

	t.Run("flags", func(t *testing.T) {
		if code, out, _ := depth(t, secret, grant...); code != 0 || !strings.Contains(out, "total: 3 pending") {
			t.Fatalf("code %d\n%s", code, out)
		}
	})
	t.Run("environment", func(t *testing.T) {
		env := map[string]string{"KAFKA_BROKERS": strings.Join(k.OAuthBrokers, ","), "IDEM_SASL_MECHANISM": "oauthbearer",
			"IDEM_SASL_OAUTH_TOKEN_URL": iss.TokenURL, "IDEM_SASL_OAUTH_CLIENT_ID": iss.ClientID, "IDEM_SASL_OAUTH_SCOPE": "kafka.read",
			"IDEM_SASL_OAUTH_AUDIENCE": "kafka", "IDEM_SASL_OAUTH_CLIENT_SECRET": iss.ClientSecret,
			"IDEM_SASL_OAUTH_EXTENSIONS": "logicalCluster=lkc-test,identityPoolId=pool-test"}
		if code, out, _ := depth(t, env); code != 0 || !strings.Contains(out, "total: 3 pending") {
			t.Fatalf("code %d\n%s", code, out)
		}
	})
	t.Run("token file and fixed token", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "token")
		if err := os.WriteFile(file, []byte(iss.Mint(iss.Claims(""))+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		base := []string{"-b", strings.Join(k.OAuthBrokers, ","), "--sasl-mechanism", "OAUTHBEARER"}
		if code, out, _ := depth(t, nil, append(base, "--sasl-oauth-token-file", file)...); code != 0 || !strings.Contains(out, "total: 3 pending") {
			t.Fatalf("token file: code %d\n%s", code, out)
		}
		if code, out, _ := depth(t, map[string]string{"IDEM_SASL_OAUTH_TOKEN": iss.Mint(iss.Claims(""))}, base...); code != 0 || !strings.Contains(out, "total: 3 pending") {
			t.Fatalf("fixed token: code %d\n%s", code, out)
		}
	})
	t.Run("refused", func(t *testing.T) {
		if code, _, errOut := depth(t, map[string]string{"IDEM_SASL_OAUTH_CLIENT_SECRET": "wrong"}, grant...); code != 1 || !strings.Contains(errOut, "invalid_client") {
			t.Fatalf("wrong secret: code %d %q", code, errOut)
		}
		if code, _, errOut := depth(t, secret, append(grant, "--sasl-oauth-audience", "billing-api")...); code != 1 || !strings.Contains(errOut, "invalid credentials") {
			t.Fatalf("wrong audience: code %d %q", code, errOut)
		}
	})
}
