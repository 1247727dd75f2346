package console

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"unicode/utf8"

	"github.com/IBM/sarama"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/failidx"
)

// seedTwo indexes two dead letters of one origin topic and returns their ids
// (pay-1's first), the DLQ topic and the origin topic.
func seedTwo(t *testing.T, e *env) ([]int64, string, string) {
	t.Helper()
	dlqTopic, origin := e.k.Topic(t, "dlq", 1), e.k.Topic(t, "origin", 1)
	e.seedDLQ(t, dlqTopic, origin,
		dead{key: "pay-1", value: []byte(`{"id":"pay-1","card":{"number":"4111111111111111"},"amount":10}`), kind: handler.KindPermanent, err: "card declined"},
		dead{key: "pay-2", value: []byte(`{"id":"pay-2","card":{"number":"5500000000000004"},"amount":20}`), kind: handler.KindPermanent, err: "card declined"},
	)
	e.runIndexer(t, dlqTopic)
	recs := e.waitIndexed(t, failidx.Filter{Topic: dlqTopic}, 2)
	if recs[0].IdempotencyKey == "pay-2" {
		recs[0], recs[1] = recs[1], recs[0]
	}
	return []int64{recs[0].ID, recs[1].ID}, dlqTopic, origin
}

// TestAuth: no token → 401; a viewer → 403 on every action; a missing or
// wrong CSRF token → 403; an unmasked view as operator → an audit row; and
// none of the refused requests changes anything (each writes an audit row
// saying it was refused).
func TestAuth(t *testing.T) {
	// Every route is tried with a bad token: more than an address's budget
	// of bad tokens (TestLoginsAreRateLimited tests that budget).
	e := newEnv(t, func(c *Config) { c.Mask = []string{"card.number"}; c.loginBurst = 1000 })
	ids, _, origin := seedTwo(t, e)
	id := fmt.Sprint(ids[0])
	before := e.hwm(t, origin)

	// No token: 401 on every API route but the OpenAPI document.
	for _, rt := range (&server{}).routes() {
		if !rt.api || rt.public {
			continue
		}
		path := strings.NewReplacer("{id}", id, "{action}", "replay").Replace(rt.path)
		var body any
		if rt.method == "POST" {
			body = map[string]any{}
		}
		if code, b := e.call(t, rt.method, path, "", body); code != http.StatusUnauthorized {
			t.Errorf("%s %s without a token: %d %s, want 401", rt.method, path, code, b)
		}
		if code, _ := e.call(t, rt.method, path, "not-a-token-0123456789", body); code != http.StatusUnauthorized {
			t.Errorf("%s %s with an unknown token: %d, want 401", rt.method, path, code)
		}
	}
	// The UI sends an anonymous visitor to the login page.
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noRedirect.Get(e.srv.URL + "/records")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), "/login") {
		t.Errorf("UI without a session: %d → %q, want 303 to /login", resp.StatusCode, resp.Header.Get("Location"))
	}

	// A viewer reads (masked) and is refused every action.
	code, b := e.call(t, "GET", "/api/records/"+id, viewerSecret, nil)
	if code != http.StatusOK || bytes.Contains(b, []byte("4111111111111111")) || bytes.Contains(b, []byte("5500000000000004")) || !bytes.Contains(b, []byte(`\"number\":\"****\"`)) {
		t.Errorf("viewer GET record: %d, want 200 with the card number masked:\n%s", code, b)
	}
	for _, c := range []struct {
		method, path string
		body         any
	}{
		{"POST", "/api/actions/replay", map[string]any{"ids": ids}},
		{"POST", "/api/actions/resolve", map[string]any{"ids": ids}},
		{"POST", "/api/actions/archive", map[string]any{"ids": ids, "reason": "r"}},
		{"POST", "/api/records/" + id + "/edit-retry", map[string]any{"value": `{"id":"pay-1"}`}},
		{"POST", "/api/parked-keys/release", map[string]any{"group": "g", "topic": "t", "key": "k", "reason": "r"}},
		{"POST", "/api/outbox/retry", map[string]any{"ids": []int64{1}}},
		{"POST", "/api/records/" + id + "/reveal", map[string]any{}},
		{"POST", "/api/records/" + id + "/value", map[string]any{}},
		{"POST", "/api/jobs/1/cancel", map[string]any{}},
	} {
		if code, b := e.call(t, c.method, c.path, viewerSecret, c.body); code != http.StatusForbidden {
			t.Errorf("viewer %s %s: %d %s, want 403", c.method, c.path, code, b)
		}
	}
	viewer := e.login(t, viewerSecret)
	_, page := e.get(t, viewer, "/records/"+id)
	csrf := formCSRF(t, page)
	for _, c := range []struct {
		path string
		form url.Values
	}{
		{"/actions", url.Values{"action": {"replay"}, "ids": {id}}},
		{"/actions", url.Values{"action": {"archive"}, "ids": {id}, "reason": {"r"}}},
		{"/records/" + id + "/edit", nil},
		{"/records/" + id + "/edit-retry", url.Values{"value": {`{}`}}},
		{"/records/" + id + "/reveal", nil},
		{"/records/" + id + "/value", nil},
		{"/parked-keys/release", url.Values{"group": {"g"}, "topic": {"t"}, "key": {"k"}, "reason": {"r"}}},
		{"/outbox/retry", url.Values{"ids": {"1"}}},
	} {
		f := url.Values{"csrf": {csrf}}
		for k, v := range c.form {
			f[k] = v
		}
		if code, _ := e.post(t, viewer, c.path, f); code != http.StatusForbidden {
			t.Errorf("viewer UI POST %s: %d, want 403", c.path, code)
		}
	}
	// An operator may not act on a whole group: that is the admin's.
	if code, b := e.call(t, "POST", "/api/actions/resolve", operatorSecret, map[string]any{"filter": map[string]any{"topic": "x"}}); code != http.StatusForbidden {
		t.Errorf("operator resolve by filter: %d %s, want 403", code, b)
	}

	// CSRF: an operator's form without the token, or with another session's.
	op := e.login(t, operatorSecret)
	for name, tok := range map[string]string{"missing": "", "another session's": csrf, "forged": "AAAA"} {
		f := url.Values{"action": {"archive"}, "ids": {id}, "reason": {"csrf test"}}
		if tok != "" {
			f.Set("csrf", tok)
		}
		code, b := e.post(t, op, "/actions", f)
		if code != http.StatusForbidden || !bytes.Contains(b, []byte("CSRF")) {
			t.Errorf("operator POST /actions with a %s CSRF token: %d, want 403 naming CSRF", name, code)
		}
	}
	// The API from the browser's session (no bearer) needs the header too.
	req, _ := http.NewRequest("POST", e.srv.URL+"/api/actions/resolve", strings.NewReader(`{"ids":[`+id+`]}`))
	req.Header.Set("Content-Type", "application/json")
	if resp, err := op.Do(req); err != nil || resp.StatusCode != http.StatusForbidden {
		t.Errorf("API POST with the session cookie and no CSRF header: %v %v, want 403", resp.StatusCode, err)
	}

	if got := statuses(t, e, ids...); got != "unresolved,unresolved" {
		t.Errorf("statuses after refused requests: %s", got)
	}
	for _, a := range e.audit(t) {
		if !strings.HasPrefix(a.Result, "rejected 403") {
			t.Errorf("audit row after refused requests: %+v, want a refusal", a)
		}
	}
	refusals := len(e.audit(t))
	if after := e.hwm(t, origin); after != before {
		t.Errorf("refused requests published %d records", after-before)
	}

	// Unmasked views: API and UI, each audited.
	code, b = e.call(t, "POST", "/api/records/"+id+"/reveal", operatorSecret, map[string]any{})
	if code != http.StatusOK || !bytes.Contains(b, []byte("4111111111111111")) {
		t.Errorf("operator reveal: %d, want 200 with the card number:\n%s", code, b)
	}
	_, page = e.get(t, op, "/records/"+id)
	if bytes.Contains(page, []byte("4111111111111111")) {
		t.Error("the record page shows the card number before a reveal")
	}
	code, page = e.post(t, op, "/records/"+id+"/reveal", url.Values{"csrf": {formCSRF(t, page)}})
	if code != http.StatusOK || !bytes.Contains(page, []byte("4111111111111111")) {
		t.Errorf("UI reveal: %d", code)
	}
	es := e.audit(t)
	if len(es) != refusals+2 {
		t.Fatalf("audit after two reveals: %+v", es)
	}
	es = es[:2]
	for _, a := range es {
		if a.Action != "reveal" || a.Actor != "olga" || len(a.RecordIDs) != 1 || a.RecordIDs[0] != ids[0] {
			t.Errorf("reveal audit row: %+v", a)
		}
	}

	// With the CSRF token the same form works.
	_, page = e.get(t, op, "/records/"+id)
	code, page = e.post(t, op, "/actions", url.Values{"csrf": {formCSRF(t, page)}, "action": {"archive"}, "ids": {id}, "reason": {"duplicate of a refund"}})
	if code != http.StatusOK || statuses(t, e, ids[0]) != "archived" {
		t.Errorf("archive with the CSRF token: %d, status %s\n%s", code, statuses(t, e, ids[0]), page)
	}
}

