package serde_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/internal/testing/testenv"
	"github.com/idemhq/idem/retrytopic"
	"github.com/idemhq/idem/serde"
	"github.com/idemhq/idem/serde/internal/testpb"
)

// Poison records on typed topics, through consumer.Run with routes: Avro
// orders on one topic, Protobuf orders and refunds on another, routed by
// the record name of their schema (Config.TypeOf: Registry.RecordName).
// Each poison record (an unknown schema id, a wrong magic byte, a truncated
// payload, a Protobuf message index the schema does not have) is
// dead-lettered at once with kind decode, its bytes unchanged and its
// schema in idem-schema-id and idem-schema-subject when it names one; the
// good records around it are handled by their route (the partition flows).
func TestPoisonRecordsDeadLettered(t *testing.T) {
	testenv.SkipIfShort(t)
	url := registryURL(t)
	reg := newRegistry(t, url)
	ctx := ctxOf(t)
	k := idemtest.Connect(t)
	avroTopic, protoTopic := k.Topic(t, "typed-avro", 1), k.Topic(t, "typed-proto", 1)
	group := k.Group(t, "typed")
	avroSubject, protoSubject := subject(t, url, "avro"), subject(t, url, "proto")
	orders, err := serde.Avro[OrderV1](reg, serde.Options{Subject: avroSubject, Schema: orderV1})
	if err != nil {
		t.Fatal(err)
	}
	protos, err := serde.Protobuf[*testpb.Order](reg, serde.Options{Subject: protoSubject, Schema: ordersProto})
	if err != nil {
		t.Fatal(err)
	}
	refunds, err := serde.Protobuf[*testpb.Refund](reg, serde.Options{Subject: protoSubject, Schema: ordersProto})
	if err != nil {
		t.Fatal(err)
	}
	good := func(id string) []byte {
		b, err := orders.Encode(ctx, OrderV1{ID: id, Cents: 1 << 40})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	pgood, err := protos.Encode(ctx, &testpb.Order{Id: "p-1"})
	if err != nil {
		t.Fatal(err)
	}
	rgood, err := refunds.Encode(ctx, &testpb.Refund{OrderId: "r-1"})
	if err != nil {
		t.Fatal(err)
	}
	g1 := good("a-1")
	avroID, protoID := int(binary.BigEndian.Uint32(g1[1:5])), int(binary.BigEndian.Uint32(pgood[1:5]))
	// A registry gives one schema one id whatever subject it is registered
	// under (an earlier test's too), and lists that id's first subject.
	avroSubject, err = reg.Subject(&handler.Message{Value: g1})
	if err != nil {
		t.Fatal(err)
	}
	if protoSubject, err = reg.Subject(&handler.Message{Value: pgood}); err != nil {
		t.Fatal(err)
	}
	type poison struct {
		value   []byte
		id      int    // idem-schema-id; 0: none
		subject string // idem-schema-subject
	}
	poisons := map[string]poison{
		"unknown-id": {withID(0x7ffffff0, g1[5:]...), 0x7ffffff0, ""},
		"bad-magic":  {append([]byte{9}, g1[1:]...), 0, ""},
		"truncated":  {g1[:len(g1)-3], avroID, avroSubject},
		"bad-index":  {withID(uint32(protoID), 2, 14), protoID, protoSubject},
	}
	rec := func(key string, v []byte) idemtest.Record { return idemtest.Record{IdempotencyKey: key, Value: v} }
	k.Produce(t, avroTopic, rec("a-1", g1), rec("unknown-id", poisons["unknown-id"].value), rec("bad-magic", poisons["bad-magic"].value),
		rec("truncated", poisons["truncated"].value), rec("a-2", good("a-2")))
	k.Produce(t, protoTopic, rec("bad-index", poisons["bad-index"].value), rec("p-1", pgood), rec("r-1", rgood))

	var mu sync.Mutex
	handled := map[string]string{} // id → route
	seen := func(route, id string) {
		mu.Lock()
		defer mu.Unlock()
		handled[id] = route
	}
	cfg := k.Config(t, group, avroTopic, protoTopic)
	cfg.TypeOf = reg.RecordName
	cfg.Routes = []consumer.Route{{
		Name: "avro-orders", Topics: []string{avroTopic},
		Handler: handler.Typed(orders.Decode, func(ctx context.Context, o OrderV1, m *handler.Message) error {
			seen("avro-orders", o.ID)
			return nil
		}),
	}, {
		Name: "proto-orders", Topics: []string{protoTopic}, Types: []string{"idem.serdetest.Order"},
		Handler: handler.Typed(protos.Decode, func(ctx context.Context, o *testpb.Order, m *handler.Message) error {
			seen("proto-orders", o.GetId())
			return nil
		}),
	}, {
		Name: "proto-refunds", Topics: []string{protoTopic}, Types: []string{"idem.serdetest.Refund"},
		Handler: handler.Typed(refunds.Decode, func(ctx context.Context, r *testpb.Refund, m *handler.Message) error {
			seen("proto-refunds", r.GetOrderId())
			return nil
		}),
	}}
	c := idemtest.Start(t, cfg, nil)
	c.WaitOutcome(t, "processed", 4)
	c.WaitOutcome(t, "dead_lettered", 4)

	dls := append(k.ReadDLQ(t, retrytopic.Policy{}.DLQ(avroTopic, group), 3), k.ReadDLQ(t, retrytopic.Policy{}.DLQ(protoTopic, group), 1)...)
	for _, dl := range dls {
		key := ""
		for _, h := range dl.Headers {
			if h.Key == "idempotency-key" {
				key = string(h.Value)
			}
		}
		want, ok := poisons[key]
		if !ok {
			t.Fatalf("dead letter of %q: not a poison record", key)
		}
		f := dl.Failure
		if f.Kind != handler.KindDecode || !bytes.Equal(dl.Value, want.value) || f.Attempt != 1 || f.SchemaID != want.id || f.SchemaSubject != want.subject {
			t.Errorf("dead letter of %s: kind %q, attempt %d, bytes kept %v, schema %d %q; want decode, 1, true, %d %q (%s)",
				key, f.Kind, f.Attempt, bytes.Equal(dl.Value, want.value), f.SchemaID, f.SchemaSubject, want.id, want.subject, f.Error)
		}
		delete(poisons, key)
	}
	mu.Lock()
	defer mu.Unlock()
	want := map[string]string{"a-1": "avro-orders", "a-2": "avro-orders", "p-1": "proto-orders", "r-1": "proto-refunds"}
	if len(poisons) != 0 || !maps.Equal(handled, want) {
		t.Fatalf("not dead-lettered: %v; handled %v, want %v", poisons, handled, want)
	}
}

// flaky is an HTTP front of the registry that can go down: while down it
// drops every connection without an answer (a registry that crashed).
type flaky struct {
	down atomic.Bool
	srv  *httptest.Server
}

func newFlaky(t *testing.T, target string) *flaky {
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	f := &flaky{}
	proxy := &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) {
		r.SetURL(&url.URL{Scheme: u.Scheme, Host: u.Host})
		r.Out.URL.Path = u.Path + r.In.URL.Path
	}}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if f.down.Load() {
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close()
			}
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

