package dedupe_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/internal/testing/testenv"
)

func rec(key string) dedupe.Record {
	return dedupe.Record{Group: "payments", Key: key, Topic: "payments", Partition: 1, Offset: 7}
}

func count(tb testing.TB, db *pgxpool.Pool, query string, args ...any) int {
	tb.Helper()
	var n int
	if err := db.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		tb.Fatalf("%s: %v", query, err)
	}
	return n
}

// waitFor polls cond until it is true or the deadline passes.
func waitFor(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out waiting for %s", what)
		}
		select {
		case <-time.After(10 * time.Millisecond):
		case <-tb.Context().Done():
		}
	}
}

func TestPostgresEffectCommitsWithInbox(t *testing.T) {
	s, db := newPostgres(t)
	ctx := t.Context()
	if _, err := db.Exec(ctx, "CREATE TABLE payments (id text, amount int)"); err != nil {
		t.Fatal(err)
	}
	if dedupe.HasTx(ctx) {
		t.Fatal("Tx(ctx) outside Process is not nil")
	}
	pay := func(id string, fail error) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			tx := dedupe.Tx(ctx)
			if tx == nil {
				return errors.New("no tx in ctx")
			}
			if _, err := tx.Exec(ctx, "INSERT INTO payments VALUES ($1, 100)", id); err != nil {
				return err
			}
			return fail
		}
	}

	out, err := s.Process(ctx, rec("ok"), pay("ok", nil))
	if err != nil || out != dedupe.Processed {
		t.Fatalf("Process = (%v, %v)", out, err)
	}
	if n := count(t, db, "SELECT count(*) FROM payments WHERE id = 'ok'"); n != 1 {
		t.Fatalf("committed effect rows = %d, want 1", n)
	}
	if n := count(t, db, `SELECT count(*) FROM idem_processed WHERE consumer_group = 'payments' AND idempotency_key = 'ok'
		AND topic = 'payments' AND "partition" = 1 AND "offset" = 7 AND status = 'done'`); n != 1 {
		t.Fatalf("inbox rows = %d, want 1", n)
	}

	boom := errors.New("declined")
	if _, err := s.Process(ctx, rec("bad"), pay("bad", boom)); err != boom {
		t.Fatalf("err = %v, want fn's error unchanged", err)
	}
	if n := count(t, db, "SELECT count(*) FROM payments WHERE id = 'bad'"); n != 0 {
		t.Fatalf("effect of failed fn committed (%d rows)", n)
	}
	if n := count(t, db, "SELECT count(*) FROM idem_processed WHERE idempotency_key = 'bad'"); n != 0 {
		t.Fatalf("failed key recorded (%d rows)", n)
	}
}

// TestPostgresRaceExactlyOneEffect makes the second member's INSERT block on
// the first's uncommitted inbox row (observed in pg_stat_activity) before the
// first commits, then checks one effect row in a table with no unique key.
func TestPostgresRaceExactlyOneEffect(t *testing.T) {
	for _, firstFails := range []bool{false, true} {
		t.Run(fmt.Sprintf("firstFails=%v", firstFails), func(t *testing.T) {
			table := "inbox_race" // the test's schema is its own
			s, db := newPostgres(t, dedupe.WithTable(table))
			ctx := t.Context()
			if _, err := db.Exec(ctx, "CREATE TABLE effects (key text)"); err != nil {
				t.Fatal(err)
			}
			waiting := func() bool {
				return count(t, db, `SELECT count(*) FROM pg_stat_activity
					WHERE wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%'`, table) > 0
			}
			effect := func(ctx context.Context) error {
				_, err := dedupe.Tx(ctx).Exec(ctx, "INSERT INTO effects VALUES ('k')")
				return err
			}
			secondDone := make(chan struct{})
			var out2 dedupe.Outcome
			var err2 error
			boom := errors.New("first member failed")

			out1, err1 := s.Process(ctx, rec("k"), func(ctx context.Context) error {
				if err := effect(ctx); err != nil {
					return err
				}
				go func() {
					defer close(secondDone)
					out2, err2 = s.Process(ctx, rec("k"), effect)
				}()
				waitFor(t, "second member to block on the inbox row", waiting)
				if firstFails {
					return boom
				}
				return nil
			})
			<-secondDone
			if firstFails {
				if err1 != boom || err2 != nil || out2 != dedupe.Processed {
					t.Fatalf("first = (%v, %v), second = (%v, %v); want fn error, then Processed", out1, err1, out2, err2)
				}
			} else if err1 != nil || out1 != dedupe.Processed || err2 != nil || out2 != dedupe.Duplicate {
				t.Fatalf("first = (%v, %v), second = (%v, %v); want Processed, Duplicate", out1, err1, out2, err2)
			}
			if n := count(t, db, "SELECT count(*) FROM effects"); n != 1 {
				t.Fatalf("effect rows = %d, want exactly 1", n)
			}
		})
	}
}

