package console

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/internal/failidx"
)

// rowForm returns the fields of the whole-group form in the groups page's
// row whose DLQ topic is topic, as the browser would post them.
func rowForm(t *testing.T, page []byte, topic string) url.Values {
	t.Helper()
	rows := regexp.MustCompile(`(?s)<tr class="group".*?</tr>`).FindAll(page, -1)
	input := regexp.MustCompile(`<input type="hidden" name="([a-z_]+)" value="([^"]*)">`)
	for _, row := range rows {
		if !bytes.Contains(row, []byte("<code>"+topic+"</code>")) {
			continue
		}
		v := url.Values{}
		for _, m := range input.FindAllSubmatch(row, -1) {
			v.Add(string(m[1]), string(m[2]))
		}
		return v
	}
	t.Fatalf("no group row of %s on the page:\n%s", topic, page)
	return nil
}

// TestGroupRowActsOnItsRow: two consumer groups' dead letters share a
// fingerprint (the same error). The admin's "All N unresolved" button on
// one group's row archives that row only: its fingerprint, kind, consumer
// group and DLQ topic. A filter too wide to name a row is 400 (audited),
// unless the admin says all_groups.
func TestGroupRowActsOnItsRow(t *testing.T) {
	e := newEnv(t, nil)
	origin := e.k.Topic(t, "payments", 1)
	billing, payroll := e.k.Topic(t, "billing.dlq", 1), e.k.Topic(t, "payroll.dlq", 1)
	e.seedDLQ(t, billing, origin, dead{key: "b-1", value: []byte(`{}`), kind: handler.KindPermanent, err: "card declined"},
		dead{key: "b-2", value: []byte(`{}`), kind: handler.KindPermanent, err: "card declined"})
	e.seedDLQ(t, payroll, origin, dead{key: "p-1", value: []byte(`{}`), kind: handler.KindPermanent, err: "card declined", group: "payroll"})
	e.runIndexer(t, billing, payroll)
	recs := e.waitIndexed(t, failidx.Filter{}, 3)
	var payrollID int64
	for _, r := range recs {
		if r.Fingerprint != recs[0].Fingerprint {
			t.Fatalf("the seeded groups do not share a fingerprint: %s, %s", r.Fingerprint, recs[0].Fingerprint)
		}
		if r.Topic == payroll {
			payrollID = r.ID
		}
	}
	admin := e.login(t, adminSecret)
	_, page := e.get(t, admin, "/groups?status=unresolved")
	form := rowForm(t, page, billing)
	form.Set("csrf", formCSRF(t, page))
	form.Set("action", "archive")
	form.Set("reason", "test traffic")
	if code, body := e.post(t, admin, "/actions", form); code != http.StatusOK {
		t.Fatalf("the billing row's archive: %d\n%s", code, body)
	}
	for _, r := range recs {
		want := failidx.Archived
		if r.Topic == payroll {
			want = failidx.Unresolved
		}
		if got := statuses(t, e, r.ID); got != string(want) {
			t.Errorf("record %d of %s: %s, want %s", r.ID, r.Topic, got, want)
		}
	}

	// The API: a prefix of one digit names no row.
	wide := map[string]any{"filter": map[string]any{"fingerprint": recs[0].Fingerprint[:1]}, "reason": "wide"}
	code, body := e.call(t, "POST", "/api/actions/archive", adminSecret, wide)
	if code != http.StatusBadRequest || !bytes.Contains(body, []byte(`"field": "filter"`)) {
		t.Errorf("archive by a one-digit fingerprint: %d %s, want 400 on filter", code, body)
	}
	if a := e.audit(t)[0]; a.Action != "archive" || !strings.Contains(a.Result, "400") {
		t.Errorf("the refused archive's audit row: %+v", a)
	}
	if got := statuses(t, e, payrollID); got != "unresolved" {
		t.Errorf("payroll's record after the refused archive: %s", got)
	}
	wide["all_groups"] = true
	if code, body := e.call(t, "POST", "/api/actions/archive", adminSecret, wide); code != http.StatusOK {
		t.Errorf("archive by a one-digit fingerprint with all_groups: %d %s", code, body)
	}
	if got := statuses(t, e, payrollID); got != "archived" {
		t.Errorf("payroll's record after the all_groups archive: %s", got)
	}
}

