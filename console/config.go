package console

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/internal/control"
	"github.com/idemhq/idem/internal/mask"
	"github.com/idemhq/idem/serde"
)

// Defaults of Config.
const (
	// defaultPageSize is the number of records a list page or API call
	// returns when the request names no limit.
	defaultPageSize = 50
	// maxPageSize bounds the limit a request may ask for.
	maxPageSize = 500
	// defaultDisplayBytes is how much of a value or header the UI shows
	// inline before it truncates the display and offers a download.
	defaultDisplayBytes = 16 << 10
	// defaultSessionTTL is how long a UI login lasts.
	defaultSessionTTL = 12 * time.Hour
	// defaultMaxOperatorRecords bounds the records an operator acts on in
	// one request.
	defaultMaxOperatorRecords = 100
	// defaultReadTimeout bounds how long a request's body may take to
	// arrive.
	defaultReadTimeout = 30 * time.Second
	// defaultQueryTimeout bounds a request's work in the database.
	defaultQueryTimeout = 15 * time.Second
	// loginBodyBytes bounds a login form's body, read before it is parsed.
	loginBodyBytes = 4 << 10
)

// Config configures the console's handler. Pool and Client are required;
// every other field has a usable zero value.
type Config struct {
	// Pool is the database holding the failure index: the tables
	// idem.Migrate creates and an index.Indexer fills. The console reads
	// records, groups, the overview and the audit log from it, and records
	// every action (with an audit row) in it. Its search_path must reach
	// idem's tables. The caller keeps owning it.
	// Required.
	Pool *pgxpool.Pool
	// Client is the Kafka client through which replays, edit-and-retry and
	// key releases publish. Build it on a config set up by retrytopic.ConfigureProducer (idempotent,
	// acks=all, successes returned, no topic auto-creation): New refuses a
	// client whose config cannot publish that way. The caller keeps owning
	// it (nothing here closes it).
	// Required.
	Client sarama.Client

	// Tokens are the accepted bearer tokens and the role of each. A UI user
	// logs in with one of them and gets a session cookie. Load them with
	// LoadTokens (a file) or ParseTokens (text, e.g. an environment
	// variable's value).
	// Default: none, which New accepts only together with InsecureNoAuth.
	Tokens []Token
	// InsecureNoAuth turns authentication off: every request acts as the
	// admin "anonymous". CSRF protection stays on. Callers must only set it
	// when listening on a loopback address (idem console refuses otherwise).
	// Default: false.
	InsecureNoAuth bool

	// Mask lists JSON paths whose values are masked in payloads shown by the
	// UI and the API: dot-separated object keys, "*" for any key or array
	// element, an optional leading "$.", e.g. "card.number",
	// "$.customer.*.iban", "items.*.pan". When Mask is not empty, a payload
	// that is not JSON cannot be masked and is hidden as a whole. Showing the
	// unmasked value needs the operator role and writes an audit row.
	// Default: none (payloads shown as they are).
	Mask []string

	// Registry decodes values in a schema registry's wire format (Avro,
	// Protobuf, JSON Schema: a 0 byte, then a schema id) to JSON for
	// display, in the UI and the API (value.decoded, value.schema); Mask
	// then applies to the decoded fields. A value that does not decode (a
	// schema the registry does not know, a value the index kept only a
	// prefix of, the registry unavailable) is shown as its bytes, with the
	// reason. Schemas are fetched once per id.
	// Default: nil (values shown as their bytes).
	Registry *serde.Registry

	// EncryptionKeyFile names a file holding the key-encryption key (KEK)
	// of payload encryption at rest: 32 random bytes in base64 or
	// hexadecimal (`idem keys generate` writes one), one key a line; the
	// first wraps new data keys, the others only unwrap (during a rotation).
	// New refuses a file that others may read. With a KEK, the console reads
	// values and headers the indexer sealed (index.Indexer's field of the
	// same name), shows a record whose data key was destroyed as "key
	// destroyed", and seals the values of edits. New refuses a KEK that does
	// not unwrap the index's data keys (wrong key file). Rows written in
	// clear read as ever.
	// Default: "" (no encryption; sealed rows show as "encrypted, no key
	// given").
	EncryptionKeyFile string
	// EncryptionKey is EncryptionKeyFile's content given directly, e.g. from
	// an environment variable (idem console reads IDEM_ENCRYPTION_KEY). Give
	// one of the two.
	// Default: "".
	EncryptionKey string

	// BasePath is the path prefix the handler is mounted under, without a
	// trailing slash (e.g. "/console" with
	// mux.Handle("/console/", http.StripPrefix("/console", h))). It is used
	// to build links and the session cookie's path.
	// Default: "" (mounted at the root).
	BasePath string
	// SessionKey signs session cookies and CSRF tokens (at least 32 bytes).
	// Give every replica behind one load balancer the same key.
	// Default: 32 random bytes per New (sessions end when the process does).
	SessionKey []byte
	// SessionTTL is how long a UI login lasts.
	// Default: 12 h.
	SessionTTL time.Duration
	// SecureCookies marks the session and login cookies Secure (sent over
	// HTTPS only) and names them with the __Host- prefix (path /, no
	// domain: no other site or path of the host can set or read them). Set
	// it when the console is served over TLS or behind a proxy that
	// terminates TLS (idem console sets it for --http-tls-cert and
	// --behind-proxy).
	// Default: false.
	SecureCookies bool
	// BehindProxy says a proxy that terminates TLS forwards the requests:
	// the client's address, which logins and bearer tokens are rate-limited
	// by, is the last hop of X-Forwarded-For rather than the connection's
	// peer (the proxy). Set it only when every request comes through that
	// proxy: a client reaching the console directly could name any address.
	// Default: false.
	BehindProxy bool

	// ReplayTopics lists topics a replay may target besides each record's
	// origin topic and the origin's retry tiers for the record's consumer
	// group (<origin>.<group>.retry.<n>). A replay to any other topic is
	// refused (400), so the console can never be used to write into another
	// team's topic or to read payloads out unaudited; a replay to a listed
	// topic says so in its audit row. idem console: --replay-topic.
	// Default: none.
	ReplayTopics []string
	// MaxOperatorRecords is the most records an operator may act on in one
	// request (replay, resolve, archive, chosen by id). A longer list, or a
	// filter, needs the admin role.
	// Default: 100.
	MaxOperatorRecords int
	// MaxRedrivesPerHour bounds the re-drives of one consumer group started
	// in any hour, through any console or the CLI (they are counted in the
	// database; cancelled ones count). A re-drive past it is refused with
	// 429 and when the next one is allowed. idem console:
	// --max-redrives-per-hour.
	// Default: 6.
	MaxRedrivesPerHour int
	// ReadTimeout bounds how long a request's body may take to arrive,
	// from when its headers were read (a login form's body is also capped
	// at 4 KiB before it is parsed). A client that trickles its body is cut
	// off.
	// Default: 30 s.
	ReadTimeout time.Duration
	// QueryTimeout bounds the database work of each request: its context
	// ends after it, which cancels the query running then. (idem console
	// also sets statement_timeout on its connections.) A replay's job runs
	// outside the request and is not bound by it.
	// Default: 15 s.
	QueryTimeout time.Duration
	// DisplayBytes is how many bytes of a value or header the UI shows inline;
	// longer values are truncated on screen with a download link.
	// Default: 16 KiB.
	DisplayBytes int
	// Logger receives request errors.
	// Default: slog.Default().
	Logger *slog.Logger
	// Registerer, when set, gets the failure index's gauges, read from
	// Pool at each scrape: idem_dlq_unresolved and
	// idem_dlq_oldest_unresolved_seconds by group and topic. An
	// index.Indexer given the same Registerer shares them and adds
	// idem_dlq_retention_seconds, so a service that runs both gives both the
	// same one and registers nothing else.
	// Default: nil (no metrics).
	Registerer prometheus.Registerer
	// now is the clock (tests). Default: time.Now.
	now func() time.Time
	// jobWait is how long an action request waits for its job before it
	// answers 202 with the job (tests). Default: defaultJobWait.
	jobWait time.Duration
	// loginBurst is each client address's budget of logins and bad bearer
	// tokens (tests). Default: loginBurst.
	loginBurst int
}

