package kafkaauth_test

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/IBM/sarama"

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
		{"unknown mechanism", kafkaauth.Options{Mechanism: "GSSAPI", User: "u", Password: "p"}, `SASL mechanism "GSSAPI": want PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512`},
		{"the constant's Go name", kafkaauth.Options{Mechanism: "SCRAMSHA512", User: "u", Password: "p"}, "want PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512"},
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