// TestBadInput: malformed JSON edit, unknown record, replay to a missing
// topic, empty reason where one is required, and malformed requests get a
// clear 4xx, and nothing is published or changed.
func TestBadInput(t *testing.T) {
	e := newEnv(t, nil)
	ids, _, origin := seedTwo(t, e)
	id := fmt.Sprint(ids[0])
	before := e.hwm(t, origin)
	for _, c := range []struct {
		name, method, path string
		body               any
		want               int
		says               string
	}{
		{"malformed JSON edit", "POST", "/api/records/" + id + "/edit-retry", map[string]any{"value": `{"id":"pay-1",`, "reason": "fix"}, 400, "not valid JSON"},
		{"edit without value", "POST", "/api/records/" + id + "/edit-retry", map[string]any{"reason": "fix"}, 400, "value is missing"},
		{"edit of an unknown record", "POST", "/api/records/987654321/edit-retry", map[string]any{"value": `{}`}, 404, "987654321"},
		{"unknown record", "GET", "/api/records/987654321", nil, 404, "987654321"},
		{"record id not a number", "GET", "/api/records/abc", nil, 404, "no such record"},
		{"replay of an unknown record", "POST", "/api/actions/replay", map[string]any{"ids": []int64{987654321}}, 404, "987654321"},
		{"replay to a missing topic", "POST", "/api/actions/replay", map[string]any{"ids": ids, "to": "no-such-topic-x9"}, 400, "no-such-topic-x9"},
		{"archive without a reason", "POST", "/api/actions/archive", map[string]any{"ids": ids, "reason": "  "}, 400, "reason"},
		{"unknown action", "POST", "/api/actions/delete", map[string]any{"ids": ids}, 404, "unknown action"},
		{"nothing selected", "POST", "/api/actions/resolve", map[string]any{}, 400, "no records selected"},
		{"ids and filter", "POST", "/api/actions/resolve", map[string]any{"ids": ids, "filter": map[string]any{"topic": "x"}}, 400, "not both"},
		{"filter that selects everything", "POST", "/api/actions/resolve", map[string]any{"filter": map[string]any{}}, 400, "every record"},
		{"negative rate", "POST", "/api/actions/replay", map[string]any{"ids": ids, "rate": -1}, 400, "rate"},
		{"unknown field", "POST", "/api/actions/resolve", map[string]any{"idz": ids}, 400, "idz"},
		{"bad status filter", "GET", "/api/records?status=lost", nil, 400, "lost"},
		{"bad time filter", "GET", "/api/records?since=yesterday", nil, 400, "since"},
		{"limit too large", "GET", "/api/records?limit=100000", nil, 400, "limit"},
		{"release without a reason", "POST", "/api/parked-keys/release", map[string]any{"group": "g", "topic": "t", "key": "k"}, 400, "reason"},
		{"outbox retry without ids", "POST", "/api/outbox/retry", map[string]any{}, 400, "no outbox rows"},
	} {
		code, b := e.call(t, c.method, c.path, adminSecret, c.body)
		var msg struct{ Error string }
		if err := json.Unmarshal(b, &msg); err != nil || code != c.want || !strings.Contains(msg.Error, c.says) {
			t.Errorf("%s: %d %s, want %d and an error saying %q", c.name, code, b, c.want, c.says)
		}
	}
	// A body that is not JSON at all, and one of the wrong media type.
	for _, ct := range []string{"application/json", "text/plain"} {
		req, _ := http.NewRequest("POST", e.srv.URL+"/api/actions/resolve", strings.NewReader(`{"ids":[1`))
		req.Header.Set("Content-Type", ct)
		req.Header.Set("Authorization", "Bearer "+adminSecret)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if want := map[string]int{"application/json": 400, "text/plain": 415}[ct]; resp.StatusCode != want {
			t.Errorf("truncated body as %s: %d, want %d", ct, resp.StatusCode, want)
		}
	}
	// The UI: archive without a reason, a malformed edit (form shown again
	// with the problem and the operator's text kept).
	op := e.login(t, operatorSecret)
	_, page := e.get(t, op, "/records/"+id)
	csrf := formCSRF(t, page)
	if code, b := e.post(t, op, "/actions", url.Values{"csrf": {csrf}, "action": {"archive"}, "ids": {id}}); code != 400 || !bytes.Contains(b, []byte("archive needs a reason")) {
		t.Errorf("UI archive without a reason: %d", code)
	}
	code, b := e.post(t, op, "/records/"+id+"/edit-retry", url.Values{"csrf": {csrf}, "value": {`{"amount": 1O}`}, "reason": {"typo"}})
	if code != 400 || !bytes.Contains(b, []byte("not valid JSON")) || !bytes.Contains(b, []byte(`{&#34;amount&#34;: 1O}`)) {
		t.Errorf("UI malformed edit: %d\n%s", code, b)
	}

	if got := statuses(t, e, ids...); got != "unresolved,unresolved" {
		t.Errorf("statuses after bad input: %s", got)
	}
	if after := e.hwm(t, origin); after != before {
		t.Errorf("bad input published %d records", after-before)
	}
	for _, id := range ids {
		r, err := e.store.Get(t.Context(), id)
		if err != nil || len(r.Versions) != 0 {
			t.Errorf("record %d after bad input: versions %v, %v", id, r.Versions, err)
		}
	}
}

