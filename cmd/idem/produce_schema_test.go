package main

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/sr/srfake"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/serde"
)

// produceOrder is the Avro record of TestProduceWithSchema.
type produceOrder struct {
	ID       string `avro:"id"`
	Cents    int64  `avro:"cents"`
	Currency string `avro:"currency"`
}

// testRegistry is the schema registry of `make services` (SCHEMA_REGISTRY_URL),
// or franz-go's in-process fake when it is not set and the real services are
// not required.
func testRegistry(t *testing.T) string {
	if u := os.Getenv("SCHEMA_REGISTRY_URL"); u != "" {
		return u
	}
	if os.Getenv("IDEM_REQUIRE_REAL_KAFKA") == "1" {
		t.Fatal("SCHEMA_REGISTRY_URL is not set: make services starts a registry")
	}
	fake := srfake.New()
	t.Cleanup(fake.Close)
	return fake.URL()
}

// testRegistryClient returns testRegistry's URL, a client of it, and a
// context for its requests.
func testRegistryClient(t *testing.T) (string, *serde.Registry, context.Context) {
	t.Helper()
	url := testRegistry(t)
	reg, err := serde.NewRegistry(serde.RegistryConfig{URL: url})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return url, reg, ctx
}

// idem produce --schema-subject writes each JSON line in Confluent's wire
// format with the subject's latest schema; a line that does not fit stops
// everything before anything is sent.
func TestProduceWithSchema(t *testing.T) {
	k := idemtest.Connect(t)
	topic := k.Topic(t, "typed", 1)
	url, reg, ctx := testRegistryClient(t)
	subject := topic + "-value"
	if _, err := reg.Register(ctx, subject, "AVRO", `{"type":"record","name":"Order","fields":[
		{"name":"id","type":"string"},{"name":"cents","type":"long"},{"name":"currency","type":"string","default":"EUR"}]}`); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := idem(t, k, "o-1:{\"id\":\"o-1\",\"cents\":10}\no-2:{\"id\":\"o-2\",\"cents\":\"ten\"}\n",
		"produce", topic, "--key-sep", ":", "--schema-subject", subject, "--registry-url", url)
	if code != 1 || !strings.Contains(errOut, "line 2 does not fit schema id") || !strings.Contains(errOut, "cents") {
		t.Fatalf("a line that does not fit: exit %d, %q", code, errOut)
	}
	code, out, _ := idem(t, k, "o-1:{\"id\":\"o-1\",\"cents\":10}\no-2:{\"id\":\"o-2\",\"cents\":20,\"currency\":\"USD\"}\n",
		"produce", topic, "--key-sep", ":", "--key-header", "idempotency-key", "--schema-subject", subject, "--registry-url", url)
	if code != 0 || !strings.Contains(out, "produced 2 records") {
		t.Fatalf("exit %d: %s", code, out)
	}
	orders, err := serde.Avro[produceOrder](reg, serde.Options{})
	if err != nil {
		t.Fatal(err)
	}
	recs := k.ReadDLQ(t, topic, 2) // any topic: the first two records
	for i, want := range []produceOrder{{"o-1", 10, "EUR"}, {"o-2", 20, "USD"}} {
		got, err := orders.Decode(ctx, &handler.Message{Value: recs[i].Value})
		if err != nil || got != want {
			t.Fatalf("record %d = %+v, %v; want %+v", i, got, err, want)
		}
	}
	for _, tc := range []struct{ args, says string }{
		{"--schema-subject " + subject + " --schema-id 1", "not both"},
		{"--schema-message Order", "needs --schema-subject"},
		{"--schema-subject no-such-subject-" + topic + " --registry-url " + url, "not found"},
	} {
		code, _, errOut := idem(t, k, "{}\n", append([]string{"produce", topic}, strings.Fields(tc.args)...)...)
		if code != 1 || !strings.Contains(errOut, tc.says) {
			t.Errorf("idem produce %s: exit %d, %q; want %q", tc.args, code, errOut, tc.says)
		}
	}
}
