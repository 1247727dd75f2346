package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/breaker"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/outbox"
	"github.com/idemhq/idem/saga"
)

// Order is the event on the orders topic and the saga's input.
type Order struct {
	ID      string `json:"id"`
	SKU     string `json:"sku"`
	Qty     int    `json:"qty"`
	Amount  int    `json:"amount"`  // cents; the payment service declines more than cardLimit
	Address string `json:"address"` // shipping fails for an empty address
}

// cardLimit is the payment service's limit: larger charges are declined.
const cardLimit = 100_00

const schema = `
CREATE TABLE IF NOT EXISTS stock        (sku text PRIMARY KEY, qty int NOT NULL CHECK (qty >= 0));
CREATE TABLE IF NOT EXISTS reservations (key text PRIMARY KEY, order_id text NOT NULL, sku text NOT NULL, qty int NOT NULL);
CREATE TABLE IF NOT EXISTS charges      (key text PRIMARY KEY, order_id text NOT NULL, amount int NOT NULL);
CREATE TABLE IF NOT EXISTS refunds      (key text PRIMARY KEY, charge_key text NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS shipments    (key text PRIMARY KEY, order_id text NOT NULL UNIQUE, address text NOT NULL);`

// migrate creates idem's tables (idem.Migrate: the inbox, the saga and
// outbox tables, and every other table idem keeps) and the example's.
func migrate(ctx context.Context, pool *pgxpool.Pool) error {
	if err := idem.Migrate(ctx, pool); err != nil {
		return err
	}
	_, err := pool.Exec(ctx, schema)
	return err
}

// paymentService stands for another service reached over the network: its
// writes are not in the saga's transaction, so it deduplicates by the
// idempotency key it is given, as a payment provider's API does.
type paymentService struct{ db *pgxpool.Pool }

var errDeclined = errors.New("card declined")

func (p paymentService) Charge(ctx context.Context, key, orderID string, amount int) error {
	if amount > cardLimit {
		return handler.Permanent(errDeclined)
	}
	_, err := p.db.Exec(ctx, `INSERT INTO charges (key, order_id, amount) VALUES ($1, $2, $3) ON CONFLICT (key) DO NOTHING`, key, orderID, amount)
	return err
}

func (p paymentService) Refund(ctx context.Context, key, chargeKey string) error {
	_, err := p.db.Exec(ctx, `INSERT INTO refunds (key, charge_key) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING`, key, chargeKey)
	return err
}

// orderSaga is reserve stock → charge payment → schedule shipping. Stock is
// local (written through the step's transaction, so once); the payment
// service is called directly, with the step's key and through a circuit
// breaker; shipping is a Kafka command whose reply resumes the saga.
func orderSaga(pay paymentService, breakers *breaker.Set, t topics) saga.Definition {
	input := func(c saga.Call) (Order, error) {
		var o Order
		return o, json.Unmarshal(c.Input, &o)
	}
	return saga.Definition{
		Type: "order",
		Steps: []saga.Step{{
			Name: "reserve-stock",
			Action: func(ctx context.Context, c saga.Call) ([]byte, error) {
				o, err := input(c)
				if err != nil {
					return nil, handler.Permanent(err)
				}
				tag, err := c.Tx.Exec(ctx, `UPDATE stock SET qty = qty - $2 WHERE sku = $1 AND qty >= $2`, o.SKU, o.Qty)
				if err != nil {
					return nil, err
				}
				if tag.RowsAffected() == 0 {
					return nil, handler.Permanent(fmt.Errorf("out of stock: %s", o.SKU))
				}
				_, err = c.Tx.Exec(ctx, `INSERT INTO reservations (key, order_id, sku, qty) VALUES ($1, $2, $3, $4)`, c.Key, o.ID, o.SKU, o.Qty)
				return nil, err
			},
			Compensate: func(ctx context.Context, c saga.Call) error {
				// Put back what the reservation took, once: the row goes with it.
				_, err := c.Tx.Exec(ctx, `WITH r AS (DELETE FROM reservations WHERE key = $1 RETURNING sku, qty)
					UPDATE stock s SET qty = s.qty + r.qty FROM r WHERE s.sku = r.sku`, c.SagaID+"/reserve-stock")
				return err
			},
		}, {
			Name: "charge-payment",
			Action: func(ctx context.Context, c saga.Call) ([]byte, error) {
				o, err := input(c)
				if err != nil {
					return nil, handler.Permanent(err)
				}
				err = breakers.Do(ctx, "payments", func(ctx context.Context) error {
					return pay.Charge(ctx, c.Key, o.ID, o.Amount)
				})
				return []byte(c.Key), err // the result is the charge's key
			},
			Compensate: func(ctx context.Context, c saga.Call) error {
				return breakers.Do(ctx, "payments", func(ctx context.Context) error {
					return pay.Refund(ctx, c.Key, string(c.Results["charge-payment"]))
				})
			},
		}, {
			// Asynchronous: the command goes out through the outbox in the
			// step's transaction; the saga waits for the shipping service's
			// reply, which handleReply records with saga.Complete or saga.Fail.
			Name: "schedule-shipping",
			Action: func(ctx context.Context, c saga.Call) ([]byte, error) {
				o, err := input(c)
				if err != nil {
					return nil, handler.Permanent(err)
				}
				cmd, _ := json.Marshal(shipCommand{SagaID: c.SagaID, Order: o})
				err = outbox.Enqueue(ctx, c.Tx, outbox.Message{Topic: t.Commands, Key: []byte(o.ID), Value: cmd,
					Headers: []handler.Header{{Key: outbox.HeaderIdempotencyKey, Value: []byte(c.Key)}}})
				if err != nil {
					return nil, err
				}
				return nil, saga.ErrPending
			},
		}},
	}
}