// TestReplayToAForeignTopic: the API and the UI refuse a replay to a topic
// that is neither the record's origin nor one of its group's tiers (400 on
// "to", nothing published, audited). (A topic the console lists in
// ReplayTopics is allowed: TestReplayTargets in internal/failidx.)
func TestReplayToAForeignTopic(t *testing.T) {
	e := newEnv(t, nil)
	ids, _, origin := seedTwo(t, e)
	foreign := e.k.Topic(t, "other-team", 1)
	code, body := e.call(t, "POST", "/api/actions/replay", operatorSecret, map[string]any{"ids": ids[:1], "to": foreign})
	if code != http.StatusBadRequest || !bytes.Contains(body, []byte(`"field": "to"`)) {
		t.Errorf("API replay to %s: %d %s, want 400 on to", foreign, code, body)
	}
	op := e.login(t, operatorSecret)
	_, page := e.get(t, op, fmt.Sprintf("/records/%d", ids[0]))
	code, body = e.post(t, op, "/actions", url.Values{"csrf": {formCSRF(t, page)}, "ids": {fmt.Sprint(ids[0])}, "action": {"replay"}, "to": {foreign}})
	if code != http.StatusBadRequest {
		t.Errorf("UI replay to %s: %d, want 400\n%s", foreign, code, body)
	}
	if n := e.hwm(t, foreign) + e.hwm(t, origin); n != 0 {
		t.Errorf("%d records published", n)
	}
	if a := e.audit(t)[0]; a.Action != "replay" || !strings.HasPrefix(a.Result, "error") {
		t.Errorf("audit: %+v", a)
	}
}

// TestOperatorActsOnABoundedList: an operator acts on records chosen one by
// one, up to Config.MaxOperatorRecords a request; a longer list is 403 (the
// admin role is needed), audited, and changes nothing. An admin may.
func TestOperatorActsOnABoundedList(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxOperatorRecords = 1 })
	ids, _, _ := seedTwo(t, e)
	code, body := e.call(t, "POST", "/api/actions/resolve", operatorSecret, map[string]any{"ids": ids})
	if code != http.StatusForbidden || !bytes.Contains(body, []byte(`"field": "ids"`)) {
		t.Errorf("an operator resolving 2 records (bound 1): %d %s, want 403 on ids", code, body)
	}
	if got := statuses(t, e, ids...); got != "unresolved,unresolved" {
		t.Errorf("statuses after the refusal: %s", got)
	}
	if a := e.audit(t)[0]; a.Actor != "olga" || !strings.Contains(a.Result, "403") {
		t.Errorf("the refusal's audit row: %+v", a)
	}
	if code, body := e.call(t, "POST", "/api/actions/resolve", adminSecret, map[string]any{"ids": ids}); code != http.StatusOK {
		t.Errorf("an admin resolving 2 records: %d %s", code, body)
	}
	// The default bound is 100.
	e2 := newEnv(t, nil)
	many := make([]int64, 101)
	for i := range many {
		many[i] = int64(i + 1)
	}
	if code, body := e2.call(t, "POST", "/api/actions/resolve", operatorSecret, map[string]any{"ids": many}); code != http.StatusForbidden {
		t.Errorf("an operator acting on 101 ids: %d %s, want 403", code, body)
	}
}

// seedN indexes n dead letters of one origin topic and returns their ids in
// offset order, the DLQ topic and the origin.
func seedN(t *testing.T, e *env, n int) ([]int64, string, string) {
	t.Helper()
	dlqTopic, origin := e.k.Topic(t, "dlq", 1), e.k.Topic(t, "origin", 1)
	var ds []dead
	for i := range n {
		ds = append(ds, dead{key: fmt.Sprint("pay-", i), value: fmt.Appendf(nil, `{"id":"pay-%d"}`, i), kind: handler.KindPermanent, err: "ledger down"})
	}
	e.seedDLQ(t, dlqTopic, origin, ds...)
	e.runIndexer(t, dlqTopic)
	recs := e.waitIndexed(t, failidx.Filter{Topic: dlqTopic}, n)
	ids := make([]int64, n)
	for i, r := range recs {
		ids[n-1-i] = r.ID
	}
	return ids, dlqTopic, origin
}

