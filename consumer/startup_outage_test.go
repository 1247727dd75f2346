package consumer_test

import (
	"context"
	"net"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemhq/idem/consumer"
)

// A broker or PostgreSQL that goes away while Run is starting is an outage
// like one after the start: every start-up step that talks to the cluster or
// the database rides it out instead of returning. (A chaos member whose
// broker was SIGKILLed right after it connected exited with "metadata:
// client has run out of available brokers": the check that the source
// topics exist was not retried.) The hook fails each step's first try the way
// a killed broker or a restarting database does; Run must still consume.
func TestStartRidesOutOutages(t *testing.T) {
	t.Parallel()
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	for _, tc := range []struct {
		name  string
		setup func(cfg *consumer.Config, e *env)
		want  []string // steps that must each have been tried twice
	}{
		{"default", func(*consumer.Config, *env) {}, []string{
			"connecting to the cluster", "reading the topics' metadata", "reading metadata", "starting the forwarder's producer"}},
		{"ordering", func(cfg *consumer.Config, e *env) {
			cfg.Ordering = consumer.ByKey(e.pool)
		}, []string{"reading the topics' metadata", "starting the forwarder's producer", "creating the ordering schema"}},
		{"transactions", func(cfg *consumer.Config, _ *env) { cfg.Transactions.Enabled = true }, []string{
			"reading the topics' metadata", "starting the transactional producer"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 2)
			cfg := e.config()
			tc.setup(&cfg, e)
			var mu sync.Mutex
			tries := map[string]int{}
			ctx := consumer.WithStartStepHook(context.Background(), func(what string) error {
				mu.Lock()
				defer mu.Unlock()
				tries[what]++
				if tries[what] > 1 {
					return nil
				}
				if what == "creating the ordering schema" {
					// PostgreSQL restarting: "the database system is shutting down".
					return &pgconn.PgError{Code: "57P03", Message: "the database system is starting up"}
				}
				return refused
			})
			startCtx(t, ctx, cfg, effectHandler())
			e.produce([]string{"a", "b", "c"}, 2)
			for _, k := range []string{"a", "b", "c"} {
				e.waitEffect(k, time.Minute)
			}
			mu.Lock()
			defer mu.Unlock()
			for _, step := range tc.want {
				if tries[step] < 2 {
					t.Errorf("step %q tried %d times, want a retry after its outage (steps seen: %v)", step, tries[step], keys(tries))
				}
			}
		})
	}
}

func keys(m map[string]int) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}
