package serde_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemhq/idem/breaker"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/serde"
	"github.com/idemhq/idem/serde/internal/testpb"
)

// withID returns a value in the wire format: magic byte, id, rest.
func withID(id uint32, rest ...byte) []byte {
	b := []byte{0, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(b[1:], id)
	return append(b, rest...)
}

// Every record that cannot be read is a decode error (handler.Decode,
// wrapping a *serde.DecodeError naming the schema id when there is one),
// and the record's bytes are left as they were.
func TestPoisonRecords(t *testing.T) {
	url := registryURL(t)
	reg := newRegistry(t, url)
	ctx := ctxOf(t)
	avroC, err := serde.Avro[OrderV1](reg, serde.Options{Subject: subject(t, url, "avro"), Schema: orderV1})
	if err != nil {
		t.Fatal(err)
	}
	good, err := avroC.Encode(ctx, OrderV1{ID: "a-fairly-long-order-id", Cents: 1 << 40})
	if err != nil {
		t.Fatal(err)
	}
	avroID := binary.BigEndian.Uint32(good[1:5])
	protoC, err := serde.Protobuf[*testpb.Order](reg, serde.Options{Subject: subject(t, url, "proto"), Schema: ordersProto})
	if err != nil {
		t.Fatal(err)
	}
	pgood, err := protoC.Encode(ctx, &testpb.Order{Id: "o-1", Cents: 3})
	if err != nil {
		t.Fatal(err)
	}
	protoID := binary.BigEndian.Uint32(pgood[1:5])
	jsonC, err := serde.JSONSchema[OrderJSON](reg, serde.Options{Subject: subject(t, url, "json"), Schema: orderJSONSchema})
	if err != nil {
		t.Fatal(err)
	}
	jgood, err := jsonC.Encode(ctx, OrderJSON{ID: "o-1", Cents: 1})
	if err != nil {
		t.Fatal(err)
	}
	jsonID := binary.BigEndian.Uint32(jgood[1:5])

	decodeAvro := func(v []byte) error { _, err := avroC.Decode(ctx, msg(v)); return err }
	decodeProto := func(v []byte) error { _, err := protoC.Decode(ctx, msg(v)); return err }
	decodeJSON := func(v []byte) error { _, err := jsonC.Decode(ctx, msg(v)); return err }
	const unknown = 0x7ffffff0
	tests := []struct {
		name   string
		value  []byte
		decode func([]byte) error
		id     uint32 // the schema id the error names, 0: none
		says   string
	}{
		{"unknown schema id", withID(unknown, good[5:]...), decodeAvro, unknown, "not found"},
		{"wrong magic byte", append([]byte{1}, good[1:]...), decodeAvro, 0, "magic byte"},
		{"plain JSON, no header", []byte(`{"id":"o-1"}`), decodeAvro, 0, "first byte is 0x7b"},
		{"shorter than a header", []byte{0, 0, 1}, decodeAvro, 0, "at least 5"},
		{"truncated Avro payload", good[:len(good)-4], decodeAvro, avroID, "does not decode"},
		{"Avro string claiming 2^30 bytes", withID(avroID, 0x80, 0x80, 0x80, 0x80, 0x08, 'x'), decodeAvro, avroID, "does not decode"}, // avroBounded
		{"Avro record read as Protobuf", good, decodeProto, avroID, "is AVRO"},
		{"Protobuf message index that does not exist", withID(protoID, 2, 10), decodeProto, protoID, "no message 5"},
		{"Protobuf nested index that does not exist", withID(protoID, 4, 0, 4), decodeProto, protoID, "no message 2 at depth 1"},
		{"Protobuf index count too large", withID(protoID, 0xfe, 0x0f), decodeProto, protoID, "index path does not decode"},
		{"Protobuf index path cut short", withID(protoID, 6, 2), decodeProto, protoID, "index path does not decode"},
		{"truncated Protobuf payload", pgood[:len(pgood)-1], decodeProto, protoID, "does not decode"},
		{"not JSON", withID(jsonID, []byte(`{"id":`)...), decodeJSON, jsonID, "not JSON"},
		{"JSON its schema rejects", withID(jsonID, []byte(`{"cents":1}`)...), decodeJSON, jsonID, "breaks its JSON Schema"},
		{"tombstone", nil, decodeAvro, 0, "tombstone"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kept := bytes.Clone(tt.value)
			err := tt.decode(tt.value)
			var de *serde.DecodeError
			if !handler.IsDecode(err) || !errors.As(err, &de) {
				t.Fatalf("got %v; want a handler.Decode error wrapping a *serde.DecodeError", err)
			}
			if handler.ErrorKind(err) != handler.KindDecode {
				t.Fatalf("kind %q, want decode", handler.ErrorKind(err))
			}
			if de.SchemaID != int(tt.id) || !strings.Contains(err.Error(), tt.says) {
				t.Fatalf("got %v (schema id %d); want schema id %d and %q", err, de.SchemaID, tt.id, tt.says)
			}
			// A schema the registry has: the error names a subject of it, for
			// the dead letter's headers, through an interface the consumer can
			// look for without importing serde.
			var ref interface{ SchemaRef() (int, string) }
			if !errors.As(err, &ref) {
				t.Fatal("no SchemaRef in the error's chain")
			}
			if id, subj := ref.SchemaRef(); id != int(tt.id) || (tt.id != 0 && tt.id != unknown) != strings.HasPrefix(subj, "testpoisonrecords-") {
				t.Fatalf("SchemaRef() = %d, %q; want %d and a subject of the test's iff the registry has the id", id, subj, tt.id)
			}
			if !bytes.Equal(tt.value, kept) {
				t.Fatal("decoding changed the record's bytes")
			}
			var ue *serde.UnavailableError
			if errors.As(err, &ue) || breaker.IsOpen(err) {
				t.Fatalf("a bad record is not an outage: %v", err)
			}
		})
	}
}

