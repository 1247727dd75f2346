package payments

import (
	"context"

	"github.com/idemhq/idem/recovery"
)

// paymentRules is the service's recoverability policy (Config.Retry.Rules): a bank
// call that timed out gets more in-process attempts than other failures. A
// timeout says the bank is slow, not that the payment is wrong, and the bank
// charges once per idempotency key, so trying again soon is safe and usually
// succeeds; a 5xx or a validation error keeps Config.Retry's attempts and the retry
// tiers (the rules' fallback), and a permanent error still goes to the DLQ at
// once. (Rules may also send a failure to a ladder or a dead-letter topic of
// its own, e.g. fraud declines to payments.dlq.fraud: see package recovery.)
func paymentRules() []recovery.Rule {
	return []recovery.Rule{{
		Name:     "bank-timeout",
		Match:    recovery.Is(context.DeadlineExceeded), // bankClient.Charge wraps it: "bank: no answer within …"
		Attempts: bankTimeoutAttempts,
	}}
}

// bankTimeoutAttempts is the handler calls a delivery whose bank call timed
// out gets (the demo's fallback gives 2, serve's 4).
const bankTimeoutAttempts = 6
