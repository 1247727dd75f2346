// Command member is a member of the chaos harness's consumer group
// (internal/tools/chaos builds and launches it): the reference service
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
// handlers with the recorder; with no -history it returns them unchanged.
func (o *hookFlags) wrap(ctx context.Context, mode string, pool *pgxpool.Pool, h handler.Handler, bh handler.BatchHandler) (handler.Handler, handler.BatchHandler, func() error, error) {
	if o.history == "" {
		if o.failHeader != "" {
			return nil, nil, nil, payments.UsageErrorf("-fail-header needs -history")
		}
		return h, bh, nil, nil
	}
	if _, err := pool.Exec(ctx, effectsSchema); err != nil {
		return nil, nil, nil, fmt.Errorf("chaos ledger: %w", err)
	}
	hl, err := openHistory(o.history)
	if err != nil {
		return nil, nil, nil, err
	}
	r := &recorder{member: o.member, mode: mode, failHeader: o.failHeader, log: hl}
	return r.wrap(h), r.wrapBatch(bh), hl.Close, nil
}
