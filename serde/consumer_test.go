package serde_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/internal/testenv"
	"github.com/idemhq/idem/retrytopic"
	"github.com/idemhq/idem/serde"
	"github.com/idemhq/idem/serde/internal/testpb"
)

// Poison records on a typed topic, through today's consumer.Run: each is
// dead-lettered at once with kind decode and its bytes unchanged, and the
// good records around it are handled (the partition flows).
func TestPoisonRecordsDeadLettered(t *testing.T) {
	testenv.SkipIfShort(t)
	url := registryURL(t)
	reg := newRegistry(t, url)
	ctx := ctxOf(t)
	k := idemtest.Connect(t)
	avroTopic, protoTopic := k.Topic(t, "typed-avro", 1), k.Topic(t, "typed-proto", 1)
	group := k.Group(t, "typed")
	orders, err := serde.Avro[OrderV1](reg, serde.Options{Subject: subject(t, url, "avro"), Schema: orderV1})
	if err != nil {
		t.Fatal(err)
	}
	protos, err := serde.Protobuf[*testpb.Order](reg, serde.Options{Subject: subject(t, url, "proto"), Schema: ordersProto})
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
	g1 := good("a-1")
	poison := map[string][]byte{
		"unknown-id": withID(0x7ffffff0, g1[5:]...),
		"bad-magic":  append([]byte{9}, g1[1:]...),
		"truncated":  g1[:len(g1)-3],
		"bad-index":  withID(uint32(pgood[1])<<24|uint32(pgood[2])<<16|uint32(pgood[3])<<8|uint32(pgood[4]), 2, 14),
	}
	rec := func(key string, v []byte) idemtest.Record { return idemtest.Record{IdempotencyKey: key, Value: v} }
	k.Produce(t, avroTopic, rec("a-1", g1), rec("unknown-id", poison["unknown-id"]), rec("bad-magic", poison["bad-magic"]),
		rec("truncated", poison["truncated"]), rec("a-2", good("a-2")))
	k.Produce(t, protoTopic, rec("bad-index", poison["bad-index"]), rec("p-1", pgood))

	var mu sync.Mutex
	handled := map[string]int{}
	// Two typed handlers, one per topic, until routes come.
	avroH := handler.Typed(orders.Decode, func(ctx context.Context, o OrderV1, m *handler.Message) error {
		mu.Lock()
		defer mu.Unlock()
		handled[o.ID]++
		return nil
	})
	protoH := handler.Typed(protos.Decode, func(ctx context.Context, o *testpb.Order, m *handler.Message) error {
		mu.Lock()
		defer mu.Unlock()
		handled[o.GetId()]++
		return nil
	})
	h := handler.Func(func(ctx context.Context, m *handler.Message) error {
		if m.Origin().Topic == protoTopic {
			return protoH.Handle(ctx, m)
		}
		return avroH.Handle(ctx, m)
	})
	c := idemtest.Start(t, k.Config(t, group, avroTopic, protoTopic), h)
	c.WaitOutcome(t, "processed", 3)
	c.WaitOutcome(t, "dead_lettered", 4)

	dls := append(k.ReadDLQ(t, retrytopic.Policy{}.DLQ(avroTopic, group), 3), k.ReadDLQ(t, retrytopic.Policy{}.DLQ(protoTopic, group), 1)...)
	for _, dl := range dls {
		key := ""
		for _, h := range dl.Headers {
			if h.Key == "idempotency-key" {
				key = string(h.Value)
			}
		}
		want, ok := poison[key]
		if !ok {
			t.Fatalf("dead letter of %q: not a poison record", key)
		}
		if dl.Failure.Kind != handler.KindDecode || !bytes.Equal(dl.Value, want) || dl.Failure.Attempt != 1 {
			t.Errorf("dead letter of %s: kind %q, attempt %d, bytes kept %v; want decode, 1, true (%s)",
				key, dl.Failure.Kind, dl.Failure.Attempt, bytes.Equal(dl.Value, want), dl.Failure.Error)
		}
		delete(poison, key)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(poison) != 0 || handled["a-1"] != 1 || handled["a-2"] != 1 || handled["p-1"] != 1 {
		t.Fatalf("not dead-lettered: %v; handled %v", poison, handled)
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
func TestRegistryDownMidStream(t *testing.T) {
	testenv.SkipIfShort(t)
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
			out[i] = idemtest.Record{Partition: int32(i % 2), IdempotencyKey: fmt.Sprintf("%s-%d", prefix, i), Value: b}
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
		mu.Lock()
		defer mu.Unlock()
		handled[o.ID] = append(handled[o.ID], m.Attempt)
		return nil
	})
	k := idemtest.Connect(t)
	topic, group := k.Topic(t, "typed", 2), k.Group(t, "typed")
	k.Produce(t, topic, before...)
	c := idemtest.Start(t, k.Config(t, group, topic), h)
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
