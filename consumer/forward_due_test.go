package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/testing/testenv"
	"github.com/idemhq/idem/internal/wire"
	"github.com/idemhq/idem/retrytopic"
)

// callTimes records when each idempotency key reached the handler.
type callTimes struct {
	mu sync.Mutex
	at map[string][]time.Time
}

func (c *callTimes) add(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.at == nil {
		c.at = map[string][]time.Time{}
	}
	c.at[key] = append(c.at[key], time.Now())
	return len(c.at[key])
}

func (c *callTimes) get(key string) []time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Time(nil), c.at[key]...)
}

// Issue 8: handler.RetryAfter is capped at the delay of the tier the record is
// sent to: a RetryAfter of an hour still makes the record due the tier's delay
// after the failure (never earlier), so it cannot hold the tier partition.
func TestRetryAfterCappedAtTierDelay(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	cfg := e.config()
	cfg.Retry.Attempts = 1
	delay := 300 * time.Millisecond
	cfg.Retry.Tiers = retrytopic.Policy{Delays: []time.Duration{delay}}
	var calls callTimes
	h := handler.Func(func(ctx context.Context, m *handler.Message) error {
		if calls.add(m.IdempotencyKey) == 1 {
			return handler.RetryAfter(errors.New("429 Too Many Requests"), time.Hour)
		}
		return effectHandler()(ctx, m)
	})
	e.produce([]string{"k"}, 1)
	start(t, cfg, h)
	e.waitEffect("k", 30*time.Second)
	at := calls.get("k")
	if len(at) != 2 {
		t.Fatalf("%d calls, want 2", len(at))
	}
	if gap := at[1].Sub(at[0]); gap < delay || gap > 20*time.Second {
		t.Fatalf("tier 1 ran %s after the failure, want at least its delay %s and far less than RetryAfter's hour", gap, delay)
	}
	m := e.readAll(e.tier(1), 1)[0]
	f, _, err := wire.Decode(m.Headers)
	if err != nil {
		t.Fatal(err)
	}
	if d := f.DueAt.Sub(f.LastFailureAt); d < delay || d > delay+time.Millisecond {
		t.Fatalf("idem-due-at is %s after the failure, want the tier's delay %s (rounded up to the ms)", d, delay)
	}
}

// Issue 8: a tier record whose idem-due-at lies far beyond its tier's delay
// (another version, a changed policy, a skewed clock) is held only for about
// the tier's delay, never for as long as the header says.
func TestTierWaitIsBoundedByItsDelay(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	cfg := e.config()
	delay := 200 * time.Millisecond
	cfg.Retry.Tiers = retrytopic.Policy{Delays: []time.Duration{delay}}
	e.k.CreateTopic(t, e.tier(1), 1)
	now := time.Now()
	f := retrytopic.Failure{Attempt: 1, Tier: 1, DueAt: now.Add(time.Hour), OriginalTopic: e.topic, Group: e.group,
		Kind: handler.KindRetriable, Error: "earlier", FirstFailureAt: now, LastFailureAt: now}
	hs := wire.Encode([]sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte("far")}}, f)
	if _, _, err := e.k.Producer(t).SendMessage(&sarama.ProducerMessage{Topic: e.tier(1), Partition: 0,
		Key: sarama.StringEncoder("far"), Value: sarama.StringEncoder(`{}`), Headers: hs}); err != nil {
		t.Fatal(err)
	}
	var calls callTimes
	begin := time.Now()
	start(t, cfg, handler.Func(func(ctx context.Context, m *handler.Message) error {
		calls.add(m.IdempotencyKey)
		return effectHandler()(ctx, m)
	}))
	e.waitEffect("far", 60*time.Second)
	if at := calls.get("far"); len(at) != 1 || at[0].Sub(begin) < delay {
		t.Fatalf("calls %v, want one at least %s after start", at, delay)
	}
	testenv.Eventually(t, 30*time.Second, func() error {
		if got := e.committed(e.tier(1), 1)[0]; got != 1 {
			return fmt.Errorf("tier offset committed %d, want 1", got)
		}
		return nil
	})
}
