package consumer_test

// Crossing tests of issue 28, third phase: Ordering × a second record with
// the head's idempotency key (a producer's duplicate). The head of a key is
// one record, not one idempotency key: another record that carries the
// head's idempotency key is not the head, and waits behind it.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idemhq/idem/handler"
)

// Swarm (soak run 7, seeds 1796388943105795458 with Transactions and
// 1796388943105795468 without): H fails into its tier and becomes its key's
// head; P is parked behind it; D, a duplicate of H produced later (the same
// idempotency key, its own offset), is read while H waits in its tier. D
// must wait behind H too, after P, and be a duplicate of H once its turn
// comes. (The store took any record with the head's idempotency key for the
// head: D was handled at once, overtaking P, and sent a second copy of H up
// the ladder. With a second claim reading H's tier copy, both drained the
// key at once: two DLQ copies of a parked message, and a record handled
// after one produced long after it.)
func TestCrossingDuplicateOfTheHeadWaitsBehindIt(t *testing.T) {
	t.Parallel()
	forEachMode(t, orderingModes, func(t *testing.T, mode testMode) {
		e, cfg := orderedEnv(t, 1, time.Second)
		e.in(mode)
		cfg = mode.apply(cfg)
		var mu sync.Mutex
		var log []string // the handler calls, as "<ikey>@<origin offset> from <topic>"
		h := handler.Func(func(ctx context.Context, m *handler.Message) error {
			mu.Lock()
			log = append(log, fmt.Sprintf("%s@%d from %s", m.IdempotencyKey, m.Origin().Offset, m.Topic))
			mu.Unlock()
			if m.IdempotencyKey == "H" && m.Topic == e.topic {
				return errors.New("H fails at its source")
			}
			return apply(ctx, m)
		})
		p := e.k.Producer(t)
		for _, ik := range []string{"H", "P", "H"} { // offsets 0, 1, 2
			e.send(p, 0, []byte("K"), ik)
		}
		r := start(t, cfg, h)
		e.waitSettled("H,P")
		e.waitCommitted(e.topic, 1, 60*time.Second)
		if err := r.stop(); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		defer mu.Unlock()
		want := []string{"H@0 from " + e.topic, "H@0 from " + e.tier(1), "P@1 from " + e.topic}
		if fmt.Sprint(log) != fmt.Sprint(want) {
			t.Errorf("handler calls %q, want %q: the duplicate of the head (offset 2) did not wait behind it", log, want)
		}
		if got := e.ikeyCopies(e.tier(1)); got["H"] != 1 {
			t.Errorf("H: %d copies in tier 1, want 1 (all: %v)", got["H"], got)
		}
	})
}