// jobOf waits for the API's view of job id to satisfy ok.
func (e *env) jobOf(t *testing.T, id int64, ok func(jobView) bool) jobView {
	t.Helper()
	var j jobView
	idemtest.Eventually(t, 60*time.Second, func() error {
		code, body := e.call(t, "GET", fmt.Sprintf("/api/jobs/%d", id), viewerSecret, nil)
		if code != http.StatusOK {
			return fmt.Errorf("GET job %d: %d %s", id, code, body)
		}
		if err := json.Unmarshal(body, &j); err != nil {
			return err
		}
		if !ok(j) {
			return fmt.Errorf("job %d: %s", id, body)
		}
		return nil
	})
	return j
}

// TestReplayJobOutlivesItsRequest: a rate-limited replay runs as a job, not
// inside the HTTP request. The client goes away after a moment: the job
// publishes every record anyway. A second job is handed back when its
// console stops and resumed by the next one on the same database. A third
// is cancelled from the API: the records it had not published are
// unresolved again. The origin's high-water mark rises by exactly the
// records published.
func TestReplayJobOutlivesItsRequest(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.jobWait = 200 * time.Millisecond })
	ids, _, origin := seedN(t, e, 12)

	// 1. The client disconnects during a replay of 4 records at 4/s.
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	b, _ := json.Marshal(map[string]any{"ids": ids[:4], "rate": 4, "reason": "paced"})
	req, _ := http.NewRequestWithContext(ctx, "POST", e.srv.URL+"/api/actions/replay", bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+operatorSecret)
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Logf("the replay answered %d before the client left", resp.StatusCode)
	}
	cancel()
	idemtest.Eventually(t, 60*time.Second, func() error {
		if got := statuses(t, e, ids[:4]...); got != "replayed,replayed,replayed,replayed" {
			return fmt.Errorf("after the client left: %s", got)
		}
		return nil
	})
	if n := e.hwm(t, origin); n != 4 {
		t.Fatalf("the origin's high-water mark is %d after the first job, want 4", n)
	}

	// 2. A job handed back when its console stops, resumed by the next.
	code, body := e.call(t, "POST", "/api/actions/replay", operatorSecret, map[string]any{"ids": ids[4:8], "rate": 2})
	var started struct{ Job jobView }
	if err := json.Unmarshal(body, &started); code != http.StatusAccepted || err != nil || started.Job.ID == 0 {
		t.Fatalf("a replay of 4 at 2/s: %d %s, want 202 with its job", code, body)
	}
	e.jobOf(t, started.Job.ID, func(j jobView) bool { return j.Done >= 1 })
	next := e.restart(t)
	j := next.jobOf(t, started.Job.ID, func(j jobView) bool { return j.State == "done" })
	if j.Done != 4 {
		t.Errorf("the resumed job: %+v, want 4 replayed", j)
	}
	if n := next.hwm(t, origin); n != 8 {
		t.Fatalf("the origin's high-water mark is %d after the resumed job, want 8", n)
	}

	// 3. A job cancelled from the API.
	code, body = next.call(t, "POST", "/api/actions/replay", operatorSecret, map[string]any{"ids": ids[8:], "rate": 1})
	if err := json.Unmarshal(body, &started); code != http.StatusAccepted || err != nil {
		t.Fatalf("a replay of 4 at 1/s: %d %s", code, body)
	}
	next.jobOf(t, started.Job.ID, func(j jobView) bool { return j.Done >= 1 })
	if code, body := next.call(t, "POST", fmt.Sprintf("/api/jobs/%d/cancel", started.Job.ID), viewerSecret, map[string]any{}); code != http.StatusForbidden {
		t.Errorf("a viewer cancelling a job: %d %s, want 403", code, body)
	}
	if code, body := next.call(t, "POST", fmt.Sprintf("/api/jobs/%d/cancel", started.Job.ID), operatorSecret, map[string]any{}); code != http.StatusOK {
		t.Fatalf("cancel: %d %s", code, body)
	}
	j = next.jobOf(t, started.Job.ID, func(j jobView) bool { return j.State == "cancelled" })
	if j.Done >= 4 {
		t.Errorf("the cancelled job published all %d", j.Done)
	}
	if n := next.hwm(t, origin); n != int64(8+j.Done) {
		t.Errorf("the origin's high-water mark is %d, want %d", n, 8+j.Done)
	}
	want := strings.TrimSuffix(strings.Repeat("replayed,", j.Done)+strings.Repeat("unresolved,", 4-j.Done), ",")
	if got := statuses(t, next, ids[8:]...); got != want {
		t.Errorf("after the cancel: %s, want %s", got, want)
	}
}

