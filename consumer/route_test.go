package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/testing/testenv"
	"github.com/idemhq/idem/recovery"
	"github.com/idemhq/idem/retrytopic"
)

// typed is one record of the route tests: its Kafka key, idempotency key,
// CloudEvents type (ce_type) and partition.
type typed struct {
	key, ikey, typ string
	partition      int32
}

// produceTyped sends recs to topic, each with its idempotency-key and
// ce_type headers, its value the idempotency key.
func (e *env) produceTyped(topic string, recs ...typed) {
	e.t.Helper()
	p := e.k.Producer(e.t)
	msgs := make([]*sarama.ProducerMessage, len(recs))
	for i, r := range recs {
		hs := []sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte(r.ikey)}}
		if r.typ != "" {
			hs = append(hs, sarama.RecordHeader{Key: []byte("ce_type"), Value: []byte(r.typ)})
		}
		msgs[i] = &sarama.ProducerMessage{Topic: topic, Partition: r.partition, Key: sarama.StringEncoder(r.key),
			Value: sarama.StringEncoder(r.ikey), Headers: hs}
	}
	if err := p.SendMessages(msgs); err != nil {
		e.t.Fatal(err)
	}
}

// seen records which handler saw which idempotency key, at which attempts.
type seen struct {
	mu sync.Mutex
	by map[string]map[string][]int // handler → key → attempts
}

func (s *seen) add(h string, m *handler.Message) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.by == nil {
		s.by = map[string]map[string][]int{}
	}
	if s.by[h] == nil {
		s.by[h] = map[string][]int{}
	}
	s.by[h][m.IdempotencyKey] = append(s.by[h][m.IdempotencyKey], m.Attempt)
	return len(s.by[h][m.IdempotencyKey])
}

// keys returns the keys handler h saw, sorted.
func (s *seen) keys(h string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for k := range s.by[h] {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func (s *seen) attempts(h, key string) []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.by[h][key])
}

// deleteAfter deletes topics when the test ends.
func (e *env) deleteAfter(topics ...string) {
	e.t.Cleanup(func() { e.k.DeleteTopics(e.t, topics...) })
}

// routeKeys returns the idempotency keys of the records of topic (every
// partition of partitions, n in all), sorted.
func (e *env) routeKeys(topic string, partitions int32, n int) []string {
	e.t.Helper()
	var out []string
	testenv.Eventually(e.t, time.Minute, func() error {
		if got := e.total(topic, partitions); got < int64(n) {
			return fmt.Errorf("%s has %d records, want %d", topic, got, n)
		}
		return nil
	})
	for p := range partitions {
		if end := e.endOffsets(topic, partitions)[p]; end > 0 {
			for _, m := range e.coreReadRecords(topic, p, int(end), 30*time.Second) {
				out = append(out, header(m, "idempotency-key"))
			}
		}
	}
	slices.Sort(out)
	return out
}

var errFraud = errors.New("fraud suspected")

