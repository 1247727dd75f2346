package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/idemhq/idem/console"
	"github.com/idemhq/idem/console/index"
	"github.com/idemhq/idem/internal/indextable"
	"github.com/idemhq/idem/internal/seal"
	"github.com/idemhq/idem/metrics"
)

// consoleTokensEnv holds tokens ("ROLE:NAME:SECRET,…") when no tokens file
// is given; there is no flag for them, so they never show in a process list.
const consoleTokensEnv = "IDEM_CONSOLE_TOKENS"

// consoleOptions are the flags of idem console.
type consoleOptions struct {
	listen, url, tokensFile, pattern, group, metricsAddr string
	mask, topics                                         []string
	insecure, noIndexer                                  bool
	retention, refresh                                   time.Duration
	maxValue                                             int
}

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
"ROLE NAME SECRET" a line, or from IDEM_CONSOLE_TOKENS ("ROLE:NAME:SECRET,…").
The API takes "Authorization: Bearer SECRET"; the UI has a login form. Without
tokens the console refuses to start, unless --insecure-no-auth is given and
--listen is a loopback address. --mask hides JSON paths of payloads (and
those values, and card numbers, wherever else they appear); showing them
unmasked needs an operator and is audited.

--encryption-key-file (or IDEM_ENCRYPTION_KEY) turns on payload encryption at
rest: the indexer seals values and headers under data keys wrapped by that
key; see idem keys.`,
		Example: `  idem console --tokens-file /etc/idem/console-tokens --mask card.number --mask customer.iban
  idem console --insecure-no-auth                      # local only: 127.0.0.1:8088, no login
  IDEM_CONSOLE_TOKENS=admin:alice:$(openssl rand -hex 16) idem console --listen :8088`,
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
	f.StringVar(&o.tokensFile, "tokens-file", "", "file of accepted tokens, one \"ROLE NAME SECRET\" a line (else "+consoleTokensEnv+")")
	envFlag(f, "tokens-file", "IDEM_CONSOLE_TOKENS_FILE")
	f.StringSliceVar(&o.mask, "mask", nil, "JSON path to mask in payloads, e.g. card.number or items.*.pan (repeatable)")
	envFlag(f, "mask", "IDEM_CONSOLE_MASK")
	encryptionFlag(f, &a.keyFile)
	f.BoolVar(&o.insecure, "insecure-no-auth", false, "serve without authentication (everyone is admin); only on a loopback --listen")
	f.StringSliceVar(&o.topics, "topics", nil, "dead-letter topics to index (default: every topic matching --topic-pattern)")
	f.StringVar(&o.pattern, "topic-pattern", `\.dlq$`, "regular expression of the dead-letter topics to index when --topics is not given")
	f.DurationVar(&o.refresh, "topic-refresh", 30*time.Second, "how often the indexer looks for new topics matching --topic-pattern")
	f.StringVar(&o.group, "indexer-group", "idem-console-indexer", "consumer group the indexer reads with")
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
func (a *app) consoleTokens(o consoleOptions) ([]console.Token, error) {
	if o.tokensFile != "" {
		return console.LoadTokens(o.tokensFile)
	}
	if v := a.env(consoleTokensEnv); v != "" {
		ts, err := console.TokensFromEnv(v)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", consoleTokensEnv, err)
		}
		return ts, nil
	}
	return nil, nil
}

func (a *app) runConsole(ctx context.Context, o consoleOptions) error {
	tokens, err := a.consoleTokens(o)
	if err != nil {
		return err
	}
	switch {
	case o.insecure && !isLoopback(o.listen):
		return fmt.Errorf("--insecure-no-auth serves without authentication, so it needs a loopback --listen (127.0.0.1:PORT, [::1]:PORT or localhost:PORT), not %q", o.listen)
	case o.insecure && len(tokens) > 0:
		return errors.New("--insecure-no-auth and tokens contradict each other: drop one")
	case !o.insecure && len(tokens) == 0:
		return fmt.Errorf("no tokens: give --tokens-file or %s (or, on a loopback --listen, --insecure-no-auth)", consoleTokensEnv)
	}
	var pattern *regexp.Regexp
	if len(o.topics) == 0 {
		if pattern, err = regexp.Compile(o.pattern); err != nil {
			return fmt.Errorf("--topic-pattern: %w", err)
		}
	}
	pool, err := openPool(ctx, o.url)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := indextable.Migrate(ctx, pool); err != nil {
		return fmt.Errorf("migrate the index: %w", err)
	}
	if err := seal.Migrate(ctx, pool); err != nil {
		return fmt.Errorf("migrate the index: %w", err)
	}
	scfg, brokers, err := a.saramaConfig()
	if err != nil {
		return err
	}
	scfg.ClientID = "idem-console"
	scfg.Metadata.Retry.Max = 3
	client, err := sarama.NewClient(brokers, index.ProducerConfig(scfg))
	if err != nil {
		return fmt.Errorf("kafka: %w", err)
	}
	defer client.Close()
	logger := slog.New(slog.NewTextHandler(a.errOut, nil))
	// The console and the indexer register their gauges on reg through
	// their Registerer fields and share them: nothing else registers.
	reg := prometheus.NewRegistry()
	ccfg := console.Config{
		Pool: pool, Client: client,
		Tokens: tokens, InsecureNoAuth: o.insecure, Mask: o.mask, Logger: logger, Registerer: reg,
	}
	ccfg.EncryptionKeyFile, ccfg.EncryptionKey = a.kekText(a.keyFile)
	h, err := console.New(ccfg)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelWarn)}
	auth := "log in with a token"
	if o.insecure {
		auth = "NO AUTHENTICATION (--insecure-no-auth)"
	}
	fmt.Fprintf(a.out, "idem console: http://%s/ (%s)\n", ln.Addr(), auth)

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
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		errs[2] = err
	}
	cancel()
	wg.Wait()
	return errors.Join(errs...)
}
