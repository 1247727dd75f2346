package console

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/failidx"
	"github.com/idemhq/idem/serde"
)

// paymentSchema is the Avro record of TestRegistryPayloadDecoded, in
// namespace %s: the test's own, since a registry gives one schema one id,
// whatever subject it is registered under, and names its first subject.
const paymentSchema = `{"type":"record","name":"Payment","namespace":"%s","fields":[
	{"name":"id","type":"string"},
	{"name":"card","type":{"type":"record","name":"Card","fields":[{"name":"number","type":"string"}]}},
	{"name":"cents","type":"long"}]}`

type testPayment struct {
	ID    string   `avro:"id"`
	Card  testCard `avro:"card"`
	Cents int64    `avro:"cents"`
}

type testCard struct {
	Number string `avro:"number"`
}

// registryFor returns a Registry on the schema registry make services
// starts (SCHEMA_REGISTRY_URL); the test is skipped without one, unless
// IDEM_REQUIRE_REAL_KAFKA=1, when it fails.
func registryFor(t *testing.T) *serde.Registry {
	t.Helper()
	url := os.Getenv("SCHEMA_REGISTRY_URL")
	if url == "" {
		if os.Getenv("IDEM_REQUIRE_REAL_KAFKA") == "1" {
			t.Fatal("SCHEMA_REGISTRY_URL is not set: `make services` starts a schema registry; export .state/services.env")
		}
		t.Skip("SCHEMA_REGISTRY_URL is not set")
	}
	reg, err := serde.NewRegistry(serde.RegistryConfig{URL: url, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

// TestRegistryPayloadDecoded: a dead letter whose value is Avro in the
// registry's wire format is shown decoded to JSON, with its schema, by the
// API and the record page; with card.number masked, the decoded field is
// masked and the card number is scrubbed from the error text too (found in
// the decoded fields), and the raw bytes, which hold it, are not shown.
func TestRegistryPayloadDecoded(t *testing.T) {
	reg := registryFor(t)
	run := time.Now().UnixNano()
	subject := fmt.Sprintf("console-test-%d-value", run)
	codec, err := serde.Avro[testPayment](reg, serde.Options{Subject: subject, Schema: fmt.Sprintf(paymentSchema, fmt.Sprintf("idem.consoletest.t%d", run))})
	if err != nil {
		t.Fatal(err)
	}
	value, err := codec.Encode(t.Context(), testPayment{ID: "pay-7", Card: testCard{Number: secretPAN}, Cents: 1250})
	if err != nil {
		t.Fatal(err)
	}
	for _, masked := range []bool{false, true} {
		t.Run(fmt.Sprintf("masked=%v", masked), func(t *testing.T) {
			e := newEnv(t, func(c *Config) {
				c.Registry = reg
				if masked {
					c.Mask = []string{"card.number"}
				}
			})
			dlqTopic, origin := e.k.Topic(t, "dlq", 1), e.k.Topic(t, "origin", 1)
			e.seedDLQ(t, dlqTopic, origin, dead{key: "pay-7", value: value, kind: handler.KindPermanent,
				err: "charge card " + secretPAN + ": declined"})
			e.runIndexer(t, dlqTopic)
			rec := e.waitIndexed(t, failidx.Filter{Topic: dlqTopic}, 1)[0]
			code, b := e.call(t, "GET", fmt.Sprintf("/api/records/%d", rec.ID), viewerSecret, nil)
			if code != http.StatusOK {
				t.Fatalf("GET record: %d %s", code, b)
			}
			var got struct {
				Error string `json:"error"`
				Value struct {
					Text    string `json:"text"`
					Base64  string `json:"base64"`
					Decoded string `json:"decoded"`
					Masked  int    `json:"masked_values"`
					Hidden  bool   `json:"hidden"`
					Schema  *struct {
						ID      int    `json:"id"`
						Subject string `json:"subject"`
						Type    string `json:"type"`
					} `json:"schema"`
				} `json:"value"`
			}
			if err := json.Unmarshal(b, &got); err != nil {
				t.Fatal(err)
			}
			if s := got.Value.Schema; s == nil || s.Subject != subject || s.Type != "AVRO" || s.ID == 0 {
				t.Fatalf("schema %+v, want AVRO, subject %s", s, subject)
			}
			if masked {
				if got.Value.Hidden || got.Value.Masked != 1 || !strings.Contains(got.Value.Text, `"number":"****"`) || got.Value.Base64 != "" {
					t.Fatalf("masked value %+v: want the decoded JSON with card.number masked, no raw bytes", got.Value)
				}
				if leaks(b, secretPAN) != nil {
					t.Fatalf("the card number leaks: %s", b)
				}
				return
			}
			var p map[string]any
			if err := json.Unmarshal([]byte(got.Value.Decoded), &p); err != nil || p["id"] != "pay-7" || p["card"].(map[string]any)["number"] != secretPAN {
				t.Fatalf("decoded %q (%v), want the payment as JSON", got.Value.Decoded, err)
			}
			code, page := e.get(t, e.login(t, viewerSecret), fmt.Sprintf("/records/%d", rec.ID))
			if code != http.StatusOK || !strings.Contains(string(page), "&#34;id&#34;: &#34;pay-7&#34;") || !strings.Contains(string(page), "schema id") {
				t.Fatalf("the record page (%d) does not show the decoded value and its schema:\n%s", code, page)
			}
		})
	}
}
