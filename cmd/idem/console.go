package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/idemhq/idem/console"
	"github.com/idemhq/idem/console/index"
	"github.com/idemhq/idem/internal/control"
	"github.com/idemhq/idem/internal/failidx"
	"github.com/idemhq/idem/internal/seal"
	"github.com/idemhq/idem/internal/tables"
	"github.com/idemhq/idem/metrics"
)

// consoleTokensEnv holds tokens ("ROLE:NAME:SECRET,…") when no tokens file
// is given; there is no flag for them, so they never show in a process list.
const consoleTokensEnv = "IDEM_CONSOLE_TOKENS"

// consoleOptions are the flags of idem console.
type consoleOptions struct {
	listen, url, tokensFile, pattern, group, metricsAddr string
	tlsCert, tlsKey                                      string
	mask, topics, replayTopics                           []string
	insecure, noIndexer, behindProxy, anyTokensMode      bool
	retention, refresh, statementTimeout                 time.Duration
	maxValue, maxOperatorRecords, maxRedrivesPerHour     int
}

// The console's HTTP server bounds every connection.
const (
	consoleReadHeaderTimeout = 10 * time.Second
	consoleReadTimeout       = time.Minute // the console cuts a body off after 30 s itself
	consoleWriteTimeout      = time.Minute
	consoleIdleTimeout       = 2 * time.Minute
)