// TestConcurrentEditsAPI: two operators edit and retry one record at once:
// one gets 200 and its edit published, the other 409, never a 500.
func TestConcurrentEditsAPI(t *testing.T) {
	e := newEnv(t, nil)
	ids, _, origin := seedTwo(t, e)
	var wg sync.WaitGroup
	codes := make([]int, 2)
	for i := range codes {
		wg.Go(func() {
			codes[i], _ = e.call(t, "POST", fmt.Sprintf("/api/records/%d/edit-retry", ids[0]), operatorSecret,
				map[string]any{"value": fmt.Sprintf(`{"id":"pay-1","card":{"number":"4111111111111111"},"amount":%d}`, 11+i), "reason": "fix"})
		})
	}
	wg.Wait()
	if !(codes[0] == 200 && codes[1] == 409 || codes[0] == 409 && codes[1] == 200) {
		t.Errorf("two concurrent edits: %v, want one 200 and one 409", codes)
	}
	if n := e.hwm(t, origin); n != 1 {
		t.Errorf("%d records published, want 1", n)
	}
}

// TestTrickledLoginBodyIsCutOff: a client that sends its login body a byte
// at a time is cut off once Config.ReadTimeout has passed, not served for
// as long as it trickles; it gets no session.
func TestTrickledLoginBodyIsCutOff(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.ReadTimeout = time.Second })
	conn, err := net.Dial("tcp", strings.TrimPrefix(e.srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := "csrf=" + strings.Repeat("x", 200)
	fmt.Fprintf(conn, "POST /login HTTP/1.1\r\nHost: %s\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: %d\r\n\r\n",
		strings.TrimPrefix(e.srv.URL, "http://"), len(body))
	start := time.Now()
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for i := range len(body) {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			if _, err := conn.Write([]byte{body[i]}); err != nil {
				return
			}
		}
	}()
	_ = conn.SetReadDeadline(time.Now().Add(15 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	took := time.Since(start)
	if err == nil {
		defer resp.Body.Close()
		if resp.StatusCode < 400 || len(resp.Cookies()) > 0 && strings.Contains(resp.Header.Get("Set-Cookie"), sessionCookie+"=") {
			t.Errorf("trickled login: %d %v", resp.StatusCode, resp.Header)
		}
	}
	if took > 8*time.Second {
		t.Errorf("the trickled login body was read for %s (ReadTimeout 1s; the whole body takes 20 s)", took)
	}
	t.Logf("cut off after %s: %v", took, err)
}

// TestLoginBodyIsCapped: a login form's body is capped (4 KiB) before it
// is parsed: a larger one is refused (413) without being read whole.
func TestLoginBodyIsCapped(t *testing.T) {
	e := newEnv(t, nil)
	resp, err := http.PostForm(e.srv.URL+"/login", url.Values{"token": {strings.Repeat("x", 64<<10)}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("a 64 KiB login body: %d, want 413", resp.StatusCode)
	}
}

// TestLogoutRevokesTheSession: a session cookie copied before logout gets
// the login page afterwards (the API: 401).
func TestLogoutRevokesTheSession(t *testing.T) {
	e := newEnv(t, nil)
	c := e.login(t, operatorSecret)
	u, _ := url.Parse(e.srv.URL)
	saved := c.Jar.Cookies(u)
	_, page := e.get(t, c, "/")
	if code, _ := e.post(t, c, "/logout", url.Values{"csrf": {formCSRF(t, page)}}); code != http.StatusOK {
		t.Fatalf("logout: %d", code)
	}
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, path := range []string{"/records", "/api/whoami"} {
		req, _ := http.NewRequest("GET", e.srv.URL+path, nil)
		for _, ck := range saved {
			req.AddCookie(ck)
		}
		resp, err := noRedirect.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		switch {
		case path == "/records" && (resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), "/login")):
			t.Errorf("GET %s with the cookie saved before logout: %d → %q, want the login page", path, resp.StatusCode, resp.Header.Get("Location"))
		case path == "/api/whoami" && resp.StatusCode != http.StatusUnauthorized:
			t.Errorf("GET %s with the cookie saved before logout: %d, want 401", path, resp.StatusCode)
		}
	}
}

// TestRevealIsAPost: GET …?reveal=true never reveals and never writes an
// audit row; POST …/reveal (an operator) does both.
func TestRevealIsAPost(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.Mask = []string{"card.number"} })
	ids, _, _ := seedTwo(t, e)
	before := len(e.audit(t))
	for _, path := range []string{"/api/records/%d?reveal=true", "/api/records/%d/value?reveal=true"} {
		code, body := e.call(t, "GET", fmt.Sprintf(path, ids[0]), operatorSecret, nil)
		if bytes.Contains(body, []byte("4111111111111111")) {
			t.Errorf("GET %s revealed the card number: %d", path, code)
		}
	}
	if n := len(e.audit(t)); n != before {
		t.Errorf("GET with reveal=true wrote %d audit rows", n-before)
	}
	code, body := e.call(t, "POST", fmt.Sprintf("/api/records/%d/reveal", ids[0]), operatorSecret, map[string]any{})
	if code != http.StatusOK || !bytes.Contains(body, []byte("4111111111111111")) {
		t.Errorf("POST reveal: %d %s", code, body)
	}
	if a := e.audit(t)[0]; a.Action != "reveal" || a.Actor != "olga" {
		t.Errorf("the reveal's audit row: %+v", a)
	}
	if code, _ := e.call(t, "POST", fmt.Sprintf("/api/records/%d/reveal", ids[0]), viewerSecret, map[string]any{}); code != http.StatusForbidden {
		t.Errorf("a viewer's reveal: %d, want 403", code)
	}
}

