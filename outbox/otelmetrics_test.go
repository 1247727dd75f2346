package outbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	prombridge "go.opentelemetry.io/contrib/bridges/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/idemhq/idem/idemtest"
)

// TestOpenTelemetryMetricsThroughThePrometheusBridge is the metrics path of
// a team without Prometheus (docs/outbox.md, "Traces, correlation and
// OpenTelemetry metrics"): idem's collectors go into a registry of the
// service's own, and OpenTelemetry's Prometheus bridge hands that registry
// to an OpenTelemetry reader (here a manual one; in a service, a periodic
// reader with an OTLP exporter). The relay's published counter arrives as
// an OpenTelemetry sum with its table attribute.
func TestOpenTelemetryMetricsThroughThePrometheusBridge(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	relay, reg := e.relay(e.pool) // reg: the registry idem registers into
	start(t, relay)
	e.enqueue(e.msg("k", "v"))
	waitMetric(t, reg, 1, "idem_outbox_published_total", "idem_outbox")

	reader := sdkmetric.NewManualReader(sdkmetric.WithProducer(prombridge.NewMetricProducer(prombridge.WithGatherer(reg))))
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = provider.Shutdown(context.Background()) })
	idemtest.Eventually(t, 10*time.Second, func() error {
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(t.Context(), &rm); err != nil {
			return err
		}
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				if m.Name != "idem_outbox_published_total" {
					continue
				}
				sum, ok := m.Data.(metricdata.Sum[float64])
				if !ok || len(sum.DataPoints) != 1 || !sum.IsMonotonic {
					return fmt.Errorf("idem_outbox_published_total came through as %T %+v", m.Data, m.Data)
				}
				p := sum.DataPoints[0]
				if table, _ := p.Attributes.Value("table"); p.Value != 1 || table.AsString() != "idem_outbox" {
					return fmt.Errorf("idem_outbox_published_total = %v %v, want 1 for table idem_outbox", p.Value, p.Attributes)
				}
				return nil
			}
		}
		return fmt.Errorf("no idem_outbox_published_total among %d scopes", len(rm.ScopeMetrics))
	})
}
