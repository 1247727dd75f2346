package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/internal/wire"
	"github.com/idemhq/idem/retrytopic"
	"github.com/idemhq/idem/serde"
)

type cliPayment struct {
	ID   string  `avro:"id"`
	Card cliCard `avro:"card"`
}

type cliCard struct {
	Number string `avro:"number"`
}

// idem dlq show decodes a dead letter whose value is Avro in the schema
// registry's wire format to JSON (--registry-url), from the topic and from
// the failure index, as text and as JSON, naming its schema; --mask then
// masks the decoded field, and the card number it holds is scrubbed from
// the error text too. Without the registry the value is its bytes.
func TestCLIShowDecodesRegistryValues(t *testing.T) {
	k, pool, db, topic, origin := dlqAndEmptySchema(t)
	url, reg, ctx := testRegistryClient(t)
	subject := topic + "-value"
	// The namespace is the test's own: a registry gives one schema one id,
	// whatever subject it is registered under, and names its first subject.
	codec, err := serde.Avro[cliPayment](reg, serde.Options{Subject: subject, Schema: `{"type":"record","name":"Payment","namespace":"idem.clitest.` + topic + `",
		"fields":[{"name":"id","type":"string"},{"name":"card","type":{"type":"record","name":"Card","fields":[{"name":"number","type":"string"}]}}]}`})
	if err != nil {
		t.Fatal(err)
	}
	value, err := codec.Encode(ctx, cliPayment{ID: "pay-1", Card: cliCard{Number: "4111111111111111"}})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	f := retrytopic.Failure{Attempt: 1, OriginalTopic: origin, Group: "billing", Kind: handler.KindPermanent,
		Error: "charge card 4111111111111111: declined", FirstFailureAt: now, LastFailureAt: now}
	hs := wire.Encode([]sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte("pay-1")}}, f)
	k.Produce(t, topic, idemtest.Record{Key: []byte("pay-1"), Value: value, Headers: kitHeaders(hs)})

	reg2 := []string{"--registry-url", url}
	masks := []string{"--mask", "card.number"}
	code, out, _ := idem(t, k, "", append([]string{"dlq", "show", "-t", topic, "--offset", "0"}, reg2...)...)
	if code != 0 || !strings.Contains(out, "decoded with schema id") || !strings.Contains(out, "subject "+subject) ||
		!strings.Contains(out, `"number": "4111111111111111"`) {
		t.Fatalf("show with --registry-url: %d\n%s", code, out)
	}
	code, out, _ = idem(t, k, "", "dlq", "show", "-t", topic, "--offset", "0", "--registry-url", "")
	if code != 0 || strings.Contains(out, "decoded with") || strings.Contains(out, `"number"`) {
		t.Fatalf("show without a registry decodes: %d\n%s", code, out)
	}
	id := indexOne(t, k, pool, topic)
	for _, args := range [][]string{
		{"dlq", "show", "-t", topic, "--offset", "0"},
		{"dlq", "show", "-t", topic, "--offset", "0", "--json"},
		{"dlq", "list", "-t", topic},
		{"dlq", "show", "--id", fmt.Sprint(id), "--database-url", db},
		{"dlq", "show", "--id", fmt.Sprint(id), "--database-url", db, "--json"},
		{"dlq", "list", "-t", topic, "--database-url", db},
	} {
		code, out, _ := idem(t, k, "", append(append(args, reg2...), masks...)...)
		if code != 0 || strings.Contains(out, "4111111111111111") {
			t.Errorf("idem %s --mask: code %d, shows the card number\n%s", strings.Join(args, " "), code, out)
		}
		if args[1] == "show" && (!strings.Contains(out, "****") || !strings.Contains(out, "pay-1") || !strings.Contains(out, fmt.Sprint(subject))) {
			t.Errorf("idem %s --mask: want the decoded value, masked, and its subject\n%s", strings.Join(args, " "), out)
		}
	}
}