func newConsoleCmd(a *app) *cobra.Command {
	var o consoleOptions
	c := &cobra.Command{
		Use:   "console",
		Short: "Serve the failure console: web UI and HTTP API over the dead-letter index",
		Long: `Serve the failure console (package console): a web UI and a JSON API
(OpenAPI at /api/openapi.yaml) over the PostgreSQL index of dead letters. It
also runs the indexer, which tails the dead-letter topics (every topic whose
name matches --topic-pattern, or --topics) into the index and sweeps resolved
rows older than --retention.

Tokens and roles (viewer, operator, admin) come from --tokens-file, one
"ROLE NAME SECRET" a line (mode 0600: a file its group or others may read
is refused), or from IDEM_CONSOLE_TOKENS ("ROLE:NAME:SECRET,…"). The API
takes "Authorization: Bearer SECRET"; the UI has a login form. Without
tokens the console refuses to start, unless --insecure-no-auth is given and
--listen is a loopback address. --mask hides JSON paths of payloads (and
those values, and card numbers, wherever else they appear); showing them
unmasked needs an operator and is audited.

--encryption-key-file (or IDEM_ENCRYPTION_KEY) turns on payload encryption at
rest: the indexer seals values and headers under data keys wrapped by that
key; see idem keys.

Tokens and session cookies must not cross a network in clear: serve TLS
(--http-tls-cert and --http-tls-key), or name a proxy that terminates TLS in
front of the console (--behind-proxy); either way the cookies are Secure and
__Host- prefixed. Without either, --listen must be a loopback address.

A replay goes to each record's origin topic or to one of its retry tiers for
its group; --replay-topic allows more (each such replay is audited as
such). An operator acts on at most --max-operator-records records a request.

Admins pause and resume partitions and re-drive windows of consumer groups
(the Fleet and Re-drives pages); members obey them when they run with
consumer.Config.Controls. A group gets at most --max-redrives-per-hour
re-drives an hour.`,
		Example: `  idem console --tokens-file /etc/idem/console-tokens --mask card.number --mask customer.iban
  idem console --insecure-no-auth                      # local only: 127.0.0.1:8088, no login
  idem console --listen :8443 --http-tls-cert console.pem --http-tls-key console-key.pem --tokens-file /etc/idem/console-tokens
  IDEM_CONSOLE_TOKENS=admin:alice:$(openssl rand -hex 16) idem console --listen :8088 --behind-proxy`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.runConsole(cmd.Context(), o)
		},
	}
	f := c.Flags()
	f.StringVar(&o.listen, "listen", "127.0.0.1:8088", "address to serve the UI and API on")
	envFlag(f, "listen", "IDEM_CONSOLE_LISTEN")
	dbFlag(c, &o.url)
	a.kafkaFlags(c)
	f.StringVar(&o.tokensFile, "tokens-file", "", "file of accepted tokens, one \"ROLE NAME SECRET\" a line, mode 0600 (else "+consoleTokensEnv+")")
	envFlag(f, "tokens-file", "IDEM_CONSOLE_TOKENS_FILE")
	f.BoolVar(&o.anyTokensMode, "tokens-file-any-mode", false, "accept a tokens file its group or others may read, with a warning")
	f.StringVar(&o.tlsCert, "http-tls-cert", "", "PEM certificate (chain) to serve the console over HTTPS (with --http-tls-key)")
	envFlag(f, "http-tls-cert", "IDEM_CONSOLE_TLS_CERT")
	f.StringVar(&o.tlsKey, "http-tls-key", "", "PEM private key of --http-tls-cert")
	envFlag(f, "http-tls-key", "IDEM_CONSOLE_TLS_KEY")
	f.BoolVar(&o.behindProxy, "behind-proxy", false, "a proxy in front terminates TLS and adds X-Forwarded-For: Secure cookies, client address from its last hop")
	f.StringSliceVar(&o.replayTopics, "replay-topic", nil, "topic a replay may target besides a record's origin and its group's retry tiers (repeatable; audited)")
	f.IntVar(&o.maxOperatorRecords, "max-operator-records", 100, "the most records an operator acts on in one request; more needs an admin")
	f.IntVar(&o.maxRedrivesPerHour, "max-redrives-per-hour", 6, "the re-drives of one consumer group allowed in any hour (counted in the database)")
	f.DurationVar(&o.statementTimeout, "statement-timeout", 30*time.Second, "PostgreSQL statement_timeout of the console's connections")
	f.StringSliceVar(&o.mask, "mask", nil, "JSON path to mask in payloads, e.g. card.number or items.*.pan (repeatable)")
	envFlag(f, "mask", "IDEM_CONSOLE_MASK")
	f.StringVar(&a.registryURL, "registry-url", "", "the schema registry's Confluent-compatible API: values in its wire format (Avro, Protobuf, JSON Schema) are shown decoded to JSON, and --mask applies to the decoded fields; auth from IDEM_REGISTRY_USER and IDEM_REGISTRY_PASSWORD, or IDEM_REGISTRY_TOKEN")
	envFlag(f, "registry-url", "SCHEMA_REGISTRY_URL")
	encryptionFlag(f, &a.keyFile)
	f.BoolVar(&o.insecure, "insecure-no-auth", false, "serve without authentication (everyone is admin); only on a loopback --listen")
	f.StringSliceVar(&o.topics, "topics", nil, "dead-letter topics to index (default: every topic matching --topic-pattern)")
	f.StringVar(&o.pattern, "topic-pattern", `\.dlq$`, "regular expression of the dead-letter topics to index when --topics is not given")
	f.DurationVar(&o.refresh, "topic-refresh", 30*time.Second, "how often the indexer looks for new topics matching --topic-pattern")
	f.StringVar(&o.group, "indexer-group", "", "consumer group the indexer reads with (default: idem-console-indexer- and a digest of the database, so consoles on different databases never share it)")
	f.DurationVar(&o.retention, "retention", 30*24*time.Hour, "keep resolved, replayed and archived records this long (negative: for ever)")
	f.IntVar(&o.maxValue, "max-value-bytes", 1<<20, "longest value copied into the index; longer ones are cut and flagged")
	f.BoolVar(&o.noIndexer, "no-indexer", false, "do not run the indexer here (another process runs it)")
	f.StringVar(&o.metricsAddr, "metrics-addr", "", "serve Prometheus /metrics (idem_dlq_unresolved, …) on this address (empty: off)")
	return c
}

