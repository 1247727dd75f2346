package console

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/idemtest"
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

// TestMaskingCoversJobsAndRefusals: with masking on, a card number in what
// an operator typed (a replay job's reason and filter, the reason of an
// action refused for its role) reaches no viewer: not in the action's
// answer, the jobs (API and pages) or the audit of the refusal.
func TestMaskingCoversJobsAndRefusals(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.Mask = []string{"card.number"} })
	dlqTopic, origin := e.k.Topic(t, "dlq", 1), e.k.Topic(t, "origin", 1)
	e.seedDLQ(t, dlqTopic, origin, dead{key: "order-8", value: []byte(`{"card":{"number":"` + secretPAN + `"}}`),
		kind: handler.KindPermanent, err: "charge card " + secretPAN + ": declined"})
	e.runIndexer(t, dlqTopic)
	e.waitIndexed(t, failidx.Filter{Topic: dlqTopic}, 1)

	code, b := e.call(t, "POST", "/api/actions/replay", adminSecret, map[string]any{"filter": map[string]any{"error": secretPAN},
		"all_groups": true, "reason": "customer confirmed card " + secretPANSpaced})
	if code != http.StatusOK && code != http.StatusAccepted {
		t.Fatalf("replay: %d %s", code, b)
	}
	if l := leaks(b, secretPAN, secretPANSpaced); len(l) > 0 {
		t.Errorf("the replay's answer shows %q:\n%s", l, b)
	}
	code, b = e.call(t, "POST", "/api/actions/archive", operatorSecret, map[string]any{"filter": map[string]any{"error": "declined"},
		"all_groups": true, "reason": "card " + secretPAN + " is stolen"})
	if code != http.StatusForbidden {
		t.Fatalf("an operator's filter: %d %s, want 403", code, b)
	}
	var jobs struct {
		Jobs []struct{ ID int64 } `json:"jobs"`
	}
	idemtest.Eventually(t, 30*time.Second, func() error {
		code, b := e.call(t, "GET", "/api/jobs", viewerSecret, nil)
		if err := json.Unmarshal(b, &jobs); code != http.StatusOK || err != nil || len(jobs.Jobs) != 1 {
			return fmt.Errorf("jobs: %d %s", code, b)
		}
		return nil
	})
	job := fmt.Sprint("/jobs/", jobs.Jobs[0].ID)
	audit := func() error {
		_, b := e.call(t, "GET", "/api/audit", viewerSecret, nil)
		if !bytes.Contains(b, []byte(`"archive"`)) || !bytes.Contains(b, []byte(`"replay"`)) {
			return fmt.Errorf("the audit has no refused archive and no replay yet:\n%s", b)
		}
		return nil
	}
	idemtest.Eventually(t, 30*time.Second, audit)
	for _, path := range []string{"/api/jobs", "/api" + job, "/api/audit"} {
		code, b := e.call(t, "GET", path, viewerSecret, nil)
		if code != http.StatusOK {
			t.Fatalf("GET %s: %d %s", path, code, b)
		}
		if l := leaks(b, secretPAN, secretPANSpaced); len(l) > 0 {
			t.Errorf("GET %s shows %q:\n%s", path, l, b)
		}
	}
	vic := e.login(t, viewerSecret)
	for _, path := range []string{"/jobs", job, "/audit"} {
		code, page := e.get(t, vic, path)
		if code != http.StatusOK {
			t.Fatalf("GET %s: %d\n%s", path, code, page)
		}
		if l := leaks(page, secretPAN, secretPANSpaced); len(l) > 0 {
			t.Errorf("page %s shows %q", path, l)
		}
	}
}