// Three routes on two topics, with different rules and tiers, beside Run's
// handler as the default route: each message is handled by its route's
// handler only (by topic and by ce_type), with its route's attempts;
// failures go to that route's own tiers and dead-letter topics (a tier
// record comes back to its route), or to a rule's; and the metrics carry
// the route.
func TestRoutesThreeRoutes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	ship := e.k.Topic(t, 2)
	g := e.group
	placedTier, refundTier1, refundTier2 := e.topic+"."+g+".placed.retry.1", e.topic+"."+g+".refund.retry.1", e.topic+"."+g+".refund.retry.2"
	refundDLQ, fraudDLQ, shipDLQ := e.topic+"."+g+".refund.dlq", e.topic+"."+g+".fraud", ship+"."+g+".dlq"
	e.deleteAfter(placedTier, e.topic+"."+g+".placed.dlq", refundTier1, refundTier2, refundDLQ, fraudDLQ, shipDLQ)
	var s seen
	fast := recovery.Backoff{Base: time.Millisecond, Max: 5 * time.Millisecond}
	cfg := e.config()
	cfg.Topics = []string{e.topic, ship}
	cfg.TypeHeader = "ce_type"
	cfg.Retry = consumer.RetryConfig{Attempts: 1} // the default route's: no tiers
	cfg.Routes = []consumer.Route{{
		Name: "placed", Topics: []string{e.topic}, Types: []string{"order.placed"}, OwnTopics: true,
		Retry: &consumer.RetryConfig{Attempts: 1, Tiers: retrytopic.Policy{Delays: []time.Duration{300 * time.Millisecond}}},
		Handler: handler.Func(func(ctx context.Context, m *handler.Message) error {
			if s.add("placed", m) == 1 && strings.HasSuffix(m.IdempotencyKey, "-r") {
				return errors.New("fails once")
			}
			return effectHandler()(ctx, m)
		}),
	}, {
		Name: "refund", Topics: []string{e.topic}, Types: []string{"refund.issued"}, OwnTopics: true,
		Retry: &consumer.RetryConfig{Attempts: 2, Backoff: fast, Tiers: retrytopic.Policy{Delays: []time.Duration{200 * time.Millisecond, 200 * time.Millisecond}},
			Rules: []recovery.Rule{{Name: "fraud", Match: recovery.Is(errFraud), DLQ: fraudDLQ}}},
		Handler: handler.Func(func(ctx context.Context, m *handler.Message) error {
			s.add("refund", m)
			switch {
			case strings.HasSuffix(m.IdempotencyKey, "-x"):
				return errors.New("always fails")
			case strings.HasSuffix(m.IdempotencyKey, "-f"):
				return handler.Permanent(errFraud)
			}
			return effectHandler()(ctx, m)
		}),
	}, {
		Name: "ship", Topics: []string{ship}, Retry: &consumer.RetryConfig{Attempts: 3, Backoff: fast},
		Handler: handler.Func(func(ctx context.Context, m *handler.Message) error {
			s.add("ship", m)
			if strings.HasSuffix(m.IdempotencyKey, "-p") {
				return errors.New("never ships")
			}
			return effectHandler()(ctx, m)
		}),
	}}
	start(t, cfg, handler.Func(func(ctx context.Context, m *handler.Message) error {
		s.add("default", m)
		return effectHandler()(ctx, m)
	}))
	e.produceTyped(e.topic,
		typed{"o1", "placed-1", "order.placed", 0}, typed{"o2", "placed-2-r", "order.placed", 1},
		typed{"o3", "refund-1", "refund.issued", 0}, typed{"o4", "refund-2-x", "refund.issued", 1}, typed{"o5", "refund-3-f", "refund.issued", 0},
		typed{"o6", "cancel-1", "order.cancelled", 1}, typed{"o7", "untyped-1", "", 0})
	e.produceTyped(ship, typed{"o1", "ship-1", "order.shipped", 0}, typed{"o2", "ship-2-p", "", 1})

	want := map[string][]string{
		"placed":  {"placed-1", "placed-2-r"},
		"refund":  {"refund-1", "refund-2-x", "refund-3-f"},
		"ship":    {"ship-1", "ship-2-p"},
		"default": {"cancel-1", "untyped-1"},
	}
	e.coreWaitEffects(6, time.Minute)
	testenv.Eventually(t, time.Minute, func() error {
		for h, keys := range want {
			if got := s.keys(h); !slices.Equal(got, keys) {
				return fmt.Errorf("handler %s saw %v, want %v", h, got, keys)
			}
		}
		if got := s.attempts("refund", "refund-2-x"); len(got) != 6 {
			return fmt.Errorf("refund-2-x handled at attempts %v, want 6 (2 a delivery, 2 tiers)", got)
		}
		return nil
	})
	for h, want := range map[[2]string][]int{
		{"placed", "placed-2-r"}: {1, 2},             // one attempt, then its tier
		{"refund", "refund-2-x"}: {1, 2, 3, 4, 5, 6}, // 2 attempts a delivery, 2 tiers
		{"refund", "refund-3-f"}: {1},                // permanent: the rule's DLQ at once
		{"ship", "ship-2-p"}:     {1, 2, 3},          // 3 attempts, no tiers
	} {
		if got := s.attempts(h[0], h[1]); !slices.Equal(got, want) {
			t.Errorf("%s handled %s at attempts %v, want %v", h[0], h[1], got, want)
		}
	}
	for topic, keys := range map[string][]string{
		placedTier:  {"placed-2-r"},
		refundTier1: {"refund-2-x"},
		refundTier2: {"refund-2-x"},
		refundDLQ:   {"refund-2-x"},
		fraudDLQ:    {"refund-3-f"},
		shipDLQ:     {"ship-2-p"},
	} {
		if got := e.routeKeys(topic, 2, len(keys)); !slices.Equal(got, keys) {
			t.Errorf("%s holds %v, want %v", topic, got, keys)
		}
	}
	if n := e.total(e.dlq(), 2); n != 0 {
		t.Errorf("the default dead-letter topic holds %d records, want none", n)
	}
	e.coreAssertOnePerKey(6)
	for route, n := range map[string]float64{"placed": 2, "refund": 1, "ship": 1, "default": 2} {
		if got := metricValue(t, e, "idem_messages_total", map[string]string{"route": route, "outcome": "processed"}); got != n {
			t.Errorf("idem_messages_total{route=%q,outcome=processed} = %v, want %v", route, got, n)
		}
	}
	if got := metricValue(t, e, "idem_messages_total", map[string]string{"route": "refund", "outcome": "dead_lettered"}); got != 2 {
		t.Errorf("refund's dead letters = %v, want 2", got)
	}
	if got := metricValue(t, e, "idem_handler_attempts_total", map[string]string{"route": "ship", "result": "error"}); got != 3 {
		t.Errorf("ship's failed attempts = %v, want 3", got)
	}
}

