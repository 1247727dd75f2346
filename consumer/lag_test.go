package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/testing/testenv"
	"github.com/idemhq/idem/retrytopic"
	"github.com/idemhq/idem/schedule"
)

// TestActionableLag (issue 31, item 4): 10,000 records parked in a
// ten-minute retry tier and 50 messages deferred for ten minutes count in
// idem_consumer_lag (the tier's 10,000) but not in
// idem_consumer_lag_actionable, which stays 0 while none is due; when the
// lag watcher's clock passes their due time, the actionable lag rises to
// all of them (the tier's due records, and the deferred messages due in
// PostgreSQL, counted on the deferred topic's partitions), and
// idem_consumer_lag_seconds says how long they have been due. Real Kafka
// and PostgreSQL; the consumer itself keeps the real clock, so nothing is
// handled meanwhile.
func TestActionableLag(t *testing.T) {
	t.Parallel()
	const parked, deferred = 10000, 50
	e := newEnv(t, 4)
	deferredTopic := e.topic + "." + e.group + ".deferred"
	t.Cleanup(func() { e.k.DeleteTopics(t, deferredTopic) })
	var ahead atomic.Int64 // how far the lag watcher's clock is ahead
	ctx := consumer.WithLagClock(context.Background(), func() time.Time { return time.Now().Add(time.Duration(ahead.Load())) })

	cfg := e.config()
	cfg.LagInterval = 200 * time.Millisecond
	cfg.Retry.Attempts = 1
	cfg.Retry.Tiers = retrytopic.Policy{Delays: []time.Duration{10 * time.Minute}}
	cfg.Defer = &schedule.Scheduler{Pool: e.pool}
	failed := errors.New("the dependency is down")
	var handled atomic.Int64
	h := handler.Func(func(ctx context.Context, m *handler.Message) error {
		if m.Attempt > 1 {
			handled.Add(1) // a tier record handled: it was not due
		}
		if strings.HasPrefix(m.IdempotencyKey, "d-") {
			return handler.DeferUntil(time.Now().Add(10 * time.Minute))
		}
		return failed
	})
	startCtx(t, ctx, cfg, h)
	e.produce(coreKeys("t", parked), 4)
	e.produce(coreKeys("d", deferred), 4)

	group := map[string]string{"group": e.group}
	tier := map[string]string{"group": e.group, "topic": e.tier(1)}
	testenv.Eventually(t, 5*time.Minute, func() error {
		// Run creates idem_deferred as it starts, which startCtx does not wait for.
		if e.count(`SELECT count(*) FROM pg_tables WHERE tablename = 'idem_deferred'`) == 0 {
			return errors.New("idem_deferred not created yet")
		}
		if n := e.count(`SELECT count(*) FROM idem_deferred`); n != deferred {
			return fmt.Errorf("%d of %d messages deferred", n, deferred)
		}
		if got := metricValue(t, e, "idem_consumer_lag", tier); got != parked {
			return fmt.Errorf("offset lag of the tier %v, want %d", got, parked)
		}
		if got := metricValue(t, e, "idem_consumer_lag", map[string]string{"group": e.group, "topic": e.topic}); got != 0 {
			return fmt.Errorf("offset lag of the source %v, want 0 (every record forwarded or deferred)", got)
		}
		return nil
	})
	// The refresh that set the tier's offset lag set its actionable lag too.
	if got := metricValue(t, e, "idem_consumer_lag_actionable", group); got != 0 {
		t.Fatalf("actionable lag %v with %d records parked and %d deferred, none due; want 0", got, parked, deferred)
	}
	if got := metricValue(t, e, "idem_consumer_lag_seconds", group); got != 0 {
		t.Fatalf("lag seconds %v with nothing due; want 0", got)
	}
	if n := seriesCount(t, e, "idem_consumer_lag_actionable", group); n != 12 {
		t.Errorf("idem_consumer_lag_actionable has %d series, want 12 (4 partitions of the source, the tier and the deferred topic)", n)
	}

	ahead.Store(int64(11 * time.Minute))
	testenv.Eventually(t, time.Minute, func() error {
		if got := metricValue(t, e, "idem_consumer_lag_actionable", tier); got != parked {
			return fmt.Errorf("actionable lag of the tier %v once due, want %d", got, parked)
		}
		if got := metricValue(t, e, "idem_consumer_lag_actionable", map[string]string{"group": e.group, "topic": deferredTopic}); got != deferred {
			return fmt.Errorf("actionable lag of the deferred topic %v once due, want %d", got, deferred)
		}
		return nil
	})
	if got := metricValue(t, e, "idem_consumer_lag_actionable", group); got != parked+deferred {
		t.Errorf("actionable lag of the group %v, want %d", got, parked+deferred)
	}
	if got := maxSeries(t, e, "idem_consumer_lag_seconds", tier); got < 55 || got > 5*60 {
		t.Errorf("lag seconds of the tier %v, want about 60 (due a minute ago by the watcher's clock)", got)
	}
	if got := metricValue(t, e, "idem_consumer_lag", tier); got != parked {
		t.Errorf("offset lag of the tier %v, want still %d", got, parked)
	}
	if n := handled.Load(); n != 0 {
		t.Errorf("%d tier records handled before their due time", n)
	}
}

// maxSeries is the largest sample of the metric family name among the
// series whose labels include want.
func maxSeries(t *testing.T, e *env, name string, want map[string]string) float64 {
	t.Helper()
	mfs, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for k, v := range want {
				found := false
				for _, l := range m.GetLabel() {
					if l.GetName() == k && l.GetValue() == v {
						found = true
					}
				}
				if !found {
					continue series
				}
			}
			out = max(out, m.GetGauge().GetValue())
		}
	}
	return out
}
