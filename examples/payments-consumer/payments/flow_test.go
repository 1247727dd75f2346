package payments

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/breaker"
	"github.com/idemhq/idem/handler"
)

// runCheckedDemo runs the demo with o, logs its output (and its logs if it
// fails), and fails the test unless it completes and its figures balance. It
// returns the summary and the output.
func runCheckedDemo(t *testing.T, o demoOptions) (summary, string) {
	t.Helper()
	var out, logs bytes.Buffer
	s, err := runDemo(t.Context(), servicesEnv(t), o, &out, &logs)
	t.Logf("demo output:\n%s", out.String())
	if err != nil {
		t.Logf("demo logs:\n%s", logs.String())
		t.Fatalf("demo: %v", err)
	}
	if err := s.check(); err != nil {
		t.Fatalf("figures do not balance:\n%v", err)
	}
	return s, out.String()
}

// runFlowDemo is runCheckedDemo (whose check includes: no 429 forwarded, no
// call during a Retry-After, the rate kept) that also wants every payment
// applied and charged once and the flow figures printed.
func runFlowDemo(t *testing.T, o demoOptions) summary {
	t.Helper()
	s, out := runCheckedDemo(t, o)
	if s.Stored != int64(o.N) || s.Bank.ChargedPrefix != int64(o.N) || s.OrdersPaid != int64(o.N) || s.DoubleCharges != 0 {
		t.Errorf("applied: %d stored, %d charged, %d orders paid, %d double charges; want %d, %d, %d, 0",
			s.Stored, s.Bank.ChargedPrefix, s.OrdersPaid, s.DoubleCharges, o.N, o.N, o.N)
	}
	for _, want := range []string{"calls/s", "bank flow:", "bank 429s:"} {
		if !strings.Contains(out, want) {
			t.Errorf("demo output lacks %q", want)
		}
	}
	return s
}

// scrapeBank returns the values of the idem_dependency_* and
// payments_bank_requests_total series on /metrics at addr, by name and
// labels ("name{k=v,…}", labels sorted as parseExposition keeps them).
func scrapeBank(ctx context.Context, addr string) (map[string]float64, error) {
	samples, err := scrape(ctx, "http://"+addr+"/metrics")
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, s := range samples {
		if !strings.HasPrefix(s.Name, "idem_dependency_") && s.Name != "payments_bank_requests_total" && s.Name != "idem_retries_total" {
			continue
		}
		out[seriesKey(s.Name, s.Labels)] += s.Value
	}
	return out, nil
}

// seriesKey is name{labels} without the group and topic labels.
func seriesKey(name string, labels map[string]string) string {
	for _, k := range []string{"reason", "result"} {
		if v, ok := labels[k]; ok {
			name += "{" + k + "=" + v + "}"
		}
	}
	return name
}

// TestBankRateLimit: with a limit of 100 calls/s (burst 1) toward the bank,
// the bank's own ledger sees at most 105 calls in any 1 s window, every
// payment is applied and charged once, and /metrics shows the limit.
// The stream (460 records at 300/s, the bank's failures, timeouts and outage
// on) comes faster than the limit, so calls wait for tokens.
//
// Two partitions, so two callers wait for tokens: the 5 % is for the time
// between a call's token and its arrival at the bank, and when the process
// stalls (GC, a busy CPU) every caller whose token came due meanwhile sends at
// once, so the bank's busiest second grows with the callers. Six of them on a
// loaded 2-core machine under -race reached 105.
func TestBankRateLimit(t *testing.T) {
	o := testDemoOptions(t)
	o.N, o.Partitions = 400, 2
	o.Bank.limits = breaker.Limits{Rate: 100, Burst: 1}
	o.Bank.faults.Throttles = nil
	var metrics map[string]float64
	o.consumed = func(ctx context.Context) (err error) {
		metrics, err = scrapeBank(ctx, o.Metrics.Addr().String())
		return err
	}
	s := runFlowDemo(t, o)
	if got := s.Bank.Flow.PeakPerSecond; got > 105 || got < 1 {
		t.Errorf("the bank saw %d calls in its busiest 1 s window; want 1..105 (100/s + 5 %%)", got)
	}
	if s.Flow.Waited <= 0 {
		t.Errorf("calls waited %gs for tokens; the stream is faster than the limit, so some must wait", s.Flow.Waited)
	}
	if s.Bank.Calls < int64(o.N) || s.Flow.Requests != s.Bank.Calls {
		t.Errorf("client counted %d requests, the bank %d calls; want equal and >= %d", s.Flow.Requests, s.Bank.Calls, o.N)
	}
	if got := metrics["idem_dependency_rate_limit"]; got != 100 {
		t.Errorf("/metrics idem_dependency_rate_limit{dependency=bank} = %v, want 100 (scraped: %v)", got, metrics)
	}
	if got := metrics["idem_dependency_throttled_seconds_total{reason=wait}"]; got <= 0 {
		t.Errorf("/metrics idem_dependency_throttled_seconds_total{reason=wait} = %v, want > 0", got)
	}
}