// A type no route takes, without a default route (Run is given no
// handler), under each Config.Unmatched policy: dead-lettered with kind
// permanent and its type in idem-error, or skipped without an inbox row;
// counted either way, and the partition flows.
func TestRoutesUnmatched(t *testing.T) {
	t.Parallel()
	for _, policy := range []consumer.UnmatchedPolicy{consumer.UnmatchedDeadLetter, consumer.UnmatchedSkip} {
		t.Run(policy.String(), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 1)
			cfg := e.config()
			cfg.TypeHeader = "ce_type"
			cfg.Unmatched = policy
			cfg.Routes = []consumer.Route{{Name: "placed", Types: []string{"order.placed"}, Handler: effectHandler()}}
			start(t, cfg, nil)
			e.produceTyped(e.topic, typed{"a", "k-1", "order.placed", 0}, typed{"b", "k-2", "order.refunded", 0},
				typed{"c", "k-3", "", 0}, typed{"d", "k-4", "order.placed", 0})
			e.waitCommitted(e.topic, 1, time.Minute)
			e.coreAssertOnePerKey(2)
			action := "skipped"
			if policy == consumer.UnmatchedDeadLetter {
				action = "dead_lettered"
				recs := e.coreReadRecords(e.dlq(), 0, 2, 30*time.Second)
				for i, want := range []string{"k-2", "k-3"} {
					if k := header(recs[i], "idempotency-key"); k != want || header(recs[i], "idem-error-kind") != "permanent" ||
						!strings.Contains(header(recs[i], "idem-error"), "no route takes the message") {
						t.Errorf("dead letter %d: key %s, kind %q, error %q; want %s, permanent, no route", i, k,
							header(recs[i], "idem-error-kind"), header(recs[i], "idem-error"), want)
					}
				}
				if !strings.Contains(header(recs[0], "idem-error"), `"order.refunded"`) {
					t.Errorf("the dead letter's error does not name its type: %s", header(recs[0], "idem-error"))
				}
			} else if n := e.total(e.dlq(), 1); n != 0 {
				t.Errorf("skip dead-lettered %d records", n)
			}
			if got := metricValue(t, e, "idem_unmatched_total", map[string]string{"action": action}); got != 2 {
				t.Errorf("idem_unmatched_total{action=%q} = %v, want 2", action, got)
			}
		})
	}
}

