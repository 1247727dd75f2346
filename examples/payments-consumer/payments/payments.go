package payments

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync/atomic"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/step"
)

// Payment is the event on the payments topic:
//
//	{"idempotency_key":"…","order_id":"…","amount":"12.34","currency":"KRW"}
//
// Amount is decimal text (a JSON string, or a bare JSON number whose literal
// text is kept): money never goes through a float.
type Payment struct {
	IdempotencyKey string `json:"idempotency_key"`
	OrderID        string `json:"order_id"`
	Amount         Amount `json:"amount"`
	Currency       string `json:"currency"`
}

// Amount is a decimal amount kept as its text, e.g. "12.34".
type Amount string

// UnmarshalJSON accepts "12.34" and 12.34, keeping the digits as written.
func (a *Amount) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		*a = Amount(strings.TrimSpace(s))
		return nil
	}
	if len(b) > 0 && (b[0] == '-' || b[0] >= '0' && b[0] <= '9') {
		*a = Amount(b) // a JSON number literal: its exact text
		return nil
	}
	return fmt.Errorf("amount must be a decimal string or number, got %s", b)
}

// amountRE is a plain decimal: optional sign, up to 18 integer digits, up to 6
// fraction digits. No exponent, no thousands separators.
var amountRE = regexp.MustCompile(`^-?[0-9]{1,18}(\.[0-9]{1,6})?$`)

// currencies the service accepts.
var currencies = map[string]bool{"KRW": true, "USD": true, "EUR": true, "JPY": true}

// errNoTx means Config.Dedupe is not the transactional PostgreSQL inbox.
var errNoTx = errors.New("no transaction in the handler's context: Config.Dedupe must be dedupe.NewPostgres(pool)")

// decodePayment parses a payment event. A syntax error is a decode error
// (the bytes will never parse); the caller validates the fields.
func decodePayment(b []byte) (Payment, error) {
	var p Payment
	if err := json.Unmarshal(b, &p); err != nil {
		return Payment{}, fmt.Errorf("payment JSON: %w", err)
	}
	return p, nil
}

// validate checks the business rules that no retry can fix.
func (p Payment) validate() error {
	switch {
	case strings.TrimSpace(p.OrderID) == "":
		return errors.New("payment has no order_id")
	case !amountRE.MatchString(string(p.Amount)):
		return fmt.Errorf("amount %q is not a decimal number", p.Amount)
	case strings.HasPrefix(string(p.Amount), "-") || strings.Trim(string(p.Amount), "0.") == "":
		return fmt.Errorf("amount %s must be positive", p.Amount)
	case !currencies[p.Currency]:
		return fmt.Errorf("currency %q is not accepted (KRW, USD, EUR, JPY)", p.Currency)
	}
	return nil
}

// paymentKey is the service's consumer.KeyFunc: the idempotency-key header
// when present, else the idempotency_key field of the JSON body. A message with
// neither has no key; idem dead-letters it (kind "missing-key") rather than
// guess.
func paymentKey(m *handler.Message) (string, error) {
	if v, ok := m.Header("idempotency-key"); ok && len(bytes.TrimSpace(v)) > 0 {
		return string(bytes.TrimSpace(v)), nil
	}
	var body struct {
		Key string `json:"idempotency_key"`
	}
	if err := json.Unmarshal(m.Value, &body); err != nil {
		return "", fmt.Errorf("no idempotency-key header, and the body is not JSON: %w", err)
	}
	return strings.TrimSpace(body.Key), nil
}

var _ consumer.KeyFunc = paymentKey

// service is the payment consumer's handler and what it depends on.
type service struct {
	bank        *bankClient
	eventsTopic string // where payment.recorded events go, through the outbox

	// naturalDups counts deliveries the inbox let through but the payments
	// table's natural key stopped (the inbox row was swept, or another
	// consumer group applied the payment).
	naturalDups atomic.Int64
}