// The registry goes down for 20 s in the middle of a stream whose next
// records need a schema not yet cached: the consumer waits (an open
// breaker: no attempt spent, nothing forwarded or dead-lettered), and once
// the registry is back every record is applied once, at its first attempt.
// In "key from payload" the idempotency key is read from the
// schema-encoded value (Codec.Key as Config.KeyFunc; the records carry no
// key header), so the key's extraction is what meets the outage first: it
// waits too, and nothing is dead-lettered as missing-key.
func TestRegistryDownMidStream(t *testing.T) {
	testenv.SkipIfShort(t)
	for _, fromPayload := range []bool{false, true} {
		name := "key header"
		if fromPayload {
			name = "key from payload"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			registryDownMidStream(t, fromPayload)
		})
	}
}

func registryDownMidStream(t *testing.T, keyFromPayload bool) {
	target := registryURL(t)
	ctx := ctxOf(t)
	setup := newRegistry(t, target)
	subj := subject(t, target, "value")
	v1, err := serde.Avro[OrderV1](setup, serde.Options{Subject: subj, Schema: orderV1})
	if err != nil {
		t.Fatal(err)
	}
	v2, err := serde.Avro[OrderV2](setup, serde.Options{Subject: subj, Schema: orderV2})
	if err != nil {
		t.Fatal(err)
	}
	const n = 20
	records := func(prefix string, enc func(i int) ([]byte, error)) []idemtest.Record {
		out := make([]idemtest.Record, n)
		for i := range out {
			b, err := enc(i)
			if err != nil {
				t.Fatal(err)
			}
			out[i] = idemtest.Record{Partition: int32(i % 2), Value: b}
			if !keyFromPayload {
				out[i].IdempotencyKey = fmt.Sprintf("%s-%d", prefix, i)
			}
		}
		return out
	}
	before := records("v1", func(i int) ([]byte, error) { return v1.Encode(ctx, OrderV1{ID: fmt.Sprintf("v1-%d", i)}) })
	after := records("v2", func(i int) ([]byte, error) {
		return v2.Encode(ctx, OrderV2{ID: fmt.Sprintf("v2-%d", i), Currency: "USD"})
	})

	front := newFlaky(t, target)
	reg, err := serde.NewRegistry(serde.RegistryConfig{URL: front.srv.URL, Timeout: 2 * time.Second, OutagePause: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	reader, err := serde.Avro[OrderV2](reg, serde.Options{Schema: orderV2})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	handled := map[string][]int{} // order id → the attempts it was handled at
	h := handler.Typed(reader.Decode, func(ctx context.Context, o OrderV2, m *handler.Message) error {
		if keyFromPayload && m.IdempotencyKey != o.ID {
			return handler.Permanent(fmt.Errorf("key %q, want the payload's %q", m.IdempotencyKey, o.ID))
		}
		mu.Lock()
		defer mu.Unlock()
		handled[o.ID] = append(handled[o.ID], m.Attempt)
		return nil
	})
	k := idemtest.Connect(t)
	topic, group := k.Topic(t, "typed", 2), k.Group(t, "typed")
	k.Produce(t, topic, before...)
	cfg := k.Config(t, group, topic)
	if keyFromPayload {
		cfg.KeyFunc = reader.Key(func(o OrderV2) string { return o.ID })
	}
	c := idemtest.Start(t, cfg, h)
	c.WaitOutcome(t, "processed", n)

	front.down.Store(true)
	k.Produce(t, topic, after...)
	down := time.Now()
	for time.Since(down) < 20*time.Second { // the outage itself: its length is the scenario
		outs := c.Outcomes(t)
		if outs["processed"] != n || outs["retried"] != 0 || outs["dead_lettered"] != 0 {
			t.Fatalf("%s into the outage: outcomes %v; want %d processed and nothing forwarded", time.Since(down).Round(time.Second), outs, n)
		}
		time.Sleep(500 * time.Millisecond)
	}
	front.down.Store(false)
	c.WaitOutcome(t, "processed", 2*n)
	outs := c.Outcomes(t)
	mu.Lock()
	defer mu.Unlock()
	if outs["processed"] != 2*n || outs["retried"] != 0 || outs["dead_lettered"] != 0 || len(handled) != 2*n {
		t.Fatalf("outcomes %v, %d orders handled; want %d processed once, nothing forwarded", outs, len(handled), 2*n)
	}
	for id, attempts := range handled {
		if len(attempts) != 1 || attempts[0] != 1 {
			t.Fatalf("order %s handled at attempts %v; want once, at attempt 1 (an outage spends no attempt)", id, attempts)
		}
	}
}