// Config.Filter skips messages before the inbox, counted per reason: no
// inbox row, no handler call; the others are handled.
func TestRoutesFilter(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	cfg := e.config()
	cfg.Filter = func(m *handler.Message) string {
		switch v, _ := m.Header("ce_type"); string(v) {
		case "heartbeat":
			return "heartbeat"
		case "test":
			return "test-event"
		}
		return ""
	}
	var s seen
	start(t, cfg, handler.Func(func(ctx context.Context, m *handler.Message) error {
		s.add("h", m)
		return effectHandler()(ctx, m)
	}))
	e.produceTyped(e.topic, typed{"a", "k-1", "order", 0}, typed{"b", "k-2", "heartbeat", 0}, typed{"c", "k-3", "test", 0},
		typed{"d", "k-4", "heartbeat", 0}, typed{"e", "k-5", "order", 0})
	e.waitCommitted(e.topic, 1, time.Minute)
	e.coreAssertOnePerKey(2)
	if got := s.keys("h"); !slices.Equal(got, []string{"k-1", "k-5"}) {
		t.Errorf("handled %v, want k-1 and k-5", got)
	}
	for reason, n := range map[string]float64{"heartbeat": 2, "test-event": 1} {
		if got := metricValue(t, e, "idem_filtered_total", map[string]string{"reason": reason}); got != n {
			t.Errorf("idem_filtered_total{reason=%q} = %v, want %v", reason, got, n)
		}
	}
	if got := metricValue(t, e, "idem_messages_total", map[string]string{"outcome": "skipped"}); got != 3 {
		t.Errorf("skipped = %v, want 3", got)
	}
}

// Routes in every pipeline mode: batches (a batch is of one route: a batch
// handler's route and a per-message one's, with their own batch sizes),
// lanes, Ordering ByKey and Transactions. Each message is handled once by
// its route's handler, a failing one goes to its route's tier and comes
// back, and with Ordering a key's messages keep their order across the
// routes of the topic (the second waits, parked, while the first is in its
// route's tier).
func TestRoutesModes(t *testing.T) {
	t.Parallel()
	forEachMode(t, append(slices.Clone(allModes), "txn", "txn-lanes", "ordering", "ordering-txn"), func(t *testing.T, mode testMode) {
		ordered := strings.HasPrefix(string(mode), "ordering")
		e := newEnv(t, 2)
		if !ordered {
			e = e.in(mode)
		}
		bTier := e.topic + "." + e.group + ".bulk.retry.1"
		e.deleteAfter(bTier, e.topic+"."+e.group+".bulk.dlq")
		cfg := e.config()
		if ordered {
			_, cfg = orderedEnvOn(t, e, 300*time.Millisecond)
			cfg.Transactions.Enabled = mode == "ordering-txn"
		}
		cfg.TypeHeader = "ce_type"
		var s seen
		var mu sync.Mutex
		var order []string // the keys applied, in order
		applied := func(ctx context.Context, m *handler.Message) error {
			if err := effectHandler()(ctx, m); err != nil {
				return err
			}
			mu.Lock()
			order = append(order, m.IdempotencyKey)
			mu.Unlock()
			return nil
		}
		bulk := 16
		if cfg.Batch.MaxMessages > 1 {
			bulk = cfg.Batch.MaxMessages
		}
		cfg.Routes = []consumer.Route{{
			Name: "bulk", Types: []string{"bulk"}, OwnTopics: true, Batch: &consumer.BatchConfig{MaxMessages: bulk},
			Retry: &consumer.RetryConfig{Attempts: 1, Tiers: retrytopic.Policy{Delays: []time.Duration{300 * time.Millisecond}}},
			Handler: handler.Batch(func(ctx context.Context, msgs []*handler.Message) error {
				var failed handler.BatchError
				for _, m := range msgs {
					if s.add("bulk", m) == 1 && strings.HasSuffix(m.IdempotencyKey, "-r") {
						failed.Add(m, errors.New("fails once"))
						continue
					}
					if err := applied(ctx, m); err != nil {
						return err
					}
				}
				if len(failed.Failed) > 0 {
					return &failed
				}
				return nil
			}),
		}, {
			Name: "single", Types: []string{"single"},
			Handler: handler.Func(func(ctx context.Context, m *handler.Message) error {
				s.add("single", m)
				return applied(ctx, m)
			}),
		}}
		if ordered {
			cfg.Routes[0].Batch = nil // Ordering handles one message a transaction
		}
		start(t, cfg, nil)
		var recs []typed
		var wantBulk, wantSingle []string
		for i := range 40 {
			typ, k := "bulk", fmt.Sprintf("b-%02d", i)
			if i%3 == 0 {
				typ, k = "single", fmt.Sprintf("s-%02d", i)
			}
			if i%10 == 4 {
				k += "-r"
			}
			if typ == "bulk" {
				wantBulk = append(wantBulk, k)
			} else {
				wantSingle = append(wantSingle, k)
			}
			recs = append(recs, typed{fmt.Sprintf("kafka-%02d", i), k, typ, int32(i % 2)})
		}
		// One Kafka key across both routes: its bulk message fails once and
		// waits in bulk's tier; with Ordering its single message follows it.
		recs = append(recs, typed{"K", "first-r", "bulk", 0}, typed{"K", "then", "single", 0})
		wantBulk, wantSingle = append(wantBulk, "first-r"), append(wantSingle, "then")
		slices.Sort(wantBulk)
		slices.Sort(wantSingle)
		e.produceTyped(e.topic, recs...)
		e.coreWaitEffects(len(recs), 2*time.Minute)
		e.coreAssertOnePerKey(len(recs))
		if got := s.keys("bulk"); !slices.Equal(got, wantBulk) {
			t.Errorf("bulk saw %v, want %v", got, wantBulk)
		}
		if got := s.keys("single"); !slices.Equal(got, wantSingle) {
			t.Errorf("single saw %v, want %v", got, wantSingle)
		}
		if got := s.attempts("bulk", "first-r"); !slices.Equal(got, []int{1, 2}) {
			t.Errorf("first-r handled at attempts %v, want [1 2]: once, then from bulk's tier", got)
		}
		retried := 0
		for _, k := range wantBulk {
			if strings.HasSuffix(k, "-r") {
				retried++
			}
		}
		if n := metricValue(t, e, "idem_forwarded_total", map[string]string{"destination": bTier}); n != float64(retried) {
			t.Errorf("%v records forwarded to bulk's tier, want %d", n, retried)
		}
		if ordered {
			mu.Lock()
			i, j := slices.Index(order, "first-r"), slices.Index(order, "then")
			mu.Unlock()
			if i < 0 || j < i {
				t.Errorf("Ordering ByKey: %q applied at %d, %q at %d: want the same Kafka key in order across routes", "first-r", i, "then", j)
			}
		}
	})
}

