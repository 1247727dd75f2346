package dedupe

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Record identifies the message whose outcome is being recorded. Group and
// Key together are the idempotency key: Process runs its function at most once
// successfully per (Group, Key). Topic, Partition and Offset are stored for
// operators (where did this key first succeed?) and play no part in
// de-duplication.
type Record struct {
	// Group is the Kafka consumer group; the same key in two groups is two
	// independent keys. Must not be empty.
	Group string
	// Key is the message's idempotency key. Must not be empty.
	Key string
	// Topic, Partition and Offset locate the message, for diagnostics only.
	Topic     string
	Partition int32
	Offset    int64
	// Epoch is the replay epoch the message is handled under: a re-drive's
	// (`idem redrive`, the console's Re-drive) for a record inside its
	// window, 0 otherwise. The key is a new one in each epoch: a key whose
	// outcome was recorded under epoch 0 runs again, once, under epoch 3,
	// and a second delivery under epoch 3 is a Duplicate. The inbox stores
	// such a key as Key + "\x1fepoch " + Epoch (Record.InboxKey); epoch 0 stores
	// Key unchanged, as before epochs existed. A Store of your own must key
	// on rec.InboxKey(), not rec.Key (the conformance suite checks it): one
	// that ignores Epoch makes every re-driven record a Duplicate, so a
	// re-drive does nothing. Negative is invalid (ErrInvalidRecord).
	// Default: 0.
	Epoch int64
}

// Outcome is the final result of a successful Process call.
type Outcome int

const (
	// Processed means fn ran and returned nil, and its outcome is recorded.
	Processed Outcome = iota + 1
	// Duplicate means the key already had a recorded outcome; fn was not called.
	Duplicate
)

// String returns "processed", "duplicate", or "Outcome(n)" for other values.
func (o Outcome) String() string {
	switch o {
	case Processed:
		return "processed"
	case Duplicate:
		return "duplicate"
	default:
		return fmt.Sprintf("Outcome(%d)", int(o))
	}
}

// Store records which idempotency keys have had their effects.
//
// Implementations must be safe for concurrent use by multiple goroutines, and
// must pass the conformance suite in package dedupetest. Methods may be added
// to this interface only in a major version.
type Store interface {
	// Process runs fn at most once successfully per (rec.Group, rec.Key):
	//
	//   - If the key already has a recorded outcome, Process returns
	//     (Duplicate, nil) without calling fn.
	//   - Otherwise it calls fn. If fn returns nil the key is recorded and
	//     Process returns (Processed, nil).
	//   - If fn returns an error nothing is recorded, so a later delivery runs
	//     fn again, and Process returns (0, err) with fn's error unchanged
	//     (callers classify it with errors.Is / errors.As).
	//   - If fn panics nothing is recorded and the panic propagates.
	//   - If the store itself fails (connection, begin, insert, commit) or ctx
	//     is already done, Process returns (0, *StoreError); whether fn's
	//     effects happened may be unknown, and the message must be retried,
	//     not dead-lettered.
	//   - An empty rec.Group or rec.Key returns an error wrapping
	//     ErrInvalidRecord without calling fn.
	//
	// Concurrent calls for the same key result in at most one Processed; the
	// others return Duplicate, or a retriable *StoreError (such as
	// ErrInProgress) while the first is still running.
	//
	// fn receives a context derived from ctx. Stores that run fn inside a
	// database transaction make it available through Tx(ctx).
	Process(ctx context.Context, rec Record, fn func(ctx context.Context) error) (Outcome, error)
}

// DB is what the PostgreSQL stores and the Sweeper need from a database
// handle. *pgxpool.Pool satisfies it and is the intended choice; *pgx.Conn
// does too, but is not safe for concurrent use, so a store built on one is not
// either.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

type txKey struct{}

// Tx returns the transaction the store opened for the message being
// processed. Writes made through it commit atomically with the inbox row, and
// are rolled back with it when fn returns an error. fn must neither commit nor
// roll it back.
//
// Tx never returns nil. When ctx carries no transaction (the store is Memory
// or PostgresLease, say in a test that forgot idemtest.WithPostgres, or ctx
// is not the handler's), it returns a pgx.Tx whose every method fails with
// an error marked handler.Permanent that names the store to configure; the
// handler returns it and the message is dead-lettered with that reason
// instead of a nil-pointer panic. Code that serves both kinds of store asks
// HasTx first.
func Tx(ctx context.Context) pgx.Tx {
	if tx, ok := ctx.Value(txKey{}).(pgx.Tx); ok && tx != nil {
		return tx
	}
	return noTx{}
}

