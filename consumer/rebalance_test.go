package consumer_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/internal/coremetrics"
	"github.com/idemhq/idem/internal/testing/testenv"
)

// Three members of one group consume a stream; one leaves and another
// joins while messages are in flight. Every unique key ends with exactly one
// effect and every offset is committed. Progress is gated by tokens, so the
// membership changes happen at known points of the stream, not by timing.
func TestMembersLeaveAndJoinMidStream(t *testing.T) {
	t.Parallel()
	forEachMode(t, allModes, func(t *testing.T, mode testMode) {
		const partitions, total = 6, 3000
		e := newEnv(t, partitions).in(mode)
		keys, uniq := keysWithDuplicates(total, 0.1, 4)
		// The last third is produced only once d has joined, so every partition
		// d claims still has new keys for it, whichever partitions the assignor
		// moves (ones a and c already finished would leave d nothing to do).
		const late = total / 3
		e.produce(keys[:total-late], partitions)

		gate := coreNewTokens()
		t.Cleanup(gate.open) // let blocked handlers go when the test fails early
		h := coreGatedHandler(gate)
		type member struct {
			name string
			reg  *prometheus.Registry
			run  *running
		}
		join := func(name string) *member {
			m := &member{name: name, reg: prometheus.NewRegistry()}
			cfg := e.config()
			cfg.Registerer = m.reg
			cfg.ShutdownGrace = time.Second // in-flight handlers waiting for tokens are cancelled at revoke
			m.run = start(t, cfg, h)
			return m
		}
		waitClaims := func(want map[*member]int) {
			t.Helper()
			testenv.Eventually(t, 90*time.Second, func() error {
				for m, n := range want {
					if got := coreClaimed(t, m.reg); got != n {
						return fmt.Errorf("member %s claims %d partitions, want %d", m.name, got, n)
					}
				}
				return nil
			})
		}

		a, b, c := join("a"), join("b"), join("c")
		waitClaims(map[*member]int{a: 2, b: 2, c: 2})

		gate.release(600)
		e.coreWaitProgress(gate, 590, 60*time.Second)

		// b leaves while the stream moves on.
		gate.release(600)
		if err := b.run.stop(); err != nil {
			t.Fatalf("member b: Run = %v", err)
		}
		waitClaims(map[*member]int{a: 3, c: 3})

		// d joins while the stream moves on.
		gate.release(600)
		d := join("d")
		waitClaims(map[*member]int{a: 2, c: 2, d: 2})
		e.produce(keys[total-late:], partitions)
		e.coreWaitProgress(gate, 1750, 60*time.Second)

		gate.open()
		e.waitCommitted(e.topic, partitions, 120*time.Second)
		e.coreAssertOnePerKey(uniq)

		processed := 0
		for _, m := range []*member{a, b, c, d} {
			n := coreOutcome(t, m.reg, coremetrics.OutcomeProcessed)
			t.Logf("member %s processed %d, duplicates %d", m.name, n, coreOutcome(t, m.reg, coremetrics.OutcomeDuplicate))
			if n == 0 {
				t.Errorf("member %s processed nothing: it took no part in the stream", m.name)
			}
			processed += n
		}
		if processed != uniq {
			t.Errorf("processed over all members = %d, want %d", processed, uniq)
		}
	})
}
