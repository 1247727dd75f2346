package consumer_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemhq/idem/breaker"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/testing/testenv"
)

// A KeyFunc that meets a dependency that is down (a schema registry the key
// is read through: an error for which breaker.IsOpen holds) makes the
// message wait like any outage: no attempt is spent, nothing is
// dead-lettered as missing-key, and the key is extracted again once the
// dependency is back; every message is then applied once, at attempt 1.
func TestKeyFuncOutageWaits(t *testing.T) {
	forEachMode(t, allModes, func(t *testing.T, mode testMode) {
		e := newEnv(t, 2).in(mode)
		var down atomic.Bool
		down.Store(true)
		var tries atomic.Int64
		cfg := e.config()
		cfg.KeyFunc = func(m *handler.Message) (string, error) {
			if down.Load() {
				tries.Add(1)
				return "", fmt.Errorf("key: %w", &breaker.OpenError{Name: "schema-registry", State: breaker.Open, RetryAfter: 100 * time.Millisecond})
			}
			v, _ := m.Header("idempotency-key")
			return string(v), nil
		}
		var mu sync.Mutex
		attempts := map[string][]int{}
		h := handler.Func(func(ctx context.Context, m *handler.Message) error {
			mu.Lock()
			attempts[m.IdempotencyKey] = append(attempts[m.IdempotencyKey], m.Attempt)
			mu.Unlock()
			return effectHandler()(ctx, m)
		})
		start(t, cfg, h)
		keys := coreKeys("k", 20)
		e.produce(keys, 2)
		testenv.Eventually(t, time.Minute, func() error {
			if n := tries.Load(); n < 10 {
				return fmt.Errorf("the KeyFunc met the outage %d times", n)
			}
			return nil
		})
		if n := metricValue(t, e, "idem_missing_key_total", nil) + metricValue(t, e, "idem_forwarded_total", nil); n != 0 {
			t.Fatalf("during the outage %v messages were dead-lettered or forwarded; want none", n)
		}
		if n := e.count(`SELECT count(*) FROM effects`); n != 0 {
			t.Fatalf("%d effects during the outage", n)
		}
		down.Store(false)
		e.coreWaitEffects(len(keys), time.Minute)
		e.coreAssertOnePerKey(len(keys))
		if n := metricValue(t, e, "idem_missing_key_total", nil) + metricValue(t, e, "idem_forwarded_total", nil); n != 0 {
			t.Fatalf("%v messages dead-lettered or forwarded; want none", n)
		}
		mu.Lock()
		defer mu.Unlock()
		for k, a := range attempts {
			if len(a) != 1 || a[0] != 1 {
				t.Fatalf("%s handled at attempts %v; want once, at attempt 1", k, a)
			}
		}
	})
}
