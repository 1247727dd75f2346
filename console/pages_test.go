package console

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"testing"
	"time"

	"github.com/idemhq/idem/internal/failidx"
	"github.com/idemhq/idem/internal/keyorder"
)

// TestParkedKeysAndOutboxPages: the parked-keys and failed-outbox pages
// list what is there, and their forms release a key (its parked record goes
// back to the source topic) and retry a row, each audited.
func TestParkedKeysAndOutboxPages(t *testing.T) {
	e := newEnv(t, nil)
	ctx := t.Context()
	op := e.login(t, operatorSecret)

	// Empty first.
	for _, p := range []string{"/parked-keys", "/outbox"} {
		if code, page := e.get(t, op, p); code != http.StatusOK || !bytes.Contains(page, []byte("No ")) {
			t.Errorf("%s with nothing: %d", p, code)
		}
	}

	// A key blocked behind head h-1 with one record parked behind it.
	source, group := e.k.Topic(t, "payments", 1), e.k.Group(t, "billing")
	ko := keyorder.New(e.pool, group)
	if err := ko.BlockTier(ctx, source, []byte("acct-<7>"), "h-1", 1); err != nil {
		t.Fatal(err)
	}
	if _, err := ko.Park(ctx, keyorder.Record{Topic: source, Key: []byte("acct-<7>"), IdempotencyKey: "p-2", Offset: 5,
		Timestamp: time.Now(), Value: []byte(`{"n":2}`), Headers: []keyorder.Header{{Key: "idempotency-key", Value: []byte("p-2")}}}); err != nil {
		t.Fatal(err)
	}
	// A failed outbox row.
	var rowID int64
	if err := e.pool.QueryRow(ctx, `INSERT INTO idem_outbox (topic, key, value, state, attempts, last_error)
		VALUES ('no-such-topic', 'order-9', '{}', 'failed', 5, 'unknown topic <b>no-such-topic</b>') RETURNING id`).Scan(&rowID); err != nil {
		t.Fatal(err)
	}

	code, page := e.get(t, op, "/parked-keys")
	if code != http.StatusOK || !bytes.Contains(page, []byte("acct-&lt;7&gt;")) || !bytes.Contains(page, []byte(group)) {
		t.Fatalf("parked keys page: %d\n%s", code, page)
	}
	code, b := e.call(t, "GET", "/api/parked-keys", viewerSecret, nil)
	var pk struct{ Keys []parkedView }
	if err := json.Unmarshal(b, &pk); code != 200 || err != nil || len(pk.Keys) != 1 || pk.Keys[0].Parked != 1 || pk.Keys[0].Head != "h-1" {
		t.Errorf("API parked keys: %d %s", code, b)
	}
	before := e.hwm(t, source)
	code, page = e.post(t, op, "/parked-keys/release", url.Values{"csrf": {formCSRF(t, page)}, "group": {group}, "topic": {source}, "key": {"acct-<7>"}, "reason": {"head resolved by hand"}})
	if code != http.StatusOK || !bytes.Contains(page, []byte(`id="result"`)) {
		t.Fatalf("release: %d\n%s", code, page)
	}
	if after := e.hwm(t, source); after != before+1 {
		t.Errorf("release sent %d records to %s, want the 1 parked", after-before, source)
	}
	if _, page = e.get(t, op, "/parked-keys"); bytes.Contains(page, []byte("acct-&lt;7&gt;")) {
		t.Error("the released key is still listed")
	}

	code, page = e.get(t, op, "/outbox")
	if code != http.StatusOK || !bytes.Contains(page, []byte("unknown topic &lt;b&gt;no-such-topic&lt;/b&gt;")) {
		t.Fatalf("outbox page: %d\n%s", code, page)
	}
	code, page = e.post(t, op, "/outbox/retry", url.Values{"csrf": {formCSRF(t, page)}, "ids": {fmt.Sprint(rowID)}, "reason": {"topic created"}})
	if code != http.StatusOK {
		t.Fatalf("outbox retry: %d\n%s", code, page)
	}
	var state string
	if err := e.pool.QueryRow(ctx, `SELECT state FROM idem_outbox WHERE id = $1`, rowID).Scan(&state); err != nil || state != "pending" {
		t.Errorf("outbox row after retry: %q %v, want pending", state, err)
	}
	acts := map[string]string{}
	for _, a := range e.audit(t) {
		acts[a.Action] = a.Actor + ": " + a.Reason
	}
	if acts["release-key"] != "olga: head resolved by hand" || acts["retry-outbox"] != "olga: topic created" {
		t.Errorf("audit: %v", acts)
	}
}

// TestGroupActions: an admin resolves a whole failure group from the groups
// page; the records of other groups stay unresolved.
func TestGroupActions(t *testing.T) {
	e := newEnv(t, nil)
	ids, dlqTopic, _ := seedTwo(t, e)
	e.seedDLQ(t, dlqTopic, "other", dead{key: "pay-3", value: []byte(`{}`), kind: "decode", err: "decode: unexpected end of JSON input"})
	all := e.waitIndexed(t, failidx.Filter{Topic: dlqTopic}, 3)
	r1, err := e.store.Get(t.Context(), ids[0])
	if err != nil {
		t.Fatal(err)
	}
	admin := e.login(t, adminSecret)
	code, page := e.get(t, admin, "/groups?status=unresolved")
	if code != http.StatusOK || !bytes.Contains(page, []byte("All 2 unresolved")) {
		t.Fatalf("groups page: %d\n%s", code, page)
	}
	// The form of r1's group, as the page renders it.
	re := regexp.MustCompile(`(?s)name="fingerprint" value="` + regexp.QuoteMeta(r1.Fingerprint) + `"`)
	if !re.Match(page) {
		t.Fatalf("no whole-group form for %s", r1.Fingerprint)
	}
	form := rowForm(t, page, dlqTopic)
	if form.Get("fingerprint") != r1.Fingerprint {
		form = url.Values{"scope": {"filter"}, "fingerprint": {r1.Fingerprint}, "kind": {r1.Kind}, "group": {r1.Group}, "topic": {r1.Topic}, "status": {"unresolved"}}
	}
	form.Set("csrf", formCSRF(t, page))
	form.Set("action", "resolve")
	form.Set("reason", "card issuer fixed")
	code, page = e.post(t, admin, "/actions", form)
	if code != http.StatusOK {
		t.Fatalf("resolve group: %d\n%s", code, page)
	}
	want := map[int64]failidx.Status{}
	for _, r := range all {
		want[r.ID] = failidx.Unresolved
	}
	want[ids[0]], want[ids[1]] = failidx.Resolved, failidx.Resolved
	for id, st := range want {
		if got := statuses(t, e, id); got != string(st) {
			t.Errorf("record %d: %s, want %s", id, got, st)
		}
	}
	// An operator sees no whole-group controls.
	op := e.login(t, operatorSecret)
	if _, page = e.get(t, op, "/groups"); bytes.Contains(page, []byte(`name="scope"`)) {
		t.Error("the groups page offers an operator whole-group actions")
	}
}
