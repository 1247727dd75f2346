package keyorder_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/idemhq/idem/internal/keyorder"
)

// Two workers handling one key at once: of two Blocks by different messages,
// and of two Promotes of the same parked message, exactly one wins and the
// other gets ErrOtherHead; nothing is left half done.
func TestConcurrentHeadsOneWins(t *testing.T) {
	t.Parallel()
	s, ctx, _ := newStore(t, "g")
	for round := range 10 {
		key := []byte(fmt.Sprint("K", round))
		errs := race(func(i int) error { return s.Block(ctx, "t", key, fmt.Sprint("m", i)) })
		if won, lost := outcomes(t, errs); won != 1 || lost != 1 {
			t.Fatalf("round %d: Block: %d won, %d lost: %v", round, won, lost, errs)
		}
	}
	// Two drains of head h both read parked m2 and both try to promote it.
	if err := s.Block(ctx, "t", []byte("P"), "h"); err != nil {
		t.Fatal(err)
	}
	r := rec("m2", 2)
	r.Key = []byte("P")
	if st, err := s.Park(ctx, r); err != nil || st != keyorder.Blocked {
		t.Fatalf("Park = %v, %v", st, err)
	}
	next, _, err := s.Next(ctx, "t", []byte("P"), "h")
	if err != nil {
		t.Fatal(err)
	}
	next.Tier = 1
	errs := race(func(int) error { return s.Promote(ctx, "h", next) })
	if won, lost := outcomes(t, errs); won != 1 || lost != 1 {
		t.Fatalf("Promote: %d won, %d lost: %v", won, lost, errs)
	}
	if p, err := s.PendingOf(ctx, "t", 0); err != nil || len(p) != 1 || p[0].IdempotencyKey != "m2" {
		t.Fatalf("PendingOf = %+v, %v", p, err)
	}
}

// race runs f(0) and f(1) at once and returns their errors.
func race(f func(i int) error) []error {
	errs := make([]error, 2)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range errs {
		wg.Go(func() {
			<-start
			errs[i] = f(i)
		})
	}
	close(start)
	wg.Wait()
	return errs
}

func outcomes(t *testing.T, errs []error) (won, lost int) {
	t.Helper()
	for _, err := range errs {
		switch {
		case err == nil:
			won++
		case errors.Is(err, keyorder.ErrOtherHead):
			lost++
		default:
			t.Fatalf("unexpected error: %v", err)
		}
	}
	return won, lost
}
