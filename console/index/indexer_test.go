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

	"github.com/idemhq/idem/internal/failidx"
	"github.com/idemhq/idem/internal/testing/failidxtest"
	"github.com/idemhq/idem/internal/testing/testenv"
)

// TestIndexerIndexesEveryRecordOnce runs the indexer on real Kafka and
// PostgreSQL: every record is indexed once with its fields (stub flagged,
// value capped), a topic created later is found by the pattern, a repeated
// failure links to the earlier one, and indexers reading again (same group
// after a restart, or a new group from the start) add nothing.
func TestIndexerIndexesEveryRecordOnce(t *testing.T) {
	k := testenv.NewKafka(t)
	pool, _ := failidxtest.NewPool(t)
	prefix := testenv.Unique("ix")
	first, second := prefix+".billing.dlq", prefix+"_2.billing.dlq"
	k.CreateTopic(t, first, 3)
	origin := k.Topic(t, 3)
	var ds []dead
	for i := range 18 {
		ds = append(ds, dead{Topic: first, Partition: int32(i % 3), Origin: origin, Key: fmt.Sprint("k-", i),
			Value: []byte(fmt.Sprintf(`{"n":%d}`, i)), Err: fmt.Sprintf("boom %d", i)})
	}
	ds = append(ds, dead{Topic: first, Partition: 0, Origin: origin, Key: "big", Value: bytes.Repeat([]byte("x"), 1000), Err: "too big"},
		dead{Topic: first, Partition: 1, Origin: origin, Key: "stub-1", Stub: true, Err: "too large"})
	failidxtest.Produce(t, k, ds...)

	reg := prometheus.NewRegistry()
	group := testenv.Group(t)
	ix := &Indexer{Brokers: k.Brokers, Sarama: k.SaramaConfig(), Pool: pool, Group: group, TopicPattern: regexp.MustCompile("^" + prefix),
		RefreshInterval: 200 * time.Millisecond, MaxValueBytes: 64, Registerer: reg}
	stop := runUntil(t, ix)
	failidxtest.WaitCount(t, pool, 20, `SELECT count(*) FROM idem_dlq_records`)

	s := failidx.NewStore(pool)
	big := mustList(t, s, failidx.Filter{Key: "big"})[0]
	if !big.ValueTruncated || len(big.Value) != 64 || big.ValueSize != 1000 || big.Stub {
		t.Errorf("big value: truncated %v, %d of %d bytes", big.ValueTruncated, len(big.Value), big.ValueSize)
	}
	// Replay reads a truncated value back from Kafka while Kafka has it.
	res, err := failidx.NewActions(s, producerClient(t, k)).Replay(testenv.Context(t), "alice", failidx.Selection{IDs: []int64{big.ID}}, "", 0, "")
	if err != nil || res.Done != 1 {
		t.Fatalf("Replay of the truncated record = %+v, %v", res, err)
	}
	if got := failidxtest.ReadAll(t, k, origin); len(got) != 1 || len(got[0].Value) != 1000 {
		t.Fatalf("origin got %d records (want 1 of 1000 bytes)", len(got))
	}
	stub := mustList(t, s, failidx.Filter{Key: "stub-1"})[0]
	if !stub.Stub || stub.Value != nil || stub.ValueSize != 3<<20 {
		t.Errorf("stub: %+v", stub)
	}
	if n := failidxtest.Gauge(t, reg, "idem_dlq_unresolved", "billing", first); n != 19 {
		t.Errorf("idem_dlq_unresolved = %v, want 19 (20, one replayed)", n)
	}

	// A topic created later is found; a failure repeating k-1 links to it.
	k.CreateTopic(t, second, 1)
	failidxtest.Produce(t, k, dead{Topic: second, Origin: origin, Key: "k-1", Value: []byte(`{"n":1}`), Err: "boom again"})
	failidxtest.WaitCount(t, pool, 21, `SELECT count(*) FROM idem_dlq_records`)
	firstK1 := mustList(t, s, failidx.Filter{Key: "k-1", Topic: first})[0]
	again := mustList(t, s, failidx.Filter{Key: "k-1", Topic: second})[0]
	if again.PreviousID != firstK1.ID || firstK1.PreviousID != 0 {
		t.Errorf("lineage: repeat's PreviousID = %d, want %d", again.PreviousID, firstK1.ID)
	}
	stop()

	// Restarted with the same group, and a new group reading from the start:
	// nothing is indexed twice.
	failidxtest.Produce(t, k, dead{Topic: first, Partition: 2, Origin: origin, Key: "late", Value: []byte("{}"), Err: "late"})
	stop = runUntil(t, ix)
	failidxtest.WaitCount(t, pool, 22, `SELECT count(*) FROM idem_dlq_records`)
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
	if n := failidxtest.Count(t, pool, `SELECT count(*) FROM idem_dlq_records`); n != 22 {
		t.Fatalf("%d rows after re-reading, want 22", n)
	}
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
	pool, _ := failidxtest.NewPool(t)
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