func TestPostgresManyMembersOneEffect(t *testing.T) {
	db := idemtest.ConnectPostgres(t)
	pool, schema := db.Pool, db.Schema
	ctx := t.Context()
	if err := dedupe.NewPostgres(pool).Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE effects (key text)"); err != nil {
		t.Fatal(err)
	}
	// Each "member" has its own pool, as separate processes would.
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range 4 {
		s := dedupe.NewPostgres(testenv.PoolOnSchema(t, schema))
		wg.Go(func() {
			<-start
			for i := range 20 {
				_, err := s.Process(ctx, rec(fmt.Sprint("k", i)), func(ctx context.Context) error {
					_, err := dedupe.Tx(ctx).Exec(ctx, "INSERT INTO effects VALUES ($1)", fmt.Sprint("k", i))
					return err
				})
				if err != nil {
					t.Error(err)
				}
			}
		})
	}
	close(start)
	wg.Wait()
	if n := count(t, pool, "SELECT count(*) FROM effects"); n != 20 {
		t.Fatalf("effect rows = %d, want 20", n)
	}
	if n := count(t, pool, "SELECT count(DISTINCT key) FROM effects"); n != 20 {
		t.Fatalf("distinct keys = %d, want 20", n)
	}
}

func TestPostgresCustomTableIsQuoted(t *testing.T) {
	pg := idemtest.ConnectPostgres(t)
	db := pg.Pool
	ctx := t.Context()
	schema := `Odd "Sch ema_` + pg.Schema[len(pg.Schema)-12:] // the odd characters, and a suffix unique to the test
	if _, err := db.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = db.Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	})
	tableName := `In-Box "x"; DROP TABLE y --`
	name := schema + "." + tableName
	s := dedupe.NewPostgres(db, dedupe.WithTable(name))
	for range 2 {
		if err := s.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
	}
	out, err := s.Process(ctx, rec("k"), func(context.Context) error { return nil })
	if err != nil || out != dedupe.Processed {
		t.Fatalf("Process = (%v, %v)", out, err)
	}
	out, err = s.Process(ctx, rec("k"), func(context.Context) error { return nil })
	if err != nil || out != dedupe.Duplicate {
		t.Fatalf("second Process = (%v, %v)", out, err)
	}
	quoted := pgx.Identifier{schema, tableName}.Sanitize()
	if n := count(t, db, "SELECT count(*) FROM "+quoted); n != 1 {
		t.Fatalf("rows in %s = %d", quoted, n)
	}
	if n := count(t, db, "SELECT count(*) FROM pg_indexes WHERE schemaname = $1 AND tablename = $2", schema, tableName); n != 2 {
		t.Fatalf("indexes on %s = %d, want 2 (primary key, processed_at)", quoted, n)
	}
}

func TestPostgresBadTableIsAnErrorNotAPanic(t *testing.T) {
	for _, name := range []string{"", ".t", "s.", string(make([]byte, 64))} {
		s := dedupe.NewPostgres(nil, dedupe.WithTable(name))
		if err := s.Migrate(context.Background()); !errors.Is(err, dedupe.ErrInvalidConfig) {
			t.Errorf("Migrate with table %q: err = %v, want ErrInvalidConfig", name, err)
		}
		_, err := s.Process(context.Background(), rec("k"), func(context.Context) error { return nil })
		if !errors.Is(err, dedupe.ErrInvalidConfig) || !isStoreError(err) {
			t.Errorf("Process with table %q: err = %v, want StoreError wrapping ErrInvalidConfig", name, err)
		}
	}
}