// TestBank429: the bank answers every charge 429 with Retry-After 2 s for
// 10 s. No message reaches a retry tier or the DLQ because of it (the DLQ
// holds the poison records only), no retry is counted, the bank gets no call
// during any Retry-After it gave (after 500 ms for calls already sent), and
// everything is applied and charged once afterwards.
func TestBank429(t *testing.T) {
	o := testDemoOptions(t)
	o.N, o.Rate = 300, 100 // 3.4 s of stream: much of it arrives during the 429s
	o.Bank.faults = bankFaults{Latency: time.Millisecond, Throttles: []window{{time.Second, 10 * time.Second}}, RetryAfter: 2 * time.Second}
	o.Bank.limits = breaker.Limits{}
	// No call may time out: a timeout is a retry, and this test counts none.
	// The demo's 100 ms client timeout turned slow answers on a loaded machine
	// into 17 retries once.
	o.Bank.timeout = 2 * time.Second
	var metrics map[string]float64
	o.consumed = func(ctx context.Context) (err error) {
		metrics, err = scrapeBank(ctx, o.Metrics.Addr().String())
		return err
	}
	s := runFlowDemo(t, o)
	f, bank := s.Flow, s.Bank.Flow
	// 10 s of 429s with Retry-After 2 s: about five pauses, each ended by one
	// probe that gets the next 429.
	if bank.Answered429 < 4 {
		t.Errorf("the bank answered %d 429s; want >= 4 over 10 s with Retry-After 2 s", bank.Answered429)
	}
	if bank.CallsInPause != 0 {
		t.Errorf("the bank got %d calls during a Retry-After it had given; want 0", bank.CallsInPause)
	}
	if f.Paused < 8 {
		t.Errorf("calls to the bank were paused %.1fs; want about 10 s (>= 8 s)", f.Paused)
	}
	if f.ThrottledAttempts < bank.Answered429 {
		t.Errorf("%d handler attempts throttled < %d 429s", f.ThrottledAttempts, bank.Answered429)
	}
	for i, n := range s.TierRecords {
		if n != 0 {
			t.Errorf("tier %d holds %d records; a 429 must send none there", i+1, n)
		}
	}
	if s.DeadLettered != int64(o.Bad) || f.Forwarded429 != 0 {
		t.Errorf("DLQ: %d records, %d of them for a 429; want the %d poison records only", s.DeadLettered, f.Forwarded429, o.Bad)
	}
	if s.InProcess != 0 || metrics["idem_retries_total"] != 0 {
		t.Errorf("retries counted: %d (idem_retries_total %v); want 0", s.InProcess, metrics["idem_retries_total"])
	}
	if got := metrics["payments_bank_requests_total{result=throttled}"]; got != float64(bank.Answered429) {
		t.Errorf("client counted %v 429s, the bank answered %d", got, bank.Answered429)
	}
	if got := metrics["idem_dependency_throttled_total{reason=retry-after}"]; got < float64(bank.Answered429) {
		t.Errorf("/metrics idem_dependency_throttled_total{reason=retry-after} = %v, want >= %d", got, bank.Answered429)
	}
	if got := metrics["idem_dependency_throttled_seconds_total{reason=retry-after}"]; math.Abs(got-f.Paused) > 0.5 {
		t.Errorf("/metrics throttled seconds (retry-after) = %v, summary %v", got, f.Paused)
	}
}

// TestBank429Charge: a 429 pauses every call to the bank for its Retry-After,
// through the Set: the charge's error is a *breaker.ThrottleError (the
// consumer pauses, spends no retry), and the next charge is refused without
// reaching the bank.
func TestBank429Charge(t *testing.T) {
	svc, bk := testService(t, bankFaults{Throttles: []window{{0, time.Hour}}, RetryAfter: 2 * time.Second})
	p := Payment{OrderID: "o1", Amount: "1.00", Currency: "KRW"}
	err := svc.bank.Charge(t.Context(), "k1", p)
	var te *breaker.ThrottleError
	if !errors.As(err, &te) || te.Reason != breaker.ReasonRetryAfter || !errors.Is(err, errBankThrottled) {
		t.Fatalf("charge during a 429 window: %v; want a *breaker.ThrottleError (retry-after) caused by the 429", err)
	}
	if d, _ := breaker.RetryAfter(err); d <= time.Second || d > 2*time.Second {
		t.Errorf("RetryAfter = %s, want about 2s", d)
	}
	err = svc.bank.Charge(t.Context(), "k2", p)
	if !breaker.IsThrottled(err) || !breaker.Rejected(err) {
		t.Errorf("charge during the pause: %v; want refused by the pause", err)
	}
	if f := bk.figures(""); f.Calls != 1 || f.Flow.Answered429 != 1 || f.Charges != 0 {
		t.Errorf("bank: %d calls, %d 429s, %d charges; want 1, 1, 0", f.Calls, f.Flow.Answered429, f.Charges)
	}
}

