package serde

import (
	"crypto/tls"
	"errors"
	"net/url"
	"strings"
	"time"

	"github.com/idemhq/idem/internal/configerr"
)

// errInvalidConfig prefixes every error NewRegistry returns for a bad
// RegistryConfig (the only errors it returns), and a codec's for bad
// Options. Each problem names the field, its value and the rule it breaks.
var errInvalidConfig = errors.New("serde: invalid config")

// RegistryConfig configures a Registry. The zero value of every field but
// URL is useful.
type RegistryConfig struct {
	// URL is the base URL of the registry's Confluent-compatible REST API,
	// the prefix of /schemas/ids/{id}: "http://127.0.0.1:8081" for
	// Confluent's registry, "http://host:8080/apis/ccompat/v7" for
	// Apicurio Registry (`make services` writes SCHEMA_REGISTRY_URL). Give
	// several, separated by commas, to try them in order. Required.
	URL string

	// TLS is the TLS configuration for https URLs: the CA to trust, a
	// client certificate. nil uses the system's roots.
	// Default: nil
	TLS *tls.Config

	// Username and Password, when Username is set, are sent as HTTP basic
	// authentication (Confluent Cloud: the API key and secret).
	// Default: "" and "" (no basic authentication).
	Username, Password string

	// BearerToken, when set, is sent as "Authorization: Bearer <token>". It
	// cannot be combined with Username.
	// Default: "" (none).
	BearerToken string

	// Timeout bounds each request to the registry. A request that has not
	// answered by then counts as the registry being unavailable.
	// Default: 5s
	Timeout time.Duration

	// OutagePause is how long the registry is taken as unavailable after a
	// request failed because it is (connection refused, a timeout, a 5xx, a
	// 401/403/429): for that long, calls that need it fail at once with an
	// *UnavailableError without a request, and the first call after it
	// probes. The *UnavailableError's breaker.OpenError says how long is
	// left, so a consumer pauses for it instead of spending attempts.
	// Default: 2s
	OutagePause time.Duration

	// SubjectTTL is how long the latest version of a subject (Latest, and
	// Codec.Encode without Options.Schema) is kept before it is asked for
	// again. Schemas by id are kept for the Registry's lifetime: an id
	// never changes its schema.
	// Default: 1m
	SubjectTTL time.Duration
}

// defaults returns c with every zero field at its default: the one place the
// defaults live.
func (c RegistryConfig) defaults() RegistryConfig {
	if c.Timeout == 0 {
		c.Timeout = 5 * time.Second
	}
	if c.OutagePause == 0 {
		c.OutagePause = 2 * time.Second
	}
	if c.SubjectTTL == 0 {
		c.SubjectTTL = time.Minute
	}
	return c
}

// validate reports every problem of c (defaults applied).
func (c RegistryConfig) validate() error {
	l := configerr.New(errInvalidConfig, "RegistryConfig.")
	if strings.TrimSpace(c.URL) == "" {
		l.Bad("URL", c.URL, "is required: the base URL of the registry's Confluent-compatible API (SCHEMA_REGISTRY_URL)")
	}
	for _, u := range c.urls() {
		p, err := url.Parse(u)
		if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
			l.Bad("URL", u, "must be an http:// or https:// URL")
		}
	}
	if c.Username != "" && c.BearerToken != "" {
		l.Bad("BearerToken", "<set>", "cannot be combined with Username (basic authentication): give one")
	}
	if c.Username == "" && c.Password != "" {
		l.Bad("Password", "<set>", "needs Username")
	}
	l.NonNegative(map[string]time.Duration{"Timeout": c.Timeout, "OutagePause": c.OutagePause, "SubjectTTL": c.SubjectTTL})
	return l.Err()
}

func (c RegistryConfig) urls() []string {
	var out []string
	for u := range strings.SplitSeq(c.URL, ",") {
		if u = strings.TrimSpace(u); u != "" {
			out = append(out, strings.TrimSuffix(u, "/"))
		}
	}
	return out
}