// TestPostgresMigrateTwiceAndConcurrently needs an empty schema (testenv's,
// not idemtest's, which is migrated already): four members migrate it at once.
func TestPostgresMigrateTwiceAndConcurrently(t *testing.T) {
	db, schema := testenv.PostgresSchema(t)
	ctx := t.Context()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	start := make(chan struct{})
	for _, p := range []*pgxpool.Pool{db, testenv.PoolOnSchema(t, schema), testenv.PoolOnSchema(t, schema), testenv.PoolOnSchema(t, schema)} {
		wg.Go(func() {
			<-start
			errs <- dedupe.NewPostgres(p).Migrate(ctx)
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := dedupe.NewPostgres(db).Migrate(ctx); err != nil {
		t.Fatalf("migrate again: %v", err)
	}
	if n := count(t, db, "SELECT count(*) FROM idem_schema_migrations WHERE component = 'dedupe:idem_processed'"); n != 1 {
		t.Fatalf("recorded migrations = %d, want 1", n)
	}
}

func TestPostgresSwallowedSQLErrorIsHandlerError(t *testing.T) {
	s, db := newPostgres(t)
	ctx := t.Context()
	out, err := s.Process(ctx, rec("k"), func(ctx context.Context) error {
		_, _ = dedupe.Tx(ctx).Exec(ctx, "SELECT * FROM no_such_table") // error swallowed
		return nil
	})
	if out != 0 || !errors.Is(err, pgx.ErrTxCommitRollback) || !errors.Is(err, dedupe.ErrTxAborted) {
		t.Fatalf("Process = (%v, %v), want ErrTxAborted wrapping pgx.ErrTxCommitRollback", out, err)
	}
	if isStoreError(err) {
		t.Fatalf("handler fault classified as store error: %v", err)
	}
	if n := count(t, db, "SELECT count(*) FROM idem_processed"); n != 0 {
		t.Fatalf("aborted key recorded (%d rows)", n)
	}
	out, err = s.Process(ctx, rec("k"), func(context.Context) error { return nil })
	if err != nil || out != dedupe.Processed {
		t.Fatalf("retry = (%v, %v), want Processed", out, err)
	}
}

func TestPostgresHandlerClosingTxIsHandlerError(t *testing.T) {
	s, _ := newPostgres(t)
	ctx := t.Context()
	_, err := s.Process(ctx, rec("k"), func(ctx context.Context) error {
		return dedupe.Tx(ctx).Rollback(ctx)
	})
	if !errors.Is(err, dedupe.ErrTxAborted) || !errors.Is(err, pgx.ErrTxClosed) || isStoreError(err) {
		t.Fatalf("err = %v, want ErrTxAborted wrapping pgx.ErrTxClosed", err)
	}
}

// TestPostgresCommitFailureIsStoreError kills the transaction's backend while
// fn runs: COMMIT fails for a reason that is not the handler's.
func TestPostgresCommitFailureIsStoreError(t *testing.T) {
	s, db := newPostgres(t)
	ctx := t.Context()
	_, err := s.Process(ctx, rec("k"), func(ctx context.Context) error {
		var pid int32
		if err := dedupe.Tx(ctx).QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
			return err
		}
		if _, err := db.Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
			return err
		}
		waitFor(t, "backend to exit", func() bool {
			return count(t, db, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid) == 0
		})
		return nil
	})
	var se *dedupe.StoreError
	if !errors.As(err, &se) || se.Op != "commit" {
		t.Fatalf("err = %v, want *StoreError with Op commit", err)
	}
	if errors.Is(err, dedupe.ErrTxAborted) {
		t.Fatalf("outage classified as handler fault: %v", err)
	}
	out, err := s.Process(ctx, rec("k"), func(context.Context) error { return nil })
	if err != nil || out != dedupe.Processed {
		t.Fatalf("retry = (%v, %v), want Processed", out, err)
	}
}

type failingDB struct{ dedupe.DB }

var errDown = errors.New("connection refused")

func (failingDB) Begin(context.Context) (pgx.Tx, error) { return nil, errDown }

func TestPostgresBeginFailureIsStoreError(t *testing.T) {
	s := dedupe.NewPostgres(failingDB{})
	called := false
	_, err := s.Process(context.Background(), rec("k"), func(context.Context) error { called = true; return nil })
	var se *dedupe.StoreError
	if !errors.As(err, &se) || se.Op != "begin" || !errors.Is(err, errDown) || called {
		t.Fatalf("err = %v (fn called %v), want *StoreError{Op: begin} wrapping the cause", err, called)
	}
}

func TestPostgresCancelledCtxDuringFn(t *testing.T) {
	s, db := newPostgres(t)
	t.Run("fn succeeds: work is still committed", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		out, err := s.Process(ctx, rec("ok"), func(ctx context.Context) error {
			cancel()
			return nil
		})
		if err != nil || out != dedupe.Processed {
			t.Fatalf("Process = (%v, %v), want Processed", out, err)
		}
		if n := count(t, db, "SELECT count(*) FROM idem_processed WHERE idempotency_key = 'ok'"); n != 1 {
			t.Fatalf("inbox rows = %d, want 1", n)
		}
	})
	t.Run("fn fails: rolled back cleanly", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		_, err := s.Process(ctx, rec("bad"), func(ctx context.Context) error {
			cancel()
			return ctx.Err()
		})
		if !errors.Is(err, context.Canceled) || isStoreError(err) {
			t.Fatalf("err = %v, want fn's context.Canceled", err)
		}
		// Had the transaction been left open, its row lock would block this retry.
		rctx, rcancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer rcancel()
		out, err := s.Process(rctx, rec("bad"), func(context.Context) error { return nil })
		if err != nil || out != dedupe.Processed {
			t.Fatalf("retry = (%v, %v), want Processed", out, err)
		}
	})
}