// topics are the run's Kafka topics.
type topics struct {
	Orders   string // order events: start a saga
	Commands string // schedule-shipping commands, consumed by the shipping service
	Replies  string // the shipping service's replies, consumed by handleReply
}

// shipCommand is the command the schedule-shipping step sends.
type shipCommand struct {
	SagaID string `json:"saga_id"`
	Order  Order  `json:"order"`
}

// shipReply is the shipping service's answer.
type shipReply struct {
	SagaID     string `json:"saga_id"`
	ShipmentID string `json:"shipment_id,omitempty"`
	Error      string `json:"error,omitempty"`
}

// handleShipCommand is the shipping service (another service in real life,
// an idem consumer like any other): it records the shipment and sends its
// reply through the outbox, both in the message's transaction.
func handleShipCommand(repliesTopic string) handler.Func {
	return func(ctx context.Context, m *handler.Message) error {
		var cmd shipCommand
		if err := json.Unmarshal(m.Value, &cmd); err != nil {
			return handler.Decode(err)
		}
		tx := dedupe.Tx(ctx)
		reply := shipReply{SagaID: cmd.SagaID, ShipmentID: m.IdempotencyKey}
		if cmd.Order.Address == "" {
			reply = shipReply{SagaID: cmd.SagaID, Error: "no shipping address"}
		} else if _, err := tx.Exec(ctx, `INSERT INTO shipments (key, order_id, address) VALUES ($1, $2, $3)`,
			m.IdempotencyKey, cmd.Order.ID, cmd.Order.Address); err != nil {
			return err
		}
		v, _ := json.Marshal(reply)
		return outbox.Enqueue(ctx, tx, outbox.Message{Topic: repliesTopic, Key: m.Key, Value: v,
			Headers: []handler.Header{{Key: outbox.HeaderIdempotencyKey, Value: []byte(m.IdempotencyKey + "/reply")}}})
	}
}

// handleReply resumes the saga waiting for a shipping reply, in the reply's
// transaction: the inbox row and the step's outcome commit together. A reply
// to a step that no longer waits (the saga gave up on it) is dropped.
func handleReply(ctx context.Context, m *handler.Message) error {
	var r shipReply
	if err := json.Unmarshal(m.Value, &r); err != nil {
		return handler.Decode(err)
	}
	var err error
	if r.Error != "" {
		err = saga.Fail(ctx, dedupe.Tx(ctx), r.SagaID, "schedule-shipping", r.Error)
	} else {
		err = saga.Complete(ctx, dedupe.Tx(ctx), r.SagaID, "schedule-shipping", []byte(r.ShipmentID))
	}
	if errors.Is(err, saga.ErrNotPending) {
		return nil
	}
	return err
}

// startSaga is the consumer's handler: an order event starts its saga in
// the message's transaction. The order id is the saga id, so a redelivered
// event (or one whose inbox row was swept) starts nothing new.
func startSaga(o *saga.Orchestrator) handler.Func {
	return func(ctx context.Context, m *handler.Message) error {
		var ord Order
		if err := json.Unmarshal(m.Value, &ord); err != nil || ord.ID == "" || ord.Qty <= 0 {
			return handler.Decode(fmt.Errorf("bad order %q: %v", m.Value, err))
		}
		if !dedupe.HasTx(ctx) {
			return errors.New("no transaction in the handler's context: configure a dedupe.Postgres store")
		}
		tx := dedupe.Tx(ctx)
		_, err := o.Start(ctx, tx, "order", ord.ID, m.Value)
		return err
	}
}
