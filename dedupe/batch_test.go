package dedupe_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/internal/testenv"
)

func TestProcessBatch(t *testing.T) {
	pool := testenv.Postgres(t)
	if err := dedupe.Migrate(testenv.Context(t), pool); err != nil {
		t.Fatal(err)
	}
	for name, s := range map[string]dedupe.BatchStore{"postgres": dedupe.NewPostgres(pool), "memory": dedupe.NewMemory()} {
		t.Run(name, func(t *testing.T) {
			ctx := testenv.Context(t)
			g := testenv.Unique("g")
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
				if name == "postgres" && dedupe.Tx(ctx) == nil {
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
