package payments

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/breaker"
	"github.com/idemhq/idem/dlq"
	"github.com/idemhq/idem/handler"
)

// Flow control toward the bank. Banks take a quota of calls, and answer 429
// with a Retry-After when it is used up. The service keeps to the quota with a
// rate limit and a cap of calls in flight on the dependency "bank"
// (breaker.Set.SetLimits: waiting for a token is not an attempt), and honours
// a 429 by returning handler.RetryAfter from inside Set.Do: every call to the
// bank then pauses until the Retry-After has passed, and the handler's error
// is a *breaker.ThrottleError, on which idem holds the message until then
// without spending a retry or forwarding anything. breaker.NewLimitCollector exports
// the limits (idem_dependency_*).
//
// This file has the flags, the bank's side (429 windows; a ledger of the calls
// in any 1 s window and of the calls that ignored its Retry-After), the
// client's request counter, and the demo's figures.

// demoBankLimits are the demo's limits toward the bank (-bank-rate,
// -bank-burst): above the calls a loaded laptop makes at the demo's 1,000
// records/s, so the limit holds only the catch-up after the bank's outage and
// the demo takes as long as without it. The burst of a tenth of a second's
// calls lets the partitions' calls bunch up without waiting below the rate
// (with a burst of 1, the calls of 6 partitions wait about 3 ms each).
var demoBankLimits = breaker.Limits{Rate: 800, Burst: 80}

// registerFlow adds the flow-control flags to fs with bf's values as defaults
// (-bank-retry-after: 2s unless bf has one).
func (bf *bankFlags) registerFlow(fs *flag.FlagSet) {
	if bf.faults.RetryAfter == 0 {
		bf.faults.RetryAfter = 2 * time.Second
	}
	fs.Float64Var(&bf.limits.Rate, "bank-rate", bf.limits.Rate, "calls a second to the bank at most (a token bucket of -bank-burst, breaker.Set.SetLimits); 0: no rate limit")
	fs.IntVar(&bf.limits.Burst, "bank-burst", bf.limits.Burst, "calls that may start at once on top of -bank-rate (the token bucket's size); 0: 1")
	fs.IntVar(&bf.limits.MaxInFlight, "bank-max-in-flight", bf.limits.MaxInFlight, "calls to the bank in flight at most; 0: no cap")
	fs.Var(windowsFlag{&bf.faults.Throttles}, "bank-throttle", "windows, start+length from the bank's start (comma-separated, e.g. 8s+2s), in which the bank answers every charge 429 with -bank-retry-after")
	fs.DurationVar(&bf.faults.RetryAfter, "bank-retry-after", bf.faults.RetryAfter, "the Retry-After of the bank's 429s, whole seconds")
}

// bankLimits are the limits of the flags: none (the zero Limits) when
// -bank-rate and -bank-max-in-flight are both 0, and no burst without a rate
// (so -bank-rate 0 turns the demo's limit off).
func (bf bankFlags) bankLimits() breaker.Limits {
	l := bf.limits
	if l.Rate == 0 {
		l.Burst = 0
	}
	if l.Rate == 0 && l.MaxInFlight == 0 {
		return breaker.Limits{}
	}
	return l
}

// validateFlow checks the flow-control flags.
func (bf bankFlags) validateFlow() error {
	if l := bf.bankLimits(); l != (breaker.Limits{}) {
		if err := l.Validate(); err != nil {
			return usagef("-bank-rate, -bank-burst, -bank-max-in-flight: %v", err)
		}
	}
	if ra := bf.faults.RetryAfter; len(bf.faults.Throttles) > 0 && (ra < time.Second || ra%time.Second != 0) {
		return usagef("-bank-retry-after %s: must be whole seconds, at least 1s (HTTP's Retry-After counts seconds)", ra)
	}
	return nil
}

// describeLimits is a summary of the limits, for logs and the demo header.
func (bf bankFlags) describeLimits() string {
	l := bf.bankLimits()
	var parts []string
	if l.Rate > 0 {
		parts = append(parts, "rate limit "+strconv.FormatFloat(l.Rate, 'f', -1, 64)+" calls/s, burst "+strconv.Itoa(max(l.Burst, 1)))
	}
	if l.MaxInFlight > 0 {
		parts = append(parts, "at most "+strconv.Itoa(l.MaxInFlight)+" calls in flight")
	}
	if len(parts) == 0 {
		return "no rate limit"
	}
	return strings.Join(parts, ", ")
}

