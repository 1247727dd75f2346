package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// shutdownTimeout bounds how long Serve waits for requests in progress once
// its ctx is done.
const shutdownTimeout = 5 * time.Second

// NewServeMux returns a mux serving the three endpoints an orchestrator and a
// Prometheus server need, on one address:
//
//   - /metrics: the metrics of g in the Prometheus text (or OpenMetrics, when
//     asked) format. A nil g serves prometheus.DefaultGatherer.
//   - /healthz: liveness. 200 "ok" whenever the process can answer HTTP.
//   - /readyz: readiness. 200 "ok" when ready(r.Context()) returns nil, else
//     503 with the error's text. A nil ready is always ready. With idem's
//     consumer, pass (*consumer.Readiness).Check: ready once the group is
//     joined and the dedupe store of the claimed partitions answers.
//
// Other paths are 404.
func NewServeMux(g prometheus.Gatherer, ready func(context.Context) error) *http.ServeMux {
	if g == nil {
		g = prometheus.DefaultGatherer
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{EnableOpenMetrics: true}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if ready != nil {
			if err := ready(r.Context()); err != nil {
				w.WriteHeader(http.StatusServiceUnavailable)
				_, _ = fmt.Fprintln(w, err.Error())
				return
			}
		}
		_, _ = fmt.Fprintln(w, "ok")
	})
	return mux
}

// Serve listens on addr ("host:port"; ":9464" for every interface) and serves
// NewServeMux(g, ready) until ctx is done; then it stops accepting
// connections, waits up to 5s for requests in progress, and returns nil. It
// returns an error at once when addr cannot be listened on, and any error
// the server stops with other than the shutdown. A nil ready is always ready.
func Serve(ctx context.Context, addr string, g prometheus.Gatherer, ready func(context.Context) error) error {
	var lc net.ListenConfig
	ln, err := lc.Listen(context.WithoutCancel(ctx), "tcp", addr) // a done ctx still serves nothing and returns nil
	if err != nil {
		return fmt.Errorf("metrics: listen on %s: %w", addr, err)
	}
	return serve(ctx, ln, NewServeMux(g, ready))
}

// serve runs h on ln until ctx is done, then shuts down gracefully.
func serve(ctx context.Context, ln net.Listener, h http.Handler) error {
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc: // the server stopped by itself: a listener failure
		return fmt.Errorf("metrics: serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	err := srv.Shutdown(sctx)
	if serr := <-errc; serr != nil && !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	if err != nil {
		return fmt.Errorf("metrics: shutdown: %w", err)
	}
	return nil
}
