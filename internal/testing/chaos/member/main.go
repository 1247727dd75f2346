// Command member is a member of the chaos harness's consumer group
// (internal/testing/tools/chaos builds and launches it): the reference service
// examples/payments-consumer, run through payments.Main, with the harness's
// hooks added. Besides the service's own flags it takes
//
//	-history FILE     append each handler call to FILE (JSON lines) and write
//	                  a chaos_effects row per success, in the message's transaction
//	-member NAME      this member's name in the history and the ledger
//	-fail-header H    a message with header H, value N, fails its first N
//	                  attempts with a retriable error (needs -history)
//
// Without -history it runs the service unchanged.
package main

import (
	"context"
	"flag"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/examples/payments-consumer/payments"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/testing/chaos/memberkit"
)

func main() {
	var o hookFlags
	payments.Main(payments.Hooks{Flags: o.register, Wrap: o.wrap})
}

// hookFlags are the member's own flags.
type hookFlags struct {
	history, member, failHeader string
}

func (o *hookFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&o.history, "history", "", "chaos hook: append each handler call to this JSON-lines file and write a chaos_effects row per success")
	fs.StringVar(&o.member, "member", "", "chaos hook: this member's name in the history and the ledger")
	fs.StringVar(&o.failHeader, "fail-header", "", "chaos hook (needs -history): a message with this header, value N, fails its first N attempts with a retriable error")
}

// wrap creates the ledger, opens the history and wraps the service's
// handler with the recorder (a batch handler in a batch handler); with no
// -history it returns it unchanged.
func (o *hookFlags) wrap(ctx context.Context, mode string, pool *pgxpool.Pool, h handler.Handler) (handler.Handler, func() error, error) {
	if o.history == "" {
		if o.failHeader != "" {
			return nil, nil, payments.UsageErrorf("-fail-header needs -history")
		}
		return h, nil, nil
	}
	if _, err := pool.Exec(ctx, memberkit.EffectsSchema); err != nil {
		return nil, nil, fmt.Errorf("chaos ledger: %w", err)
	}
	hl, err := memberkit.OpenHistory(o.history)
	if err != nil {
		return nil, nil, err
	}
	r := &recorder{member: o.member, mode: mode, failHeader: o.failHeader, log: hl}
	if bh, ok := h.(handler.BatchHandler); ok {
		return r.wrapBatch(bh), hl.Close, nil
	}
	return r.wrap(h), hl.Close, nil
}
