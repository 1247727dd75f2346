package index

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/internal/testenv"
)

// TestIndexerIndexesEveryRecordOnce runs the indexer on real Kafka and
// PostgreSQL: every record is indexed once with its fields (stub flagged,
// value capped), a topic created later is found by the pattern, a repeated
// failure links to the earlier one, and indexers reading again (same group
// after a restart, or a new group from the start) add nothing.
func TestIndexerIndexesEveryRecordOnce(t *testing.T) {
	k := testenv.NewKafka(t)
	pool, _ := newPool(t)
	prefix := testenv.Unique("ix")
	first, second := prefix+".billing.dlq", prefix+"_2.billing.dlq"
	k.CreateTopic(t, first, 3)
	origin := k.Topic(t, 3)
	var ds []dead
	for i := range 18 {
		ds = append(ds, dead{topic: first, partition: int32(i % 3), origin: origin, key: fmt.Sprint("k-", i),
			value: []byte(fmt.Sprintf(`{"n":%d}`, i)), err: fmt.Sprintf("boom %d", i)})
	}
	ds = append(ds, dead{topic: first, partition: 0, origin: origin, key: "big", value: bytes.Repeat([]byte("x"), 1000), err: "too big"},
		dead{topic: first, partition: 1, origin: origin, key: "stub-1", stub: true, err: "too large"})
	produce(t, k, ds...)

	reg := prometheus.NewRegistry()
	group := testenv.Group(t)
	ix := &Indexer{Brokers: k.Brokers, Sarama: k.SaramaConfig(), Pool: pool, Group: group, TopicPattern: regexp.MustCompile("^" + prefix),
		RefreshInterval: 200 * time.Millisecond, MaxValueBytes: 64, Registerer: reg}
	stop := runUntil(t, ix)
	waitCount(t, pool, 20, `SELECT count(*) FROM idem_dlq_records`)

	s := NewStore(pool)
	big := mustList(t, s, Filter{Key: "big"})[0]
	if !big.ValueTruncated || len(big.Value) != 64 || big.ValueSize != 1000 || big.Stub {
		t.Errorf("big value: truncated %v, %d of %d bytes", big.ValueTruncated, len(big.Value), big.ValueSize)
	}
	// Replay reads a truncated value back from Kafka while Kafka has it.
	res, err := NewActions(s, producerClient(t, k)).Replay(testenv.Context(t), "alice", Selection{IDs: []int64{big.ID}}, "", 0, "")
	if err != nil || res.Done != 1 {
		t.Fatalf("Replay of the truncated record = %+v, %v", res, err)
	}
	if got := readAll(t, k, origin); len(got) != 1 || len(got[0].Value) != 1000 {
		t.Fatalf("origin got %d records (want 1 of 1000 bytes)", len(got))
	}
	stub := mustList(t, s, Filter{Key: "stub-1"})[0]
	if !stub.Stub || stub.Value != nil || stub.ValueSize != 3<<20 {
		t.Errorf("stub: %+v", stub)
	}
	if n := gauge(t, reg, "idem_dlq_unresolved", "billing", first); n != 19 {
		t.Errorf("idem_dlq_unresolved = %v, want 19 (20, one replayed)", n)
	}

	// A topic created later is found; a failure repeating k-1 links to it.
	k.CreateTopic(t, second, 1)
	produce(t, k, dead{topic: second, origin: origin, key: "k-1", value: []byte(`{"n":1}`), err: "boom again"})
	waitCount(t, pool, 21, `SELECT count(*) FROM idem_dlq_records`)
	firstK1 := mustList(t, s, Filter{Key: "k-1", Topic: first})[0]
	again := mustList(t, s, Filter{Key: "k-1", Topic: second})[0]
	if again.PreviousID != firstK1.ID || firstK1.PreviousID != 0 {
		t.Errorf("lineage: repeat's PreviousID = %d, want %d", again.PreviousID, firstK1.ID)
	}
	stop()

	// Restarted with the same group, and a new group reading from the start:
	// nothing is indexed twice.
	produce(t, k, dead{topic: first, partition: 2, origin: origin, key: "late", value: []byte("{}"), err: "late"})
	stop = runUntil(t, ix)
	waitCount(t, pool, 22, `SELECT count(*) FROM idem_dlq_records`)
	stop()
	ix2 := *ix
	ix2.Group = testenv.Group(t)
	stop = runUntil(t, &ix2)
	testenv.Eventually(t, 60*time.Second, func() error {
		// The new group has read everything once its lag is 0.
		lag, err := groupLag(k, ix2.Group, first, second)
		if err != nil || lag != 0 {
			return fmt.Errorf("lag %d, %v", lag, err)
		}
		return nil
	})
	stop()
	if n := count(t, pool, `SELECT count(*) FROM idem_dlq_records`); n != 22 {
		t.Fatalf("%d rows after re-reading, want 22", n)
	}
}

// gauge returns the value of gauge name{group,topic} gathered from reg; the
// test fails when there is no such series.
func gauge(t *testing.T, reg *prometheus.Registry, name, group, topic string) float64 {
	t.Helper()
	v, ok := testenv.MetricFound(t, reg, name, map[string]string{"group": group, "topic": topic})
	if !ok {
		t.Fatalf("no %s{group=%q,topic=%q}", name, group, topic)
	}
	return v
}

// runUntil runs ix and returns a function that stops it and waits.
func runUntil(t testing.TB, ix *Indexer) func() {
	t.Helper()
	done := make(chan error, 1)
	ctx, cancel := contextWithCancel()
	go func() { done <- ix.Run(ctx) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Indexer.Run: %v", err)
		}
	}
	t.Cleanup(stop)
	return stop
}

// logCounter counts log records whose message contains a string.
type logCounter struct {
	mu   sync.Mutex
	want string
	n    int
}

func (l *logCounter) Enabled(context.Context, slog.Level) bool { return true }
func (l *logCounter) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if strings.Contains(r.Message, l.want) {
		l.n++
	}
	return nil
}
func (l *logCounter) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logCounter) WithGroup(string) slog.Handler      { return l }
func (l *logCounter) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n
}

// TestIndexerRetriesItsStart: with Kafka unreachable at start the indexer
// does not give up (as the outbox relay once did, issue 18 defect 4): it
// logs and retries until its context ends, then returns nil.
func TestIndexerRetriesItsStart(t *testing.T) {
	pool, _ := newPool(t)
	logs := &logCounter{want: "cannot start; retrying"}
	ix := &Indexer{Brokers: []string{"127.0.0.1:1"}, Pool: pool, Topics: []string{"x.g.dlq"}, Logger: slog.New(logs)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ix.Run(ctx) }()
	testenv.Eventually(t, 30*time.Second, func() error {
		if logs.count() < 2 {
			return errNotYet
		}
		return nil
	})
	select {
	case err := <-done:
		t.Fatalf("Run returned %v while its context was live", err)
	default:
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
}