// isLoopback reports whether a listen address binds only loopback
// interfaces: localhost or a loopback IP, never an empty host.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// consoleTokens reads the tokens of --tokens-file or IDEM_CONSOLE_TOKENS.
// A tokens file its group or others may read is refused (LoadTokens),
// unless --tokens-file-any-mode accepts it with a warning.
func (a *app) consoleTokens(o consoleOptions) ([]console.Token, error) {
	if o.tokensFile != "" {
		st, err := os.Stat(o.tokensFile)
		if err != nil {
			return nil, fmt.Errorf("tokens file: %w", err)
		}
		open := st.Mode().Perm()&0o077 != 0
		if !open || !o.anyTokensMode {
			ts, err := console.LoadTokens(o.tokensFile)
			if err != nil && open {
				err = fmt.Errorf("%w (or give --tokens-file-any-mode to accept it with a warning)", err)
			}
			return ts, err
		}
		fmt.Fprintf(a.errOut, "idem: warning: the tokens file %s has mode %04o, open to its group or others; accepted (--tokens-file-any-mode)\n",
			o.tokensFile, st.Mode().Perm())
		b, err := os.ReadFile(o.tokensFile)
		if err != nil {
			return nil, fmt.Errorf("tokens file: %w", err)
		}
		ts, err := console.ParseTokens(string(b))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", o.tokensFile, err)
		}
		return ts, nil
	}
	if v := a.env(consoleTokensEnv); v != "" {
		ts, err := console.ParseTokens(v)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", consoleTokensEnv, err)
		}
		return ts, nil
	}
	return nil, nil
}

// checkConsole refuses the flag combinations that would expose the console.
func checkConsole(o consoleOptions, tokens []console.Token) error {
	tls := o.tlsCert != "" || o.tlsKey != ""
	switch {
	case (o.tlsCert == "") != (o.tlsKey == ""):
		return errors.New("--http-tls-cert and --http-tls-key go together: give both")
	case tls && o.behindProxy:
		return errors.New("--http-tls-cert and --behind-proxy contradict each other: the console serves TLS itself, or a proxy does")
	case o.insecure && !isLoopback(o.listen):
		return fmt.Errorf("--insecure-no-auth serves without authentication, so it needs a loopback --listen (127.0.0.1:PORT, [::1]:PORT or localhost:PORT), not %q", o.listen)
	case o.insecure && len(tokens) > 0:
		return errors.New("--insecure-no-auth and tokens contradict each other: drop one")
	case !o.insecure && len(tokens) == 0:
		return fmt.Errorf("no tokens: give --tokens-file or %s (or, on a loopback --listen, --insecure-no-auth)", consoleTokensEnv)
	case !tls && !o.behindProxy && !isLoopback(o.listen):
		return fmt.Errorf("--listen %q is not a loopback address and the console serves no TLS: tokens and session cookies would cross the network in clear; "+
			"give --http-tls-cert and --http-tls-key, or --behind-proxy for a proxy that terminates TLS, or listen on 127.0.0.1", o.listen)
	case o.maxOperatorRecords < 1:
		return fmt.Errorf("--max-operator-records %d: must be >= 1", o.maxOperatorRecords)
	case o.maxRedrivesPerHour < 1:
		return fmt.Errorf("--max-redrives-per-hour %d: must be >= 1", o.maxRedrivesPerHour)
	case o.statementTimeout < 0:
		return fmt.Errorf("--statement-timeout %s: must be >= 0 (0: none)", o.statementTimeout)
	}
	return nil
}

// consolePool opens the console's pool: every connection runs its
// statements under statement_timeout.
func consolePool(ctx context.Context, url string, timeout time.Duration) (*pgxpool.Pool, error) {
	if url == "" {
		return nil, errors.New("no database: set --database-url or DATABASE_URL")
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("database: %w", err)
	}
	cfg.ConnConfig.RuntimeParams["statement_timeout"] = strconv.FormatInt(timeout.Milliseconds(), 10)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("database: %w", err)
	}
	return pool, nil
}

