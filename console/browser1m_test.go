package console

import (
	"fmt"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/idemhq/idem/internal/failidx"
)

// BenchmarkBrowser1M loads IDEM_BENCH_ROWS records (default 1,000,000, as
// BenchmarkRecordList does) and drives the console's web UI in headless
// Chromium, logged in as an operator: the overview, the failure groups, the
// record list (first page, one failure group's unresolved records, and page
// 20 of the unresolved records reached by following the "next page" link),
// one record, and the audit log. For each page it checks that the page shows
// what it should (a table with rows, no error) and reports, over a few
// loads, the p50 and p95 of the browser's own time from navigation start to
// the end of the load event (PerformanceNavigationTiming), as
// <page>-p50-ms and <page>-p95-ms. With IDEM_CONSOLE_SCREENSHOTS=1 it saves
// the record list as docs/console/records-1m.png. The schema it loads is
// dropped when it ends. A benchmark, so `make test` does not run it:
//
//	go test -run '^$' -bench Browser1M -benchtime 1x ./console/
func BenchmarkBrowser1M(b *testing.B) {
	pool, rows := loadRecords(b)
	// Audit rows for the audit log page, as a busy console would have.
	if _, err := pool.Exec(b.Context(), `
		INSERT INTO idem_dlq_audit (at, actor, action, record_ids, detail, reason, result)
		SELECT now() - make_interval(secs => i * 60), 'olga', (ARRAY['replay','archive','resolve'])[1 + i % 3],
			ARRAY[i::bigint, i::bigint + 1], 'to source', 'bench', 'done 2'
		FROM generate_series(1, 2000) AS i`); err != nil {
		b.Fatal(err)
	}
	st := failidx.NewStore(pool) // nothing is replayed: no Kafka
	h, err := newServer(Config{Mask: []string{"card"},
		Tokens: []Token{{Name: "olga", Role: Operator, Secret: operatorSecret}}}, st, failidx.NewActions(st, nil))
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(h)
	b.Cleanup(srv.Close)

	br := browser(b)
	run := func(what string, actions ...chromedp.Action) {
		b.Helper()
		if err := chromedp.Run(br, actions...); err != nil {
			b.Fatalf("%s: %v", what, err)
		}
	}
	run("log in",
		chromedp.Navigate(srv.URL+"/"),
		chromedp.WaitVisible(`#token`, chromedp.ByID),
		chromedp.SendKeys(`#token`, operatorSecret, chromedp.ByID),
		chromedp.Click(`#login`, chromedp.ByID),
		chromedp.WaitVisible(`#overview`, chromedp.ByID),
	)

	// load navigates to path (chromedp.Navigate returns on the load event),
	// checks that the page has no error and at least one row matching rows,
	// and returns the browser's navigation-to-load-end time.
	load := func(path, rowsSel string) time.Duration {
		b.Helper()
		var loadMS float64
		var n, problems int
		run(path,
			chromedp.Navigate(srv.URL+path),
			chromedp.Evaluate(`new Promise(done => { const f = () => {
				const e = performance.getEntriesByType('navigation')[0];
				if (e && e.loadEventEnd > 0) done(e.loadEventEnd - e.startTime); else setTimeout(f, 5);
			}; f(); })`, &loadMS, func(p *runtime.EvaluateParams) *runtime.EvaluateParams { return p.WithAwaitPromise(true) }),
			chromedp.Evaluate(fmt.Sprintf(`document.querySelectorAll(%q).length`, rowsSel), &n),
			chromedp.Evaluate(`document.querySelectorAll('#problem, .problem, #login').length`, &problems),
		)
		if problems != 0 || n == 0 {
			var text string
			run("read the page", chromedp.Text(`main, body`, &text))
			b.Fatalf("%s: %d rows (%s), %d error banners:\n%s", path, n, rowsSel, problems, text)
		}
		return time.Duration(loadMS * float64(time.Millisecond))
	}
	// next returns the path of the page's "next page" link.
	next := func() string {
		b.Helper()
		var href string
		var ok bool
		run("read the next link", chromedp.AttributeValue(`#next`, "href", &href, &ok, chromedp.ByID))
		if !ok || href == "" {
			b.Fatal("the record list has no next link")
		}
		return strings.TrimPrefix(href, srv.URL)
	}
	const list = `table.records tbody tr`
	page := func(path, rowsSel string) func() time.Duration {
		return func() time.Duration { return load(path, rowsSel) }
	}
	// page20 walks to page 20 of the unresolved records, link by link, and
	// returns the time of the last page only.
	page20 := func() time.Duration {
		path := "/records?status=unresolved"
		for range 19 {
			load(path, list)
			path = next()
		}
		return load(path, list)
	}
	// 20 loads of each page; 5 walks to page 20 (100 pages loaded).
	pages := []struct {
		name  string
		loads int
		load  func() time.Duration
	}{
		{"overview", 20, page("/", `#overview table tbody tr`)},
		{"groups", 20, page("/groups", `tr.group`)},
		{"records", 20, page("/records", list)},
		{"records-group", 20, page("/records?fingerprint=000000000005&status=unresolved", list)},
		{"records-page20", 5, page20},
		{"record", 20, page(fmt.Sprintf("/records/%d", rows/2), `#payload`)},
		{"audit", 20, page("/audit", `#audit tbody tr`)},
	}
	b.ResetTimer()
	for range b.N {
		for _, p := range pages {
			var ds []time.Duration
			for range p.loads {
				ds = append(ds, p.load())
			}
			slices.Sort(ds)
			p50, p95 := ms(ds[len(ds)/2]), ms(ds[(len(ds)*95+99)/100-1])
			b.Logf("%-15s p50 %6.1f ms  p95 %6.1f ms  max %6.1f ms", p.name, p50, p95, ms(ds[len(ds)-1]))
			b.ReportMetric(p50, p.name+"-p50-ms")
			b.ReportMetric(p95, p.name+"-p95-ms")
		}
	}
	b.StopTimer()
	load("/records", list)
	run("screenshot", shot(b, "records-1m"))
}