// TestBankMaxInFlight: with -bank-max-in-flight 1 and a bank that takes
// 100 ms a charge, four charges at once run one at a time: the bank never
// has two.
func TestBankMaxInFlight(t *testing.T) {
	bf := bankFlags{faults: bankFaults{Latency: 100 * time.Millisecond}, timeout: time.Second, cooldown: time.Hour,
		limits: breaker.Limits{MaxInFlight: 1, MaxWait: 5 * time.Second}}
	svc, bk, err := startService(bf, prometheus.NewRegistry(), "payments.events")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(bk.close)
	errs := make(chan error, 4)
	for i := range 4 {
		go func() {
			errs <- svc.bank.Charge(t.Context(), fmt.Sprint("k", i), Payment{OrderID: fmt.Sprint("o", i), Amount: "1.00", Currency: "KRW"})
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if f := bk.figures(""); f.Charges != 4 || f.Flow.PeakPerSecond > 4 {
		t.Fatalf("bank: %d charges, peak %d/s", f.Charges, f.Flow.PeakPerSecond)
	}
	if got := bk.figures("").Flow.PeakInFlight; got != 1 {
		t.Errorf("the bank had %d charges at once; want 1", got)
	}
}

// TestCallLedger: the busiest 1 s window and the calls inside a Retry-After,
// on a clock of the test's own.
func TestCallLedger(t *testing.T) {
	var l callLedger
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	for _, ms := range []int{0, 100, 900, 999, 1000, 1500, 1999} {
		l.arrive(at(ms))()
	}
	// (0, 1000]: 100, 900, 999, 1000 = 4; (999, 1999]: 1000, 1500, 1999 = 3.
	if got := l.figures().PeakPerSecond; got != 4 {
		t.Errorf("peak = %d, want 4", got)
	}
	l.throttled(at(3000), 2*time.Second)
	l.arrive(at(3000 + 100))()  // sent before the client read the 429: allowed
	l.arrive(at(3000 + 600))()  // ignored the Retry-After
	l.arrive(at(3000 + 1999))() // ignored it too
	l.arrive(at(3000 + 2000))() // after it: allowed
	if f := l.figures(); f.Answered429 != 1 || f.CallsInPause != 2 {
		t.Errorf("figures %+v; want 1 429, 2 calls in the pause", f)
	}
}

func TestTooManyRequests(t *testing.T) {
	for header, want := range map[string]time.Duration{"2": 2 * time.Second, " 5 ": 5 * time.Second, "": 0, "soon": 0, "-1": 0} {
		err := tooManyRequests(header)
		d, ok := handler.RetryAfterOf(err)
		if !ok || d != want || !errors.Is(err, errBankThrottled) {
			t.Errorf("Retry-After %q: %v (%s, %v); want a RetryAfter of %s", header, err, d, ok, want)
		}
	}
	date := time.Now().Add(3 * time.Second).UTC().Format(http.TimeFormat)
	if d, _ := handler.RetryAfterOf(tooManyRequests(date)); d < time.Second || d > 3*time.Second {
		t.Errorf("Retry-After %q: %s, want about 3s", date, d)
	}
}

// TestFlowFlags: the flags parse into the limits, -bank-rate 0 turns the
// demo's limit off, and bad values are usage errors that name the flag.
func TestFlowFlags(t *testing.T) {
	parse := func(args ...string) (bankFlags, error) {
		bf := defaultDemoOptions().Bank
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		bf.register(fs)
		if err := fs.Parse(args); err != nil {
			return bf, err
		}
		return bf, bf.validate()
	}
	bf, err := parse("-bank-rate", "50", "-bank-burst", "5", "-bank-max-in-flight", "3", "-bank-throttle", "1s+2s", "-bank-retry-after", "3s")
	if err != nil {
		t.Fatal(err)
	}
	if want := (breaker.Limits{Rate: 50, Burst: 5, MaxInFlight: 3}); bf.bankLimits() != want {
		t.Errorf("limits %+v, want %+v", bf.bankLimits(), want)
	}
	if bf.faults.RetryAfter != 3*time.Second || len(bf.faults.Throttles) != 1 {
		t.Errorf("throttle %v, Retry-After %s", bf.faults.Throttles, bf.faults.RetryAfter)
	}
	if bf, err := parse("-bank-rate", "0"); err != nil || bf.bankLimits() != (breaker.Limits{}) {
		t.Errorf("-bank-rate 0: %+v, %v; want no limits", bf.bankLimits(), err)
	}
	for _, args := range [][]string{
		{"-bank-rate", "-1"},
		{"-bank-rate", "NaN"},
		{"-bank-max-in-flight", "-2"},
		{"-bank-rate", "10", "-bank-burst", "-1"},
		{"-bank-retry-after", "1500ms"},
		{"-bank-retry-after", "0s"},
	} {
		_, err := parse(args...)
		if !errors.As(err, new(usageError)) || !strings.Contains(err.Error(), args[len(args)-2]) && !strings.Contains(err.Error(), "-bank-rate") {
			t.Errorf("%v: %v; want a usage error naming the flag", args, err)
		}
	}
}
