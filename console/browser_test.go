package console

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/chromedp/chromedp"

	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/internal/failidx"
	"github.com/idemhq/idem/retrytopic"
)

// screenshotsEnv, set to 1, makes TestBrowserTriage write its screenshots
// into docs/console/ (CI leaves it unset, so the tree stays clean).
const screenshotsEnv = "IDEM_CONSOLE_SCREENSHOTS"

// browser starts headless Chromium (the Debian chromium package; CI
// installs it) and returns a context that drives one tab.
func browser(t testing.TB) context.Context {
	t.Helper()
	path := ""
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			path = p
			break
		}
	}
	if path == "" {
		t.Fatal("no Chromium: apt-get install chromium (.ci/run installs it)")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.WindowSize(1360, 900), chromedp.Flag("lang", "en-US"),
		// Chromium's first start on a machine (its font cache, its profile)
		// can take more than chromedp's 20 s under load: it once did here.
		chromedp.WSURLReadTimeout(90*time.Second))
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelC := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	tctx, cancelT := context.WithTimeout(ctx, 3*time.Minute)
	t.Cleanup(func() { cancelT(); cancelC(); cancelA() })
	if err := chromedp.Run(tctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return tctx
}

// runner returns a function that runs actions in the tab b and fails the
// test, naming what, when they fail.
func runner(t *testing.T, b context.Context) func(what string, actions ...chromedp.Action) {
	return func(what string, actions ...chromedp.Action) {
		t.Helper()
		if err := chromedp.Run(b, actions...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
}

// logIn returns the actions that log in to e's console with secret and
// wait for the overview.
func logIn(e *env, secret string) []chromedp.Action {
	return []chromedp.Action{
		chromedp.Navigate(e.srv.URL + "/"),
		chromedp.WaitVisible(`#token`, chromedp.ByID),
		chromedp.SendKeys(`#token`, secret, chromedp.ByID),
		chromedp.Click(`#login`, chromedp.ByID),
		chromedp.WaitVisible(`#overview`, chromedp.ByID),
	}
}

// shot saves a full-page PNG as docs/console/name.png when
// IDEM_CONSOLE_SCREENSHOTS=1.
func shot(t testing.TB, name string) chromedp.Action {
	return chromedp.ActionFunc(func(ctx context.Context) error {
		if os.Getenv(screenshotsEnv) != "1" {
			return nil
		}
		var png []byte
		if err := chromedp.FullScreenshot(&png, 100).Do(ctx); err != nil {
			return err
		}
		dir := filepath.Join("..", "docs", "console")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		t.Logf("screenshot %s.png", name)
		return os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644)
	})
}

// payment is the body of the test's source records.
type payment struct {
	ID     string `json:"id"`
	Amount any    `json:"amount"`
}

// TestBrowserTriage drives the console in Chromium against a real
// consumer.Run that dead-letters a mix of records, with the indexer
// running: open the overview, then a failure group; replay two selected
// records, archive one with a reason, edit one and retry it. Then it checks
// PostgreSQL (each effect applied once, the statuses, the audit rows) and
// Kafka (exactly the records the console sent).
func TestBrowserTriage(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.Mask = []string{"card"} })
	ctx := t.Context()
	// Names that read well in the screenshots, unique all the same.
	source, group := e.k.Topic(t, "payments", 1), e.k.Group(t, "billing")
	dlqTopic := retrytopic.Policy{}.DLQ(source, group) // deleted with source
	if _, err := e.pool.Exec(ctx, `CREATE TABLE payments_applied (payment text NOT NULL, amount numeric NOT NULL, at timestamptz NOT NULL DEFAULT now())`); err != nil {
		t.Fatal(err)
	}

	// The consumer: a payment whose amount is not a number is bad input
	// (permanent); while the ledger is "frozen", payments p-0…p-3 are refused
	// (permanent too). Others are applied in the inbox's transaction.
	var frozen atomic.Bool
	frozen.Store(true)
	h := handler.Func(func(ctx context.Context, m *handler.Message) error {
		var p payment
		if err := json.Unmarshal(m.Value, &p); err != nil {
			return handler.Permanent(fmt.Errorf("decode payment: %w", err))
		}
		amount, ok := p.Amount.(float64)
		if !ok {
			return handler.Permanent(fmt.Errorf("decode payment %s: amount %v is not a number", p.ID, p.Amount))
		}
		if frozen.Load() && p.ID < "p-4" {
			return handler.Permanent(errors.New("ledger rejected payment: account frozen"))
		}
		_, err := dedupe.Tx(ctx).Exec(ctx, `INSERT INTO payments_applied (payment, amount) VALUES ($1, $2)`, p.ID, amount)
		return err
	})
	var values [8][]byte
	for i := range values {
		p := payment{ID: fmt.Sprintf("p-%d", i), Amount: 10 * (i + 1)}
		if i == 4 || i == 5 {
			p.Amount = "1O" // a letter O: bad input
		}
		values[i], _ = json.Marshal(map[string]any{"id": p.ID, "amount": p.Amount, "card": map[string]string{"number": "4111111111111111"}})
		e.k.Produce(t, source, idemtest.Record{IdempotencyKey: p.ID, Key: []byte(p.ID), Value: values[i]})
	}
	idemtest.Start(t, idemtest.WithPostgres(t, e.k.Config(t, group, source), e.pool), h)
	e.runIndexer(t, dlqTopic)
	recs := e.waitIndexed(t, failidx.Filter{Topic: dlqTopic}, 6)
	byKey := map[string]failidx.Record{}
	for _, r := range recs {
		byKey[r.IdempotencyKey] = r
	}
	applied := func() map[string]int {
		rows, err := e.pool.Query(ctx, `SELECT payment, count(*) FROM payments_applied GROUP BY payment`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		m := map[string]int{}
		for rows.Next() {
			var k string
			var n int
			if err := rows.Scan(&k, &n); err != nil {
				t.Fatal(err)
			}
			m[k] = n
		}
		return m
	}
	idemtest.Eventually(t, 30*time.Second, func() error {
		if m := applied(); len(m) != 2 {
			return fmt.Errorf("applied %v, want p-6 and p-7", m)
		}
		return nil
	})
	sourceBefore := e.hwm(t, source)
	frozen.Store(false) // the ledger is fixed: replays of p-0… now succeed

	id := func(key string) string { return fmt.Sprint(byKey[key].ID) }
	run := runner(t, browser(t))
	var text string
	run("log in", append(logIn(e, operatorSecret),
		chromedp.Text(`#overview`, &text, chromedp.ByID),
		shot(t, "overview"))...,
	)
	if !strings.Contains(text, dlqTopic) || !strings.Contains(text, group) {
		t.Fatalf("overview shows no row for %s:\n%s", dlqTopic, text)
	}
	frozenFP := byKey["p-0"].Fingerprint
	run("open the failure groups, then the frozen-account group",
		chromedp.Click(`a[href^="/groups"]`),
		chromedp.WaitVisible(`tr.group`),
		shot(t, "groups"),
		chromedp.Click(fmt.Sprintf(`tr.group[data-fingerprint="%s"] td.err a`, frozenFP)),
		chromedp.WaitVisible(`#act`, chromedp.ByID),
		chromedp.Text(`table.records tbody`, &text),
	)
	for _, k := range []string{"p-0", "p-1", "p-2", "p-3"} {
		if !strings.Contains(text, k) {
			t.Errorf("the group's records lack %s:\n%s", k, text)
		}
	}
	if strings.Contains(text, "p-4") {
		t.Errorf("the frozen-account group lists the bad-amount record p-4:\n%s", text)
	}
	run("replay p-0 and p-1",
		chromedp.Click(`input[name=ids][value="`+id("p-0")+`"]`),
		chromedp.Click(`input[name=ids][value="`+id("p-1")+`"]`),
		shot(t, "records"),
		chromedp.SetValue(`#action`, "replay", chromedp.ByID),
		chromedp.SendKeys(`#reason`, "ledger unfrozen", chromedp.ByID),
		chromedp.Click(`#apply`, chromedp.ByID),
		chromedp.WaitVisible(`#result`, chromedp.ByID),
		chromedp.Text(`#result`, &text, chromedp.ByID),
	)
	if !strings.Contains(strings.Join(strings.Fields(text), " "), "Done 2") {
		t.Errorf("replay result:\n%s", text)
	}
	run("archive p-2 with a reason",
		chromedp.Click(`#back`, chromedp.ByID),
		chromedp.WaitVisible(`#act`, chromedp.ByID),
		chromedp.Click(`input[name=ids][value="`+id("p-2")+`"]`),
		chromedp.SetValue(`#action`, "archive", chromedp.ByID),
		chromedp.SendKeys(`#reason`, "customer closed the account", chromedp.ByID),
		chromedp.Click(`#apply`, chromedp.ByID),
		chromedp.WaitVisible(`#result`, chromedp.ByID),
		chromedp.Text(`#result`, &text, chromedp.ByID),
	)
	if !strings.Contains(strings.Join(strings.Fields(text), " "), "Done 1") {
		t.Errorf("archive result:\n%s", text)
	}
	edited := `{"id":"p-4","amount":10,"card":{"number":"4111111111111111"}}`
	run("edit p-4 and retry it",
		chromedp.Navigate(e.srv.URL+"/records/"+id("p-4")),
		chromedp.WaitVisible(`#payload`, chromedp.ByID),
		chromedp.Text(`#payload`, &text, chromedp.ByID),
	)
	if strings.Contains(text, "4111111111111111") || !strings.Contains(text, "****") {
		t.Errorf("the record page shows the card unmasked:\n%s", text)
	}
	run("edit p-4 and retry it",
		shot(t, "record"),
		chromedp.Click(`#edit`, chromedp.ByID),
		chromedp.WaitVisible(`#value`, chromedp.ByID),
		chromedp.SetValue(`#value`, edited, chromedp.ByID),
		chromedp.SendKeys(`#edit-reason`, "amount typed with a letter O", chromedp.ByID),
		shot(t, "edit"),
		chromedp.Click(`#send`, chromedp.ByID),
		chromedp.WaitVisible(`#result`, chromedp.ByID),
		chromedp.Text(`#result`, &text, chromedp.ByID),
	)
	if !strings.Contains(strings.Join(strings.Fields(text), " "), "Done 1") {
		t.Errorf("edit and retry result:\n%s", text)
	}
	run("the edited record",
		chromedp.Navigate(e.srv.URL+"/records/"+id("p-4")),
		chromedp.WaitVisible(`.version`, chromedp.ByQuery),
		shot(t, "record-edited"),
	)
	run("the audit log",
		chromedp.Navigate(e.srv.URL+"/audit"),
		chromedp.WaitVisible(`#audit`, chromedp.ByID),
		chromedp.Text(`#audit`, &text, chromedp.ByID),
		shot(t, "audit"),
	)
	for _, want := range []string{"replay", "archive", "customer closed the account", "olga"} {
		if !strings.Contains(text, want) {
			t.Errorf("audit page lacks %q:\n%s", want, text)
		}
	}

	// PostgreSQL: each effect once; p-2 archived, p-3 and p-5 untouched.
	want := map[string]int{"p-0": 1, "p-1": 1, "p-4": 1, "p-6": 1, "p-7": 1}
	idemtest.Eventually(t, 60*time.Second, func() error {
		if m := applied(); fmt.Sprint(m) != fmt.Sprint(want) {
			return fmt.Errorf("applied %v, want %v", m, want)
		}
		return nil
	})
	var amount float64
	if err := e.pool.QueryRow(ctx, `SELECT amount FROM payments_applied WHERE payment = 'p-4'`).Scan(&amount); err != nil || amount != 10 {
		t.Errorf("p-4 applied with amount %v (%v), want the edited 10", amount, err)
	}
	for key, st := range map[string]failidx.Status{"p-0": failidx.Replayed, "p-1": failidx.Replayed, "p-2": failidx.Archived, "p-3": failidx.Unresolved, "p-5": failidx.Unresolved} {
		r, err := e.store.Get(ctx, byKey[key].ID)
		if err != nil || r.Status != st {
			t.Errorf("%s: status %s (%v), want %s", key, r.Status, err, st)
		}
		if key == "p-2" && (r.StatusReason != "customer closed the account" || r.StatusActor != "olga") {
			t.Errorf("p-2 archived by %q for %q", r.StatusActor, r.StatusReason)
		}
	}
	r4, err := e.store.Get(ctx, byKey["p-4"].ID)
	if err != nil || len(r4.Versions) != 1 || string(r4.Versions[0].Value) != edited || string(r4.Value) != string(values[4]) {
		t.Errorf("p-4: %d versions (%v), original kept: %v", len(r4.Versions), err, string(r4.Value) == string(values[4]))
	}
	acts := map[string][]int64{}
	for _, a := range e.audit(t) {
		if a.Action != "reveal" {
			acts[a.Action] = append(acts[a.Action], a.RecordIDs...)
		}
		if a.Actor != "olga" {
			t.Errorf("audit row by %q, want olga: %+v", a.Actor, a)
		}
	}
	if len(acts) != 3 || len(acts["replay"]) != 2 || len(acts["archive"]) != 1 || acts["archive"][0] != byKey["p-2"].ID || len(acts["edit-retry"]) != 1 {
		t.Errorf("audit: %v, want replay (2 records), archive (p-2), edit-retry (p-4)", acts)
	}

	// Kafka: the source topic got exactly p-0 and p-1 as they were, and the
	// edited p-4 naming the DLQ record it replaces; the DLQ nothing new.
	got := readFrom(t, e, source, sourceBefore)
	if len(got) != 3 {
		t.Fatalf("the console sent %d records to the source topic, want 3", len(got))
	}
	sent := map[string]*sarama.ConsumerMessage{}
	for _, m := range got {
		sent[string(m.Key)] = m
	}
	for i, k := range []string{"p-0", "p-1"} {
		if m := sent[k]; m == nil || string(m.Value) != string(values[i]) {
			t.Errorf("replayed %s: %v", k, m)
		}
	}
	m4 := sent["p-4"]
	if m4 == nil || string(m4.Value) != edited || header(m4, "idem-replaces") != fmt.Sprintf("%s/%d/%d", dlqTopic, byKey["p-4"].Partition, byKey["p-4"].Offset) ||
		header(m4, "idempotency-key") != "p-4" {
		t.Errorf("edited p-4 as sent: %+v", m4)
	}
	if n := e.hwm(t, dlqTopic); n != 6 {
		t.Errorf("the DLQ holds %d records, want the 6 first failures only", n)
	}
}

func header(m *sarama.ConsumerMessage, key string) string {
	for _, h := range m.Headers {
		if string(h.Key) == key {
			return string(h.Value)
		}
	}
	return ""
}

// readFrom reads partition 0 of topic from offset to its current end.
func readFrom(t *testing.T, e *env, topic string, offset int64) []*sarama.ConsumerMessage {
	t.Helper()
	end := e.hwm(t, topic)
	if end <= offset {
		return nil
	}
	c, err := sarama.NewConsumerFromClient(e.client)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pc, err := c.ConsumePartition(topic, 0, offset)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	var out []*sarama.ConsumerMessage
	timeout := time.After(30 * time.Second)
	for int64(len(out)) < end-offset {
		select {
		case m := <-pc.Messages():
			out = append(out, m)
		case <-timeout:
			t.Fatalf("read %d of %d records of %s", len(out), end-offset, topic)
		}
	}
	return out
}
