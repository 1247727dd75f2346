package dedupe_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/dedupe/dedupetest"
	"github.com/idemhq/idem/internal/testing/testenv"
)

const day = 24 * time.Hour

// dbNow reads the database's clock.
func dbNow(tb testing.TB, db *pgxpool.Pool) time.Time {
	tb.Helper()
	var now time.Time
	if err := db.QueryRow(tb.Context(), "SELECT now()").Scan(&now); err != nil {
		tb.Fatal(err)
	}
	return now
}

// partitioned makes a partitioned inbox in an empty schema of the test's
// own: converted as if at were the database's clock (zero: now), so with at
// ten days back the test has daily partitions for those ten days.
func partitioned(tb testing.TB, every time.Duration, at time.Time) (*dedupe.Postgres, *pgxpool.Pool, string) {
	tb.Helper()
	db, schema := testenv.PostgresSchema(tb)
	s := dedupe.NewPostgres(db, dedupe.WithPartitions(every))
	if at.IsZero() {
		if err := s.Migrate(tb.Context()); err != nil {
			tb.Fatal(err)
		}
	} else if err := dedupe.PartitionAt(tb.Context(), s, at); err != nil {
		tb.Fatal(err)
	}
	return s, db, schema
}

// partitionOf names the partition holding (group, key), "" when none does.
func partitionOf(tb testing.TB, db *pgxpool.Pool, group, key string) string {
	tb.Helper()
	var name string
	err := db.QueryRow(tb.Context(), `SELECT tableoid::regclass::text FROM idem_processed
		WHERE consumer_group = $1 AND idempotency_key = $2`, group, key).Scan(&name)
	if errors.Is(err, pgx.ErrNoRows) {
		return ""
	}
	if err != nil {
		tb.Fatal(err)
	}
	return name
}

