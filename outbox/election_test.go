package outbox_test

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/idemtest"
)

// TestRelaysElectOneLeaderAndFailOver: two relays on one table elect one
// leader (internal/pglead's election, the scheduler's too), which alone
// publishes; the other finds the lock held and stands by; when the leader
// stops, the standby leads within a few LeaderRetry and publishes what
// comes next.
func TestRelaysElectOneLeaderAndFailOver(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	recs := e.consume(e.topic)
	a, regA := e.relay(e.pool)
	b, regB := e.relay(e.pool)
	sb := &standbyLog{stood: make(chan struct{})}
	b.Logger = slog.New(slog.NewTextHandler(io.MultiWriter(testWriter{t}, sb), &slog.HandlerOptions{Level: slog.LevelInfo}))
	stopA := start(t, a)
	waitMetric(t, regA, 1, "idem_outbox_leader", "idem_outbox")
	start(t, b)
	select { // b has tried the lock and found it held: checking it does not lead means something now
	case <-sb.stood:
	case <-time.After(60 * time.Second):
		t.Fatal("the second relay never reported standing by (did it take a lock of its own?)")
	}
	e.enqueue(e.msg("k", "1"), e.msg("k", "2"))
	recs.waitKeys(t, "k")
	idemtest.Eventually(t, 30*time.Second, func() error {
		if v := recs.values("k"); len(v) < 2 {
			return fmt.Errorf("published %v", v)
		}
		return nil
	})
	standingBy(t, regB)

	stopA()
	stopped := time.Now()
	waitMetric(t, regB, 1, "idem_outbox_leader", "idem_outbox")
	t.Logf("the standby led %s after the leader stopped", time.Since(stopped).Round(time.Millisecond))
	if l := metric(t, regA, "idem_outbox_leader", "idem_outbox"); l != 0 {
		t.Fatal("the stopped relay still says it leads")
	}
	e.enqueue(e.msg("k", "3"))
	idemtest.Eventually(t, 30*time.Second, func() error {
		if v := recs.values("k"); len(v) < 3 || v[len(v)-1] != "3" {
			return fmt.Errorf("published %v", v)
		}
		return nil
	})
	waitMetric(t, regB, 1, "idem_outbox_published_total", "idem_outbox") // the new leader published it
}

// standingBy fails the test unless the relay of reg stands by: it neither
// leads nor has published anything.
func standingBy(t *testing.T, reg *prometheus.Registry) {
	t.Helper()
	if p := metric(t, reg, "idem_outbox_published_total", "idem_outbox"); p != 0 {
		t.Fatalf("the standby published %v rows while the other relay led", p)
	}
	if l := metric(t, reg, "idem_outbox_leader", "idem_outbox"); l != 0 {
		t.Fatal("both relays lead")
	}
}

// standbyLog is a relay's log output that closes stood at the first line
// saying the relay stands by (it tried the table's lock and found it held).
type standbyLog struct {
	once  sync.Once
	stood chan struct{}
}

func (s *standbyLog) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte("standing by: another holds the lock")) {
		s.once.Do(func() { close(s.stood) })
	}
	return len(p), nil
}