// A registry that cannot answer is an *serde.UnavailableError that a
// consumer treats as an open breaker (wait RetryAfter), never a decode
// error: refused connections, 5xx, 401 and timeouts alike. While it is
// down no request is made for OutagePause; then one probe goes, and when it
// answers the schema is read.
func TestRegistryUnavailable(t *testing.T) {
	ctx := ctxOf(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + l.Addr().String()
	l.Close()

	var status atomic.Int32
	status.Store(http.StatusServiceUnavailable)
	var requests atomic.Int32
	real := registryURL(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		if s := int(status.Load()); s != http.StatusOK {
			w.WriteHeader(s)
			_, _ = w.Write([]byte(`{"error_code":50001,"message":"down"}`))
			return
		}
		// Up: pass the request to the real registry.
		resp, err := http.Get(real + r.URL.Path)
		if err != nil {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		w.WriteHeader(resp.StatusCode)
		var b bytes.Buffer
		_, _ = b.ReadFrom(resp.Body)
		_, _ = w.Write(b.Bytes())
	}))
	t.Cleanup(srv.Close)
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }))
	t.Cleanup(slow.Close)

	// A schema the real registry has, read through the flaky front.
	realReg := newRegistry(t, real)
	s, err := realReg.Register(ctx, subject(t, real, "value"), "AVRO", orderV1)
	if err != nil {
		t.Fatal(err)
	}
	value := withID(uint32(s.ID), 2, 'x', 4)

	for _, tc := range []struct {
		name, url string
		setup     func()
	}{
		{"connection refused", closed, func() {}},
		{"503", srv.URL, func() { status.Store(http.StatusServiceUnavailable) }},
		{"401", srv.URL, func() { status.Store(http.StatusUnauthorized) }},
		{"timeout", slow.URL, func() {}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.setup()
			reg, err := serde.NewRegistry(serde.RegistryConfig{URL: tc.url, Timeout: 300 * time.Millisecond, OutagePause: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			c, _ := serde.Avro[OrderV1](reg, serde.Options{})
			_, err = c.Decode(ctx, msg(value))
			var ue *serde.UnavailableError
			if !errors.As(err, &ue) || handler.IsDecode(err) || handler.IsPermanent(err) {
				t.Fatalf("got %v; want an *serde.UnavailableError, not a decode error", err)
			}
			if d, ok := breaker.RetryAfter(err); !breaker.IsOpen(err) || !ok || d <= 0 || d > time.Hour {
				t.Fatalf("breaker.IsOpen %v, RetryAfter %v %v; want an open breaker asking to wait up to OutagePause", breaker.IsOpen(err), d, ok)
			}
			if !strings.Contains(err.Error(), "schema-registry") || !strings.Contains(err.Error(), "unavailable") {
				t.Fatalf("message %q names neither the registry nor the outage", err)
			}
			// Down: the next call fails at once, without a request.
			before := requests.Load()
			if _, err := c.Decode(ctx, msg(value)); !errors.As(err, &ue) || !breaker.Rejected(err) {
				t.Fatalf("second call while down: %v; want a rejected call", err)
			}
			if requests.Load() != before {
				t.Fatal("a request went to a registry known to be down")
			}
		})
	}

	// Back up: after OutagePause the next call probes, and reads the schema.
	status.Store(http.StatusServiceUnavailable)
	reg, err := serde.NewRegistry(serde.RegistryConfig{URL: srv.URL, OutagePause: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	c, _ := serde.Avro[OrderV1](reg, serde.Options{})
	if _, err := c.Decode(ctx, msg(value)); !errors.As(err, new(*serde.UnavailableError)) {
		t.Fatalf("down: %v", err)
	}
	status.Store(http.StatusOK)
	idemtest.Eventually(t, 10*time.Second, func() error {
		_, err := c.Decode(ctx, msg(value))
		if err != nil && !errors.As(err, new(*serde.UnavailableError)) {
			t.Fatalf("after the registry came back: %v", err)
		}
		return err
	})
	// A caller's own cancelled ctx is its own error, not an outage.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	reg2, _ := serde.NewRegistry(serde.RegistryConfig{URL: srv.URL})
	c2, _ := serde.Avro[OrderV1](reg2, serde.Options{})
	if _, err := c2.Decode(cctx, msg(value)); !errors.Is(err, context.Canceled) || errors.As(err, new(*serde.UnavailableError)) {
		t.Fatalf("cancelled ctx: %v", err)
	}
}

func TestRegistryConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		cfg  serde.RegistryConfig
		says string
	}{
		{serde.RegistryConfig{}, "RegistryConfig.URL"},
		{serde.RegistryConfig{URL: "localhost:8081"}, "must be an http:// or https:// URL"},
		{serde.RegistryConfig{URL: "http://r", Username: "u", BearerToken: "t"}, "BearerToken"},
		{serde.RegistryConfig{URL: "http://r", Timeout: -time.Second}, "RegistryConfig.Timeout"},
	} {
		_, err := serde.NewRegistry(tc.cfg)
		if (err == nil || !strings.Contains(err.Error(), "serde: invalid config")) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("NewRegistry(%+v) = %v; want an invalid-config error naming %s", tc.cfg, err, tc.says)
		}
	}
	if _, err := serde.Avro[OrderV1](nil, serde.Options{Schema: "{not avro"}); err == nil || !strings.Contains(err.Error(), "serde: invalid config") {
		t.Errorf("Avro with a bad Options.Schema: %v", err)
	}
}
