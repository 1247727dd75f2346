package dedupe_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/dedupe"
)

func TestLeaseStates(t *testing.T) {
	s, db := newLease(t, time.Minute)
	ctx := t.Context()
	insert := func(key, status, leaseUntil, owner string) {
		t.Helper()
		if _, err := db.Exec(ctx, `INSERT INTO idem_processed (consumer_group, idempotency_key, status, lease_until, lease_owner)
			VALUES ('payments', $1, $2, now() + $3::interval, $4)`, key, status, leaseUntil, owner); err != nil {
			t.Fatal(err)
		}
	}
	insert("crashed", "in_progress", "-1 second", "dead-member")
	insert("live", "in_progress", "1 hour", "other-member")
	insert("done", "done", "0", "")

	t.Run("expired claim is taken over", func(t *testing.T) {
		called := false
		out, err := s.Process(ctx, rec("crashed"), func(context.Context) error { called = true; return nil })
		if err != nil || out != dedupe.Processed || !called {
			t.Fatalf("Process = (%v, %v), called %v; want Processed", out, err, called)
		}
		if n := count(t, db, `SELECT count(*) FROM idem_processed WHERE idempotency_key = 'crashed'
			AND status = 'done' AND lease_owner IS NULL AND lease_until IS NULL AND "offset" = 7`); n != 1 {
			t.Fatal("taken-over key not marked done")
		}
	})
	t.Run("live claim is in progress", func(t *testing.T) {
		called := false
		out, err := s.Process(ctx, rec("live"), func(context.Context) error { called = true; return nil })
		if out != 0 || called || !errors.Is(err, dedupe.ErrInProgress) || !isStoreError(err) {
			t.Fatalf("Process = (%v, %v), called %v; want StoreError wrapping ErrInProgress", out, err, called)
		}
		if n := count(t, db, "SELECT count(*) FROM idem_processed WHERE idempotency_key = 'live' AND lease_owner = 'other-member'"); n != 1 {
			t.Fatal("live claim was disturbed")
		}
	})
	t.Run("done is duplicate", func(t *testing.T) {
		out, err := s.Process(ctx, rec("done"), func(context.Context) error { t.Fatal("fn called"); return nil })
		if err != nil || out != dedupe.Duplicate {
			t.Fatalf("Process = (%v, %v), want Duplicate", out, err)
		}
	})
}

func TestLeaseCrashedClaimExpires(t *testing.T) {
	s, db := newLease(t, 300*time.Millisecond)
	ctx := t.Context()
	// A member claims and "crashes": its claim stays behind.
	if _, err := db.Exec(ctx, `INSERT INTO idem_processed (consumer_group, idempotency_key, status, lease_until, lease_owner)
		VALUES ('payments', 'k', 'in_progress', now() + interval '300 milliseconds', 'crashed')`); err != nil {
		t.Fatal(err)
	}
	var out dedupe.Outcome
	var err error
	waitFor(t, "the crashed claim to expire", func() bool {
		out, err = s.Process(ctx, rec("k"), func(context.Context) error { return nil })
		return !errors.Is(err, dedupe.ErrInProgress)
	})
	if err != nil || out != dedupe.Processed {
		t.Fatalf("Process = (%v, %v), want Processed", out, err)
	}
}

