package handler

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// Batch returns a Handler that consumer.Run runs as a batch handler: fn
// gets several new messages of one partition at once, so that it can write
// them with one statement (a pgx.Batch, CopyFrom, an unnest INSERT). A
// batch handler batches by default: Config.Batch.MaxMessages, left 0, is 500
// with it (and 0, off, with any other handler); set it to 1 for one message
// per transaction. Batch(nil) returns nil.
//
// The contract is Handler's, per batch: fn is called from one goroutine per
// partition (per lane with Config.Concurrency), msgs are in offset order and
// are all new (duplicates were filtered out by the inbox before the call);
// ctx carries the batch's transaction (dedupe.Tx) and is cancelled as
// Handler's is: only once the consumer's ShutdownGrace after a revoke or a
// shutdown has run out. msgs and the messages must not be used after fn
// returns.
//
// Returning nil commits the inbox rows and every write of the batch at once.
// Any error fails the whole batch: it is rolled back, and then each of its
// messages runs alone, as a batch of one in its own transaction, in offset
// order, so nothing after a failing message commits before that message's
// own outcome. A *BatchError names the messages that failed and how: each
// named error counts as that message's first attempt, which then takes the
// per-message failure path (in-process retries with a batch of one, retry
// tiers, the DLQ; a Permanent error goes to the DLQ without running again);
// the messages it does not name run alone as usual. With any other error,
// every message runs alone, so only the failing ones take the failure path.
//
// Its Handle method passes one message as a batch of one and unpacks a
// *BatchError naming it into its own error. A *BatchError that does not name
// the message (it is empty, or names a copy or a message the batch was not
// given) is a failure of the message, not a success: Handle returns an error
// wrapping the *BatchError, so the message takes the failure path instead of
// being recorded with no effect.
func Batch(fn func(ctx context.Context, msgs []*Message) error) Handler {
	if fn == nil {
		return nil
	}
	return batch(fn)
}

// BatchHandler is what consumer.Run looks for in its Handler to run it as a
// batch handler; Batch's Handler is one. HandleBatch has the contract Batch
// describes, and Handle handles one message as a batch of one.
type BatchHandler interface {
	Handler
	HandleBatch(ctx context.Context, msgs []*Message) error
}

// batch is Batch's Handler.
type batch func(ctx context.Context, msgs []*Message) error

// HandleBatch calls b(ctx, msgs).
func (b batch) HandleBatch(ctx context.Context, msgs []*Message) error { return b(ctx, msgs) }

// Handle calls b with m alone; see Batch.
func (b batch) Handle(ctx context.Context, m *Message) error {
	err := b(ctx, []*Message{m})
	var be *BatchError
	if errors.As(err, &be) {
		for _, f := range be.Failed {
			if f.Message == m {
				return f.Err
			}
		}
		return fmt.Errorf("handler: the batch handler's *BatchError names none of the messages it was given (offset %d): %w", m.Offset, err)
	}
	return err
}

var _ BatchHandler = batch(nil)

// MessageError is the failure of one message of a batch.
type MessageError struct {
	Message *Message // one of the messages HandleBatch was given
	Err     error    // classified like a Handler's error (Permanent, RetryAfter, …)
}

// BatchError is returned by a batch handler (Batch) when only some messages of the
// batch failed. Messages it does not name are treated as handled, provided
// it names at least one message of the batch, by the very pointer the
// handler was given: a *BatchError that names none of them (empty, or only
// copies) fails the whole batch like any other error, and each message then
// runs alone, where the same *BatchError fails that message (see Batch).
type BatchError struct {
	Failed []MessageError
}

// Add records that m failed with err and returns e, for chaining.
func (e *BatchError) Add(m *Message, err error) *BatchError {
	e.Failed = append(e.Failed, MessageError{Message: m, Err: err})
	return e
}

// Error describes the failures in one line.
func (e *BatchError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "handler: %d message(s) of the batch failed", len(e.Failed))
	for i, f := range e.Failed {
		if i == 3 {
			fmt.Fprintf(&b, "; …")
			break
		}
		fmt.Fprintf(&b, "; offset %d: %v", f.Message.Offset, f.Err)
	}
	return b.String()
}

// Unwrap returns the failures' errors, so errors.Is/As see through it.
func (e *BatchError) Unwrap() []error {
	errs := make([]error, len(e.Failed))
	for i, f := range e.Failed {
		errs[i] = f.Err
	}
	return errs
}
