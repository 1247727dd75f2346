package payments

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemhq/idem/recovery"
)

// TestPaymentRules: the service's rule gives a bank timeout, as Charge
// returns it, bankTimeoutAttempts handler calls and leaves a 5xx to the
// fallback (the demo's Retry.Attempts: 2 calls).
func TestPaymentRules(t *testing.T) {
	p, err := recovery.New(recovery.Fallback{
		Attempts: 2,
		Backoff:  recovery.Backoff{Base: 20 * time.Millisecond, Max: 5 * time.Second},
		Retry:    demoRetry,
	}, paymentRules()...)
	if err != nil {
		t.Fatal(err)
	}
	timeout := fmt.Errorf("bank: no answer within %s: %w", 100*time.Millisecond, context.DeadlineExceeded)
	if d := p.Decide(fmt.Errorf("charge: %w", timeout)); d.Name != "bank-timeout" || d.Attempts != bankTimeoutAttempts {
		t.Errorf("a bank timeout: rule %q with %d attempts, want bank-timeout with %d", d.Name, d.Attempts, bankTimeoutAttempts)
	}
	if d := p.Decide(errors.New("bank: 503 Service Unavailable")); d.Name != "default" || d.Attempts != 2 {
		t.Errorf("a 5xx: rule %q with %d attempts, want the fallback's 2", d.Name, d.Attempts)
	}
}
