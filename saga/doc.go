// Package saga is a lean orchestrated saga (seed §7): ordered steps, each an
// action and a compensation; when a step fails, the steps done before it are
// compensated in reverse order.
//
// State lives in PostgreSQL (idem_saga, idem_saga_step; created by
// idem.Migrate), so a crashed orchestrator loses nothing: any orchestrator
// resumes the saga where the last committed step left it.
//
//	o, _ := saga.New(saga.Config{DB: pool}, saga.Definition{
//		Type: "order", Timeout: 10 * time.Minute,
//		Steps: []saga.Step{
//			{Name: "reserve", Action: reserve, Compensate: release},
//			{Name: "charge", Action: charge, Compensate: refund},
//			{Name: "ship", Action: ship},
//		},
//	})
//	o.Start(ctx, tx, "order", orderID, input) // in the handler's transaction
//	go o.Run(ctx)                               // drives due sagas
//
// # Exactly-once steps
//
// Each step runs in a transaction that holds the saga row's lock; the
// action's writes through Call.Tx and the record of its outcome commit
// together. A crash before that commit runs the step again, so an effect
// outside the database must be idempotent by Call.Key (SagaID/Step): the key
// goes to the service as its idempotency key, as everywhere in idem (seed
// §2). A step's effect therefore happens at most once.
//
// # Failures, retries, compensations
//
// An action's error is retried with full-jitter exponential backoff
// (Config.StepAttempts; an error wrapping handler.Permanent fails at once);
// then the step fails, its writes are rolled back, and the saga compensates.
// An error wrapping a breaker *OpenError (package breaker: a dependency is
// down) is not a failure: the saga waits for the breaker's RetryAfter.
// Compensations are retried until they succeed, with exponential backoff
// and jitter that grows with every failed call of that compensation (counted
// in the step's row, across Execute calls and processes) up to
// Config.CompensationBackoffMax (5 minutes by default): each Execute tries
// at most Config.CompensationAttempts times, then leaves the saga
// Compensating, due again at next_at, for RunDue.
//
// # Asynchronous steps
//
// A step may send a command instead of calling a service: the action
// enqueues it through Call.Tx (outbox.Enqueue, with Call.Key as the
// message's idempotency key) and returns ErrPending. The command and the
// step's pending state commit together; the saga is Waiting. The reply is
// consumed by an idem consumer whose handler calls Complete (or Fail) in
// its own transaction; the saga is then due and Run drives it on. The
// package knows nothing of Kafka or the outbox.
//
// # Correlation
//
// A saga keeps the correlation id of the ctx Start was called with
// (outbox.WithCorrelationID, or in an idem handler the consumed message's), or its own id when that ctx
// has none. Every action and compensation gets it in Call.CorrelationID and
// in its ctx, so a command it enqueues through the outbox carries it.
//
// # Deadline
//
// Definition.Timeout bounds a saga from Start: actions get a ctx with the
// deadline, and a saga still Running or Waiting past it compensates (a
// pending step included, as its command may have been acted on).
//
// # When not to use a saga
//
// Two or three simple steps rarely need one: one local transaction with an
// outbox message, or an idempotent handler that retries, is simpler and
// easier to operate.
package saga
