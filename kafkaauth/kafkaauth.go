// Package kafkaauth configures a sarama client for a secured Kafka cluster:
// TLS (server verification against a CA file, client certificates) and SASL
// (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER). It has one job — fill in
// sarama.Config.Net from a few plain settings — so that a service's
// consumer.Config.Sarama and the idem CLI reach a cluster the same way.
//
// Call Apply on the sarama.Config given to consumer.Config.Sarama (see the
// package Example).
//
// sarama needs a SCRAM implementation it does not ship; this package has one,
// built on github.com/xdg-go/scram as sarama's own examples are. Apply sets
// it for the SCRAM mechanisms.
//
// For OAUTHBEARER (KIP-255) sarama asks for a token at every connection and
// re-authentication. Options takes one of four sources: an OAuth
// client-credentials grant (Options.OAuth), any function that fetches a
// token with its expiry (Options.FetchToken, e.g. AWS MSK IAM's
// awsmsk.Config.Fetch from the separate module
// github.com/idemhq/idem/kafkaauth/awsmsk, so this one does not pull in the
// AWS SDK), a fixed token (Options.Token) or a token file read at every
// authentication (Options.TokenFile). Tokens of the first two are kept and
// fetched again once 80 % of their lifetime has passed, before they expire.
// docs/secured-clusters.md shows MSK, Confluent Cloud and a generic OIDC
// provider.
package kafkaauth

import (
	"context"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/xdg-go/scram"
)

// Options are the settings of a secured connection. The zero value is a
// plaintext connection without authentication (Apply changes nothing).
type Options struct {
	// TLS turns TLS on, verifying the brokers' certificates against the
	// system roots (or CAFile). Setting CAFile, CertFile, KeyFile or
	// InsecureSkipVerify turns TLS on as well.
	TLS bool
	// CAFile is a PEM file of the CA certificates that signed the brokers'
	// certificates. Default: the system roots.
	CAFile string
	// CertFile and KeyFile are a PEM client certificate and its key, for
	// brokers that require client authentication (ssl.client.auth=required).
	// Give both or neither.
	CertFile, KeyFile string
	// InsecureSkipVerify accepts any broker certificate and host name. It
	// leaves the connection open to interception: for tests only.
	InsecureSkipVerify bool
	// Mechanism is the SASL mechanism, as Kafka spells it
	// (sasl.mechanism), case-insensitive:
	//   - "PLAIN": user and password sent as they are, so only over TLS;
	//   - "SCRAM-SHA-256": SASL/SCRAM with SHA-256 (RFC 7677);
	//   - "SCRAM-SHA-512": SASL/SCRAM with SHA-512;
	//   - "OAUTHBEARER": SASL/OAUTHBEARER (KIP-255) with a token from
	//     exactly one of FetchToken, OAuth, Token and TokenFile.
	// Any other value is an error naming these four (Validate, Apply).
	// Default: "" (no SASL).
	Mechanism string
	// User and Password are the SASL credentials of PLAIN and SCRAM; both
	// are required for those mechanisms, and refused for OAUTHBEARER.
	User, Password string

	// FetchToken supplies the OAUTHBEARER tokens: it returns a new token
	// and the time it expires (the zero time: never), such as the MSK IAM
	// signer awsmsk.Config.Fetch of module
	// github.com/idemhq/idem/kafkaauth/awsmsk. Apply keeps the token and
	// calls FetchToken again once 80 % of its lifetime has passed (Kafka's
	// Java client refreshes at the same point,
	// sasl.login.refresh.window.factor), so the broker's re-authentication
	// (connections.max.reauth.ms, KIP-368) always gets a fresh one. Calls
	// are serialised: concurrent connections wait for one fetch. When a
	// fetch fails, the kept token is used while it has not expired, and the
	// error is the connection's once it has. Each call gets a context that
	// ends after 30 s. Default: nil.
	FetchToken func(ctx context.Context) (token string, expiry time.Time, err error)
	// OAuth is an OAuth 2.0 client-credentials grant; Apply fetches its
	// tokens (OAuth.Fetch) and refreshes them as for FetchToken.
	// Default: the zero OAuth (not used).
	OAuth OAuth
	// Token is one OAUTHBEARER token (a JWT), sent as it is at every
	// authentication and never refreshed: for tests and short jobs. The
	// broker ends the session at the token's expiry (KIP-368), and in its
	// last second may already refuse a re-authentication with
	// ILLEGAL_SASL_STATE (Kafka allows one re-authentication a second).
	// Default: "".
	Token string
	// TokenFile is a file holding one OAUTHBEARER token, read again at
	// every connection and re-authentication, so a process that rewrites it
	// (an agent, a Kubernetes projected service-account token) keeps the
	// client authenticated. Default: "".
	TokenFile string
	// Extensions are SASL extensions sent with every OAUTHBEARER token
	// (KIP-342), e.g. Confluent Cloud's logicalCluster and identityPoolId.
	// Keys are a letter then letters, digits, '.', '_' or '-'; "auth" is
	// reserved. Kafka: sasl.oauthbearer.extensions (Java client:
	// extension_NAME in the JAAS config). Default: none.
	Extensions map[string]string
}

