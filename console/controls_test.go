package console

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/internal/control"
	"github.com/idemhq/idem/internal/seal"
	"github.com/idemhq/idem/internal/tables"
	"github.com/idemhq/idem/internal/testing/testenv"
)

// lastAudit returns the newest audit row of action.
func (e *env) lastAudit(t *testing.T, action string) (row struct{ Actor, Result, Detail string }) {
	t.Helper()
	for _, a := range e.audit(t) {
		if a.Action == action {
			row.Actor, row.Result, row.Detail = a.Actor, a.Result, a.Detail
			return row
		}
	}
	t.Fatalf("no audit row of %s", action)
	return row
}

// TestControlsAuthorization (issue 29 items 17-18): an operator can neither
// pause nor re-drive (403, each refusal audited); an admin can, each once
// (a second pause is 409, audited too); a viewer reads the fleet and the
// pauses.
func TestControlsAuthorization(t *testing.T) {
	e := newEnv(t, nil)
	topic := e.k.Topic(t, "payments", 2)
	e.k.Produce(t, topic, idemtest.Record{IdempotencyKey: "k-0"}, idemtest.Record{IdempotencyKey: "k-1", Partition: 1})
	pause := map[string]any{"group": "billing", "topic": topic, "partition": 1, "reason": "migration"}
	if code, body := e.call(t, "POST", "/api/pauses", operatorSecret, pause); code != http.StatusForbidden {
		t.Fatalf("an operator's pause: %d %s", code, body)
	}
	if a := e.lastAudit(t, "pause"); a.Actor != "olga" || !strings.Contains(a.Result, "403") {
		t.Errorf("audit of the operator's pause: %+v", a)
	}
	redrive := map[string]any{"group": "billing", "topic": topic, "from": "1h", "reason": "handler fixed"}
	if code, body := e.call(t, "POST", "/api/redrives", operatorSecret, redrive); code != http.StatusForbidden {
		t.Fatalf("an operator's re-drive: %d %s", code, body)
	}
	if a := e.lastAudit(t, "redrive"); a.Actor != "olga" || !strings.Contains(a.Result, "403") {
		t.Errorf("audit of the operator's re-drive: %+v", a)
	}
	op := e.login(t, operatorSecret)
	_, page := e.get(t, op, "/fleet")
	if code, _ := e.post(t, op, "/pauses", url.Values{"csrf": {formCSRF(t, page)}, "group": {"billing"}, "topic": {topic}, "reason": {"x"}}); code != http.StatusForbidden {
		t.Fatalf("an operator's pause form: %d", code)
	}
	if ps, _ := (control.Admin{DB: e.pool}).Pauses(t.Context(), ""); len(ps) != 0 {
		t.Fatalf("an operator paused: %+v", ps)
	}

	code, body := e.call(t, "POST", "/api/pauses", adminSecret, pause)
	if code != http.StatusOK || !strings.Contains(string(body), "Config.Controls") {
		t.Fatalf("the admin's pause: %d %s (want a warning that no member reports)", code, body)
	}
	if code, body := e.call(t, "POST", "/api/pauses", adminSecret, pause); code != http.StatusConflict || !strings.Contains(string(body), "by alice") {
		t.Fatalf("a second pause: %d %s", code, body)
	}
	if a := e.lastAudit(t, "pause"); a.Actor != "alice" || !strings.Contains(a.Result, "409") {
		t.Errorf("audit of the second pause: %+v", a)
	}
	var fleet struct {
		Groups []fleetGroup `json:"groups"`
	}
	code, body = e.call(t, "GET", "/api/fleet", viewerSecret, nil)
	if err := json.Unmarshal(body, &fleet); code != http.StatusOK || err != nil || len(fleet.Groups) != 1 || len(fleet.Groups[0].Pauses) != 1 {
		t.Fatalf("the fleet as a viewer: %d %s", code, body)
	}
	if code, body = e.call(t, "GET", "/api/overview", viewerSecret, nil); code != http.StatusOK || !strings.Contains(string(body), `"paused_by": "alice"`) {
		t.Errorf("the overview shows no pause: %d %s", code, body)
	}
	if code, body = e.call(t, "POST", "/api/pauses/resume", adminSecret, map[string]any{"group": "billing", "topic": topic, "partition": 1}); code != http.StatusOK {
		t.Fatalf("resume: %d %s", code, body)
	}
	if code, _ = e.call(t, "POST", "/api/pauses/resume", adminSecret, map[string]any{"group": "billing", "topic": topic, "partition": 1}); code != http.StatusConflict {
		t.Fatalf("a second resume: %d", code)
	}
}

