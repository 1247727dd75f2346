package dedupe_test

import (
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/internal/tables"
)

func TestSweeperDeletesOnlyOldRowsInBatches(t *testing.T) {
	_, db := newPostgres(t, dedupe.WithTable("Inbox Custom"))
	ctx := t.Context()
	rows := []struct {
		key, age, status, leaseUntil string
		kept                         bool
	}{
		{"old1", "30 days", "done", "", false},
		{"old2", "20 days", "done", "", false},
		{"old3", "15 days", "done", "", false},
		{"old4", "15 days", "done", "", false},
		{"old5", "15 days", "done", "", false},
		{"young", "13 days", "done", "", true},
		{"new", "0 days", "done", "", true},
		{"old-expired-claim", "20 days", "in_progress", "-1 day", false},
		{"old-live-claim", "20 days", "in_progress", "1 day", true},
	}
	for _, r := range rows {
		var until any
		if r.leaseUntil != "" {
			until = r.leaseUntil
		}
		if _, err := db.Exec(ctx, `INSERT INTO "Inbox Custom" (consumer_group, idempotency_key, status, processed_at, lease_until)
			VALUES ('g', $1, $2, now() - $3::interval, now() + $4::interval)`, r.key, r.status, r.age, until); err != nil {
			t.Fatal(err)
		}
	}
	sw := &dedupe.Sweeper{DB: db, Table: "Inbox Custom", BatchSize: 2}
	n, err := sw.SweepOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n != 6 {
		t.Fatalf("deleted %d, want 6 (in batches of 2)", n)
	}
	for _, r := range rows {
		got := count(t, db, `SELECT count(*) FROM "Inbox Custom" WHERE idempotency_key = $1`, r.key) == 1
		if got != r.kept {
			t.Errorf("%s: kept = %v, want %v", r.key, got, r.kept)
		}
	}
	if n, err := sw.SweepOnce(ctx); err != nil || n != 0 {
		t.Fatalf("second sweep = (%d, %v), want (0, nil)", n, err)
	}
}

func TestSweeperRun(t *testing.T) {
	_, db := newPostgres(t)
	ctx, cancel := context.WithCancel(t.Context())
	sw := &dedupe.Sweeper{DB: db, Interval: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)}
	done := make(chan error, 1)
	go func() { done <- sw.Run(ctx) }()
	// Rows that become old while Run is looping are swept by a later pass.
	for i := range 3 {
		if _, err := db.Exec(ctx, `INSERT INTO idem_processed (consumer_group, idempotency_key, processed_at)
			VALUES ('g', $1, now() - interval '15 days')`, string(rune('a'+i))); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "Run to sweep", func() bool { return count(t, db, "SELECT count(*) FROM idem_processed") == 0 })
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run returned %v on cancel, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

func TestSweeperValidate(t *testing.T) {
	valid := func() dedupe.Sweeper { return dedupe.Sweeper{DB: &pgx.Conn{}} }
	cases := map[string]struct {
		mutate func(*dedupe.Sweeper)
		field  string // "" = valid
	}{
		"zero value with DB":  {func(*dedupe.Sweeper) {}, ""},
		"nil DB":              {func(s *dedupe.Sweeper) { s.DB = nil }, "Sweeper.DB"},
		"negative retention":  {func(s *dedupe.Sweeper) { s.Retention = -time.Hour }, "Sweeper.Retention"},
		"too short retention": {func(s *dedupe.Sweeper) { s.Retention = time.Minute }, "Sweeper.Retention"},
		"negative batch":      {func(s *dedupe.Sweeper) { s.BatchSize = -1 }, "Sweeper.BatchSize"},
		"huge batch":          {func(s *dedupe.Sweeper) { s.BatchSize = 2_000_000 }, "Sweeper.BatchSize"},
		"negative interval":   {func(s *dedupe.Sweeper) { s.Interval = -time.Second }, "Sweeper.Interval"},
		"bad table":           {func(s *dedupe.Sweeper) { s.Table = "s." }, "Sweeper.Table"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			s := valid()
			tc.mutate(&s)
			err := s.Validate()
			if tc.field == "" {
				if err != nil {
					t.Fatalf("Validate = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, dedupe.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("Validate = %v, want ErrInvalidConfig naming %s", err, tc.field)
			}
			if _, err := s.SweepOnce(context.Background()); !errors.Is(err, dedupe.ErrInvalidConfig) {
				t.Fatalf("SweepOnce = %v, want the validation error", err)
			}
			if err := s.Run(context.Background()); !errors.Is(err, dedupe.ErrInvalidConfig) {
				t.Fatalf("Run = %v, want the validation error", err)
			}
		})
	}
}

// TestDocumentedDefaults checks the "Default:" line of each Sweeper field's
// doc comment against what withDefaults actually applies.
func TestDocumentedDefaults(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "sweeper.go", nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]string{}
	ast.Inspect(f, func(n ast.Node) bool {
		ts, ok := n.(*ast.TypeSpec)
		if !ok || ts.Name.Name != "Sweeper" {
			return true
		}
		for _, field := range ts.Type.(*ast.StructType).Fields.List {
			for _, line := range strings.Split(field.Doc.Text(), "\n") {
				if v, ok := strings.CutPrefix(line, "Default: "); ok {
					documented[field.Names[0].Name] = v
				}
			}
		}
		return false
	})
	d := dedupe.SweeperWithDefaults(dedupe.Sweeper{})
	want := map[string]string{
		"Table":     fmt.Sprintf("%q", d.Table),
		"Retention": strings.TrimSuffix(d.Retention.String(), "0m0s"),
		"BatchSize": fmt.Sprint(d.BatchSize),
		"Interval":  strings.TrimSuffix(d.Interval.String(), "0s"),
		"Logger":    "slog.Default()",
	}
	for field, w := range want {
		if !strings.HasPrefix(documented[field], w) {
			t.Errorf("Sweeper.%s doc says Default: %q, code applies %s", field, documented[field], w)
		}
	}
	if d.Logger != slog.Default() {
		t.Error("Logger default is not slog.Default()")
	}
	if dedupe.DefaultTable != d.Table || tables.DefaultInboxRetention != d.Retention {
		t.Error("exported Default* constants disagree with the applied defaults")
	}
	if dedupe.DefaultLeaseForTest != 5*time.Minute {
		t.Error("the lease default disagrees with the NewPostgresLease doc")
	}
}

// TestStoresAreSweepable: the PostgreSQL stores hand consumer.Run a Sweeper
// over their own table; a store with a bad table name gives none.
func TestStoresAreSweepable(t *testing.T) {
	for _, s := range []interface{ Sweeper() *dedupe.Sweeper }{
		dedupe.NewPostgres(nil, dedupe.WithTable("billing.inbox")),
		dedupe.NewPostgresLease(nil, 0, dedupe.WithTable("billing.inbox")),
	} {
		sw := s.Sweeper()
		if sw == nil || sw.Table != "billing.inbox" || sw.Retention != 0 {
			t.Errorf("%T.Sweeper() = %+v, want one on billing.inbox with the default retention", s, sw)
		}
	}
	if sw := dedupe.NewPostgres(nil, dedupe.WithTable("")).Sweeper(); sw != nil {
		t.Errorf("a store with an invalid table gave a Sweeper: %+v", sw)
	}
}