// orderedEnvOn configures e for Ordering ByKey, as orderedEnv does for a
// new env.
func orderedEnvOn(t *testing.T, e *env, delay time.Duration) (*env, consumer.Config) {
	t.Helper()
	cfg := e.config()
	cfg.Ordering = consumer.ByKey(e.pool)
	cfg.Retry.Attempts = 1
	cfg.Retry.Tiers = retrytopic.Policy{Delays: []time.Duration{delay}}
	return e, cfg
}

// Validate names the route and the field of every problem of Routes.
func TestRoutesValidate(t *testing.T) {
	t.Parallel()
	h := handler.Func(func(context.Context, *handler.Message) error { return nil })
	base := consumer.Config{Brokers: []string{"b:9092"}, Group: "g", Topics: []string{"a", "b"}, Dedupe: dedupe.NewMemory()}
	for _, tt := range []struct {
		name   string
		set    func(c *consumer.Config)
		fields []string
	}{
		{"no name, no handler", func(c *consumer.Config) { c.Routes = []consumer.Route{{}} }, []string{"Config.Routes[0].Name", "Config.Routes[0].Handler"}},
		{"duplicate and reserved names", func(c *consumer.Config) {
			c.Routes = []consumer.Route{{Name: "x", Topics: []string{"a"}, Handler: h}, {Name: "x", Topics: []string{"b"}, Handler: h}, {Name: "default", Topics: []string{"b"}, Types: []string{"t"}, Handler: h}}
			c.TypeOf = consumer.HeaderKey("ce_type")
		}, []string{`Config.Routes["x"].Name`, `Config.Routes["default"].Name`}},
		{"unknown topic", func(c *consumer.Config) { c.Routes = []consumer.Route{{Name: "x", Topics: []string{"c"}, Handler: h}} }, []string{`Config.Routes["x"].Topics`}},
		{"types without TypeOf", func(c *consumer.Config) { c.Routes = []consumer.Route{{Name: "x", Types: []string{"t"}, Handler: h}} }, []string{`Config.Routes["x"].Types`}},
		{"never reached", func(c *consumer.Config) {
			c.Routes = []consumer.Route{{Name: "all", Handler: h}, {Name: "late", Topics: []string{"a"}, Handler: h}}
		}, []string{`Config.Routes["late"]`}},
		{"bad route policies", func(c *consumer.Config) {
			c.Routes = []consumer.Route{{Name: "x", Handler: h, Retry: &consumer.RetryConfig{Attempts: -1}, Batch: &consumer.BatchConfig{MaxMessages: -2},
				Expiry: &consumer.Expiry{MaxAge: -time.Second}}}
		}, []string{`Config.Routes["x"].Retry.Attempts`, `Config.Routes["x"].Batch.MaxMessages`, `Config.Routes["x"].Expiry`}},
		{"one tier topic, two delays", func(c *consumer.Config) {
			c.Retry.Tiers = retrytopic.Policy{Delays: []time.Duration{time.Second}}
			c.Routes = []consumer.Route{{Name: "x", Topics: []string{"a"}, Handler: h, Retry: &consumer.RetryConfig{Tiers: retrytopic.Policy{Delays: []time.Duration{time.Minute}}}}}
		}, []string{"Config.Routes"}},
		{"unknown unmatched policy", func(c *consumer.Config) { c.Unmatched = 7 }, []string{"Config.Unmatched"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := base
			tt.set(&c)
			err := c.Validate()
			if !errors.Is(err, consumer.ErrInvalidConfig) {
				t.Fatalf("Validate() = %v, want ErrInvalidConfig", err)
			}
			for _, f := range tt.fields {
				if !strings.Contains(err.Error(), f+" ") && !strings.Contains(err.Error(), f+":") {
					t.Errorf("the error does not name %s:\n%v", f, err)
				}
			}
		})
	}
	ok := base
	ok.TypeOf = consumer.HeaderKey("ce_type")
	ok.Retry.Tiers = retrytopic.Policy{Delays: []time.Duration{time.Second}}
	ok.Routes = []consumer.Route{{Name: "x", Topics: []string{"a"}, Types: []string{"t"}, Handler: h, OwnTopics: true,
		Retry: &consumer.RetryConfig{Tiers: retrytopic.Policy{Delays: []time.Duration{time.Minute}}}}, {Name: "y", Handler: h}}
	if err := ok.Validate(); err != nil {
		t.Fatalf("a valid Config: %v", err)
	}
}

