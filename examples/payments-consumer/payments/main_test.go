package payments

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/breaker"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/idemtest"
)

// servicesEnv returns the real services' addresses. Tests that need them
// skip only under -short and fail, with the fix, when they are not set.
func servicesEnv(t *testing.T) env {
	t.Helper()
	if testing.Short() {
		t.Skip("needs Kafka and PostgreSQL (skipped under -short)")
	}
	e, err := loadEnv()
	if err != nil {
		t.Fatalf("%v\nrun `make services` first (make test does it for you)", err)
	}
	return e
}

// testDemoOptions is a short demo with every fault on: ~1 s of stream, a
// bank outage inside it and a breaker cool-down to match. Metrics go to a
// port of their own and Grafana is not probed.
func testDemoOptions(t *testing.T) demoOptions {
	t.Helper()
	o := defaultDemoOptions()
	o.N, o.Rate, o.Timeout, o.Cleanup = 300, 300, 2*time.Minute, true
	// The outage starts at the bank's 50th call, wherever that falls in
	// the run, so the breaker sees it even on a machine too busy to charge
	// anything in the run's first second.
	o.Bank.faults.Outages = []window{{0, 700 * time.Millisecond}}
	o.Bank.faults.ClockAtCall = 50
	o.Bank.cooldown = 300 * time.Millisecond
	o.MetricsAddr, o.GrafanaURL = "", ""
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	o.Metrics = ln
	return o
}

// TestDemoBalances runs the demo end to end against real Kafka and
// PostgreSQL, with bank failures, timeouts and an outage, and checks every
// figure balances.
func TestDemoBalances(t *testing.T) {
	e := servicesEnv(t)
	o := testDemoOptions(t)
	var out, logs bytes.Buffer
	s, err := runDemo(t.Context(), e, o, &out, &logs)
	t.Logf("demo output:\n%s", out.String())
	if logs.Len() > 0 {
		t.Logf("demo logs:\n%s", logs.String())
	}
	if err != nil {
		t.Fatalf("demo: %v", err)
	}
	if err := s.check(); err != nil {
		t.Fatalf("figures do not balance:\n%v", err)
	}
	kinds := map[handler.Kind]int64{}
	for _, g := range s.DLQGroups {
		kinds[g.Kind] += g.Count
	}
	dups := int(float64(o.N)*o.Dup + 0.5)
	for _, c := range []struct {
		name      string
		got, want int64
	}{
		{"produced", int64(s.Produced), int64(o.N + dups + o.Bad)},
		{"payments stored", s.Stored, int64(o.N)},
		{"bank charges", s.Bank.ChargedPrefix, int64(o.N)},
		{"duplicates skipped", s.DuplicatesSkipped(), int64(dups)},
		{"orders paid", s.OrdersPaid, int64(o.N)},
		{"dead-lettered", s.DeadLettered, int64(o.Bad)},
		{"double charges", s.DoubleCharges, 0},
		{"events published", s.Events.Published, int64(o.N)},
		{"DLQ decode", kinds[handler.KindDecode], int64(o.Bad / 5)},
		{"DLQ missing-key", kinds[handler.KindMissingKey], int64(o.Bad / 5)},
		{"DLQ permanent", kinds[handler.KindPermanent], int64(o.Bad - 2*(o.Bad/5))},
	} {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.name, c.got, c.want)
		}
	}
	if s.BreakerOpenings < 1 {
		t.Errorf("breaker openings = %d; the bank outage should open it", s.BreakerOpenings)
	}
	if s.Bank.Failed == 0 {
		t.Errorf("the bank failed no call; its faults are off")
	}
	for _, want := range []string{"done · bank", "double charges:", "duplicates skipped:", "retried:", "breaker openings:", "dead-lettered:"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, out.String())
		}
	}
}