// TestRedriveAPI: a dry run counts the window and changes nothing; a
// re-drive starts (201, audited) and a second one of the topic while it
// runs is 409; cancel ends it; the group's hourly limit answers 429 with
// Retry-After; bad input is 400 naming the field.
func TestRedriveAPI(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxRedrivesPerHour = 2 })
	topic := e.k.Topic(t, "payments", 2)
	for i := range 6 {
		e.k.Produce(t, topic, idemtest.Record{IdempotencyKey: fmt.Sprint("k-", i), Partition: int32(i % 2)})
	}
	req := map[string]any{"group": "billing", "topic": topic, "from": "1h", "reason": "handler fixed", "dry_run": true}
	var out redriveOutcome
	code, body := e.call(t, "POST", "/api/redrives", adminSecret, req)
	if err := json.Unmarshal(body, &out); code != http.StatusOK || err != nil || !out.DryRun || out.Offsets != 6 || out.Redrive.Epoch != 1 {
		t.Fatalf("dry run: %d %s", code, body)
	}
	if rs, _ := (control.Admin{DB: e.pool}).Redrives(t.Context(), "", 10); len(rs) != 0 {
		t.Fatalf("a dry run started a re-drive: %+v", rs)
	}
	req["dry_run"] = false
	code, body = e.call(t, "POST", "/api/redrives", adminSecret, req)
	if err := json.Unmarshal(body, &out); code != http.StatusCreated || err != nil || out.Redrive.ID == 0 || out.Offsets != 6 {
		t.Fatalf("re-drive: %d %s", code, body)
	}
	if a := e.lastAudit(t, "redrive"); a.Actor != "alice" || !strings.HasPrefix(a.Result, "ok") || !strings.Contains(a.Detail, topic) {
		t.Errorf("audit of the re-drive: %+v", a)
	}
	if code, body = e.call(t, "POST", "/api/redrives", adminSecret, req); code != http.StatusConflict {
		t.Fatalf("a second re-drive while one runs: %d %s", code, body)
	}
	var ov struct {
		Controls liveControls `json:"controls"`
	}
	if code, body = e.call(t, "GET", "/api/overview", viewerSecret, nil); json.Unmarshal(body, &ov) != nil || len(ov.Controls.Redrives) != 1 || ov.Controls.Redrives[0].ID != out.Redrive.ID {
		t.Errorf("the overview's running re-drives: %d %s", code, body)
	}
	if code, body = e.call(t, "POST", fmt.Sprintf("/api/redrives/%d/cancel", out.Redrive.ID), adminSecret, map[string]any{"reason": "wrong window"}); code != http.StatusOK || !strings.Contains(string(body), `"cancelled"`) {
		t.Fatalf("cancel: %d %s", code, body)
	}
	if code, body = e.call(t, "POST", "/api/redrives", adminSecret, req); code != http.StatusCreated {
		t.Fatalf("a re-drive after the cancel: %d %s", code, body)
	}
	resp := func() *http.Response {
		b, _ := json.Marshal(map[string]any{"group": "billing", "topic": topic, "from": "1h", "reason": "again", "partition": 0})
		r, err := http.NewRequest("POST", e.srv.URL+"/api/redrives", strings.NewReader(string(b)))
		if err != nil {
			t.Fatal(err)
		}
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Authorization", "Bearer "+adminSecret)
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}()
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("the third re-drive of the hour: %d, Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	for _, bad := range []map[string]any{
		{"group": "billing", "topic": topic, "reason": "no start"},
		{"group": "billing", "topic": topic, "from": "yesterday-ish", "reason": "x"},
		{"group": "billing", "topic": topic + "-none", "from": "1h", "reason": "x", "dry_run": true},
		{"group": "billing", "topic": topic, "from_offset": 3, "reason": "x", "dry_run": true},
	} {
		if code, body := e.call(t, "POST", "/api/redrives", adminSecret, bad); code != http.StatusBadRequest || !strings.Contains(string(body), `"field"`) {
			t.Errorf("%v: %d %s, want 400 naming the field", bad, code, body)
		}
	}
}

