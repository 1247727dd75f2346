package main

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/idemtest"
)

// The routes benchmark (issue 30): what routing by type costs through
// consumer.Run. The micro-benchmark of the lookup itself is
// BenchmarkRouteLookup in package consumer (goal: under 50 ns a message,
// no allocation).
//
//	cd bench && go test -run '^$' -bench 'ConsumerRoutes' -benchtime 4x

var routesTopic struct {
	once  sync.Once
	k     *idemtest.Kafka
	topic string
}

// routeTypes are the CloudEvents types of the routes benchmark's records,
// one route each.
var routeTypes = []string{"shop.order.placed", "shop.order.paid", "shop.order.shipped"}

// BenchmarkConsumerRoutes consumes the same consumerRecords records (three
// types, in their ce_type header) through consumer.Run with one handler and
// with three routes by type (Config.TypeHeader), alternating, and reports
// the CPU time per record of each and the difference: the route lookup and
// what follows from it per message. Run it with -benchtime Nx for N pairs.
func BenchmarkConsumerRoutes(b *testing.B) {
	if os.Getenv("KAFKA_BROKERS") == "" {
		b.Skip("needs KAFKA_BROKERS (make services)")
	}
	routesTopic.once.Do(func() {
		k := idemtest.Connect(b)
		topic := fmt.Sprintf("idem-bench-routes-%d", time.Now().UnixNano())
		k.CreateTopic(b, topic, 1)
		recs := make([]idemtest.Record, consumerRecords)
		for i := range recs {
			recs[i] = idemtest.Record{IdempotencyKey: fmt.Sprintf("k-%d", i), Value: []byte(`{"order_id":"o-1"}`),
				Headers: []handler.Header{{Key: "ce_type", Value: []byte(routeTypes[i%len(routeTypes)])}}}
		}
		k.Produce(b, topic, recs...)
		routesTopic.k, routesTopic.topic = k, topic
	})
	k, topic := routesTopic.k, routesTopic.topic
	count := func(done func()) handler.Handler {
		return handler.Func(func(ctx context.Context, m *handler.Message) error {
			sink.Add(int64(len(m.Value)))
			done()
			return nil
		})
	}
	routes := func(cfg *consumer.Config, done func()) {
		cfg.TypeHeader = "ce_type"
		for _, typ := range routeTypes {
			cfg.Routes = append(cfg.Routes, consumer.Route{Name: typ, Types: []string{typ}, Handler: count(done)})
		}
	}
	var oneCPU, routesCPU time.Duration
	for i := 0; i < b.N; i++ {
		_, c := consumeAll(b, k, topic, fmt.Sprintf("idem-bench-one-%d", i), nil, count)
		oneCPU += c
		_, c = consumeAll(b, k, topic, fmt.Sprintf("idem-bench-routes-%d", i), routes, func(func()) handler.Handler { return nil })
		routesCPU += c
	}
	records := float64(consumerRecords * b.N)
	b.ReportMetric(float64(oneCPU.Nanoseconds())/records, "one-handler-cpu-ns/record")
	b.ReportMetric(float64(routesCPU.Nanoseconds())/records, "routes-cpu-ns/record")
	b.ReportMetric(float64((routesCPU-oneCPU).Nanoseconds())/records, "routes-added-cpu-ns/record")
}