// TestHostileRendering: a payload and headers with <script>, invalid UTF-8
// and 1 MB values render as inert text, the display is truncated with a
// download of the exact bytes, and the API's JSON stays valid.
func TestHostileRendering(t *testing.T) {
	e := newEnv(t, nil)
	dlqTopic, origin := e.bigTopic(t), e.k.Topic(t, "origin", 1)
	huge := bytes.Repeat([]byte("<b>x</b>"), 1<<17-8) // 1 MiB less 64 bytes: the index keeps up to 1 MiB
	value := append([]byte(`<script>alert("v")</script>`+"\xff\xfe\x00"), huge...)
	e.seedDLQ(t, dlqTopic, origin, dead{
		key: `k"><img src=x onerror=alert(1)>`, value: value, kind: handler.KindDecode,
		err: "decode: <script>alert('e')</script> \xc3\x28",
		headers: []sarama.RecordHeader{
			{Key: []byte("<script>h</script>"), Value: []byte("<svg onload=alert(2)>\xff")},
			{Key: []byte("big"), Value: huge},
		},
	})
	e.runIndexer(t, dlqTopic)
	rec := e.waitIndexed(t, failidx.Filter{Topic: dlqTopic}, 1)[0]
	if len(rec.Value) != len(value) {
		t.Fatalf("the index kept %d of %d bytes", len(rec.Value), len(value))
	}
	c := e.login(t, viewerSecret)
	for _, path := range []string{fmt.Sprintf("/records/%d", rec.ID), "/records?topic=" + url.QueryEscape(dlqTopic), "/groups"} {
		code, page := e.get(t, c, path)
		if code != http.StatusOK {
			t.Fatalf("%s: %d", path, code)
		}
		for _, raw := range []string{"<script>alert", "<img src=x", "<svg", "<script>h", "<b>x</b>"} {
			if bytes.Contains(page, []byte(raw)) {
				t.Errorf("%s contains %q unescaped", path, raw)
			}
		}
		if !utf8.Valid(page) {
			t.Errorf("%s is not valid UTF-8", path)
		}
		if len(page) > 256<<10 {
			t.Errorf("%s is %d bytes: huge values are not truncated", path, len(page))
		}
		if strings.HasPrefix(path, "/records/") {
			for _, want := range []string{"&lt;script&gt;alert(&#34;v&#34;)&lt;/script&gt;\\xff\\xfe\\x00", "&lt;svg onload=alert(2)&gt;\\xff", "Display truncated", "Download value", "KiB in all"} {
				if !bytes.Contains(page, []byte(want)) {
					t.Errorf("record page lacks %q", want)
				}
			}
		}
	}
	// In Chromium: nothing of the payload, key, error or headers became an
	// element or ran.
	b := browser(t)
	var dialog atomic.Bool
	chromedp.ListenTarget(b, func(ev any) {
		if _, ok := ev.(*page.EventJavascriptDialogOpening); ok {
			dialog.Store(true)
		}
	})
	var scripts, injected int
	var text string
	if err := chromedp.Run(b,
		chromedp.Navigate(e.srv.URL+"/login"),
		chromedp.WaitVisible(`#token`, chromedp.ByID),
		chromedp.SendKeys(`#token`, viewerSecret, chromedp.ByID),
		chromedp.Click(`#login`, chromedp.ByID),
		chromedp.WaitVisible(`#overview`, chromedp.ByID),
		chromedp.Navigate(fmt.Sprintf("%s/records/%d", e.srv.URL, rec.ID)),
		chromedp.WaitVisible(`#payload`, chromedp.ByID),
		chromedp.Evaluate(`document.querySelectorAll('script').length`, &scripts),
		chromedp.Evaluate(`document.querySelectorAll('main img, main svg, main b, main script').length`, &injected),
		chromedp.Text(`#payload`, &text, chromedp.ByID),
	); err != nil {
		t.Fatal(err)
	}
	if scripts != 1 || injected != 0 || dialog.Load() || !strings.HasPrefix(text, `<script>alert("v")</script>\xff\xfe\x00<b>x</b>`) {
		t.Errorf("in Chromium: %d scripts (want 1, htmx), %d injected elements, dialog %v, payload text %.60q", scripts, injected, dialog.Load(), text)
	}

	code, got := e.get(t, c, fmt.Sprintf("/records/%d/value", rec.ID))
	if code != http.StatusOK || !bytes.Equal(got, value) {
		t.Errorf("download: %d, %d bytes, want the %d bytes of the value", code, len(got), len(value))
	}
	code, body := e.call(t, "GET", fmt.Sprintf("/api/records/%d", rec.ID), viewerSecret, nil)
	var v recordView
	if err := json.Unmarshal(body, &v); code != http.StatusOK || err != nil || v.Value == nil || v.Value.Base64 == "" || len(v.Headers) < 2 {
		t.Errorf("API record: %d %v", code, err)
	}
}