// setUpFlow gives the dependency "bank" of set bf's limits, if any, and
// registers on reg the limits' collector and the client's request counter,
// which it returns.
func (bf bankFlags) setUpFlow(set *breaker.Set, reg prometheus.Registerer) (*prometheus.CounterVec, error) {
	if l := bf.bankLimits(); l != (breaker.Limits{}) {
		if err := set.SetLimits("bank", l); err != nil {
			return nil, err
		}
	}
	if err := reg.Register(breaker.NewLimitCollector(set)); err != nil {
		return nil, fmt.Errorf("register the bank's limit metrics: %w", err)
	}
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "payments_bank_requests_total",
		Help: "HTTP requests the payments service sent the bank, by result: ok, throttled (429), unavailable (5xx), refused (other 4xx), no_answer.",
	}, []string{"result"})
	if err := reg.Register(requests); err != nil {
		return nil, fmt.Errorf("register payments_bank_requests_total: %w", err)
	}
	for _, r := range bankResults {
		requests.WithLabelValues(r) // every series from the start, at 0
	}
	return requests, nil
}

// bankResults are payments_bank_requests_total's result values.
var bankResults = []string{"ok", "throttled", "unavailable", "refused", "no_answer"}

// count notes one request to the bank by its HTTP status (0: no answer).
func (c *bankClient) count(status int) {
	if c.requests == nil {
		return
	}
	r := "ok"
	switch {
	case status == 0:
		r = "no_answer"
	case status == http.StatusTooManyRequests:
		r = "throttled"
	case status >= 500:
		r = "unavailable"
	case status >= 400:
		r = "refused"
	}
	c.requests.WithLabelValues(r).Inc()
}

// errBankThrottled is the bank's 429: it asks for no call before its
// Retry-After.
var errBankThrottled = errors.New("bank: HTTP 429 Too Many Requests")

// tooManyRequests is the error of a 429 whose Retry-After header is
// retryAfter: seconds or an HTTP date; absent or unreadable, the breaker's own
// short pause applies.
func tooManyRequests(retryAfter string) error {
	var d time.Duration
	retryAfter = strings.TrimSpace(retryAfter)
	if n, err := strconv.Atoi(retryAfter); err == nil && n > 0 {
		d = time.Duration(n) * time.Second
	} else if t, err := http.ParseTime(retryAfter); err == nil {
		d = time.Until(t)
	}
	return handler.RetryAfter(fmt.Errorf("%w (Retry-After %s)", errBankThrottled, d), d)
}

// throttle answers 429 with the bank's Retry-After when now falls in one of
// its throttle windows, and reports whether it did.
func (b *bank) throttle(w http.ResponseWriter, now time.Time) bool {
	if !b.within(b.faults.Throttles, now) {
		return false
	}
	b.ledger1s.throttled(now, b.faults.RetryAfter)
	w.Header().Set("Retry-After", strconv.Itoa(int(b.faults.RetryAfter/time.Second)))
	http.Error(w, "too many requests", http.StatusTooManyRequests)
	return true
}

// retryAfterGrace is how long after a 429 the bank still takes calls without
// counting them as ignoring its Retry-After: calls the client sent before it
// read the answer.
const retryAfterGrace = 500 * time.Millisecond

// callLedger is the bank's account of how it is called: the most calls in any
// 1 s window and at once, its 429 answers, and the calls that came during one
// of their Retry-After periods (after retryAfterGrace). Its memory is bounded
// by the calls of one second.
type callLedger struct {
	mu       sync.Mutex
	lastSec  []time.Time // arrivals of the last second, oldest first
	peak     int
	inFlight int
	peakIn   int             // most calls at once
	answered int64           // 429s
	pauses   []retryAfterWin // the 429s whose Retry-After is not over
	ignored  int64           // calls inside a pause (after the grace)
}

// retryAfterWin is one 429: answered at at, no call expected before until.
type retryAfterWin struct{ at, until time.Time }