// testDB opens the service's database (DATABASE_URL), migrated, closed
// when the test ends (after the cleanups the test registers later), and a
// run id for the test's rows.
func testDB(t *testing.T) (*pgxpool.Pool, string) {
	t.Helper()
	e := servicesEnv(t)
	pool, err := openDB(t.Context(), e.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := migrate(t.Context(), pool); err != nil {
		t.Fatal(err)
	}
	return pool, "test-" + newRunID()
}

// TestHandlePayment drives the handler through its paths in a transaction of
// the test's own, as the consumer does once the inbox took a key
// (idemtest.Postgres.Handle).
func TestHandlePayment(t *testing.T) {
	ctx := t.Context()
	pool, run := testDB(t)
	if _, err := pool.Exec(ctx, `INSERT INTO orders (id) VALUES ($1), ($2)`, run+"-o1", run+"-o2"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c := context.Background()
		_, _ = pool.Exec(c, `DELETE FROM payments WHERE order_id LIKE $1`, run+"-%")
		_, _ = pool.Exec(c, `DELETE FROM orders WHERE id LIKE $1`, run+"-%")
		_, _ = pool.Exec(c, `DELETE FROM idem_outbox WHERE topic = $1`, run+".events")
		_, _ = pool.Exec(c, `DELETE FROM idem_steps WHERE consumer_group = $1`, run)
	})
	svc, bk := testService(t, bankFaults{})
	svc.eventsTopic = run + ".events"
	// handle runs one message in a transaction that commits on success, as
	// the consumer does once the inbox took its key (none is recorded here).
	db := &idemtest.Postgres{Pool: pool}
	handle := func(key, body string) error {
		return db.Handle(ctx, run, handler.Func(svc.handlePayment), &handler.Message{Value: []byte(body), IdempotencyKey: key})
	}
	body := func(key, order, amount, cur string) string {
		return fmt.Sprintf(`{"idempotency_key":%q,"order_id":%q,"amount":%s,"currency":%q}`, key, order, amount, cur)
	}
	steps := []struct {
		name, key, body string
		want            string // "" ok, "permanent", "decode"
	}{
		{"first payment", run + "-k1", body(run+"-k1", run+"-o1", `"12.34"`, "KRW"), ""},
		{"same payment again (inbox swept)", run + "-k1", body(run+"-k1", run+"-o1", `"12.34"`, "KRW"), ""},
		{"another payment for the paid order", run + "-k2", body(run+"-k2", run+"-o1", `"1.00"`, "KRW"), "permanent"},
		{"number amount keeps its digits", run + "-k3", body(run+"-k3", run+"-o2", `99.999999`, "USD"), ""},
		{"unknown order", run + "-k4", body(run+"-k4", run+"-nope", `"1"`, "EUR"), "permanent"},
		{"zero amount", run + "-k5", body(run+"-k5", run+"-o2", `"0.00"`, "EUR"), "permanent"},
		{"bad JSON", run + "-k6", `{"order_id":`, "decode"},
	}
	for _, st := range steps {
		err := handle(st.key, st.body)
		var got string
		switch {
		case handler.IsDecode(err):
			got = "decode"
		case handler.IsPermanent(err):
			got = "permanent"
		case err != nil:
			got = "retriable: " + err.Error()
		}
		if got != st.want {
			t.Errorf("%s: got %q (err %v), want %q", st.name, got, err, st.want)
		}
	}
	var n int
	var amount string
	if err := pool.QueryRow(ctx, `SELECT count(*), max(amount::text) FILTER (WHERE order_id = $2) FROM payments WHERE order_id LIKE $1`,
		run+"-%", run+"-o2").Scan(&n, &amount); err != nil {
		t.Fatal(err)
	}
	if n != 2 || amount != "99.999999" {
		t.Errorf("payments: %d rows, o2 amount %q; want 2 rows, 99.999999", n, amount)
	}
	// One payment.recorded per stored payment; the repeat and the refused
	// ones enqueued nothing (or rolled it back).
	var events []string
	rows, err := pool.Query(ctx, `SELECT value->>'idempotency_key' FROM (SELECT convert_from(value, 'UTF8')::jsonb AS value
		FROM idem_outbox WHERE topic = $1) e ORDER BY 1`, run+".events")
	if err != nil {
		t.Fatal(err)
	}
	if events, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	if want := []string{run + "-k1", run + "-k3"}; !slices.Equal(events, want) {
		t.Errorf("payment.recorded events enqueued for %v, want %v", events, want)
	}
	if f := bk.figures(run + "-"); f.ChargedPrefix != 2 || f.DoubleCharged != 0 {
		t.Errorf("bank: %d charges, %d orders charged twice; want 2, 0", f.ChargedPrefix, f.DoubleCharged)
	}
	if got := svc.naturalDups.Load(); got != 1 {
		t.Errorf("natural-key duplicates = %d, want 1", got)
	}
}

// testService starts a bank with faults and a service charging it, with a
// 1 s client timeout and a 1 h breaker cool-down (an opened breaker stays
// open for the test). The timeout is far above a charge's time on a loaded
// machine: at 50 ms, under load 35, answered charges timed out and calls
// that were sent never reached the bank.
func testService(t *testing.T, f bankFaults) (*service, *bank) {
	t.Helper()
	svc, bk, err := startService(bankFlags{faults: f, timeout: time.Second, cooldown: time.Hour}, prometheus.NewRegistry(), "payments.events")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(bk.close)
	return svc, bk
}

