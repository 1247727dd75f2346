package console

import (
	"bytes"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/failidx"
)

// The secrets of TestMaskedValueInsideText: a card number and an e-mail
// address at masked JSON paths of the record's value, also written into its
// error text, stack, headers and key.
const (
	secretPAN       = "4111111111111111"
	secretPANSpaced = "4111 1111 1111 1111"
	secretEmail     = "ann.lee@example.com"
)

// leaks reports which of the secrets b shows.
func leaks(b []byte, secrets ...string) []string {
	var out []string
	for _, s := range secrets {
		if bytes.Contains(b, []byte(s)) {
			out = append(out, s)
		}
	}
	return out
}

// TestMaskedValueInsideText: with card.number and customer.email masked, a
// card number and an e-mail address written into the error text, the stack,
// a header and the Kafka key never reach a viewer: not in the API (record,
// record list, failure groups, audit, failed outbox rows), nor in the HTML
// pages. An operator's reveal shows them, audited.
func TestMaskedValueInsideText(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.Mask = []string{"card.number", "customer.email"} })
	dlqTopic, origin := e.k.Topic(t, "dlq", 1), e.k.Topic(t, "origin", 1)
	e.seedDLQ(t, dlqTopic, origin, dead{
		key:   "order-7 " + secretEmail,
		value: []byte(`{"id":"order-7","card":{"number":"` + secretPAN + `"},"customer":{"email":"` + secretEmail + `","name":"Ann"}}`),
		kind:  handler.KindPermanent,
		err:   "charge card " + secretPAN + " for " + secretEmail + ": declined",
		stack: "goroutine 7 [running]:\nmain.charge({0x" + secretPAN + "}, \"" + secretEmail + "\")",
		headers: []sarama.RecordHeader{
			{Key: []byte("x-card"), Value: []byte("card " + secretPANSpaced)},
			{Key: []byte("x-customer"), Value: []byte(secretEmail)},
		},
	})
	e.runIndexer(t, dlqTopic)
	rec := e.waitIndexed(t, failidx.Filter{Topic: dlqTopic}, 1)[0]
	id := fmt.Sprint(rec.ID)

	// An operator acts with the card number in the reason; a failed outbox
	// row's error holds it too.
	if code, b := e.call(t, "POST", "/api/actions/resolve", operatorSecret, map[string]any{"ids": []int64{rec.ID},
		"reason": "customer says card " + secretPAN + " was stolen"}); code != http.StatusOK {
		t.Fatalf("resolve: %d %s", code, b)
	}
	if _, err := e.pool.Exec(t.Context(), `INSERT INTO idem_outbox (topic, key, value, state, attempts, last_error)
		VALUES ('payments', 'order-7', '{}', 'failed', 5, $1)`, "serialize card "+secretPAN+": bad field"); err != nil {
		t.Fatal(err)
	}

	all := []string{secretPAN, secretPANSpaced, secretEmail}
	for _, path := range []string{"/api/records/" + id, "/api/records?topic=" + url.QueryEscape(dlqTopic) + "&status=any",
		"/api/groups?status=resolved", "/api/groups?status=resolved&error=declined", "/api/audit", "/api/outbox/failed"} {
		code, b := e.call(t, "GET", path, viewerSecret, nil)
		if code != http.StatusOK {
			t.Fatalf("GET %s: %d %s", path, code, b)
		}
		if l := leaks(b, all...); len(l) > 0 {
			t.Errorf("GET %s shows %q:\n%s", path, l, b)
		}
	}
	vic := e.login(t, viewerSecret)
	for _, path := range []string{"/records/" + id, "/records?topic=" + url.QueryEscape(dlqTopic) + "&status=any",
		"/groups?status=resolved", "/audit", "/outbox"} {
		code, page := e.get(t, vic, path)
		if code != http.StatusOK {
			t.Fatalf("GET %s: %d\n%s", path, code, page)
		}
		if l := leaks(page, all...); len(l) > 0 {
			t.Errorf("page %s shows %q", path, l)
		}
	}
	// As a person sees them in Chromium.
	paths := []string{"/records/" + id, "/records?topic=" + url.QueryEscape(dlqTopic) + "&status=any", "/groups?status=resolved", "/audit", "/outbox"}
	for i, text := range inChromium(t, e, viewerSecret, paths...) {
		if l := leaks([]byte(text), all...); len(l) > 0 || !strings.Contains(text, "****") && i < 3 {
			t.Errorf("%s in Chromium shows %q:\n%s", paths[i], l, text)
		}
	}
	// The record page says what it masked.
	if code, b := e.call(t, "GET", "/api/records/"+id, viewerSecret, nil); code != http.StatusOK || !bytes.Contains(b, []byte("charge card **** for ****: declined")) {
		t.Errorf("record: %d, want the error with both secrets masked:\n%s", code, b)
	}

	// An operator who reveals (a POST) sees them, and the reveal is audited.
	code, b := e.call(t, "POST", "/api/records/"+id+"/reveal", operatorSecret, map[string]any{})
	if code != http.StatusOK || len(leaks(b, secretPAN, secretEmail)) != 2 {
		t.Errorf("revealed record: %d, want the card number and e-mail shown:\n%s", code, b)
	}
}