// arrive notes a call that arrived at now; the call is in flight until the
// returned function is called.
func (l *callLedger) arrive(now time.Time) (done func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.inFlight++
	l.peakIn = max(l.peakIn, l.inFlight)
	done = func() {
		l.mu.Lock()
		l.inFlight--
		l.mu.Unlock()
	}
	i := 0
	for i < len(l.lastSec) && !l.lastSec[i].After(now.Add(-time.Second)) {
		i++
	}
	l.lastSec = append(l.lastSec[i:], now)
	l.peak = max(l.peak, len(l.lastSec))
	live := l.pauses[:0]
	inPause := false
	for _, p := range l.pauses {
		if now.Before(p.until) {
			live = append(live, p)
			inPause = inPause || now.Sub(p.at) > retryAfterGrace
		}
	}
	l.pauses = live
	if inPause {
		l.ignored++
	}
	return done
}

// throttled notes a 429 answered at now with Retry-After d.
func (l *callLedger) throttled(now time.Time, d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.answered++
	l.pauses = append(l.pauses, retryAfterWin{now, now.Add(d)})
}

// ledgerFigures is what the bank's call ledger says.
type ledgerFigures struct {
	PeakPerSecond int   // most calls in any 1 s window
	PeakInFlight  int   // most calls at once
	Answered429   int64 // charges answered 429
	CallsInPause  int64 // calls that came during a Retry-After the bank had given (after retryAfterGrace)
}

func (l *callLedger) figures() ledgerFigures {
	l.mu.Lock()
	defer l.mu.Unlock()
	return ledgerFigures{PeakPerSecond: l.peak, PeakInFlight: l.peakIn, Answered429: l.answered, CallsInPause: l.ignored}
}

// flowFigures are the demo's flow-control figures: the limits configured,
// what the bank's ledger saw, and what idem and the client counted.
type flowFigures struct {
	Limits     breaker.Limits // -bank-rate, -bank-max-in-flight
	Throttles  []window       // 429 windows configured (-bank-throttle)
	RetryAfter time.Duration  // their Retry-After

	Requests int64 // payments_bank_requests_total: HTTP requests sent to the bank

	Throttled         map[breaker.ThrottleReason]int64 // idem_dependency_throttled_total{dependency="bank"} by reason
	Waited, Paused    float64                          // idem_dependency_throttled_seconds_total{dependency="bank"}: waiting for a token or a slot; paused by a Retry-After
	ThrottledAttempts int64                            // idem_handler_attempts_total{result="throttled"}
	Forwarded429      int64                            // tier and DLQ records whose failure is the bank's 429 (Kafka)
}

// readFlow fills s.Flow from the gathered metrics and the run's tier and DLQ
// topics, and the bank's limits and throttles from bf.
func readFlow(ctx context.Context, client sarama.Client, g gatheredMetrics, bf bankFlags, s *summary) error {
	bank := func(more ...string) map[string]string {
		m := map[string]string{"dependency": "bank"}
		for i := 0; i+1 < len(more); i += 2 {
			m[more[i]] = more[i+1]
		}
		return m
	}
	f := flowFigures{
		Limits: bf.bankLimits(), Throttles: bf.faults.Throttles, RetryAfter: bf.faults.RetryAfter,
		Requests:          g.sum("payments_bank_requests_total", "", ""),
		Throttled:         map[breaker.ThrottleReason]int64{},
		Waited:            g.sumFloat("idem_dependency_throttled_seconds_total", bank("reason", "wait")),
		Paused:            g.sumFloat("idem_dependency_throttled_seconds_total", bank("reason", string(breaker.ReasonRetryAfter))),
		ThrottledAttempts: g.sum("idem_handler_attempts_total", "result", "throttled"),
	}
	for _, r := range []breaker.ThrottleReason{breaker.ReasonRate, breaker.ReasonInFlight, breaker.ReasonRetryAfter} {
		f.Throttled[r] = g.sumWhere("idem_dependency_throttled_total", bank("reason", string(r)))
	}
	d := dlq.New(client)
	for _, t := range append(append([]string{}, s.Tiers...), s.DLQ) {
		groups, err := d.List(ctx, t)
		if errors.Is(err, dlq.ErrUnknownTopic) {
			continue
		}
		if err != nil {
			return fmt.Errorf("list the failures in %s: %w", t, err)
		}
		for _, gr := range groups {
			if is429(gr.SampleError) {
				f.Forwarded429 += gr.Count
			}
		}
	}
	s.Flow = f
	return nil
}