// TLSEnabled reports whether o asks for TLS: TLS is set or any TLS file or
// InsecureSkipVerify is.
func (o Options) TLSEnabled() bool {
	return o.TLS || o.CAFile != "" || o.CertFile != "" || o.KeyFile != "" || o.InsecureSkipVerify
}

// mechanism returns o.Mechanism in Kafka's spelling, or an error naming the
// supported ones.
func (o Options) mechanism() (sarama.SASLMechanism, error) {
	switch m := strings.ToUpper(strings.TrimSpace(o.Mechanism)); m {
	case "":
		return "", nil
	case sarama.SASLTypePlaintext, sarama.SASLTypeSCRAMSHA256, sarama.SASLTypeSCRAMSHA512, sarama.SASLTypeOAuth:
		return sarama.SASLMechanism(m), nil
	default:
		return "", fmt.Errorf("kafkaauth: SASL mechanism %q: want %s, %s, %s or %s", o.Mechanism,
			sarama.SASLTypePlaintext, sarama.SASLTypeSCRAMSHA256, sarama.SASLTypeSCRAMSHA512, sarama.SASLTypeOAuth)
	}
}

// Validate reports settings that cannot work: an unknown mechanism, a
// mechanism without user or password, credentials without a mechanism, or a
// client certificate without its key (or the reverse); for OAUTHBEARER, no
// token source or more than one, a user or password, an OAuth grant
// without its endpoint, id or secret, or a malformed extension; token
// settings without OAUTHBEARER. It reads no file.
func (o Options) Validate() error {
	m, err := o.mechanism()
	if err != nil {
		return err
	}
	if m == sarama.SASLTypeOAuth {
		if err := o.validateOAuthBearer(); err != nil {
			return err
		}
	} else if o.hasToken() {
		return fmt.Errorf("kafkaauth: a token source or SASL extensions are set but the SASL mechanism is %q, not %s", o.Mechanism, sarama.SASLTypeOAuth)
	}
	userPassword := m != "" && m != sarama.SASLTypeOAuth
	switch {
	case userPassword && o.User == "":
		return fmt.Errorf("kafkaauth: SASL %s needs a user", m)
	case userPassword && o.Password == "":
		return fmt.Errorf("kafkaauth: SASL %s needs a password", m)
	case m == "" && (o.User != "" || o.Password != ""):
		return errors.New("kafkaauth: a SASL user or password is set but no SASL mechanism")
	case (o.CertFile == "") != (o.KeyFile == ""):
		return errors.New("kafkaauth: a client certificate needs both CertFile and KeyFile")
	}
	return nil
}

