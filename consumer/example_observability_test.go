package consumer_test

import (
	"context"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/metrics"
)

// A consumer with /metrics, /healthz and /readyz on :9464, lifecycle hooks,
// and traces exported by whatever SDK provider the program installed with
// otel.SetTracerProvider.
func ExampleReadiness() {
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	ready := consumer.NewReadiness()
	go func() { _ = metrics.Serve(ctx, ":9464", reg, ready.Check) }()

	err := consumer.Run(ctx, consumer.Config{
		Brokers:    []string{"localhost:9092"},
		Group:      "payments",
		Topics:     []string{"payments"},
		Dedupe:     dedupe.NewMemory(),
		Registerer: reg,
		Readiness:  ready,
		OnAssigned: func(ctx context.Context, tps []consumer.TopicPartition) {
			slog.Info("assigned", "partitions", tps)
		},
		OnRevoked: func(ctx context.Context, tps []consumer.TopicPartition) {
			slog.Info("revoked; offsets committed", "partitions", tps)
		},
		TracerProvider: otel.GetTracerProvider(),
	}, handler.Func(func(ctx context.Context, m *handler.Message) error {
		return nil // ctx carries the idem.handle span: start child spans from it
	}))
	if err != nil {
		slog.Error("consumer stopped", "err", err)
	}
}