// is429 reports whether a forwarded record's error is the bank's 429 (or the
// throttle it became).
func is429(errText string) bool {
	return strings.Contains(errText, errBankThrottled.Error()) || strings.Contains(errText, "asked to wait")
}

// peakBound is the most calls the bank may see in a 1 s window under l: the
// rate plus 5 % (the calls' times at the bank are not their tokens' times, and
// the bucket starts full), and the rest of the bucket's burst.
func peakBound(l breaker.Limits) int {
	return int(math.Floor(l.Rate*1.05)) + max(l.Burst, 1) - 1
}

// check returns an error for each flow figure that is wrong: a 429 that sent
// a message to a tier or the DLQ, a call during a Retry-After, more calls in a
// second than the rate limit allows.
func (f flowFigures) check(bank ledgerFigures) error {
	var errs []error
	if f.Forwarded429 != 0 {
		errs = append(errs, fmt.Errorf("%d records went to a tier or the DLQ because of a 429, want 0", f.Forwarded429))
	}
	if bank.CallsInPause != 0 {
		errs = append(errs, fmt.Errorf("the bank got %d calls during a Retry-After it had given, want 0", bank.CallsInPause))
	}
	if l := f.Limits; l.Rate > 0 && bank.PeakPerSecond > peakBound(l) {
		errs = append(errs, fmt.Errorf("the bank got %d calls in one 1 s window; the rate limit is %g/s, burst %d (at most %d)", bank.PeakPerSecond, l.Rate, max(l.Burst, 1), peakBound(l)))
	}
	return errors.Join(errs...)
}

// print writes the summary's flow-control lines.
func (f flowFigures) print(line func(label, format string, args ...any), bank ledgerFigures) {
	limit := "no rate limit"
	if f.Limits.Rate > 0 {
		limit = fmt.Sprintf("limit %g calls/s (burst %d)", f.Limits.Rate, max(f.Limits.Burst, 1))
	}
	if f.Limits.MaxInFlight > 0 {
		limit += fmt.Sprintf(", %d in flight", f.Limits.MaxInFlight)
	}
	line("bank flow", "%s; peak %s calls in 1 s and %d at once at the bank; %.1fs waited for a token or a slot (summed over calls), %s calls refused by the limit",
		limit, num(int64(bank.PeakPerSecond)), bank.PeakInFlight, f.Waited, num(f.Throttled[breaker.ReasonRate]+f.Throttled[breaker.ReasonInFlight]))
	windows := "none configured"
	if len(f.Throttles) > 0 {
		windows = "Retry-After " + f.RetryAfter.String() + " in " + windowsFlag{&f.Throttles}.String()
	}
	line("bank 429s", "%s answered (%s); calls paused %.1fs, %s handler attempts throttled, %d calls during a Retry-After; sent to a tier or the DLQ because of a 429: %d",
		num(bank.Answered429), windows, f.Paused, num(f.ThrottledAttempts), bank.CallsInPause, f.Forwarded429)
}

// flowProgress is the progress line's bank figures: calls a second (over the
// last second or more), the rate limit, and the calls throttled so far.
type flowProgress struct {
	at     time.Time
	n      int64
	perSec float64
}

// stats returns ", N calls/s" (", N/limit calls/s" under a rate limit) and,
// once calls were throttled, their count and the seconds the bank's
// Retry-After paused calls.
func (p *flowProgress) stats(g gatheredMetrics, now time.Time) string {
	n := g.sum("payments_bank_requests_total", "", "")
	switch el := now.Sub(p.at); {
	case p.at.IsZero():
		p.at, p.n = now, n
	case el >= time.Second:
		p.perSec = float64(n-p.n) / el.Seconds()
		p.at, p.n = now, n
	}
	bank := map[string]string{"dependency": "bank"}
	s := ", " + num(int64(p.perSec+0.5))
	if limit := g.sumFloat("idem_dependency_rate_limit", bank); limit > 0 {
		s += "/" + strconv.FormatFloat(limit, 'f', -1, 64)
	}
	s += " calls/s"
	if thr := g.sumWhere("idem_dependency_throttled_total", bank); thr > 0 {
		paused := g.sumFloat("idem_dependency_throttled_seconds_total", map[string]string{"dependency": "bank", "reason": string(breaker.ReasonRetryAfter)})
		s += fmt.Sprintf(", %s throttled, paused %.1fs", num(thr), paused)
	}
	return s
}
