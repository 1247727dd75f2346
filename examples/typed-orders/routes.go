package main

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/examples/typed-orders/shippingpb"
	"github.com/idemhq/idem/handler"
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

// route is one kind of message the service handles: a topic and the typed
// handler of its records. Today the service dispatches by topic itself
// (dispatch); when idem routes inside one Run (issue 30, item 3), each
// route becomes a route of the consumer's configuration, with its own retry
// rules, and a third joins them: Returned records on the shipments topic,
// routed by type (the Protobuf message name).
type route struct {
	topic string
	h     handler.Handler
}

// codecs are the service's serdes, one per topic.
type codecs struct {
	orders    *serde.Codec[OrderPlaced]
	shipments *serde.Codec[*shippingpb.Shipped]
}

func newCodecs(reg *serde.Registry, ordersTopic, shipmentsTopic string) (codecs, error) {
	orders, err := serde.Avro[OrderPlaced](reg, serde.Options{Subject: ordersTopic + "-value", Schema: orderSchema})
	if err != nil {
		return codecs{}, err
	}
	shipments, err := serde.Protobuf[*shippingpb.Shipped](reg, serde.Options{Subject: shipmentsTopic + "-value", Schema: shippingpb.Proto})
	if err != nil {
		return codecs{}, err
	}
	return codecs{orders: orders, shipments: shipments}, nil
}

// routes are the service's handlers: orders (Avro) charge the card through
// a durable step and record the order; shipments (Protobuf) mark it
// shipped. flaky, when set, fails an order's handler once after its step
// (a lost connection, say) to show that the retry does not charge again.
func routes(c codecs, pool *pgxpool.Pool, psp *PSP, ordersTopic, shipmentsTopic string, flaky func(OrderPlaced) bool, retried *atomic.Int64) []route {
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
	return []route{{ordersTopic, placed}, {shipmentsTopic, shipped}}
}

// dispatch is the one handler given to consumer.Run: it passes each record
// to its topic's route (by Origin, so records read back from a retry tier
// find their route too). A topic without a route cannot happen: Run reads
// only the routes' topics.
func dispatch(rs []route) handler.Handler {
	byTopic := map[string]handler.Handler{}
	for _, r := range rs {
		byTopic[r.topic] = r.h
	}
	return handler.Func(func(ctx context.Context, m *handler.Message) error {
		h, ok := byTopic[m.Origin().Topic]
		if !ok {
			return handler.Permanent(fmt.Errorf("no route for topic %s", m.Origin().Topic))
		}
		return h.Handle(ctx, m)
	})
}