func (a *app) runConsole(ctx context.Context, o consoleOptions) error {
	tokens, err := a.consoleTokens(o)
	if err != nil {
		return err
	}
	if err := checkConsole(o, tokens); err != nil {
		return err
	}
	var pattern *regexp.Regexp
	if len(o.topics) == 0 {
		if pattern, err = regexp.Compile(o.pattern); err != nil {
			return fmt.Errorf("--topic-pattern: %w", err)
		}
	}
	// The migration may take longer than a statement of the console may: it
	// runs on a connection of its own, without statement_timeout.
	mig, err := openPool(ctx, o.url)
	if err != nil {
		return err
	}
	err = tables.MigrateIndex(ctx, mig)
	if err == nil {
		err = seal.Migrate(ctx, mig)
	}
	if err == nil {
		err = control.Migrate(ctx, mig) // the live controls' tables
	}
	mig.Close()
	if err != nil {
		return fmt.Errorf("migrate the index: %w", err)
	}
	pool, err := consolePool(ctx, o.url, o.statementTimeout)
	if err != nil {
		return err
	}
	defer pool.Close()
	scfg, brokers, err := a.saramaConfig()
	if err != nil {
		return err
	}
	scfg.ClientID = "idem-console"
	scfg.Metadata.Retry.Max = 3
	client, err := sarama.NewClient(brokers, failidx.ProducerConfig(scfg))
	if err != nil {
		return fmt.Errorf("kafka: %w", err)
	}
	defer client.Close()
	logger := slog.New(slog.NewTextHandler(a.errOut, nil))
	// The console and the indexer register their gauges on reg through
	// their Registerer fields and share them: nothing else registers.
	reg := prometheus.NewRegistry()
	tls := o.tlsCert != ""
	ccfg := console.Config{
		Pool: pool, Client: client,
		Tokens: tokens, InsecureNoAuth: o.insecure, Mask: o.mask, Logger: logger, Registerer: reg,
		SecureCookies: tls || o.behindProxy, BehindProxy: o.behindProxy, ReplayTopics: o.replayTopics,
		MaxOperatorRecords: o.maxOperatorRecords,
		MaxRedrivesPerHour: o.maxRedrivesPerHour,
	}
	ccfg.EncryptionKeyFile, ccfg.EncryptionKey = a.kekText(a.keyFile)
	if ccfg.Registry, err = a.registry(); err != nil {
		return err
	}
	h, err := console.New(ccfg)
	if err != nil {
		return err
	}
	defer h.Close()
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	srv := consoleServer(h, logger)
	auth := "log in with a token"
	if o.insecure {
		auth = "NO AUTHENTICATION (--insecure-no-auth)"
	}
	scheme := "http"
	if tls {
		scheme = "https"
	}
	fmt.Fprintf(a.out, "idem console: %s://%s/ (%s)\n", scheme, ln.Addr(), auth)

	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, 3)
	if !o.noIndexer {
		ix := &index.Indexer{Brokers: brokers, Sarama: scfg, Pool: pool, Topics: o.topics, TopicPattern: pattern, RefreshInterval: o.refresh,
			Group: o.group, MaxValueBytes: o.maxValue, Retention: o.retention, Logger: logger, Registerer: reg}
		ix.EncryptionKeyFile, ix.EncryptionKey = a.kekText(a.keyFile)
		wg.Go(func() {
			if errs[0] = ix.Run(rctx); errs[0] != nil {
				errs[0] = fmt.Errorf("indexer: %w", errs[0])
				cancel()
			}
		})
	}
	if o.metricsAddr != "" {
		wg.Go(func() {
			if errs[1] = metrics.Serve(rctx, o.metricsAddr, reg, nil); errs[1] != nil {
				cancel()
			}
		})
	}
	wg.Go(func() {
		<-rctx.Done()
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer scancel()
		_ = srv.Shutdown(sctx)
	})
	if tls {
		err = srv.ServeTLS(ln, o.tlsCert, o.tlsKey)
	} else {
		err = srv.Serve(ln)
	}
	if !errors.Is(err, http.ErrServerClosed) {
		errs[2] = err
	}
	cancel()
	wg.Wait()
	return errors.Join(errs...)
}

// consoleServer is the console's HTTP server: every phase of a connection
// is bounded (issue 29, item 7), reading a request's headers and body,
// writing its response, and waiting idle between requests, so that a slow
// or silent client cannot hold a connection open.
func consoleServer(h http.Handler, logger *slog.Logger) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: consoleReadHeaderTimeout, ReadTimeout: consoleReadTimeout,
		WriteTimeout: consoleWriteTimeout, IdleTimeout: consoleIdleTimeout, ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelWarn)}
}
