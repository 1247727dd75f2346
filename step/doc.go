// Package step makes a handler's calls outside the database safe to retry:
// durable steps, recorded once per (message, step).
//
// idem's inbox makes the handler's own writes happen once: they commit in
// the inbox's transaction or not at all. A call to another service — a
// payment provider charging a card — is not in that transaction. When the
// handler fails after the call, or the process dies before its commit, the
// message is delivered again and the call would be made again. A step
// records the call's result in its own row, committed at once, so that the
// retry gets the result instead of a second charge:
//
//	// PSP is a payment service provider that honours idempotency keys.
//	type PSP interface {
//		Charge(ctx context.Context, idempotencyKey string, cents int64) (chargeID string, err error)
//	}
//
//	func payments(psp PSP) handler.Handler {
//		return handler.Func(func(ctx context.Context, m *handler.Message) error {
//			chargeID, err := step.Do(ctx, "charge", func(ctx context.Context) (string, error) {
//				// The key makes the provider drop a second call: the one case the
//				// step's row cannot cover is a crash between the call and the row.
//				return psp.Charge(ctx, step.Key(ctx, "charge"), 1250)
//			})
//			if err != nil {
//				return err
//			}
//			_, err = dedupe.Tx(ctx).Exec(ctx, `UPDATE orders SET charge_id = $1 WHERE id = $2`, chargeID, string(m.Key))
//			return err
//		})
//	}
//
// consumer.Run gives the handler's ctx what Do needs: the database of its
// PostgreSQL dedupe store, which holds the idem_steps table (idem.Migrate
// creates it), the consumer group and the message's idempotency key. A
// batch handler's ctx is the batch's: pass step.For(ctx, m) to Do for each
// message.
//
// # What is guaranteed
//
// For one (consumer group, idempotency key, step name):
//   - fn returned a result, and the row committed: every later Do —
//     a retry, a redelivery, a replay, another member — returns that result
//     without calling fn;
//   - fn failed permanently (handler.Permanent): recorded too; later calls
//     return a Permanent error with its text;
//   - fn failed otherwise: nothing is recorded; the retry calls fn again;
//   - the process died after fn's effect and before the row committed:
//     the retry calls fn again, with the same Key(ctx, name): a provider
//     that honours idempotency keys charges once.
//
// Rows are kept as long as the inbox keeps keys: consumer.Run's inbox
// sweeper deletes older ones with the inbox's retention
// (consumer.Config.Retention).
package step
