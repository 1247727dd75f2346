package main

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/examples/typed-orders/shippingpb"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/retrytopic"
	"github.com/idemhq/idem/serde"
	"github.com/idemhq/idem/step"
)

// OrderPlaced is the Avro record of the orders topic (orderSchema).
type OrderPlaced struct {
	OrderID  string `avro:"order_id"`
	Customer string `avro:"customer"`
	Cents    int64  `avro:"cents"`
	Currency string `avro:"currency"`
}

// orderSchema is OrderPlaced's Avro schema, registered under
// "<orders topic>-value".
const orderSchema = `{"type":"record","name":"OrderPlaced","namespace":"typedorders","fields":[
	{"name":"order_id","type":"string"},
	{"name":"customer","type":"string"},
	{"name":"cents","type":"long"},
	{"name":"currency","type":"string","default":"EUR"}]}`

// codecs are the service's serdes: one per record type.
type codecs struct {
	orders    *serde.Codec[OrderPlaced]
	shipments *serde.Codec[*shippingpb.Shipped]
	returns   *serde.Codec[*shippingpb.Returned]
}

func newCodecs(reg *serde.Registry, ordersTopic, shipmentsTopic string) (codecs, error) {
	orders, err := serde.Avro[OrderPlaced](reg, serde.Options{Subject: ordersTopic + "-value", Schema: orderSchema})
	if err != nil {
		return codecs{}, err
	}
	// Both messages of shipping.proto are written under the shipments
	// topic's subject: a record's message index path says which it is.
	shipments, err := serde.Protobuf[*shippingpb.Shipped](reg, serde.Options{Subject: shipmentsTopic + "-value", Schema: shippingpb.Proto})
	if err != nil {
		return codecs{}, err
	}
	returns, err := serde.Protobuf[*shippingpb.Returned](reg, serde.Options{Subject: shipmentsTopic + "-value", Schema: shippingpb.Proto})
	if err != nil {
		return codecs{}, err
	}
	return codecs{orders: orders, shipments: shipments, returns: returns}, nil
}

// routes are the service's three routes, each with the policies its
// messages need, in one consumer.Run:
//   - "placed": the orders topic (Avro). The idempotency key is the order
//     id, read from the decoded value; the card is charged through a
//     durable step with the step's derived key, then the order is recorded
//     in the message's transaction. flaky, when set, fails an order's
//     handler once after its step (a lost connection, say) to show that
//     the retry does not charge again.
//   - "shipped": Shipped records of the shipments topic (Protobuf), routed
//     by their record name; keyed by their idempotency-key header.
//   - "returned": Returned records of the same topic, routed the same way,
//     with retry topics of their own (a return the warehouse system cannot
//     take is kept apart from the shipments' failures) and a maximum age.
//
// A record of the shipments topic of another type, or whose value is not
// in the registry's wire format, is dead-lettered (Config.Unmatched; kind
// decode for the latter).
func routes(c codecs, psp *PSP, ordersTopic, shipmentsTopic string, flaky func(OrderPlaced) bool, retried *atomic.Int64) []consumer.Route {
	placed := handler.Typed(c.orders.Decode, func(ctx context.Context, o OrderPlaced, m *handler.Message) error {
		chargeID, err := step.Do(ctx, "charge", func(ctx context.Context) (string, error) {
			// The provider drops a second request with the same key: the
			// step's row covers retries and redeliveries, the key covers a
			// crash between this call and that row.
			return psp.Charge(ctx, step.Key(ctx, "charge"), o.Cents, o.Currency)
		})
		if err != nil {
			return err
		}
		if flaky != nil && m.Attempt == 1 && flaky(o) {
			retried.Add(1)
			return fmt.Errorf("order %s: lost the database after charging (injected)", o.OrderID)
		}
		_, err = dedupe.Tx(ctx).Exec(ctx, `INSERT INTO typed_orders (order_id, customer, cents, currency, charge_id)
			VALUES ($1, $2, $3, $4, $5)`, o.OrderID, o.Customer, o.Cents, o.Currency, chargeID)
		return err
	})
	shipped := handler.Typed(c.shipments.Decode, func(ctx context.Context, s *shippingpb.Shipped, m *handler.Message) error {
		_, err := dedupe.Tx(ctx).Exec(ctx, `INSERT INTO typed_shipments (order_id, carrier, tracking) VALUES ($1, $2, $3)`,
			s.GetOrderId(), s.GetCarrier(), s.GetTracking())
		return err
	})
	returned := handler.Typed(c.returns.Decode, func(ctx context.Context, r *shippingpb.Returned, m *handler.Message) error {
		_, err := dedupe.Tx(ctx).Exec(ctx, `INSERT INTO typed_returns (order_id, reason) VALUES ($1, $2)`, r.GetOrderId(), r.GetReason())
		return err
	})
	return []consumer.Route{{
		Name: "placed", Topics: []string{ordersTopic}, Handler: placed,
		KeyFunc: c.orders.Key(func(o OrderPlaced) string { return o.OrderID }),
	}, {
		Name: "shipped", Topics: []string{shipmentsTopic}, Types: []string{"typedorders.Shipped"}, Handler: shipped,
	}, {
		Name: "returned", Topics: []string{shipmentsTopic}, Types: []string{"typedorders.Returned"}, Handler: returned,
		OwnTopics: true, // <shipments>.<group>.returned.retry.1, <shipments>.<group>.returned.dlq
		Retry:     &consumer.RetryConfig{Attempts: 3, Tiers: retrytopic.Policy{Delays: []time.Duration{time.Minute}}},
		Expiry:    &consumer.Expiry{MaxAge: 30 * 24 * time.Hour},
	}}
}
