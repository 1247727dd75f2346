package awsmsk_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"net/url"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"

	"github.com/idemhq/idem/kafkaauth"
	"github.com/idemhq/idem/kafkaauth/awsmsk"
)

// Static test credentials: nothing here reaches AWS.
const (
	keyID   = "AKIDEXAMPLE"
	secret  = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
	session = "session-token-example"
	region  = "eu-west-1"
)

// counting is a credentials provider that counts its calls.
type counting struct {
	aws.CredentialsProvider
	n atomic.Int64
}

func (c *counting) Retrieve(ctx context.Context) (aws.Credentials, error) {
	c.n.Add(1)
	return c.CredentialsProvider.Retrieve(ctx)
}

func staticCreds() *counting {
	return &counting{CredentialsProvider: credentials.NewStaticCredentialsProvider(keyID, secret, session)}
}

// checkToken checks tok against the format aws-msk-iam-sasl-signer-go
// documents: the base64url (unpadded) encoding of a SigV4 presigned GET of
// https://kafka.<region>.amazonaws.com/ for Action=kafka-cluster:Connect,
// valid X-Amz-Expires=900 s from X-Amz-Date, with the signer's User-Agent
// added after signing. The signature is recomputed here from the query
// (SigV4's canonical request, string to sign and key derivation, written
// out with the standard library), so a token signed with other
// credentials, for another region or service, or altered, fails. It
// returns the signing time.
func checkToken(t *testing.T, tok string) time.Time {
	t.Helper()
	if !regexp.MustCompile(`^[A-Za-z0-9_-]+$`).MatchString(tok) {
		t.Fatalf("token %q is not unpadded base64url", tok)
	}
	raw, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(string(raw))
	if err != nil {
		t.Fatal(err)
	}
	if u.Scheme != "https" || u.Host != "kafka."+region+".amazonaws.com" || u.Path != "/" {
		t.Fatalf("presigned URL %s: want https://kafka.%s.amazonaws.com/", u, region)
	}
	q := u.Query()
	signedAt, err := time.Parse("20060102T150405Z", q.Get("X-Amz-Date"))
	if err != nil {
		t.Fatalf("X-Amz-Date: %v", err)
	}
	day := signedAt.Format("20060102")
	scope := day + "/" + region + "/kafka-cluster/aws4_request"
	for k, want := range map[string]string{
		"Action":               "kafka-cluster:Connect",
		"X-Amz-Algorithm":      "AWS4-HMAC-SHA256",
		"X-Amz-Credential":     keyID + "/" + scope,
		"X-Amz-Expires":        "900",
		"X-Amz-SignedHeaders":  "host",
		"X-Amz-Security-Token": session,
	} {
		if got := q.Get(k); got != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
	ua := q.Get("User-Agent")
	if !strings.HasPrefix(ua, "aws-msk-iam-sasl-signer-go/") || !strings.HasSuffix(ua, "/"+runtime.Version()) {
		t.Errorf("User-Agent %q: want aws-msk-iam-sasl-signer-go/<version>/%s", ua, runtime.Version())
	}

	// Recompute the signature over everything but itself and the
	// User-Agent (added after signing).
	enc := func(s string) string { return strings.ReplaceAll(url.QueryEscape(s), "+", "%20") }
	var keys []string
	for k := range q {
		if k != "X-Amz-Signature" && k != "User-Agent" {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var pairs []string
	for _, k := range keys {
		pairs = append(pairs, enc(k)+"="+enc(q.Get(k)))
	}
	hexSum := func(s string) string { h := sha256.Sum256([]byte(s)); return hex.EncodeToString(h[:]) }
	canonical := strings.Join([]string{"GET", "/", strings.Join(pairs, "&"), "host:" + u.Host + "\n", "host", hexSum("")}, "\n")
	toSign := strings.Join([]string{"AWS4-HMAC-SHA256", q.Get("X-Amz-Date"), scope, hexSum(canonical)}, "\n")
	mac := func(key []byte, s string) []byte {
		m := hmac.New(sha256.New, key)
		m.Write([]byte(s))
		return m.Sum(nil)
	}
	key := mac(mac(mac(mac([]byte("AWS4"+secret), day), region), "kafka-cluster"), "aws4_request")
	if want := hex.EncodeToString(mac(key, toSign)); q.Get("X-Amz-Signature") != want {
		t.Errorf("X-Amz-Signature %s, want %s (SigV4 over the query with the static test credentials)", q.Get("X-Amz-Signature"), want)
	}
	return signedAt
}

func TestFetchTokenFormat(t *testing.T) {
	before := time.Now().Add(-time.Second)
	tok, exp, err := awsmsk.Config{Region: region, Credentials: staticCreds()}.Fetch(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	signedAt := checkToken(t, tok)
	if signedAt.Before(before.Truncate(time.Second)) || signedAt.After(time.Now()) {
		t.Errorf("signed at %s, not now", signedAt)
	}
	if !exp.Equal(signedAt.Add(900 * time.Second)) {
		t.Errorf("expiry %s, want the signing time + 900 s (%s)", exp, signedAt.Add(900*time.Second))
	}
}

// TestFetchPlugsIntoKafkaauth: Config.Fetch is what kafkaauth.Options'
// FetchToken takes for OAUTHBEARER; sarama accepts the config, the token it
// gets has the signer's format, and a second authentication reuses the
// token instead of signing again.
func TestFetchPlugsIntoKafkaauth(t *testing.T) {
	creds := staticCreds()
	msk := awsmsk.Config{Region: region, Credentials: creds}
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V3_9_0_0
	if err := kafkaauth.Apply(cfg, kafkaauth.Options{TLS: true, Mechanism: "OAUTHBEARER", FetchToken: msk.Fetch}); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	first, err := cfg.Net.SASL.TokenProvider.Token()
	if err != nil {
		t.Fatal(err)
	}
	checkToken(t, first.Token)
	again, err := cfg.Net.SASL.TokenProvider.Token()
	if err != nil || again.Token != first.Token || creds.n.Load() != 1 {
		t.Fatalf("second token %v (same: %v) after %d credential retrievals: want the kept token", err, again.Token == first.Token, creds.n.Load())
	}
}

func TestConfigErrors(t *testing.T) {
	creds := staticCreds()
	for _, tt := range []struct {
		name string
		c    awsmsk.Config
		want string
	}{
		{"no region", awsmsk.Config{Credentials: creds}, "Config.Region is empty"},
		{"two sources", awsmsk.Config{Region: region, Profile: "p", Credentials: creds}, "at most one of"},
		{"session name without role", awsmsk.Config{Region: region, SessionName: "s"}, "RoleARN is not"},
	} {
		if err := tt.c.Validate(); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: Validate: %v, want an error mentioning %q", tt.name, err, tt.want)
		}
		if _, _, err := tt.c.Fetch(context.Background()); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: Fetch: %v, want an error mentioning %q", tt.name, err, tt.want)
		}
	}

	// Credentials that cannot be had surface when sarama asks for a token.
	refused := errors.New("no credentials here")
	msk := awsmsk.Config{Region: region,
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) { return aws.Credentials{}, refused })}
	cfg := sarama.NewConfig()
	if err := kafkaauth.Apply(cfg, kafkaauth.Options{TLS: true, Mechanism: "OAUTHBEARER", FetchToken: msk.Fetch}); err != nil {
		t.Fatal(err)
	}
	if _, err := cfg.Net.SASL.TokenProvider.Token(); !errors.Is(err, refused) || !strings.Contains(err.Error(), region) {
		t.Fatalf("token with refused credentials: %v", err)
	}
}