// defaultJobWait is how long a replay or edit request waits for its job
// to end before it answers with the job in progress.
const defaultJobWait = 5 * time.Second

// defaults returns c with every zero field set to its default.
func (c Config) defaults() Config {
	if c.SessionTTL == 0 {
		c.SessionTTL = defaultSessionTTL
	}
	if c.DisplayBytes == 0 {
		c.DisplayBytes = defaultDisplayBytes
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.MaxOperatorRecords == 0 {
		c.MaxOperatorRecords = defaultMaxOperatorRecords
	}
	if c.MaxRedrivesPerHour == 0 {
		c.MaxRedrivesPerHour = control.DefaultMaxRedrivesPerHour
	}
	if c.ReadTimeout == 0 {
		c.ReadTimeout = defaultReadTimeout
	}
	if c.QueryTimeout == 0 {
		c.QueryTimeout = defaultQueryTimeout
	}
	if c.jobWait == 0 {
		c.jobWait = defaultJobWait
	}
	if c.loginBurst == 0 {
		c.loginBurst = loginBurst
	}
	if c.now == nil {
		c.now = time.Now
	}
	return c
}

// Validate reports the first field of c that cannot work.
func (c Config) Validate() error {
	switch {
	case c.Pool == nil:
		return errors.New("console: Config.Pool is nil: give the pool of the database that holds the failure index")
	case c.Client == nil:
		return errors.New("console: Config.Client is nil: give a Kafka client whose config retrytopic.ConfigureProducer set up")
	}
	if err := publishing(c.Client.Config()); err != nil {
		return fmt.Errorf("console: Config.Client: %w; set its config up with retrytopic.ConfigureProducer", err)
	}
	return c.validateOptions()
}

// publishing reports why a client with config cfg cannot publish the
// console's replays as retrytopic.ConfigureProducer sets it up (nil: it can).
func publishing(cfg *sarama.Config) error {
	switch {
	case cfg == nil:
		return errors.New("the client has no config")
	case !cfg.Producer.Return.Successes:
		return errors.New("Producer.Return.Successes is false (a replay must wait for each record's acknowledgement)")
	case cfg.Producer.RequiredAcks != sarama.WaitForAll:
		return fmt.Errorf("Producer.RequiredAcks is %d, not WaitForAll (acks=all)", cfg.Producer.RequiredAcks)
	case cfg.Metadata.AllowAutoTopicCreation:
		return errors.New("Metadata.AllowAutoTopicCreation is true (a replay must never create a topic)")
	}
	return nil
}

// validateOptions is Validate without Pool and Client.
func (c Config) validateOptions() error {
	switch {
	case len(c.Tokens) == 0 && !c.InsecureNoAuth:
		return errors.New("console: no tokens: give Config.Tokens (a tokens file or IDEM_CONSOLE_TOKENS), or set InsecureNoAuth on a loopback listener")
	case c.SessionKey != nil && len(c.SessionKey) < 32:
		return fmt.Errorf("console: Config.SessionKey has %d bytes, want at least 32", len(c.SessionKey))
	case c.SessionTTL < 0:
		return fmt.Errorf("console: Config.SessionTTL %s is negative", c.SessionTTL)
	case c.DisplayBytes < 0:
		return fmt.Errorf("console: Config.DisplayBytes %d is negative", c.DisplayBytes)
	case c.EncryptionKeyFile != "" && c.EncryptionKey != "":
		return errors.New("console: Config.EncryptionKeyFile and Config.EncryptionKey are both set: give the key-encryption key one way")
	case c.MaxOperatorRecords < 0:
		return fmt.Errorf("console: Config.MaxOperatorRecords %d is negative", c.MaxOperatorRecords)
	case c.MaxRedrivesPerHour < 0:
		return fmt.Errorf("console: Config.MaxRedrivesPerHour %d is negative", c.MaxRedrivesPerHour)
	case c.ReadTimeout < 0:
		return fmt.Errorf("console: Config.ReadTimeout %s is negative", c.ReadTimeout)
	case c.QueryTimeout < 0:
		return fmt.Errorf("console: Config.QueryTimeout %s is negative", c.QueryTimeout)
	case c.BasePath != "" && (c.BasePath[0] != '/' || c.BasePath[len(c.BasePath)-1] == '/'):
		return fmt.Errorf("console: Config.BasePath %q must start with / and not end with one", c.BasePath)
	}
	for i, t := range c.Tokens {
		if err := t.validate(); err != nil {
			return fmt.Errorf("console: Config.Tokens[%d]: %w", i, err)
		}
	}
	if err := checkUnique(c.Tokens); err != nil {
		return fmt.Errorf("console: Config.Tokens: %w", err)
	}
	for i, t := range c.ReplayTopics {
		if strings.TrimSpace(t) == "" || t != strings.TrimSpace(t) {
			return fmt.Errorf("console: Config.ReplayTopics[%d] %q: want a topic name", i, t)
		}
	}
	for _, p := range c.Mask {
		if err := mask.ParsePath(p); err != nil {
			return fmt.Errorf("console: Config.Mask: %w", err)
		}
	}
	return nil
}
