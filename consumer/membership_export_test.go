package consumer

import (
	"context"

	"github.com/IBM/sarama"
)

// WithSessionHook returns ctx carrying a hook that Run calls from every
// session's Setup, for the external tests: they follow the group generation
// of a member with it.
func WithSessionHook(ctx context.Context, f func(s sarama.ConsumerGroupSession)) context.Context {
	h := *hooks(ctx)
	h.session = f
	return context.WithValue(ctx, testHooksKey{}, &h)
}

// WithBeforeCommitHook returns ctx carrying a hook that the transaction owner
// of Run (Config.Transactions) calls after adding the offsets and before
// committing, with the number of records the transaction holds; an error it
// returns aborts the transaction.
func WithBeforeCommitHook(ctx context.Context, f func(records int) error) context.Context {
	h := *hooks(ctx)
	h.beforeCommit = f
	return context.WithValue(ctx, testHooksKey{}, &h)
}

// WithStartStepHook returns ctx carrying a hook that Run calls before each
// try of a start-up step that talks to the cluster or the database, with the
// step's name; an error it returns is that try's result (a test makes an
// outage at any step with it).
func WithStartStepHook(ctx context.Context, f func(what string) error) context.Context {
	h := *hooks(ctx)
	h.startStep = f
	return context.WithValue(ctx, testHooksKey{}, &h)
}

func hooks(ctx context.Context) *testHooks {
	if h := hooksOf(ctx); h != nil {
		return h
	}
	return &testHooks{}
}