// TestBankFaults checks how each bank failure reaches the consumer: 503s and
// timeouts are retriable and counted by the breaker, whose fifth failure in a
// row opens it (that call's error already says so, and the consumer pauses);
// a charge repeated with its key is charged once.
func TestBankFaults(t *testing.T) {
	ctx := t.Context()
	p := Payment{OrderID: "o1", Amount: "1.00", Currency: "KRW"}
	for _, tc := range []struct {
		name   string
		faults bankFaults
	}{
		{"503", bankFaults{FailureRate: 1}},
		{"timeout", bankFaults{TimeoutRate: 1}},
		{"outage", bankFaults{Outages: []window{{0, time.Hour}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc, bk := testService(t, tc.faults)
			for i := range 4 {
				err := svc.bank.Charge(ctx, "k1", p)
				if err == nil || !handler.IsRetriable(err) || breaker.IsOpen(err) {
					t.Fatalf("call %d: %v; want a retriable error, breaker closed", i+1, err)
				}
			}
			for i := 5; i <= 6; i++ {
				if err := svc.bank.Charge(ctx, "k1", p); !breaker.IsOpen(err) {
					t.Fatalf("call %d: %v; want the breaker open", i, err)
				}
			}
			if f := bk.figures(""); f.Calls != 5 || f.Failed != 5 {
				t.Errorf("bank saw %d calls, %d failed; want 5, 5 (none while open)", f.Calls, f.Failed)
			}
		})
	}
	t.Run("idempotent", func(t *testing.T) {
		svc, bk := testService(t, bankFaults{})
		for range 3 {
			if err := svc.bank.Charge(ctx, "k1", p); err != nil {
				t.Fatal(err)
			}
		}
		if err := svc.bank.Charge(ctx, "k2", Payment{OrderID: "o2", Amount: "2.00", Currency: "USD"}); err != nil {
			t.Fatal(err)
		}
		if f := bk.figures(""); f.Charges != 2 || f.Repeats != 2 || f.DoubleCharged != 0 {
			t.Errorf("ledger: %d charges, %d repeats, %d double; want 2, 2, 0", f.Charges, f.Repeats, f.DoubleCharged)
		}
	})
}

// TestChargeIsAStep: the bank charge is a durable step of its message. A
// handler that fails after the charge (its transaction rolled back) is
// retried without a second call to the bank, which was called with the
// step's derived key; and when the bank charged but its answer never came
// (nothing recorded), the retry calls it again with the same key and it
// charges once.
func TestChargeIsAStep(t *testing.T) {
	ctx := t.Context()
	pool, run := testDB(t)
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `DELETE FROM idem_steps WHERE consumer_group = $1`, run)
	})
	db := &idemtest.Postgres{Pool: pool}
	p := Payment{OrderID: run + "-o1", Amount: "1.00", Currency: "KRW"}
	m := &handler.Message{IdempotencyKey: run + "-k1"}

	svc, bk := testService(t, bankFaults{})
	failsAfterCharge := handler.Func(func(ctx context.Context, m *handler.Message) error {
		if err := svc.charge(ctx, p); err != nil {
			return err
		}
		return errors.New("lost the database after charging")
	})
	for i := range 3 {
		if err := db.Handle(ctx, run, failsAfterCharge, m); err == nil || !strings.Contains(err.Error(), "after charging") {
			t.Fatalf("try %d: %v; want the failure after the charge", i+1, err)
		}
	}
	f := bk.figures(run + "-")
	if f.Calls != 1 || f.Charges != 1 {
		t.Fatalf("the bank saw %d calls and made %d charges for three tries; want 1 and 1: the step's record answers the retries", f.Calls, f.Charges)
	}
	bk.mu.Lock()
	for key := range bk.ledger {
		if !strings.HasPrefix(key, "idem-") || key == m.IdempotencyKey {
			t.Errorf("the bank was called with key %q; want the step's derived key (step.Key: idem-…)", key)
		}
	}
	bk.mu.Unlock()

	// Charged, but the answer came too late: nothing is recorded, and each
	// retry calls the bank with the same key, which its ledger answers.
	slow, sbk := testService(t, bankFaults{TimeoutRate: 1})
	m2 := &handler.Message{IdempotencyKey: run + "-k2"}
	charge := handler.Func(func(ctx context.Context, m *handler.Message) error { return slow.charge(ctx, p) })
	for i := range 2 {
		if err := db.Handle(ctx, run, charge, m2); err == nil || !handler.IsRetriable(err) {
			t.Fatalf("try %d: %v; want the bank's timeout, retriable", i+1, err)
		}
	}
	if f := sbk.figures(""); f.Calls != 2 || f.Charges != 1 || f.Repeats != 1 {
		t.Errorf("the bank saw %d calls, made %d charges, answered %d from its ledger; want 2, 1, 1: the same key twice, one charge", f.Calls, f.Charges, f.Repeats)
	}
}

