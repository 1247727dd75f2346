package dedupe_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
)

// A redelivered message is a Duplicate, and a failed attempt is not recorded.
func ExampleMemory() {
	ctx := context.Background()
	store := dedupe.NewMemory()
	rec := dedupe.Record{Group: "payments", Key: "order-42", Topic: "payments", Partition: 0, Offset: 7}
	charge := func(fail bool) func(context.Context) error {
		return func(context.Context) error {
			if fail {
				return errors.New("card service unavailable")
			}
			fmt.Println("charged order-42")
			return nil
		}
	}

	_, err := store.Process(ctx, rec, charge(true))
	fmt.Println("first attempt:", err)
	out, _ := store.Process(ctx, rec, charge(false))
	fmt.Println("retry:", out)
	out, _ = store.Process(ctx, rec, charge(false))
	fmt.Println("redelivery:", out)
	// Output:
	// first attempt: card service unavailable
	// charged order-42
	// retry: processed
	// redelivery: duplicate
}

func TestOutcomeString(t *testing.T) {
	for o, want := range map[dedupe.Outcome]string{dedupe.Processed: "processed", dedupe.Duplicate: "duplicate", 0: "Outcome(0)"} {
		if got := o.String(); got != want {
			t.Errorf("Outcome(%d).String() = %q, want %q", int(o), got, want)
		}
	}
}

// isStoreError reports whether err is, or wraps, a *dedupe.StoreError, as
// a caller tests for one.
func isStoreError(err error) bool {
	_, ok := errors.AsType[*dedupe.StoreError](err)
	return ok
}

func TestStoreError(t *testing.T) {
	cause := errors.New("connection reset")
	err := fmt.Errorf("partition 3: %w", &dedupe.StoreError{Op: "commit", Err: cause})
	if !isStoreError(err) || !errors.Is(err, cause) {
		t.Fatalf("AsType/Is failed for %v", err)
	}
	if got := err.Error(); got != "partition 3: dedupe: commit: connection reset" {
		t.Fatalf("message = %q", got)
	}
	if isStoreError(cause) || isStoreError(nil) {
		t.Fatal("AsType true for a plain error")
	}
}

// TestTxContext: without a transaction in ctx, Tx is not nil but fails
// every call with the same permanent error that names the store to
// configure, and HasTx says there is none.
func TestTxContext(t *testing.T) {
	ctx := context.Background()
	for name, c := range map[string]context.Context{"bare": ctx, "WithTx(nil)": dedupe.WithTx(ctx, nil)} {
		if dedupe.HasTx(c) {
			t.Errorf("%s: HasTx is true", name)
		}
		tx := dedupe.Tx(c)
		if tx == nil {
			t.Fatalf("%s: Tx is nil", name)
		}
		_, execErr := tx.Exec(c, "SELECT 1")
		_, queryErr := tx.Query(c, "SELECT 1")
		var n int
		scanErr := tx.QueryRow(c, "SELECT 1").Scan(&n)
		_, batchErr := tx.SendBatch(c, &pgx.Batch{}).Exec()
		for _, err := range []error{execErr, queryErr, scanErr, batchErr, tx.Commit(c)} {
			if !errors.Is(err, dedupe.ErrNoTx) || !handler.IsPermanent(err) || !strings.Contains(err.Error(), "dedupe.NewPostgres") {
				t.Errorf("%s: error %v: want the permanent no-transaction error naming dedupe.NewPostgres", name, err)
			}
		}
	}
}
