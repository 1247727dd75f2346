package console

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/failidx"
)

// TestBrowserRowsJobsAndLogout drives the screens this console's safety
// changed, in Chromium: an admin archives one failure group's row while
// another group's records share its fingerprint (only the row's records
// change); a paced replay sends the browser to its job's page, which
// follows it to the end; another is cancelled from its page; the Jobs page
// lists both; logging out ends the session.
func TestBrowserRowsJobsAndLogout(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.jobWait = 300 * time.Millisecond })
	origin := e.k.Topic(t, "payments", 1)
	billing, payroll := e.k.Topic(t, "billing.dlq", 1), e.k.Topic(t, "payroll.dlq", 1)
	var ds []dead
	for i := range 10 {
		ds = append(ds, dead{key: fmt.Sprint("b-", i), value: []byte(`{}`), kind: handler.KindPermanent, err: "card declined"})
	}
	e.seedDLQ(t, billing, origin, ds[:2]...)
	e.seedDLQ(t, payroll, origin, dead{key: "p-0", value: []byte(`{}`), kind: handler.KindPermanent, err: "card declined", group: "payroll"})
	jobsTopic := e.k.Topic(t, "jobs.dlq", 1)
	e.seedDLQ(t, jobsTopic, origin, ds[2:]...)
	e.runIndexer(t, billing, payroll, jobsTopic)
	recs := e.waitIndexed(t, failidx.Filter{}, 11)
	ids := map[string]int64{}
	for _, r := range recs {
		ids[r.IdempotencyKey] = r.ID
	}

	run := runner(t, browser(t))
	var text string
	run("log in as the admin", logIn(e, adminSecret)...)
	row := fmt.Sprintf(`tr.group[data-topic="%s"]`, billing)
	run("archive the billing row",
		chromedp.Navigate(e.srv.URL+"/groups?status=unresolved"),
		chromedp.WaitVisible(row, chromedp.ByQuery),
		chromedp.SetValue(row+` select[name=action]`, "archive", chromedp.ByQuery),
		chromedp.SendKeys(row+` input[name=reason]`, "test traffic", chromedp.ByQuery),
		chromedp.Click(row+` button`, chromedp.ByQuery),
		chromedp.WaitVisible(`#result`, chromedp.ByID),
		chromedp.Text(`#result`, &text, chromedp.ByID),
	)
	if !strings.Contains(strings.Join(strings.Fields(text), " "), "Done 2") {
		t.Errorf("the billing row's archive:\n%s", text)
	}
	if got := statuses(t, e, ids["b-0"], ids["b-1"], ids["p-0"]); got != "archived,archived,unresolved" {
		t.Errorf("after archiving the billing row: %s, want payroll's record untouched", got)
	}

	replay := func(what string, keys ...string) {
		t.Helper()
		actions := []chromedp.Action{chromedp.Navigate(e.srv.URL + "/records?topic=" + jobsTopic + "&status=unresolved"), chromedp.WaitVisible(`#act`, chromedp.ByID)}
		for _, k := range keys {
			actions = append(actions, chromedp.Click(fmt.Sprintf(`input[name=ids][value="%d"]`, ids[k]), chromedp.ByQuery))
		}
		actions = append(actions, chromedp.SetValue(`#action`, "replay", chromedp.ByID),
			chromedp.SetValue(`input[name=rate]`, "1", chromedp.ByQuery),
			chromedp.Click(`#apply`, chromedp.ByID),
			chromedp.WaitVisible(`#job`, chromedp.ByID))
		run(what, actions...)
	}
	replay("a paced replay of two records", "b-2", "b-3")
	run("its job page follows it to the end",
		chromedp.WaitVisible(`.state-done`, chromedp.ByQuery),
		chromedp.Text(`#done`, &text, chromedp.ByID),
	)
	if strings.TrimSpace(text) != "2" {
		t.Errorf("the finished job published %q records, want 2", text)
	}
	replay("a paced replay of six records", "b-4", "b-5", "b-6", "b-7", "b-8", "b-9")
	run("cancel it from its page",
		chromedp.WaitVisible(`#cancel`, chromedp.ByID),
		chromedp.Click(`#cancel`, chromedp.ByID),
		chromedp.WaitVisible(`.state-cancelled`, chromedp.ByQuery),
		chromedp.Text(`#done`, &text, chromedp.ByID),
	)
	done := mustAtoi(t, strings.TrimSpace(text))
	if done == 6 {
		t.Errorf("the cancelled job published all 6 records")
	}
	run("the Jobs page lists both",
		chromedp.Click(`a[href="/jobs"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`#jobs`, chromedp.ByID),
		chromedp.Text(`#jobs`, &text, chromedp.ByID),
	)
	if !strings.Contains(text, "done") || !strings.Contains(text, "cancelled") {
		t.Errorf("the Jobs page:\n%s", text)
	}
	if n := e.hwm(t, origin); n != int64(2+done) {
		t.Errorf("the origin holds %d records, want %d", n, 2+done)
	}
	run("log out",
		chromedp.Click(`.who button`, chromedp.ByQuery),
		chromedp.WaitVisible(`#token`, chromedp.ByID),
		chromedp.Navigate(e.srv.URL+"/records"),
		chromedp.WaitVisible(`#token`, chromedp.ByID),
	)
}

func mustAtoi(t *testing.T, s string) int {
	t.Helper()
	var n int
	if _, err := fmt.Sscan(s, &n); err != nil {
		t.Fatalf("%q is not a number", s)
	}
	return n
}