// HasTx reports whether ctx carries a store's transaction, that is whether
// Tx(ctx) is a real transaction rather than one whose every method fails.
func HasTx(ctx context.Context) bool {
	tx, ok := ctx.Value(txKey{}).(pgx.Tx)
	return ok && tx != nil
}

// WithTx returns a copy of ctx carrying tx, retrievable with Tx. Stores call
// it; tests may use it to run a handler against their own transaction.
func WithTx(ctx context.Context, tx pgx.Tx) context.Context {
	return context.WithValue(ctx, txKey{}, tx)
}

// StoreError reports a failure of the store itself — begin, insert, commit,
// a lost connection, a live claim held by another member — as opposed to an
// error returned by the handler. It is retriable: the message was not recorded
// (or its outcome is unknown), and redelivering it is safe because the store
// turns a second successful run into a Duplicate. Test for it with
// errors.AsType[*dedupe.StoreError](err) (or errors.As).
type StoreError struct {
	// Op names the failed step: "begin", "insert", "commit", "claim", "complete", "config"…
	Op string
	// Err is the underlying error.
	Err error
}

// Error implements error.
func (e *StoreError) Error() string {
	return "dedupe: " + e.Op + ": " + e.Err.Error()
}

// Unwrap returns e.Err.
func (e *StoreError) Unwrap() error { return e.Err }

var (
	// ErrInProgress is returned (wrapped in a *StoreError) by
	// PostgresLease.Process when another member holds a live claim on the
	// key. It is retriable: retry after a delay; once the holder finishes the
	// retry sees Duplicate, and if the holder died the claim expires with its
	// lease.
	ErrInProgress = errors.New("dedupe: key is being processed by another member")

	// ErrInvalidRecord is wrapped by the error Process returns, without
	// calling fn, when rec.Group or rec.Key is empty. It is not a
	// *StoreError: retrying cannot fix it.
	ErrInvalidRecord = errors.New("dedupe: invalid record")

	// errLeaseLost is wrapped (in a *StoreError) by PostgresLease.Process
	// when fn succeeded but its claim had meanwhile expired and been taken
	// over by another member, so this member could not mark the key done.
	// The effect may happen twice; retrying the message is safe and will
	// normally see Duplicate. Like every *StoreError, it means "retry".
	errLeaseLost = errors.New("dedupe: lease expired and was taken over before the key was marked done")

	// errTxAborted is wrapped by the error Postgres.Process returns when fn
	// returned nil but the transaction could not commit because of fn; the
	// error also wraps pgx.ErrTxCommitRollback or pgx.ErrTxClosed, which
	// say which (see Postgres.Process).
	errTxAborted = errors.New("dedupe: handler returned nil but its transaction did not commit")
)

func checkRecord(rec Record) error {
	switch {
	case rec.Group == "":
		return fmt.Errorf("%w: empty Group (key %q)", ErrInvalidRecord, rec.Key)
	case rec.Key == "":
		return fmt.Errorf("%w: empty idempotency Key (group %q, %s/%d@%d)", ErrInvalidRecord, rec.Group, rec.Topic, rec.Partition, rec.Offset)
	case rec.Epoch < 0:
		return fmt.Errorf("%w: negative Epoch %d (group %q, key %q)", ErrInvalidRecord, rec.Epoch, rec.Group, rec.Key)
	}
	return nil
}

// epochSep separates a key from its epoch in the inbox (Record.InboxKey): the
// ASCII unit separator, which a key derived from a header or a JSON field
// practically never holds.
const epochSep = "\x1fepoch "

// InboxKey is the key the inbox records for rec: rec.Key under epoch 0,
// else rec.Key + "\x1fepoch " + rec.Epoch, so that each replay epoch (see
// Record.Epoch) is a key space of its own.
func (rec Record) InboxKey() string {
	if rec.Epoch == 0 {
		return rec.Key
	}
	return rec.Key + epochSep + strconv.FormatInt(rec.Epoch, 10)
}

// stored checks rec and returns it as the inbox records it: its Key is
// rec.InboxKey() and its Epoch 0. Every store of this package takes its
// records through it (or storedAll), so the rest of their code never sees
// an epoch.
func stored(rec Record) (Record, error) {
	if err := checkRecord(rec); err != nil {
		return rec, err
	}
	rec.Key, rec.Epoch = rec.InboxKey(), 0
	return rec, nil
}

// storedAll is stored for a batch; recs is copied only when one of them
// has an epoch.
func storedAll(recs []Record) ([]Record, error) {
	var out []Record
	for i, r := range recs {
		s, err := stored(r)
		if err != nil {
			return nil, err
		}
		if r.Epoch != 0 && out == nil {
			out = slices.Clone(recs)
		}
		if out != nil {
			out[i] = s
		}
	}
	if out == nil {
		return recs, nil
	}
	return out, nil
}