// TestInternalErrorsGiveAnID: an internal error (here, a database that is
// gone) is logged with an id; the client gets the id, not the error.
func TestInternalErrorsGiveAnID(t *testing.T) {
	logs, err := os.CreateTemp(t.TempDir(), "log")
	if err != nil {
		t.Fatal(err)
	}
	defer logs.Close()
	e := newEnv(t, func(c *Config) { c.Logger = slog.New(slog.NewTextHandler(logs, nil)) })
	e.pool.Close()
	code, body := e.call(t, "GET", "/api/overview", viewerSecret, nil)
	var v struct{ Error, ID string }
	if err := json.Unmarshal(body, &v); code != http.StatusInternalServerError || err != nil || v.ID == "" {
		t.Fatalf("overview on a closed pool: %d %s, want 500 with an id", code, body)
	}
	if bytes.Contains(body, []byte("closed")) || bytes.Contains(body, []byte("pool")) {
		t.Errorf("the client sees the internal error: %s", body)
	}
	logged, _ := os.ReadFile(logs.Name())
	if l := string(logged); !strings.Contains(l, v.ID) || !strings.Contains(l, "closed") {
		t.Errorf("the log does not hold the id %s with the error:\n%s", v.ID, l)
	}
}

// TestRejectedActionsAreAudited: an action refused for the role (403), a
// missing CSRF token (403) or bad input (400) writes an audit row saying
// so, with who asked.
func TestRejectedActionsAreAudited(t *testing.T) {
	e := newEnv(t, nil)
	ids, _, _ := seedTwo(t, e)
	if code, _ := e.call(t, "POST", "/api/actions/resolve", viewerSecret, map[string]any{"ids": ids}); code != http.StatusForbidden {
		t.Fatalf("a viewer's resolve: %d", code)
	}
	if a := e.audit(t)[0]; a.Actor != "vic" || a.Action != "resolve" || !strings.Contains(a.Result, "403") {
		t.Errorf("audit of the viewer's resolve: %+v", a)
	}
	op := e.login(t, operatorSecret)
	if code, _ := e.post(t, op, "/actions", url.Values{"ids": {fmt.Sprint(ids[0])}, "action": {"archive"}, "reason": {"x"}}); code != http.StatusForbidden {
		t.Fatalf("a form without its CSRF token: %d", code)
	}
	if a := e.audit(t)[0]; a.Actor != "olga" || !strings.Contains(a.Result, "403") || !strings.Contains(a.Result, "CSRF") {
		t.Errorf("audit of the form without a CSRF token: %+v", a)
	}
	if code, _ := e.call(t, "POST", "/api/actions/archive", operatorSecret, map[string]any{"ids": ids}); code != http.StatusBadRequest {
		t.Fatalf("an archive without a reason: %d", code)
	}
	if a := e.audit(t)[0]; a.Actor != "olga" || a.Action != "archive" || !strings.Contains(a.Result, "400") {
		t.Errorf("audit of the archive without a reason: %+v", a)
	}
}