// TestBrowserLiveControls drives the live controls in Chromium against a
// real consumer.Run with Config.Controls (issue 29 items 17-19): the fleet
// page lists the member, and a member that stopped beating greyed; the
// pause toggle pauses partition 0 (the member holds a record written to it,
// the overview lists the pause) and resumes it (the record is handled); a
// re-drive's dry run counts the window, and the re-drive it confirms runs
// each key once more.
func TestBrowserLiveControls(t *testing.T) {
	e := newEnv(t, nil)
	ctx := t.Context()
	topic, group := e.k.Topic(t, "payments", 2), e.k.Group(t, "billing")
	if _, err := e.pool.Exec(ctx, `CREATE TABLE applied (key text NOT NULL, part int, epoch bigint)`); err != nil {
		t.Fatal(err)
	}
	var handled atomic.Int64
	h := handler.Func(func(ctx context.Context, m *handler.Message) error {
		handled.Add(1)
		_, err := dedupe.Tx(ctx).Exec(ctx, `INSERT INTO applied (key, part, epoch) VALUES ($1, $2, $3)`, m.IdempotencyKey, m.Partition, m.Epoch)
		return err
	})
	for i := range 6 {
		e.k.Produce(t, topic, idemtest.Record{IdempotencyKey: fmt.Sprint("pay-", i), Partition: int32(i % 2)})
	}
	cfg := idemtest.WithPostgres(t, e.k.Config(t, group, topic), e.pool)
	cfg.Controls = e.pool
	idemtest.Start(t, cfg, h)
	count := func(q string, args ...any) int {
		var n int
		if err := e.pool.QueryRow(ctx, q, args...).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	idemtest.Eventually(t, time.Minute, func() error {
		if n := count(`SELECT count(*) FROM applied`); n != 6 {
			return fmt.Errorf("%d applied, waiting for 6", n)
		}
		return nil
	})
	// A member of the group that stopped beating (it died).
	ghost := control.Member{Group: group, ID: "ghost-host/1/dead", Host: "ghost-host", Version: "idem v0", StartedAt: time.Now().Add(-time.Hour),
		BeatEvery: time.Millisecond, Status: control.Status{Partitions: []control.PartitionStatus{}}}
	if err := control.Beat(ctx, e.pool, ghost); err != nil {
		t.Fatal(err)
	}

	run := runner(t, browser(t))
	var text string
	run("log in as the admin", logIn(e, adminSecret)...)
	part0 := fmt.Sprintf(`table.partitions tr[data-topic="%s"][data-partition="0"]`, topic)
	run("the fleet lists the member, and the ghost greyed",
		chromedp.Click(`a[href="/fleet"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`tr.member.stale[data-member="ghost-host/1/dead"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`tr.member:not(.stale)`, chromedp.ByQuery),
		chromedp.WaitVisible(part0, chromedp.ByQuery),
		chromedp.Text(`#members`, &text, chromedp.ByID),
		shot(t, "fleet"),
	)
	if !strings.Contains(text, topic+"/0") || !strings.Contains(text, "stale") {
		t.Errorf("the fleet's members:\n%s", text)
	}
	run("pause partition 0",
		chromedp.SendKeys(part0+` input[name=reason]`, "ledger migration", chromedp.ByQuery),
		chromedp.Click(part0+` button.pause`, chromedp.ByQuery),
		chromedp.WaitVisible(part0+` button.resume`, chromedp.ByQuery),
	)
	// The member holds the partition (its heartbeat says so), then a record
	// written to it waits.
	idemtest.Eventually(t, 30*time.Second, func() error {
		ms, err := control.Fleet(ctx, e.pool, group)
		if err != nil {
			return err
		}
		for _, m := range ms {
			for _, p := range m.Status.Partitions {
				if p.Topic == topic && p.Partition == 0 && len(p.Paused) > 0 && p.Paused[0] == "operator" {
					return nil
				}
			}
		}
		return fmt.Errorf("no member holds %s/0 yet: %+v", topic, ms)
	})
	e.k.Produce(t, topic, idemtest.Record{IdempotencyKey: "held-0", Partition: 0}, idemtest.Record{IdempotencyKey: "free-1", Partition: 1})
	idemtest.Eventually(t, 30*time.Second, func() error {
		if n := count(`SELECT count(*) FROM applied WHERE key = 'free-1'`); n != 1 {
			return fmt.Errorf("free-1 applied %d times", n)
		}
		return nil
	})
	run("the overview lists the pause",
		chromedp.Click(`a.brand`, chromedp.ByQuery),
		chromedp.WaitVisible(`#paused`, chromedp.ByID),
		chromedp.Text(`#paused`, &text, chromedp.ByID),
	)
	if !strings.Contains(text, topic+"/0") || !strings.Contains(text, "ledger migration") {
		t.Errorf("the overview's pauses:\n%s", text)
	}
	if n := count(`SELECT count(*) FROM applied WHERE key = 'held-0'`); n != 0 {
		t.Fatalf("a record of the paused partition was handled")
	}
	run("resume it",
		chromedp.Navigate(e.srv.URL+"/fleet"),
		chromedp.WaitVisible(part0+` button.resume`, chromedp.ByQuery),
		chromedp.Click(part0+` button.resume`, chromedp.ByQuery),
		chromedp.WaitVisible(part0+` button.pause`, chromedp.ByQuery),
	)
	idemtest.Eventually(t, 30*time.Second, func() error {
		if n := count(`SELECT count(*) FROM applied WHERE key = 'held-0'`); n != 1 {
			return fmt.Errorf("held-0 applied %d times after the resume", n)
		}
		return nil
	})

	run("a re-drive's dry run counts the window",
		chromedp.Click(`a[href="/redrives"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`#redrive-form`, chromedp.ByID),
		chromedp.SendKeys(`#redrive-form input[name=group]`, group, chromedp.ByQuery),
		chromedp.SendKeys(`#redrive-form input[name=topic]`, topic, chromedp.ByQuery),
		chromedp.SendKeys(`#redrive-form input[name=reason]`, "handler fixed", chromedp.ByQuery),
		chromedp.Click(`#dry-run`, chromedp.ByID),
		chromedp.WaitVisible(`#count`, chromedp.ByID),
		chromedp.Text(`#count`, &text, chromedp.ByID),
		shot(t, "redrive-dry-run"),
	)
	if strings.TrimSpace(text) != "8" {
		t.Fatalf("the dry run counts %q records, want 8", text)
	}
	if n := count(`SELECT count(*) FROM idem_control_redrives`); n != 0 {
		t.Fatalf("the dry run started %d re-drives", n)
	}
	run("confirm it; its page follows it to the end",
		chromedp.Click(`#start`, chromedp.ByID),
		chromedp.WaitVisible(`#parts`, chromedp.ByID),
		chromedp.WaitVisible(`.state-done`, chromedp.ByQuery),
		chromedp.Text(`#done`, &text, chromedp.ByID),
		shot(t, "redrive"),
	)
	if strings.TrimSpace(text) != "8" {
		t.Errorf("the re-drive's page shows %q offsets done, want 8", text)
	}
	if n, keys := count(`SELECT count(*) FROM applied WHERE epoch = 1`), count(`SELECT count(DISTINCT key) FROM applied WHERE epoch = 1`); n != 8 || keys != 8 {
		t.Errorf("the re-drive applied %d effects of %d keys, want 8 of 8", n, keys)
	}
	if a := e.lastAudit(t, "redrive"); a.Actor != "alice" || !strings.HasPrefix(a.Result, "ok") {
		t.Errorf("audit of the re-drive: %+v", a)
	}
}

// TestConsoleWithoutControlTables: a console on a database with the
// failure index's tables only (a service that migrated those alone) serves
// its overview, and answers the live controls' calls with what to run.
func TestConsoleWithoutControlTables(t *testing.T) {
	e := newEnv(t, nil)
	pool, _ := testenv.PostgresSchema(t)
	if err := tables.MigrateIndex(t.Context(), pool); err != nil {
		t.Fatal(err)
	}
	if err := seal.Migrate(t.Context(), pool); err != nil {
		t.Fatal(err)
	}
	cfg := e.cfg
	cfg.Pool = pool
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	srv := httptest.NewServer(c)
	t.Cleanup(srv.Close)
	e.srv = srv
	if code, body := e.call(t, "GET", "/api/overview", viewerSecret, nil); code != http.StatusOK {
		t.Errorf("overview: %d %s", code, body)
	}
	for _, path := range []string{"/api/fleet", "/api/redrives", "/api/pauses"} {
		if code, body := e.call(t, "GET", path, viewerSecret, nil); code != http.StatusServiceUnavailable || !strings.Contains(string(body), "idem migrate") {
			t.Errorf("%s: %d %s, want 503 saying to run idem migrate", path, code, body)
		}
	}
}

// TestFleetShowsBreakers (issue 29, item 19): a member whose dependency
// breaker paused it reports the breaker in its heartbeat, and the fleet
// page and API show it, with when it closes.
func TestFleetShowsBreakers(t *testing.T) {
	e := newEnv(t, nil)
	until := time.Now().Add(time.Minute)
	m := control.Member{Group: "billing-breakers", ID: "host-1/1/aa", Host: "host-1", Version: "v1", StartedAt: time.Now(), BeatEvery: time.Hour,
		Status: control.Status{Breaker: &control.BreakerStatus{Name: "bank-api", Since: time.Now(), Until: until},
			Partitions: []control.PartitionStatus{{Topic: "payments", Partition: 0, Lag: 3, Paused: []string{"breaker"}}}}}
	if err := control.Beat(t.Context(), e.pool, m); err != nil {
		t.Fatal(err)
	}
	var fleet struct {
		Groups []fleetGroup `json:"groups"`
	}
	code, body := e.call(t, "GET", "/api/fleet?group=billing-breakers", viewerSecret, nil)
	if err := json.Unmarshal(body, &fleet); code != http.StatusOK || err != nil || len(fleet.Groups) != 1 || len(fleet.Groups[0].Members) != 1 {
		t.Fatalf("the fleet: %d %s", code, body)
	}
	if b := fleet.Groups[0].Members[0].Status.Breaker; b == nil || b.Name != "bank-api" || b.Until.Sub(until).Abs() > time.Millisecond {
		t.Errorf("the API's member breaker: %+v", b)
	}
	_, page := e.get(t, e.login(t, viewerSecret), "/fleet")
	if !strings.Contains(string(page), "bank-api open until") {
		t.Errorf("the fleet page does not show the open breaker:\n%s", page)
	}
}
