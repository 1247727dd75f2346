package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/configerr"
	"github.com/idemhq/idem/internal/testing/testenv"
	"github.com/idemhq/idem/retrytopic"
)

func coreValidConfig() consumer.Config {
	return consumer.Config{
		Brokers: []string{"127.0.0.1:9092"},
		Group:   "g",
		Topics:  []string{"t"},
		Dedupe:  dedupe.NewMemory(),
	}
}

// coreConfigFields returns the field, without "Config.", of every problem of
// the Config in err's tree (each a *configerr.Error matching
// consumer.ErrInvalidConfig).
func coreConfigFields(err error) []string {
	var out []string
	var walk func(error)
	walk = func(err error) {
		if err == nil {
			return
		}
		if ce, ok := err.(*configerr.Error); ok && ce.Sentinel == consumer.ErrInvalidConfig {
			out = append(out, strings.TrimPrefix(ce.Field, "Config."))
			return
		}
		switch u := err.(type) {
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				walk(e)
			}
		case interface{ Unwrap() error }:
			walk(u.Unwrap())
		}
	}
	walk(err)
	return out
}

func TestRunRejectsInvalidConfig(t *testing.T) {
	t.Parallel()
	if err := coreValidConfig().Validate(); err != nil {
		t.Fatalf("valid config: Validate = %v", err)
	}
	long := 2 * time.Minute // longer than sarama's default rebalance timeout (60s)
	cases := []struct {
		name   string
		mutate func(c *consumer.Config)
		fields []string // every field named, in order
	}{
		{"no brokers", func(c *consumer.Config) { c.Brokers = nil }, []string{"Brokers"}},
		{"broker without port", func(c *consumer.Config) { c.Brokers = []string{"localhost"} }, []string{"Brokers"}},
		{"blank broker", func(c *consumer.Config) { c.Brokers = []string{" "} }, []string{"Brokers"}},
		{"no group", func(c *consumer.Config) { c.Group = "" }, []string{"Group"}},
		{"blank group", func(c *consumer.Config) { c.Group = "  " }, []string{"Group"}},
		{"no topics", func(c *consumer.Config) { c.Topics = nil }, []string{"Topics"}},
		{"empty topic", func(c *consumer.Config) { c.Topics = []string{""} }, []string{"Topics"}},
		{"topic twice", func(c *consumer.Config) { c.Topics = []string{"t", "t"} }, []string{"Topics"}},
		{"no dedupe", func(c *consumer.Config) { c.Dedupe = nil }, []string{"Dedupe"}},
		{"negative MaxKeyLength", func(c *consumer.Config) { c.MaxKeyLength = -1 }, []string{"MaxKeyLength"}},
		{"unknown MissingKey", func(c *consumer.Config) { c.MissingKey = consumer.MissingKeyPolicy(9) }, []string{"MissingKey"}},
		{"negative ShutdownGrace", func(c *consumer.Config) { c.ShutdownGrace = -time.Second }, []string{"ShutdownGrace"}},
		{"ShutdownGrace above rebalance timeout", func(c *consumer.Config) { c.ShutdownGrace = long }, []string{"ShutdownGrace"}},
		{"negative CommitInterval", func(c *consumer.Config) { c.CommitInterval = -time.Second }, []string{"CommitInterval"}},
		{"negative OutageBackoff", func(c *consumer.Config) { c.OutageBackoff = -time.Second }, []string{"OutageBackoff"}},
		{"non-positive retry delay", func(c *consumer.Config) { c.Retry.Tiers = retrytopic.Policy{Delays: []time.Duration{time.Second, 0}} }, []string{"Retry.Tiers"}},
		{"negative Backoff.Base", func(c *consumer.Config) { c.Retry.Backoff.Base = -time.Millisecond }, []string{"Retry.Backoff.Base"}},
		{"Backoff.Max below Backoff.Base", func(c *consumer.Config) { c.Retry.Backoff.Base, c.Retry.Backoff.Max = time.Second, time.Millisecond }, []string{"Retry.Backoff.Max"}},
		{"two problems", func(c *consumer.Config) { c.Group, c.Dedupe = "", nil }, []string{"Group", "Dedupe"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := coreValidConfig()
			tc.mutate(&cfg)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			h := handler.Func(func(context.Context, *handler.Message) error { return nil })
			err := consumer.Run(ctx, cfg, h)
			if !errors.Is(err, consumer.ErrInvalidConfig) {
				t.Fatalf("Run = %v, want an error wrapping ErrInvalidConfig", err)
			}
			if len(coreConfigFields(err)) == 0 {
				t.Fatalf("Run = %v: no problem of the Config in it", err)
			}
			if got := coreConfigFields(err); fmt.Sprint(got) != fmt.Sprint(tc.fields) {
				t.Errorf("fields named = %v, want %v (err: %v)", got, tc.fields, err)
			}
			for _, f := range tc.fields {
				if !strings.Contains(err.Error(), "Config."+f) {
					t.Errorf("error %q does not name Config.%s", err, f)
				}
			}
			if verr := cfg.Validate(); verr == nil || verr.Error() != err.Error() {
				t.Errorf("Validate = %v, Run = %v: want the same error", verr, err)
			}
		})
	}
}

