package dedupe_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/idemtest"
)

func TestProcessBatch(t *testing.T) {
	pool := idemtest.ConnectPostgres(t).Pool
	if err := dedupe.NewPostgres(pool).Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	for name, s := range map[string]dedupe.BatchStore{"postgres": dedupe.NewPostgres(pool), "memory": dedupe.NewMemory()} {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			g := t.Name()
			r := func(key string, off int64) dedupe.Record {
				return dedupe.Record{Group: g, Key: key, Topic: "t", Partition: 0, Offset: off}
			}
			if _, err := s.Process(ctx, r("old", 0), func(context.Context) error { return nil }); err != nil {
				t.Fatal(err)
			}
			recs := []dedupe.Record{r("a", 1), r("old", 2), r("b", 3), r("a", 4)}

			// A failing fn records nothing.
			boom := errors.New("boom")
			if _, err := s.ProcessBatch(ctx, recs, func(context.Context, []int) error { return boom }); !errors.Is(err, boom) {
				t.Fatalf("failing fn: err = %v, want boom", err)
			}
			var got []int
			outs, err := s.ProcessBatch(ctx, recs, func(ctx context.Context, fresh []int) error {
				got = fresh
				if name == "postgres" && !dedupe.HasTx(ctx) {
					t.Error("no transaction in ctx")
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, []int{0, 2}) {
				t.Errorf("fresh = %v, want [0 2] (a, b; old recorded before, the second a a duplicate)", got)
			}
			want := []dedupe.Outcome{dedupe.Processed, dedupe.Duplicate, dedupe.Processed, dedupe.Duplicate}
			if !slices.Equal(outs, want) {
				t.Errorf("outs = %v, want %v", outs, want)
			}
			// Everything is recorded now: fn is not called.
			outs, err = s.ProcessBatch(ctx, recs, func(context.Context, []int) error { t.Error("fn called for recorded keys"); return nil })
			if err != nil || slices.Contains(outs, dedupe.Processed) {
				t.Errorf("second batch: outs=%v err=%v, want all Duplicate", outs, err)
			}
		})
	}
}

// TestProcessBatchEpochs: a batch keys each record by its replay epoch
// (Record.Epoch): a key recorded under epoch 0 is new under epoch 2, once;
// the caller's records are left as given; the inbox row holds
// Record.InboxKey.
func TestProcessBatchEpochs(t *testing.T) {
	pool := idemtest.ConnectPostgres(t).Pool
	if err := dedupe.NewPostgres(pool).Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	for name, s := range map[string]dedupe.BatchStore{"postgres": dedupe.NewPostgres(pool), "memory": dedupe.NewMemory()} {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			g := t.Name()
			r := func(key string, epoch int64) dedupe.Record {
				return dedupe.Record{Group: g, Key: key, Topic: "t", Epoch: epoch}
			}
			if _, err := s.Process(ctx, r("a", 0), func(context.Context) error { return nil }); err != nil {
				t.Fatal(err)
			}
			recs := []dedupe.Record{r("a", 0), r("a", 2), r("b", 2), r("a", 2)}
			var fresh []int
			outs, err := s.ProcessBatch(ctx, recs, func(_ context.Context, f []int) error { fresh = f; return nil })
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(fresh, []int{1, 2}) {
				t.Errorf("fresh = %v, want [1 2] (a and b under epoch 2)", fresh)
			}
			want := []dedupe.Outcome{dedupe.Duplicate, dedupe.Processed, dedupe.Processed, dedupe.Duplicate}
			if !slices.Equal(outs, want) {
				t.Errorf("outs = %v, want %v", outs, want)
			}
			if recs[1].Key != "a" || recs[1].Epoch != 2 {
				t.Errorf("the caller's record changed: %+v", recs[1])
			}
			// Process keys by epoch as the batch did: b is recorded under
			// epoch 2 only.
			for _, c := range []struct {
				rec  dedupe.Record
				want dedupe.Outcome
			}{{r("b", 2), dedupe.Duplicate}, {r("b", 0), dedupe.Processed}, {r("b", 3), dedupe.Processed}} {
				if out, err := s.Process(ctx, c.rec, func(context.Context) error { return nil }); out != c.want || err != nil {
					t.Errorf("Process(%+v) = %v, %v, want %v", c.rec, out, err, c.want)
				}
			}
			if name != "postgres" {
				return
			}
			var n int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM idem_processed WHERE consumer_group = $1 AND idempotency_key = $2`,
				g, r("a", 2).InboxKey()).Scan(&n); err != nil || n != 1 {
				t.Errorf("inbox rows of %q = %d (%v), want 1", r("a", 2).InboxKey(), n, err)
			}
		})
	}
}

// TestProcessBatchOverlappingInOppositeOrders: two batches that share keys,
// given in opposite orders, run at once; neither may deadlock. A third
// transaction holds the middle key until both batches wait, so that without
// a common lock order each would hold a key the other needs.
func TestProcessBatchOverlappingInOppositeOrders(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	table := "inbox_overlap" // in the test's own schema
	s, pool := newPostgres(t, dedupe.WithTable(table))
	g := t.Name()
	recs := func(keys ...string) []dedupe.Record {
		out := make([]dedupe.Record, len(keys))
		for i, k := range keys {
			out[i] = dedupe.Record{Group: g, Key: k, Topic: "t", Offset: int64(i)}
		}
		return out
	}
	blocker, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Rollback(context.WithoutCancel(ctx))
	if _, err := blocker.Exec(ctx, `INSERT INTO `+pgx.Identifier{table}.Sanitize()+
		` (consumer_group, idempotency_key, topic, "partition", "offset") VALUES ($1, 'k2', 't', 0, 0)`, g); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 2)
	for _, keys := range [][]string{{"k1", "k2", "k3"}, {"k3", "k2", "k1"}} {
		go func() {
			_, err := s.ProcessBatch(ctx, recs(keys...), func(context.Context, []int) error { return nil })
			errs <- err
		}()
	}
	idemtest.Eventually(t, 30*time.Second, func() error {
		var waiting int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE cardinality(pg_blocking_pids(pid)) > 0 AND strpos(query, $1) > 0`, table).Scan(&waiting); err != nil {
			return err
		}
		if waiting < 2 {
			return fmt.Errorf("%d of 2 batches wait", waiting)
		}
		return nil
	})
	if err := blocker.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Errorf("ProcessBatch: %v", err)
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM `+pgx.Identifier{table}.Sanitize()+` WHERE consumer_group = $1`, g); n != 3 {
		t.Fatalf("%d inbox rows, want 3", n)
	}
}
