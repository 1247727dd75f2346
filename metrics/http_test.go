package metrics

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemhq/idem/internal/coremetrics"
	"github.com/prometheus/client_golang/prometheus"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// The mux serves the registry at /metrics, 200 at /healthz, and /readyz
// following ready: 200 when it returns nil, 503 with its text otherwise.
func TestServeMux(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := coremetrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	m.Commits.WithLabelValues("g").Add(3)
	var notReady error = errors.New("group \"g\" not joined yet")
	srv := httptest.NewServer(NewServeMux(reg, func(context.Context) error { return notReady }))
	t.Cleanup(srv.Close)

	if code, body := get(t, srv.URL+"/metrics"); code != 200 || !strings.Contains(body, `idem_commits_total{group="g"} 3`) {
		t.Errorf("/metrics = %d %q", code, body)
	}
	if code, body := get(t, srv.URL+"/healthz"); code != 200 || body != "ok\n" {
		t.Errorf("/healthz = %d %q", code, body)
	}
	if code, body := get(t, srv.URL+"/readyz"); code != 503 || !strings.Contains(body, `not joined yet`) {
		t.Errorf("/readyz (not ready) = %d %q", code, body)
	}
	notReady = nil
	if code, body := get(t, srv.URL+"/readyz"); code != 200 || body != "ok\n" {
		t.Errorf("/readyz (ready) = %d %q", code, body)
	}
	if code, _ := get(t, srv.URL+"/nope"); code != 404 {
		t.Errorf("/nope = %d, want 404", code)
	}

	always := httptest.NewServer(NewServeMux(reg, nil))
	t.Cleanup(always.Close)
	if code, _ := get(t, always.URL+"/readyz"); code != 200 {
		t.Errorf("/readyz with nil ready = %d, want 200", code)
	}
}

// Serve answers until its ctx is done, then returns nil; a bad address is an
// error at once.
func TestServe(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, ln, NewServeMux(prometheus.NewRegistry(), nil)) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	if code, _ := get(t, "http://"+ln.Addr().String()+"/healthz"); code != 200 {
		t.Fatalf("/healthz = %d", code)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve after cancel = %v, want nil", err)
		}
		done <- nil // for the cleanup
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not return after its ctx was cancelled")
	}
	if _, err := http.Get("http://" + ln.Addr().String() + "/healthz"); err == nil {
		t.Error("still answering after shutdown")
	}

	if err := Serve(context.Background(), "256.0.0.1:bad", nil, nil); err == nil {
		t.Error("Serve on a bad address returned nil")
	}
}

// Serve itself (listen, serve, shut down) on a free port.
func TestServeListens(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, "127.0.0.1:0", prometheus.NewRegistry(), nil) }()
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Serve = %v, want nil after cancel", err)
	}
}