func TestLeaseFnRunsWithoutTxUntilLeaseEnd(t *testing.T) {
	const lease = 2 * time.Minute
	s, db := newLease(t, lease)
	ctx := t.Context()
	before := time.Now()
	_, err := s.Process(ctx, rec("k"), func(ctx context.Context) error {
		if dedupe.HasTx(ctx) {
			t.Error("lease fn got a transaction")
		}
		dl, ok := ctx.Deadline()
		if !ok || dl.After(time.Now().Add(lease)) || dl.Before(before.Add(lease)) {
			t.Errorf("fn deadline = %v (set %v), want ~now+%v", dl, ok, lease)
		}
		// The claim is visible to others while fn runs.
		if n := count(t, db, `SELECT count(*) FROM idem_processed WHERE idempotency_key = 'k' AND status = 'in_progress'
			AND lease_until > now() + interval '1 minute' AND lease_owner <> ''`); n != 1 {
			t.Error("no live claim while fn runs")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestLeaseFailureReleasesClaim(t *testing.T) {
	s, db := newLease(t, time.Hour)
	ctx := t.Context()
	boom := errors.New("http 503")
	if _, err := s.Process(ctx, rec("k"), func(context.Context) error { return boom }); err != boom {
		t.Fatalf("err = %v, want fn's error unchanged", err)
	}
	if n := count(t, db, "SELECT count(*) FROM idem_processed"); n != 0 {
		t.Fatalf("claim not released: %d rows", n)
	}
	// Released at once: no need to wait for the hour-long lease.
	out, err := s.Process(ctx, rec("k"), func(context.Context) error { return nil })
	if err != nil || out != dedupe.Processed {
		t.Fatalf("retry = (%v, %v), want Processed", out, err)
	}
}

func TestLeaseLostAfterTakeover(t *testing.T) {
	s, db := newLease(t, time.Hour)
	ctx := t.Context()
	_, err := s.Process(ctx, rec("k"), func(ctx context.Context) error {
		// Another member took the key over (as after an expired lease).
		_, err := db.Exec(ctx, "UPDATE idem_processed SET lease_owner = 'thief' WHERE idempotency_key = 'k'")
		return err
	})
	if !errors.Is(err, dedupe.ErrLeaseLost) || !isStoreError(err) {
		t.Fatalf("err = %v, want StoreError wrapping ErrLeaseLost", err)
	}
	if n := count(t, db, "SELECT count(*) FROM idem_processed WHERE lease_owner = 'thief' AND status = 'in_progress'"); n != 1 {
		t.Fatal("the new owner's claim was disturbed")
	}
}

func TestLeaseCancelledCtxStillMarksDone(t *testing.T) {
	s, db := newLease(t, time.Minute)
	ctx, cancel := context.WithCancel(t.Context())
	out, err := s.Process(ctx, rec("k"), func(context.Context) error { cancel(); return nil })
	if err != nil || out != dedupe.Processed {
		t.Fatalf("Process = (%v, %v), want Processed", out, err)
	}
	if n := count(t, db, "SELECT count(*) FROM idem_processed WHERE status = 'done'"); n != 1 {
		t.Fatal("key not marked done")
	}
}

func TestLeaseNegativeIsConfigError(t *testing.T) {
	s := dedupe.NewPostgresLease(nil, -time.Second)
	if _, err := s.Process(context.Background(), rec("k"), nil); !errors.Is(err, dedupe.ErrInvalidConfig) || !isStoreError(err) {
		t.Fatalf("err = %v, want StoreError wrapping ErrInvalidConfig", err)
	}
	if err := s.Migrate(context.Background()); !errors.Is(err, dedupe.ErrInvalidConfig) {
		t.Fatalf("Migrate err = %v", err)
	}
}

// lostReplyDB runs every statement, but the first INSERT's reply is "lost":
// the claim is written, the caller sees a connection error.
type lostReplyDB struct {
	dedupe.DB
	lost bool
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

func (d *lostReplyDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	row := d.DB.QueryRow(ctx, sql, args...)
	if d.lost || !strings.HasPrefix(sql, "INSERT") {
		return row
	}
	d.lost = true
	var claimed bool
	if err := row.Scan(&claimed); err != nil {
		return errRow{err}
	}
	return errRow{errors.New("read tcp: connection reset by peer")}
}

func TestLeaseLostClaimReplyIsReclaimedByItsOwnMessage(t *testing.T) {
	_, pool := newLease(t, time.Hour)
	ctx := t.Context()
	s := dedupe.NewPostgresLease(&lostReplyDB{DB: pool}, time.Hour)

	r := rec("lost-reply")
	if _, err := s.Process(ctx, r, func(context.Context) error { t.Fatal("fn ran without a claim"); return nil }); !isStoreError(err) {
		t.Fatalf("first attempt: got %v, want a *StoreError (the claim's reply was lost)", err)
	}
	// Another message with the same key (a different offset) is held off by
	// the live claim...
	other := r
	other.Offset++
	if _, err := s.Process(ctx, other, func(context.Context) error { return nil }); !errors.Is(err, dedupe.ErrInProgress) {
		t.Fatalf("other message: got %v, want ErrInProgress", err)
	}
	// ...but the same message's next attempt takes its own claim back at once
	// instead of waiting an hour behind itself.
	called := false
	out, err := s.Process(ctx, r, func(context.Context) error { called = true; return nil })
	if err != nil || out != dedupe.Processed || !called {
		t.Fatalf("retry of the same message: out=%v err=%v called=%v, want Processed", out, err, called)
	}
}