// A route's own Expiry.OnExpired is the hook an expired message of that
// route owes with Transactions: it runs once the transaction carrying the
// dead letter commits, in the inbox's transaction, and Config.Expiry's
// hook does not run for it (the owed call keeps the route's name).
func TestRoutesOwnOnExpiredWithTransactions(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1).in("txn")
	ctx := testenv.Context(t)
	if _, err := e.pool.Exec(ctx, `CREATE TABLE route_expired(key text, hook text)`); err != nil {
		t.Fatal(err)
	}
	hook := func(name string) func(context.Context, consumer.Expired) error {
		return func(ctx context.Context, x consumer.Expired) error {
			_, err := dedupe.Tx(ctx).Exec(ctx, `INSERT INTO route_expired VALUES ($1, $2)`, x.Message.IdempotencyKey, name)
			return err
		}
	}
	cfg := e.config()
	cfg.Expiry.OnExpired = hook("config")
	cfg.Routes = []consumer.Route{{
		Name: "payments", Topics: []string{e.topic},
		Expiry:  &consumer.Expiry{MaxAge: time.Hour, OnExpired: hook("route")},
		Handler: handler.Func(effectHandler()),
	}}
	start(t, cfg, nil)
	e.produceExpiry(expiryRec{ikey: "old", ts: time.Now().Add(-2 * time.Hour)}, expiryRec{ikey: "ok"})
	e.coreWaitEffects(1, 2*time.Minute)
	testenv.Eventually(t, 60*time.Second, func() error {
		var got string
		if err := e.query.QueryRow(ctx, `SELECT coalesce(string_agg(key || '/' || hook, ','), '') FROM route_expired`).Scan(&got); err != nil {
			return err
		}
		if got != "old/route" {
			return fmt.Errorf("OnExpired calls %q, want %q (the route's hook, once)", got, "old/route")
		}
		return nil
	})
	if kinds := e.dlqKinds(1); kinds["old"] != "expired" {
		t.Errorf("DLQ kinds %v, want old: expired", kinds)
	}
}
