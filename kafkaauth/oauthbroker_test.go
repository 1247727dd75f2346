package kafkaauth_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/internal/testing/testenv"
	"github.com/idemhq/idem/kafkaauth"
)

// oauthConfig returns a sarama config for the OAUTHBEARER listener of k
// with o's token source.
func oauthConfig(t *testing.T, o kafkaauth.Options) *sarama.Config {
	t.Helper()
	cfg := sarama.NewConfig()
	cfg.Version = testenv.KafkaVersion
	cfg.Metadata.Retry.Max = 0
	o.Mechanism = "OAUTHBEARER"
	if err := kafkaauth.Apply(cfg, o); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestOAuthBearerBroker runs kafkaauth's OAUTHBEARER settings against a real
// broker whose OAUTHBEARER listener validates tokens with Kafka's
// OAuthBearerValidatorCallbackHandler against the JWKS of an OIDC issuer the
// test runs in process (testenv.NewOAuthKafka): a client-credentials grant
// connects and its tokens are refreshed mid-stream with no record lost;
// refused tokens (expired, forged, another issuer, a wrong audience, no
// subject), a refused client secret, and a fixed token that expires under
// a running client are refused by the broker.
func TestOAuthBearerBroker(t *testing.T) {
	t.Parallel()
	const lifetime = 10 * time.Second
	k := testenv.NewOAuthKafka(t, lifetime)
	iss := k.Issuer
	grant := kafkaauth.OAuth{TokenURL: iss.TokenURL, ClientID: iss.ClientID, ClientSecret: iss.ClientSecret, Scopes: []string{"kafka.read", "kafka.write"}}

	t.Run("refused", func(t *testing.T) {
		expired := iss.Claims("")
		expired.IssuedAt, expired.Expiry = time.Now().Add(-10*time.Minute), time.Now().Add(-5*time.Minute)
		otherIssuer := iss.Claims("")
		otherIssuer.Issuer = "http://127.0.0.1:1/elsewhere"
		noSubject := iss.Claims("")
		noSubject.Subject = ""
		wrongSecret := grant
		wrongSecret.ClientSecret = "not-the-secret"
		wrongAudience := grant
		wrongAudience.Audience = "billing-api" // the issuer mints aud=billing-api; the broker expects kafka
		for _, tt := range []struct {
			name string
			o    kafkaauth.Options
			want string
		}{
			{"expired token", kafkaauth.Options{Token: iss.Mint(expired)}, "invalid credentials"},
			{"forged signature", kafkaauth.Options{Token: iss.MintForeign(t, iss.Claims(""))}, "invalid credentials"},
			{"another issuer", kafkaauth.Options{Token: iss.Mint(otherIssuer)}, "invalid credentials"},
			{"no subject", kafkaauth.Options{Token: iss.Mint(noSubject)}, "invalid credentials"},
			{"not a JWT", kafkaauth.Options{Token: "opaque-token"}, "invalid credentials"},
			{"wrong audience", kafkaauth.Options{OAuth: wrongAudience}, "invalid credentials"},
			{"wrong client secret", kafkaauth.Options{OAuth: wrongSecret}, "invalid_client"},
		} {
			t.Run(tt.name, func(t *testing.T) {
				c, err := sarama.NewClient(k.OAuthBrokers, oauthConfig(t, tt.o))
				if err == nil {
					c.Close()
					t.Fatal("the broker accepted the token")
				}
				if !strings.Contains(err.Error(), tt.want) {
					t.Fatalf("refused with %v; want an error mentioning %q", err, tt.want)
				}
			})
		}
	})

	t.Run("accepted", func(t *testing.T) {
		for _, tt := range []struct {
			name string
			o    kafkaauth.Options
		}{
			{"client credentials", kafkaauth.Options{OAuth: grant}},
			{"audience kafka asked for", kafkaauth.Options{OAuth: kafkaauth.OAuth{TokenURL: iss.TokenURL, ClientID: iss.ClientID, ClientSecret: iss.ClientSecret, Audience: "kafka"}}},
			{"fixed token", kafkaauth.Options{Token: iss.Mint(iss.Claims(""))}},
			{"with extensions", kafkaauth.Options{OAuth: grant, Extensions: map[string]string{"logicalCluster": "lkc-test"}}},
		} {
			t.Run(tt.name, func(t *testing.T) {
				c, err := sarama.NewClient(k.OAuthBrokers, oauthConfig(t, tt.o))
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				if _, err := c.Controller(); err != nil {
					t.Fatal(err)
				}
			})
		}
	})

	// A fixed token is never refreshed: once it expires the broker ends the
	// session (it re-authenticates clients at the token's expiry,
	// connections.max.reauth.ms) and refuses it at re-authentication, so a
	// running producer fails. This is what the refresh below prevents.
	t.Run("fixed token expires under a running producer", func(t *testing.T) {
		c := iss.Claims("")
		// A whole second: the exp claim is in seconds, so the broker
		// sees exactly this expiry.
		c.Expiry = time.Now().Add(6 * time.Second).Truncate(time.Second)
		cfg := oauthConfig(t, kafkaauth.Options{Token: iss.Mint(c)})
		cfg.Producer.Return.Successes = true
		cfg.Producer.Retry.Max = 0
		topic := k.Topic(t, 1)
		p, err := sarama.NewSyncProducer(k.OAuthBrokers, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		if _, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: topic, Value: sarama.StringEncoder("before")}); err != nil {
			t.Fatalf("before expiry: %v", err)
		}
		var last error
		testenv.Eventually(t, time.Minute, func() error {
			_, _, last = p.SendMessage(&sarama.ProducerMessage{Topic: topic, Value: sarama.StringEncoder("after")})
			if last == nil {
				return fmt.Errorf("still accepted %s after the token's expiry", time.Since(c.Expiry).Round(time.Second))
			}
			return nil
		})
		// sarama re-authenticates at 85–95 % of the session the broker
		// granted, and the broker grants a fixed token only what is left
		// of its life; with under a second left, the next re-authentication
		// comes less than a second after the previous one, and Kafka
		// refuses that (KafkaChannel: at most one re-authentication a
		// second) with ILLEGAL_SASL_STATE. So a fixed token may be refused
		// in its last second, and only then; any other refusal must come at
		// or after its expiry.
		switch early := time.Until(c.Expiry); {
		case early > time.Second:
			t.Fatalf("refused %s before the token expired: %v", early.Round(time.Millisecond), last)
		case early > 0 && !errors.Is(last, sarama.ErrIllegalSASLState):
			t.Fatalf("refused %s before the token expired: %v", early.Round(time.Millisecond), last)
		}
		t.Logf("refused %s after expiry (negative: before): %v", time.Since(c.Expiry).Round(time.Millisecond), last)
	})

	// A producer and an idem consumer both on client-credentials tokens that
	// live 10 s, for about three lifetimes: the broker makes them
	// re-authenticate as each token nears expiry, Apply's provider hands
	// them a fresh one, and every record produced is handled.
	t.Run("tokens refreshed mid-stream, no record lost", func(t *testing.T) {
		topic, group := k.Topic(t, 2), testenv.Group(t)
		pcfg := oauthConfig(t, kafkaauth.Options{OAuth: grant})
		pcfg.Producer.Return.Successes = true
		pcfg.Producer.RequiredAcks = sarama.WaitForAll
		p, err := sarama.NewSyncProducer(k.OAuthBrokers, pcfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close() })

		var mu sync.Mutex
		handled := map[string]int{}
		cfg := consumer.Config{Brokers: k.OAuthBrokers, Group: group, Topics: []string{topic}, Dedupe: dedupe.NewMemory(),
			Sarama: oauthConfig(t, kafkaauth.Options{OAuth: grant}), CommitInterval: 100 * time.Millisecond, DLQDepthInterval: -1}
		c := idemtest.Start(t, cfg, handler.Func(func(_ context.Context, m *handler.Message) error {
			mu.Lock()
			defer mu.Unlock()
			handled[m.IdempotencyKey]++
			return nil
		}))

		issued := iss.Issued()
		start := time.Now()
		sent := 0
		// Pace the stream over three token lifetimes (a ticker paces, it
		// does not synchronise anything).
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for ; time.Since(start) < 3*lifetime; <-tick.C {
			key := fmt.Sprint("rec-", sent)
			_, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: topic, Partition: int32(sent % 2), Value: sarama.StringEncoder(key),
				Headers: []sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte(key)}}})
			if err != nil {
				t.Fatalf("record %d, %s into the stream: %v", sent, time.Since(start).Round(time.Millisecond), err)
			}
			sent++
		}
		testenv.Eventually(t, 2*time.Minute, func() error {
			mu.Lock()
			defer mu.Unlock()
			if len(handled) < sent {
				return fmt.Errorf("%d of %d records handled", len(handled), sent)
			}
			return nil
		})
		for i := range sent {
			if handled[fmt.Sprint("rec-", i)] == 0 {
				t.Errorf("record rec-%d lost", i)
			}
		}
		// Producer and consumer each fetched a token at start and refreshed
		// it at least twice in three lifetimes.
		if n := iss.Issued() - issued; n < 4 {
			t.Fatalf("%d tokens issued over %s of 10 s tokens: the clients did not refresh", n, time.Since(start).Round(time.Second))
		}
		if err := c.Stop(); err != nil {
			t.Fatal(err)
		}
		t.Logf("%d records over %s, %d tokens issued", sent, time.Since(start).Round(time.Second), iss.Issued()-issued)
	})
}
