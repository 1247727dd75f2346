package idemtest_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/retrytopic"
)

func TestExampleConnect(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("needs PostgreSQL (DATABASE_URL)")
	}
	testShipments(t)
}

// fatalRecorder is a testing.TB whose Fatal ends only the goroutine that
// called it, keeping the message, so a test can check that a helper fails.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (r *fatalRecorder) Helper() {}
func (r *fatalRecorder) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// fatalOf runs f with a fatalRecorder and returns what it failed with, or "".
func fatalOf(t *testing.T, f func(tb testing.TB)) string {
	r := &fatalRecorder{TB: t}
	done := make(chan struct{})
	go func() { defer close(done); f(r) }()
	<-done
	return r.msg
}

// Connect picks the broker by environment: KAFKA_BROKERS when set, else the
// in-process cluster, which IDEM_REQUIRE_REAL_KAFKA=1 forbids.
func TestConnectChoosesByEnvironment(t *testing.T) {
	t.Run("KAFKA_BROKERS", func(t *testing.T) {
		t.Setenv("KAFKA_BROKERS", " 127.0.0.1:1 , 127.0.0.1:2,")
		if k := idemtest.Connect(t); strings.Join(k.Brokers, ",") != "127.0.0.1:1,127.0.0.1:2" {
			t.Fatalf("brokers %v, want the two of KAFKA_BROKERS", k.Brokers)
		}
	})
	t.Run("in-process", func(t *testing.T) {
		t.Setenv("KAFKA_BROKERS", "")
		t.Setenv("IDEM_REQUIRE_REAL_KAFKA", "")
		k := idemtest.Connect(t)
		k.CreateTopic(t, "probe", 1) // answers: an in-process cluster was started
	})
	t.Run("real required", func(t *testing.T) {
		t.Setenv("KAFKA_BROKERS", "")
		t.Setenv("IDEM_REQUIRE_REAL_KAFKA", "1")
		msg := fatalOf(t, func(tb testing.TB) { idemtest.Connect(tb) })
		if !strings.Contains(msg, "IDEM_REQUIRE_REAL_KAFKA=1") || !strings.Contains(msg, "KAFKA_BROKERS") {
			t.Fatalf("Connect failed with %q, want an error naming IDEM_REQUIRE_REAL_KAFKA=1 and KAFKA_BROKERS", msg)
		}
	})
}

// On the broker Connect gives (the real one when KAFKA_BROKERS is set), a
// test's topic and group names are its own, and when the test ends its topic
// is deleted with the retry tier and dead-letter topic Run created for it.
func TestTopicIsUniqueAndCleanedUp(t *testing.T) {
	t.Parallel()
	k := idemtest.Connect(t)
	var topic string
	t.Run("test", func(t *testing.T) {
		topic = k.Topic(t, "Pay/ments", 1)
		group := k.Group(t, "billing")
		if other := k.Topic(t, "Pay/ments", 1); other == topic || !strings.HasPrefix(topic, "pay_ments_") || !strings.HasPrefix(group, "billing_") {
			t.Fatalf("names %q, %q and group %q: want unique names with the prefix made a name", topic, other, group)
		}
		k.Produce(t, topic, idemtest.Record{IdempotencyKey: "p-1", Value: []byte("{}")})
		cfg := k.Config(t, group, topic)
		cfg.Retry.Attempts = 2 // then the retry tier, then the DLQ
		cfg.Retry.Tiers = retrytopic.Policy{Delays: []time.Duration{10 * time.Millisecond}}
		c := idemtest.Start(t, cfg, handler.Func(func(ctx context.Context, m *handler.Message) error {
			return fmt.Errorf("bank down")
		}))
		c.WaitOutcome(t, "dead_lettered", 1)
		if dl := k.ReadDLQ(t, retrytopic.Policy{}.DLQ(topic, group), 1); len(dl) != 1 {
			t.Fatalf("%d dead letters, want 1", len(dl))
		}
		if !hasTopic(t, k, topic+"."+group+".retry.1") {
			t.Fatalf("no retry tier %s.%s.retry.1 while the test runs", topic, group)
		}
	})
	idemtest.Eventually(t, 30*time.Second, func() error {
		admin, err := sarama.NewClusterAdmin(k.Brokers, k.SaramaConfig())
		if err != nil {
			return err
		}
		defer admin.Close()
		all, err := admin.ListTopics()
		if err != nil {
			return err
		}
		for name := range all {
			if strings.HasPrefix(name, topic) {
				return fmt.Errorf("topic %s left after the test", name)
			}
		}
		return nil
	})
}