func TestParseWindows(t *testing.T) {
	ws, err := parseWindows("4s+3s, 20s+500ms")
	if err != nil || len(ws) != 2 || ws[0] != (window{4 * time.Second, 3 * time.Second}) || ws[1] != (window{20 * time.Second, 500 * time.Millisecond}) {
		t.Fatalf("parseWindows = %v, %v", ws, err)
	}
	for _, bad := range []string{"4s", "4s+0s", "-1s+2s", "x+1s"} {
		if _, err := parseWindows(bad); err == nil {
			t.Errorf("parseWindows(%q): no error", bad)
		}
	}
}

func TestPaymentKey(t *testing.T) {
	tests := []struct {
		name    string
		headers []handler.Header
		body    string
		want    string
		wantErr bool
	}{
		{"header wins", []handler.Header{{Key: "idempotency-key", Value: []byte("h1")}}, `{"idempotency_key":"b1"}`, "h1", false},
		{"header without JSON", []handler.Header{{Key: "idempotency-key", Value: []byte("h1")}}, `garbage`, "h1", false},
		{"JSON field", nil, `{"idempotency_key":"b1","order_id":"o"}`, "b1", false},
		{"empty header falls back", []handler.Header{{Key: "idempotency-key", Value: []byte(" ")}}, `{"idempotency_key":"b1"}`, "b1", false},
		{"no key anywhere", nil, `{"order_id":"o"}`, "", false},
		{"no header, bad JSON", nil, `{"idempotency_key":`, "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := paymentKey(&handler.Message{Headers: tt.headers, Value: []byte(tt.body)})
			if got != tt.want || (err != nil) != tt.wantErr {
				t.Errorf("paymentKey = %q, %v; want %q, error %v", got, err, tt.want, tt.wantErr)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	ok := Payment{OrderID: "o1", Amount: "12.34", Currency: "KRW"}
	tests := []struct {
		name   string
		mutate func(*Payment)
		valid  bool
	}{
		{"valid", func(*Payment) {}, true},
		{"integer amount", func(p *Payment) { p.Amount = "100" }, true},
		{"tiny amount", func(p *Payment) { p.Amount = "0.01" }, true},
		{"zero", func(p *Payment) { p.Amount = "0.00" }, false},
		{"negative", func(p *Payment) { p.Amount = "-5.00" }, false},
		{"exponent", func(p *Payment) { p.Amount = "1e3" }, false},
		{"comma", func(p *Payment) { p.Amount = "1,000" }, false},
		{"empty amount", func(p *Payment) { p.Amount = "" }, false},
		{"unknown currency", func(p *Payment) { p.Currency = "XYZ" }, false},
		{"lower-case currency", func(p *Payment) { p.Currency = "krw" }, false},
		{"no order", func(p *Payment) { p.OrderID = "" }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := ok
			tt.mutate(&p)
			if err := p.validate(); (err == nil) != tt.valid {
				t.Errorf("validate(%+v) = %v, want valid=%v", p, err, tt.valid)
			}
		})
	}
}

func TestDecodeAmount(t *testing.T) {
	for in, want := range map[string]Amount{`"12.34"`: "12.34", `12.34`: "12.34", `" 7 "`: "7", `100000000000000000.5`: "100000000000000000.5"} {
		p, err := decodePayment([]byte(`{"amount":` + in + `}`))
		if err != nil || p.Amount != want {
			t.Errorf("amount %s: got %q, %v; want %q", in, p.Amount, err, want)
		}
	}
	for _, in := range []string{`true`, `{}`, `[1]`} {
		if _, err := decodePayment([]byte(`{"amount":` + in + `}`)); err == nil {
			t.Errorf("amount %s: no error", in)
		}
	}
}

func TestMissingEnv(t *testing.T) {
	t.Setenv("KAFKA_BROKERS", "")
	t.Setenv("DATABASE_URL", "")
	err := run(t.Context(), []string{"demo"}, io.Discard, io.Discard, Hooks{})
	if err == nil || !strings.Contains(err.Error(), "KAFKA_BROKERS") || !strings.Contains(err.Error(), "DATABASE_URL") || !strings.Contains(err.Error(), "make services") {
		t.Fatalf("run without env = %v; want an error naming both variables and `make services`", err)
	}
}

// TestDashboardURL: the demo links the dashboard only when Grafana answers.
func TestDashboardURL(t *testing.T) {
	grafana := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/health" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintln(w, `{"database":"ok"}`)
	}))
	t.Cleanup(grafana.Close)
	if got, want := dashboardURL(t.Context(), grafana.URL+"/"), grafana.URL+"/d/idem/idem?refresh=5s"; got != want {
		t.Errorf("dashboardURL = %q, want %q", got, want)
	}
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close()
	for _, base := range []string{"", down.URL} {
		if got := dashboardURL(t.Context(), base); got != "" {
			t.Errorf("dashboardURL(%q) = %q, want none", base, got)
		}
	}
}