// TestSecureCookies: with SecureCookies (TLS, or a TLS proxy) the session
// and login cookies are Secure, path /, and named with the __Host- prefix.
func TestSecureCookies(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.SecureCookies = true })
	resp, err := http.Get(e.srv.URL + "/login")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	cs := resp.Cookies()
	if len(cs) == 0 {
		t.Fatal("no cookie on the login page")
	}
	for _, c := range cs {
		if !strings.HasPrefix(c.Name, "__Host-") || !c.Secure || c.Path != "/" {
			t.Errorf("cookie %s: Secure %v, path %q; want __Host-, Secure, /", c.Name, c.Secure, c.Path)
		}
	}
}

// TestLoginsAreRateLimited: bad logins and bad bearer tokens from one
// address are refused with 429 once its budget is spent.
func TestLoginsAreRateLimited(t *testing.T) {
	e := newEnv(t, nil)
	codes := map[int]int{}
	for range 15 {
		code, _ := e.call(t, "GET", "/api/whoami", "not-a-token-0123456789", nil)
		codes[code]++
	}
	if codes[http.StatusTooManyRequests] == 0 || codes[http.StatusUnauthorized] == 0 {
		t.Errorf("15 bad bearer tokens: %v, want 401s then 429s", codes)
	}
	// A good token from the same address is now refused too, until the
	// budget refills: guessing gains nothing.
	if code, _ := e.call(t, "GET", "/api/whoami", viewerSecret, nil); code != http.StatusTooManyRequests {
		t.Errorf("a good token after the budget is spent: %d, want 429", code)
	}
	resp, err := http.PostForm(e.srv.URL+"/login", url.Values{"token": {"wrong-0123456789"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Errorf("a login from the same address: %d, want 429", resp.StatusCode)
	}
}

// TestInsecureNoAuthNeedsALoopbackPeer: without authentication, a request
// whose Host header says 127.0.0.1 but that comes from another address is
// refused: the check reads the connection's address.
func TestInsecureNoAuthNeedsALoopbackPeer(t *testing.T) {
	st := failidx.NewStore(nil)
	h, err := newServer(Config{InsecureNoAuth: true}, st, failidx.NewActions(st, nil))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		remote, host string
		ok           bool
	}{
		{"127.0.0.1:5555", "127.0.0.1:8088", true},
		{"[::1]:5555", "localhost:8088", true},
		{"10.1.2.3:5555", "127.0.0.1:8088", false},
		{"192.0.2.7:5555", "localhost:8088", false},
	} {
		req := httptest.NewRequest("GET", "/api/whoami", nil)
		req.RemoteAddr, req.Host = c.remote, c.host
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if (rec.Code == http.StatusOK) != c.ok {
			t.Errorf("from %s for %s: %d, want ok=%v", c.remote, c.host, rec.Code, c.ok)
		}
	}
}