func TestRunNilHandler(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := consumer.Run(ctx, coreValidConfig(), nil); !errors.Is(err, consumer.ErrInvalidConfig) || !strings.Contains(err.Error(), "handler") {
		t.Fatalf("Run(nil handler) = %v, want ErrInvalidConfig naming the handler", err)
	}
	// A nil func in the Func adapter is a nil handler too: accepted, it would
	// panic on every message and dead-letter the whole stream (kind "panic").
	// (No broker listens on port 1: Run must refuse before connecting.)
	var nilFunc handler.Func
	cfg := coreValidConfig()
	cfg.Brokers = []string{"127.0.0.1:1"}
	if err := consumer.Run(ctx, cfg, nilFunc); !errors.Is(err, consumer.ErrInvalidConfig) || !strings.Contains(err.Error(), "handler") {
		t.Errorf("Run(handler.Func(nil)) = %v, want ErrInvalidConfig naming the handler", err)
	}
}

func TestRunUnknownTopic(t *testing.T) {
	t.Parallel()
	k := testenv.NewKafka(t)
	missing := testenv.Unique("t_missing")
	group := testenv.Group(t)
	t.Cleanup(func() {
		// In case the broker auto-created it; and idem's DLQ must not exist either.
		k.DeleteTopics(t, missing, missing+"."+group+".dlq")
	})
	cfg := consumer.Config{
		Brokers: k.Brokers, Group: group, Topics: []string{missing},
		Dedupe: dedupe.NewMemory(), Sarama: k.SaramaConfig(),
		Logger: slog.New(slog.NewTextHandler(testWriter{t}, nil)),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err := consumer.Run(ctx, cfg, handler.Func(func(context.Context, *handler.Message) error { return nil }))
	if !errors.Is(err, consumer.ErrUnknownTopic) {
		t.Fatalf("Run = %v, want an error wrapping ErrUnknownTopic", err)
	}
	if !strings.Contains(err.Error(), missing) {
		t.Errorf("error %q does not name the topic %q", err, missing)
	}
	// Run must not have created the topic (through metadata auto-creation).
	ts, terr := k.Admin(t).ListTopics()
	if terr != nil {
		t.Fatal(terr)
	}
	for tn := range ts {
		if tn == missing || strings.HasPrefix(tn, missing+".") {
			t.Errorf("Run created topic %q; source topics must never be auto-created", tn)
		}
	}
}

// Issue 18 #14: a dedupe store whose configuration is wrong (here an empty
// inbox table name) fails every unit of work the same way for ever: Run
// returns that error instead of retrying it as an outage.
func TestStoreConfigErrorStopsRun(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	cfg := e.config()
	cfg.Dedupe = dedupe.NewPostgres(e.pool, dedupe.WithTable(""))
	e.sendAll("K", "A")
	done := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { done <- consumer.Run(ctx, cfg, handler.Func(apply)) }()
	select {
	case err := <-done:
		var se *dedupe.StoreError
		if !errors.As(err, &se) || se.Op != "config" {
			t.Fatalf("Run returned %v, want the store's config error", err)
		}
	case <-time.After(60 * time.Second):
		cancel()
		<-done
		t.Fatal("Run kept retrying a store configuration error as an outage")
	}
}