// handlePayment records one payment, charges it at the bank and marks its
// order paid, inside the message's transaction (the inbox row commits with
// them, or nothing does).
//
// Idempotent three times over, behind idem's inbox:
//   - natural key: payments.idempotency_key is UNIQUE and the INSERT does
//     nothing on conflict;
//   - state transition: the order moves pending → paid only once;
//   - the bank charge is a durable step (charge): once it has succeeded, a
//     retry of the message (this transaction rolled back, the process died
//     before its commit) does not call the bank again, and the step's
//     derived key makes the bank drop a second call the step's record could
//     not prevent (a crash between the charge and the record, a timeout
//     after which the bank had charged).
//
// Unknown orders, malformed JSON, non-positive amounts, unknown currencies and
// a second, different payment for an already-paid order are permanent: they
// go to the dead-letter topic for an operator, and the bank is never called.
// A bank timeout or 5xx is retriable: in-process retries, then the retry
// tiers. While the bank's breaker is open the consumer pauses instead.
//
// A payment actually stored enqueues a payment.recorded event (events.go) to
// s.eventsTopic in the same transaction (transactional outbox, seed §6); a
// duplicate enqueues nothing.
func (s *service) handlePayment(ctx context.Context, m *handler.Message) error {
	p, err := decodePayment(m.Value)
	if err != nil {
		return handler.Decode(err)
	}
	if err := p.validate(); err != nil {
		return handler.Permanent(err)
	}
	if !dedupe.HasTx(ctx) {
		return errNoTx
	}
	tx := dedupe.Tx(ctx)
	key := m.IdempotencyKey // what the inbox recorded: header, else JSON field

	ins, err := tx.Exec(ctx, `
		INSERT INTO payments (idempotency_key, order_id, amount, currency, status)
		VALUES ($1, $2, $3::text::numeric, $4, 'captured')
		ON CONFLICT (idempotency_key) DO NOTHING`,
		key, p.OrderID, string(p.Amount), p.Currency)
	if err != nil {
		return fmt.Errorf("insert payment %s: %w", key, err) // retriable
	}
	if ins.RowsAffected() == 0 {
		// This very payment was applied before (its inbox row has since been
		// swept, or another consumer group applied it): nothing left to do.
		s.naturalDups.Add(1)
		return nil
	}
	upd, err := tx.Exec(ctx, `
		UPDATE orders SET status = 'paid', paid_at = now()
		WHERE id = $1 AND status = 'pending'`, p.OrderID)
	if err != nil {
		return fmt.Errorf("mark order %s paid: %w", p.OrderID, err) // retriable
	}
	if upd.RowsAffected() == 0 {
		// A new payment, but the order is not pending: find out why. Returning
		// an error rolls the payment row back with everything else.
		var status string
		switch err := tx.QueryRow(ctx, `SELECT status FROM orders WHERE id = $1`, p.OrderID).Scan(&status); {
		case errors.Is(err, pgx.ErrNoRows):
			return handler.Permanent(fmt.Errorf("unknown order %q", p.OrderID))
		case err != nil:
			return fmt.Errorf("look up order %s: %w", p.OrderID, err)
		default:
			return handler.Permanent(fmt.Errorf("order %q is %s: payment %s would charge it twice", p.OrderID, status, key))
		}
	}
	// Last, the external call: if it fails, the rows above roll back and the
	// retry charges again, with the same key.
	if err := s.charge(ctx, p); err != nil {
		return fmt.Errorf("charge payment %s: %w", key, err)
	}
	return enqueueRecorded(ctx, tx, s.eventsTopic, key, p) // commits with the payment
}

// charge charges p at the bank as a durable step of the message in ctx
// (package step): the first success is recorded in idem_steps on a
// connection of its own, at once, and every later call for the message, a
// retry or a redelivery, returns it without calling the bank. The bank's
// Idempotency-Key is the step's derived key (step.Key), the same for every
// call of this step of this message, so the one call the record cannot
// cover (the process dies after the bank charged and before the record
// commits) is answered from the bank's ledger. A refusal (4xx) is recorded
// as a permanent failure; a 5xx, a timeout or an open breaker records
// nothing, and the retry calls the bank again.
func (s *service) charge(ctx context.Context, p Payment) error {
	_, err := step.Do(ctx, "charge", func(ctx context.Context) (bool, error) {
		if err := s.bank.Charge(ctx, step.Key(ctx, "charge"), p); err != nil {
			return false, err
		}
		return true, nil
	})
	return err
}
