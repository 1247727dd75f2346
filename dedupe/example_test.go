package dedupe_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/idemhq/idem/dedupe"
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

func TestStoreError(t *testing.T) {
	cause := errors.New("connection reset")
	err := fmt.Errorf("partition 3: %w", &dedupe.StoreError{Op: "commit", Err: cause})
	if !dedupe.IsStoreError(err) || !errors.Is(err, cause) {
		t.Fatalf("IsStoreError/Is failed for %v", err)
	}
	if got := err.Error(); got != "partition 3: dedupe: commit: connection reset" {
		t.Fatalf("message = %q", got)
	}
	if dedupe.IsStoreError(cause) || dedupe.IsStoreError(nil) {
		t.Fatal("IsStoreError true for a plain error")
	}
}

func TestTxContext(t *testing.T) {
	if dedupe.Tx(context.Background()) != nil {
		t.Fatal("Tx of a bare context is not nil")
	}
	if dedupe.Tx(dedupe.WithTx(context.Background(), nil)) != nil {
		t.Fatal("Tx after WithTx(nil) is not nil")
	}
}