func hasTopic(t *testing.T, k *idemtest.Kafka, name string) bool {
	admin, err := sarama.NewClusterAdmin(k.Brokers, k.SaramaConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	all, err := admin.ListTopics()
	if err != nil {
		t.Fatal(err)
	}
	_, ok := all[name]
	return ok
}

// ConnectPostgres gives each test a schema of its own with every idem table,
// isolated from the others', reachable through Pool and URL, and drops it
// when the test ends.
func TestConnectPostgresIsolatesAndDrops(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("needs PostgreSQL (DATABASE_URL)")
	}
	if os.Getenv("DATABASE_URL") == "" {
		t.Fatal("DATABASE_URL is not set: run `make services` and export .state/services.env")
	}
	ctx := context.Background()
	var schemas []string
	t.Run("test", func(t *testing.T) {
		a, b := idemtest.ConnectPostgres(t), idemtest.ConnectPostgres(t)
		schemas = []string{a.Schema, b.Schema}
		if a.Schema == b.Schema || !strings.HasPrefix(a.Schema, "testconnectpostgresisolatesanddrops_test_") {
			t.Fatalf("schemas %q and %q: want two, named after the test", a.Schema, b.Schema)
		}
		for _, table := range []string{"idem_processed", "idem_ordering_heads", "idem_ordering_parked", "idem_outbox",
			"idem_saga", "idem_saga_step", "idem_checkpoint", "idem_dlq_records", "idem_dlq_groups", "idem_dlq_versions", "idem_dlq_audit"} {
			var found bool
			if err := a.Pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, a.Schema+"."+table).Scan(&found); err != nil || !found {
				t.Errorf("table %s.%s: found %v, err %v", a.Schema, table, found, err)
			}
		}
		if n := a.Pool.Config().MaxConns; n != 16 {
			t.Errorf("pool of %d connections, want the default 16", n)
		}
		if _, err := a.Pool.Exec(ctx, `INSERT INTO idem_processed (consumer_group, idempotency_key) VALUES ('g', 'k')`); err != nil {
			t.Fatal(err)
		}
		var n int
		if err := b.Pool.QueryRow(ctx, `SELECT count(*) FROM idem_processed`).Scan(&n); err != nil || n != 0 {
			t.Fatalf("the other test's schema has %d inbox rows (err %v), want 0", n, err)
		}
		conn, err := pgx.Connect(ctx, a.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM idem_processed`).Scan(&n); err != nil || n != 1 {
			t.Fatalf("a connection from URL sees %d inbox rows (err %v), want 1", n, err)
		}
	})
	conn, err := pgx.Connect(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var left int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_namespace WHERE nspname = ANY($1)`, schemas).Scan(&left); err != nil || left != 0 {
		t.Fatalf("%d of the schemas %v left after the test (err %v)", left, schemas, err)
	}
}

func TestConnectPostgresNeedsDatabaseURL(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	if msg := fatalOf(t, func(tb testing.TB) { idemtest.ConnectPostgres(tb) }); !strings.Contains(msg, "DATABASE_URL is not set") {
		t.Fatalf("ConnectPostgres failed with %q, want an error naming DATABASE_URL", msg)
	}
}

// pool_max_conns in DATABASE_URL sizes the pool.
func TestConnectPostgresPoolSize(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL (DATABASE_URL)")
	}
	base := os.Getenv("DATABASE_URL")
	if base == "" {
		t.Fatal("DATABASE_URL is not set: run `make services` and export .state/services.env")
	}
	sep := "?"
	if strings.Contains(base, "?") {
		sep = "&"
	}
	t.Setenv("DATABASE_URL", base+sep+"pool_max_conns=3")
	if n := idemtest.ConnectPostgres(t).Pool.Config().MaxConns; n != 3 {
		t.Fatalf("pool of %d connections, want pool_max_conns=3", n)
	}
}