// TLSConfig returns the tls.Config o describes (nil when o does not ask for
// TLS): minimum TLS 1.2, RootCAs from CAFile, the client certificate from
// CertFile and KeyFile.
func (o Options) TLSConfig() (*tls.Config, error) {
	if !o.TLSEnabled() {
		return nil, nil
	}
	if err := o.Validate(); err != nil {
		return nil, err
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: o.InsecureSkipVerify}
	if o.CAFile != "" {
		pem, err := os.ReadFile(o.CAFile)
		if err != nil {
			return nil, fmt.Errorf("kafkaauth: CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("kafkaauth: CA file %s holds no PEM certificate", o.CAFile)
		}
		c.RootCAs = pool
	}
	if o.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(o.CertFile, o.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("kafkaauth: client certificate: %w", err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}

// Apply sets cfg.Net.TLS and cfg.Net.SASL as o describes, after Validate.
// With the zero Options it changes nothing. For SASL it sets handshake on
// (Kafka requires it); for SCRAM, a sarama.SCRAMClient generator; for
// OAUTHBEARER, Net.SASL.TokenProvider (for FetchToken and OAuth: one that
// keeps each token until 80 % of its lifetime, fetches bounded by 30 s
// each).
func Apply(cfg *sarama.Config, o Options) error {
	if err := o.Validate(); err != nil {
		return err
	}
	tc, err := o.TLSConfig()
	if err != nil {
		return err
	}
	if tc != nil {
		cfg.Net.TLS.Enable = true
		cfg.Net.TLS.Config = tc
	}
	m, _ := o.mechanism() // checked by Validate
	if m == "" {
		return nil
	}
	cfg.Net.SASL.Enable = true
	cfg.Net.SASL.Handshake = true
	cfg.Net.SASL.Mechanism = m
	if m == sarama.SASLTypeOAuth {
		cfg.Net.SASL.TokenProvider = o.tokenProvider()
		return nil
	}
	cfg.Net.SASL.User = o.User
	cfg.Net.SASL.Password = o.Password
	if m != sarama.SASLTypePlaintext {
		gen, err := scramClientGenerator(m)
		if err != nil {
			return err
		}
		cfg.Net.SASL.SCRAMClientGeneratorFunc = gen
	}
	return nil
}

// scramClientGenerator returns, for sarama.Config.Net.SASL.SCRAMClientGeneratorFunc,
// a function making a new sarama.SCRAMClient for mechanism (SCRAM-SHA-256 or
// SCRAM-SHA-512).
func scramClientGenerator(mechanism sarama.SASLMechanism) (func() sarama.SCRAMClient, error) {
	var h scram.HashGeneratorFcn
	switch mechanism {
	case sarama.SASLTypeSCRAMSHA256:
		h = sha256.New
	case sarama.SASLTypeSCRAMSHA512:
		h = sha512.New
	default:
		return nil, fmt.Errorf("kafkaauth: %q is not a SCRAM mechanism", mechanism)
	}
	return func() sarama.SCRAMClient { return &scramClient{Hash: h} }, nil
}

// scramClient implements sarama.SCRAMClient with github.com/xdg-go/scram.
// One value serves one authentication; make it with scramClientGenerator.
type scramClient struct {
	// Hash is the hash of the mechanism: sha256.New or sha512.New.
	Hash scram.HashGeneratorFcn
	conv *scram.ClientConversation
}

// Begin starts a conversation for user and password (authzID is usually "").
func (c *scramClient) Begin(user, password, authzID string) error {
	cl, err := c.Hash.NewClient(user, password, authzID)
	if err != nil {
		return fmt.Errorf("kafkaauth: SCRAM client: %w", err)
	}
	c.conv = cl.NewConversation()
	return nil
}

// Step answers the server's challenge.
func (c *scramClient) Step(challenge string) (string, error) {
	if c.conv == nil {
		return "", errors.New("kafkaauth: SCRAM Step before Begin")
	}
	return c.conv.Step(challenge)
}

// Done reports whether the conversation has ended (successfully or not).
func (c *scramClient) Done() bool {
	return c.conv != nil && c.conv.Done()
}