// partitionNames lists the partitions of idem_processed, oldest first.
func partitionNames(tb testing.TB, db *pgxpool.Pool) []string {
	tb.Helper()
	rows, err := db.Query(tb.Context(), `SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = 'idem_processed'::regclass ORDER BY c.relname`)
	if err != nil {
		tb.Fatal(err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		tb.Fatal(err)
	}
	return names
}

func at(t time.Time) func() time.Time { return func() time.Time { return t } }

func nop(context.Context) error { return nil }

func TestWithPartitionsRejectsOtherWidths(t *testing.T) {
	for _, every := range []time.Duration{time.Hour, 48 * time.Hour, -day} {
		s := dedupe.NewPostgres(nil, dedupe.WithPartitions(every))
		if err := s.Migrate(context.Background()); !errors.Is(err, dedupe.ErrInvalidConfig) || !strings.Contains(err.Error(), "WithPartitions") {
			t.Errorf("WithPartitions(%v): Migrate err = %v, want ErrInvalidConfig naming WithPartitions", every, err)
		}
	}
}

func TestBoundaryAfter(t *testing.T) {
	wed := time.Date(2026, 3, 4, 13, 0, 0, 0, time.UTC) // a Wednesday
	for _, tt := range []struct {
		t     time.Time
		every time.Duration
		want  time.Time
	}{
		{wed, day, time.Date(2026, 3, 5, 0, 0, 0, 0, time.UTC)},
		{time.Date(2026, 3, 5, 0, 0, 0, 0, time.UTC), day, time.Date(2026, 3, 6, 0, 0, 0, 0, time.UTC)},
		{wed, 7 * day, time.Date(2026, 3, 9, 0, 0, 0, 0, time.UTC)},
		{time.Date(2026, 3, 9, 0, 0, 0, 0, time.UTC), 7 * day, time.Date(2026, 3, 16, 0, 0, 0, 0, time.UTC)},
		{time.Date(2026, 3, 8, 23, 59, 0, 0, time.UTC), 7 * day, time.Date(2026, 3, 9, 0, 0, 0, 0, time.UTC)},
		{wed.In(time.FixedZone("KST", 9*3600)), day, time.Date(2026, 3, 5, 0, 0, 0, 0, time.UTC)},
	} {
		if got := dedupe.BoundaryAfter(tt.t, tt.every); !got.Equal(tt.want) {
			t.Errorf("BoundaryAfter(%v, %v) = %v, want %v", tt.t, tt.every, got, tt.want)
		}
	}
}

func TestPartitionedConformance(t *testing.T) {
	for _, every := range []time.Duration{day, 7 * day} {
		t.Run(every.String(), func(t *testing.T) {
			dedupetest.Run(t, func(t *testing.T) dedupe.Store {
				s, _, _ := partitioned(t, every, time.Time{})
				return s
			})
		})
	}
	t.Run("lease", func(t *testing.T) {
		dedupetest.Run(t, func(t *testing.T) dedupe.Store {
			_, db, _ := partitioned(t, day, time.Time{})
			return dedupe.NewPostgresLease(db, 0, dedupe.WithPartitions(day))
		})
	})
}

// TestPartitionedMigrateFreshConcurrently: three members migrate an empty
// schema at once; the table is partitioned, with the partitions of the next
// two days made, and migrating again changes nothing.
func TestPartitionedMigrateFreshConcurrently(t *testing.T) {
	db, schema := testenv.PostgresSchema(t)
	ctx := t.Context()
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for _, p := range []*pgxpool.Pool{db, testenv.PoolOnSchema(t, schema), testenv.PoolOnSchema(t, schema)} {
		wg.Go(func() { errs <- dedupe.NewPostgres(p, dedupe.WithPartitions(day)).Migrate(ctx) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if k := count(t, db, "SELECT count(*) FROM pg_class WHERE oid = 'idem_processed'::regclass AND relkind = 'p'"); k != 1 {
		t.Fatal("idem_processed is not partitioned")
	}
	before := partitionNames(t, db)
	if err := dedupe.NewPostgres(db, dedupe.WithPartitions(day)).Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if after := partitionNames(t, db); strings.Join(after, ",") != strings.Join(before, ",") {
		t.Fatalf("migrating again changed the partitions: %v → %v", before, after)
	}
	// The plain table (empty) is the oldest partition, and the partitions
	// reach two days past now.
	if before[len(before)-1] != "idem_processed_plain" {
		t.Fatalf("partitions = %v, want idem_processed_plain among them", before)
	}
	if n := count(t, db, `SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = 'idem_processed'::regclass
		AND (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \(''([^'']*)''\)'))[1]::timestamptz >= now() + interval '2 days'`); n == 0 {
		t.Fatalf("no partition reaches two days ahead: %v", before)
	}
}

// TestPartitionedMigrationFromPlainWithRows converts a plain inbox holding
// rows: no row moves (the plain table's file becomes the oldest partition
// as it is), every old key stays a duplicate, and a member still configured
// without WithPartitions carries on against the partitioned table.
func TestPartitionedMigrationFromPlainWithRows(t *testing.T) {
	db, schema := testenv.PostgresSchema(t)
	ctx := t.Context()
	plain := dedupe.NewPostgres(db)
	if err := plain.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `INSERT INTO idem_processed (consumer_group, idempotency_key, processed_at)
		SELECT 'payments', 'old-' || i, now() - i * interval '1 hour' FROM generate_series(1, 2000) i`); err != nil {
		t.Fatal(err)
	}
	var file uint32
	if err := db.QueryRow(ctx, "SELECT relfilenode FROM pg_class WHERE oid = 'idem_processed'::regclass").Scan(&file); err != nil {
		t.Fatal(err)
	}

	if err := dedupe.NewPostgres(testenv.PoolOnSchema(t, schema), dedupe.WithPartitions(day)).Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	var moved uint32
	if err := db.QueryRow(ctx, "SELECT relfilenode FROM pg_class WHERE oid = 'idem_processed_plain'::regclass").Scan(&moved); err != nil {
		t.Fatal(err)
	}
	if moved != file {
		t.Fatalf("the plain table was rewritten (file %d → %d): rows moved", file, moved)
	}
	if n := count(t, db, "SELECT count(*) FROM idem_processed"); n != 2000 {
		t.Fatalf("rows after the conversion = %d, want 2000", n)
	}
	if got := partitionOf(t, db, "payments", "old-1999"); got != "idem_processed_plain" {
		t.Fatalf("old-1999 is in %q, want idem_processed_plain", got)
	}

	// plain still believes the table is plain (its first statement fails on
	// the partitioned one and it switches); a new store is configured.
	for _, s := range []*dedupe.Postgres{plain, dedupe.NewPostgres(db, dedupe.WithPartitions(day))} {
		out, err := s.Process(ctx, rec("old-7"), nop)
		if err != nil || out != dedupe.Duplicate {
			t.Fatalf("old key after the conversion: Process = (%v, %v), want Duplicate", out, err)
		}
	}
	out, err := plain.Process(ctx, rec("new"), nop)
	if err != nil || out != dedupe.Processed {
		t.Fatalf("new key: Process = (%v, %v), want Processed", out, err)
	}
	if out, err := plain.Process(ctx, rec("new"), nop); err != nil || out != dedupe.Duplicate {
		t.Fatalf("new key again: Process = (%v, %v), want Duplicate", out, err)
	}
	// Batches too, against the plain store that switched and a fresh one.
	recs := []dedupe.Record{rec("old-3"), rec("batch-1"), rec("new"), rec("batch-1")}
	outs, err := dedupe.NewPostgres(db).ProcessBatch(ctx, recs, func(context.Context, []int) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	if want := []dedupe.Outcome{dedupe.Duplicate, dedupe.Processed, dedupe.Duplicate, dedupe.Duplicate}; fmt.Sprint(outs) != fmt.Sprint(want) {
		t.Fatalf("batch outcomes = %v, want %v", outs, want)
	}
}

// TestPartitionedBoundaries: with daily partitions over the last ten days,
// a key seen yesterday (in yesterday's partition) is a duplicate today; a
// key whose partition the sweeper dropped is new again; a key in a
// partition the sweeper kept is not.
func TestPartitionedBoundaries(t *testing.T) {
	for _, kind := range []string{"Postgres", "PostgresLease"} {
		t.Run(kind, func(t *testing.T) {
			_, db, _ := partitioned(t, day, time.Now().Add(-10*day))
			ctx := t.Context()
			now := dbNow(t, db)
			store := func(clock time.Time) dedupe.Store {
				var s dedupe.Store = dedupe.NewPostgres(db, dedupe.WithPartitions(day))
				if kind == "PostgresLease" {
					s = dedupe.NewPostgresLease(db, 0, dedupe.WithPartitions(day))
				}
				dedupe.SetClock(s, at(clock))
				return s
			}
			process := func(clock time.Time, key string) dedupe.Outcome {
				t.Helper()
				out, err := store(clock).Process(ctx, rec(key), nop)
				if err != nil {
					t.Fatalf("Process(%s at %v): %v", key, clock, err)
				}
				return out
			}
			yesterday, old := now.Add(-day), now.Add(-5*day)
			if out := process(yesterday, "y"); out != dedupe.Processed {
				t.Fatalf("first y = %v", out)
			}
			if out := process(old, "o"); out != dedupe.Processed {
				t.Fatalf("first o = %v", out)
			}
			py, pt := partitionOf(t, db, "payments", "y"), "idem_processed_p"+now.UTC().Format("20060102")
			if py != "idem_processed_p"+yesterday.UTC().Format("20060102") {
				t.Fatalf("y is in %s, want yesterday's partition", py)
			}
			if out := process(now, "y"); out != dedupe.Duplicate {
				t.Fatalf("y today = %v, want Duplicate (it is in %s, today is %s)", out, py, pt)
			}
			if out := process(now, "o"); out != dedupe.Duplicate {
				t.Fatalf("o today = %v, want Duplicate", out)
			}
			// A batch across partitions too (Postgres only: the lease store
			// has no batches).
			if kind == "Postgres" {
				outs, err := store(now).(*dedupe.Postgres).ProcessBatch(ctx, []dedupe.Record{rec("o"), rec("t"), rec("y")},
					func(context.Context, []int) error { return nil })
				if err != nil || fmt.Sprint(outs) != fmt.Sprint([]dedupe.Outcome{dedupe.Duplicate, dedupe.Processed, dedupe.Duplicate}) {
					t.Fatalf("batch = (%v, %v)", outs, err)
				}
			}

			// Retention 3 days: the partitions ending before now − 3 days go,
			// o's among them; y's stays.
			before := partitionNames(t, db)
			sw := &dedupe.Sweeper{DB: db, Retention: 3 * day}
			if _, err := sw.SweepOnce(ctx); err != nil {
				t.Fatal(err)
			}
			after := partitionNames(t, db)
			if len(after) >= len(before) || partitionOf(t, db, "payments", "o") != "" {
				t.Fatalf("sweep left partitions %v (before %v) and o in %q", after, before, partitionOf(t, db, "payments", "o"))
			}
			for _, p := range after {
				if p == "idem_processed_plain" {
					t.Fatalf("the oldest partition (ending ~8 days ago) survived a 3-day retention: %v", after)
				}
			}
			if out := process(now, "o"); out != dedupe.Processed {
				t.Fatalf("o after its partition was dropped = %v, want Processed (new again)", out)
			}
			if out := process(now, "y"); out != dedupe.Duplicate {
				t.Fatalf("y after the sweep = %v, want Duplicate", out)
			}
		})
	}
}

// TestPartitionedConcurrencyAtBoundary: two members process one key at the
// same moment, one's row bound for the partition before midnight and the
// other's for the one after, so no index can see both. The second waits on
// the key's lock (seen in pg_stat_activity) until the first ends: a commit
// makes it a Duplicate, a rollback lets it process. Exactly one effect.
func TestPartitionedConcurrencyAtBoundary(t *testing.T) {
	for _, firstFails := range []bool{false, true} {
		t.Run(fmt.Sprintf("firstFails=%v", firstFails), func(t *testing.T) {
			_, db, schema := partitioned(t, day, time.Now().Add(-3*day))
			ctx := t.Context()
			if _, err := db.Exec(ctx, "CREATE TABLE effects (key text)"); err != nil {
				t.Fatal(err)
			}
			midnight := dedupe.BoundaryAfter(dbNow(t, db).Add(-day), day)
			a := dedupe.NewPostgres(db, dedupe.WithPartitions(day))
			b := dedupe.NewPostgres(testenv.PoolOnSchema(t, schema), dedupe.WithPartitions(day))
			dedupe.SetClock(a, at(midnight.Add(-time.Microsecond)))
			dedupe.SetClock(b, at(midnight))
			effect := func(ctx context.Context) error {
				_, err := dedupe.Tx(ctx).Exec(ctx, "INSERT INTO effects VALUES ('k')")
				return err
			}
			var outB dedupe.Outcome
			var errB error
			bDone := make(chan struct{})
			boom := errors.New("first member failed")
			outA, errA := a.Process(ctx, rec("k"), func(ctx context.Context) error {
				if err := effect(ctx); err != nil {
					return err
				}
				go func() {
					defer close(bDone)
					outB, errB = b.Process(t.Context(), rec("k"), effect)
				}()
				waitFor(t, "the second member to wait on the key's lock", func() bool {
					select {
					case <-bDone:
						t.Errorf("the second member finished while the first held the key: (%v, %v)", outB, errB)
						return true
					default:
					}
					return count(t, db, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND wait_event = 'advisory'
						AND query LIKE '%pg_advisory_xact_lock%'`) > 0
				})
				if firstFails {
					return boom
				}
				return nil
			})
			<-bDone
			if firstFails {
				if errA != boom || errB != nil || outB != dedupe.Processed {
					t.Fatalf("first = (%v, %v), second = (%v, %v); want fn's error, then Processed", outA, errA, outB, errB)
				}
			} else if errA != nil || outA != dedupe.Processed || errB != nil || outB != dedupe.Duplicate {
				t.Fatalf("first = (%v, %v), second = (%v, %v); want Processed, then Duplicate", outA, errA, outB, errB)
			}
			if n := count(t, db, "SELECT count(*) FROM effects"); n != 1 {
				t.Fatalf("effects = %d, want exactly 1", n)
			}
			want := "idem_processed_p" + midnight.Add(-time.Microsecond).UTC().Format("20060102")
			if firstFails {
				want = "idem_processed_p" + midnight.UTC().Format("20060102")
			}
			if got := partitionOf(t, db, "payments", "k"); got != want {
				t.Fatalf("k is in %s, want %s", got, want)
			}
		})
	}
}

// TestPartitionedManyMembersAtBoundary: five members (pools of their own)
// process the same 60 keys at once, each message's row drawn on either side
// of midnight: two one message at a time, one in batches of three, in group
// payments; two lease stores in group leased, retrying a key another holds
// (ErrInProgress) as the consumer would. Every key of each group has
// exactly one effect and one inbox row.
func TestPartitionedManyMembersAtBoundary(t *testing.T) {
	_, db, schema := partitioned(t, day, time.Now().Add(-3*day))
	ctx := t.Context()
	if _, err := db.Exec(ctx, "CREATE TABLE effects (key text)"); err != nil {
		t.Fatal(err)
	}
	midnight := dedupe.BoundaryAfter(dbNow(t, db).Add(-day), day)
	const keys = 60
	var wg sync.WaitGroup
	start := make(chan struct{})
	for m := range 5 {
		pool := testenv.PoolOnSchema(t, schema)
		rnd := rand.New(rand.NewPCG(uint64(m), 7))
		var mu sync.Mutex
		clock := func() time.Time {
			mu.Lock()
			defer mu.Unlock()
			return midnight.Add(time.Duration(rnd.IntN(2000)-1000) * time.Microsecond)
		}
		p := dedupe.NewPostgres(pool, dedupe.WithPartitions(day))
		l := dedupe.NewPostgresLease(pool, 0, dedupe.WithPartitions(day))
		dedupe.SetClock(p, clock)
		dedupe.SetClock(l, clock)
		effect := func(ctx context.Context, db interface {
			Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
		}, r dedupe.Record) error {
			_, err := db.Exec(ctx, "INSERT INTO effects VALUES ($1)", r.Group+":"+r.Key)
			return err
		}
		wg.Go(func() {
			<-start
			for i := range keys {
				r := rec(fmt.Sprint("k", (i+m*7)%keys))
				var err error
				switch m {
				case 0, 1: // one at a time
					_, err = p.Process(ctx, r, func(ctx context.Context) error { return effect(ctx, dedupe.Tx(ctx), r) })
				case 2: // batches of three keys
					if i%3 != 0 {
						continue
					}
					rs := []dedupe.Record{r, rec(fmt.Sprint("k", (i+m*7+1)%keys)), rec(fmt.Sprint("k", (i+m*7+2)%keys))}
					_, err = p.ProcessBatch(ctx, rs, func(ctx context.Context, fresh []int) error {
						for _, j := range fresh {
							if err := effect(ctx, dedupe.Tx(ctx), rs[j]); err != nil {
								return err
							}
						}
						return nil
					})
				default: // lease stores, group leased
					r.Group = "leased"
					for {
						_, err = l.Process(ctx, r, func(ctx context.Context) error { return effect(ctx, pool, r) })
						if !errors.Is(err, dedupe.ErrInProgress) {
							break
						}
					}
				}
				if err != nil {
					t.Error(err)
				}
			}
		})
	}
	close(start)
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	if n := count(t, db, "SELECT count(*) FROM (SELECT key FROM effects GROUP BY key HAVING count(*) > 1) d"); n != 0 {
		t.Fatalf("%d keys have more than one effect", n)
	}
	if n := count(t, db, "SELECT count(DISTINCT key) FROM effects"); n != 2*keys {
		t.Fatalf("keys with an effect = %d, want %d", n, 2*keys)
	}
	if n := count(t, db, "SELECT count(*) FROM idem_processed WHERE status = 'done'"); n != 2*keys {
		t.Fatalf("inbox rows = %d, want %d (one per key and group)", n, 2*keys)
	}
	if n := count(t, db, "SELECT count(DISTINCT tableoid) FROM idem_processed"); n != 2 {
		t.Fatalf("the rows fill %d partitions, want both sides of midnight", n)
	}
}

// TestPartitionedMissingPartitionIsMade: when the partitions ahead are gone
// (nobody swept for days), a store makes the one it needs and records the
// key; the sweeper makes the ones ahead again.
func TestPartitionedMissingPartitionIsMade(t *testing.T) {
	s, db, _ := partitioned(t, day, time.Time{})
	ctx := t.Context()
	for _, p := range partitionNames(t, db) {
		if p != "idem_processed_plain" {
			if _, err := db.Exec(ctx, "DROP TABLE "+pgx.Identifier{p}.Sanitize()); err != nil {
				t.Fatal(err)
			}
		}
	}
	tomorrow := dbNow(t, db).Add(2 * day)
	dedupe.SetClock(s, at(tomorrow))
	if out, err := s.Process(ctx, rec("k"), nop); err != nil || out != dedupe.Processed {
		t.Fatalf("Process with no partition for its row = (%v, %v), want Processed", out, err)
	}
	if got, want := partitionOf(t, db, "payments", "k"), "idem_processed_p"+tomorrow.UTC().Format("20060102"); got != want {
		t.Fatalf("k is in %q, want %q", got, want)
	}
	// Drop what is ahead again: the sweeper makes it.
	for _, p := range partitionNames(t, db) {
		if p != "idem_processed_plain" && partitionOf(t, db, "payments", "k") != p {
			if _, err := db.Exec(ctx, "DROP TABLE "+pgx.Identifier{p}.Sanitize()); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := db.Exec(ctx, "DROP TABLE "+pgx.Identifier{partitionOf(t, db, "payments", "k")}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	if _, err := (&dedupe.Sweeper{DB: db}).SweepOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if n := count(t, db, `SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = 'idem_processed'::regclass
		AND (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \(''([^'']*)''\)'))[1]::timestamptz >= now() + interval '2 days'`); n != 1 {
		t.Fatalf("after a sweep: partitions %v, want them to reach two days ahead", partitionNames(t, db))
	}
}

// TestSweeperOnBothLayouts: the same Sweeper deletes old rows of a plain
// inbox and drops old partitions of a partitioned one, and keeps recent
// keys in both.
func TestSweeperOnBothLayouts(t *testing.T) {
	for _, layout := range []string{"plain", "partitioned"} {
		t.Run(layout, func(t *testing.T) {
			var db *pgxpool.Pool
			if layout == "plain" {
				_, db = newPostgres(t)
			} else {
				_, db, _ = partitioned(t, day, time.Now().Add(-20*day))
			}
			ctx := t.Context()
			if _, err := db.Exec(ctx, `INSERT INTO idem_processed (consumer_group, idempotency_key, processed_at)
				SELECT 'g', 'k' || i, now() - i * interval '1 hour' FROM generate_series(0, 18 * 24) i`); err != nil {
				t.Fatal(err)
			}
			var tuples int64
			_, _ = db.Exec(ctx, "ANALYZE idem_processed")
			n, err := (&dedupe.Sweeper{DB: db, Retention: 14 * day}).SweepOnce(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := db.QueryRow(ctx, "SELECT count(*) FROM idem_processed WHERE processed_at < now() - interval '15 days'").Scan(&tuples); err != nil {
				t.Fatal(err)
			}
			if tuples != 0 {
				t.Fatalf("%d rows older than 15 days left (sweep reported %d)", tuples, n)
			}
			if k := count(t, db, "SELECT count(*) FROM idem_processed WHERE processed_at > now() - interval '14 days'"); k != 14*24 {
				t.Fatalf("rows within the retention = %d, want %d", k, 14*24)
			}
			if n < 3*24 {
				t.Fatalf("sweep reported %d rows, want about 4 days of hourly rows", n)
			}
		})
	}
}
