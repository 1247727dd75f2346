package serde_test

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/twmb/franz-go/pkg/sr/srfake"

	"github.com/idemhq/idem/serde"
)

// The registry client over TLS, with basic or bearer authentication (the
// real registry of `make services` has neither): a registry (franz-go's fake behind an https server that checks the
// credentials) serves a client that trusts its CA and sends them; a wrong
// password is a 401, which is an outage (the consumer waits), not a bad
// record; a client that does not trust the CA cannot connect.
func TestRegistryTLSAndAuth(t *testing.T) {
	ctx := ctxOf(t)
	fake := srfake.New()
	t.Cleanup(fake.Close)
	for _, tc := range []struct {
		name  string
		ok    func(r *http.Request) bool
		good  serde.RegistryConfig
		wrong serde.RegistryConfig
	}{
		{"basic", func(r *http.Request) bool { u, p, ok := r.BasicAuth(); return ok && u == "key" && p == "secret" },
			serde.RegistryConfig{Username: "key", Password: "secret"}, serde.RegistryConfig{Username: "key", Password: "nope"}},
		{"bearer", func(r *http.Request) bool { return r.Header.Get("Authorization") == "Bearer tok" },
			serde.RegistryConfig{BearerToken: "tok"}, serde.RegistryConfig{BearerToken: "other"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if !tc.ok(r) {
					w.WriteHeader(http.StatusUnauthorized)
					_, _ = w.Write([]byte(`{"error_code":40101,"message":"unauthorized"}`))
					return
				}
				fake.Handler().ServeHTTP(w, r)
			}))
			t.Cleanup(srv.Close)
			roots := x509.NewCertPool()
			roots.AddCert(srv.Certificate())
			cfg := tc.good
			cfg.URL, cfg.TLS = srv.URL, &tls.Config{RootCAs: roots}
			reg, err := serde.NewRegistry(cfg)
			if err != nil {
				t.Fatal(err)
			}
			s, err := reg.Register(ctx, "auth-"+tc.name+"-value", "AVRO", orderV1)
			if err != nil {
				t.Fatal(err)
			}
			if got, err := reg.SchemaByID(ctx, s.ID); err != nil || got.Text != orderV1 {
				t.Fatalf("SchemaByID over TLS with %s auth: %+v, %v", tc.name, got, err)
			}

			cfg = tc.wrong
			cfg.URL, cfg.TLS = srv.URL, &tls.Config{RootCAs: roots}
			wrong, _ := serde.NewRegistry(cfg)
			if _, err := wrong.SchemaByID(ctx, s.ID); !errors.As(err, new(*serde.UnavailableError)) {
				t.Fatalf("wrong credentials: %v; want an *UnavailableError (401)", err)
			}
			untrusting, _ := serde.NewRegistry(serde.RegistryConfig{URL: srv.URL, Username: "key", Password: "secret"})
			if _, err := untrusting.SchemaByID(ctx, s.ID); err == nil {
				t.Fatal("a client that does not trust the server's CA connected")
			}
		})
	}
}
