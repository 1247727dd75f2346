package payments

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/breaker"
	"github.com/idemhq/idem/handler"
)

// The bank is the payment service's one external dependency (seed §5): a
// small HTTP server that runs inside the example, so its faults are flags
// rather than a second process. Like a real card processor it takes an
// Idempotency-Key: a charge repeated with the same key is answered from its
// ledger and never charges twice, which is what makes the handler's retries
// (after a timeout the bank may well have charged) safe.

// bankFaults are the faults the bank injects. The zero value injects none.
type bankFaults struct {
	FailureRate float64       // fraction of charges answered 503 at once
	TimeoutRate float64       // fraction of charges that answer only after the client gave up (but are charged)
	Latency     time.Duration // added to every charge
	Outages     []window      // intervals, from the bank's start, in which every charge gets 503
	Throttles   []window      // intervals, from the bank's start, in which every charge gets 429 (flow.go)
	RetryAfter  time.Duration // the Retry-After of those 429s
	// ClockAtCall, when > 0, restarts the clock the windows count from at
	// the bank's ClockAtCall-th call, so that the windows fall where charges
	// happen however slow the machine is (the demo's test sets it: counted
	// from the production's start, an outage could pass before a busy
	// machine's consumer made its first charge).
	ClockAtCall int64
}

// window is one outage: from Start to Start+Length after the bank started.
type window struct{ Start, Length time.Duration }

// parseWindows parses "4s+3s,20s+5s" (start+length, comma-separated).
func parseWindows(s string) ([]window, error) {
	var ws []window
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part == "" {
			continue
		}
		a, b, ok := strings.Cut(part, "+")
		start, err1 := time.ParseDuration(a)
		length, err2 := time.ParseDuration(b)
		if !ok || err1 != nil || err2 != nil || start < 0 || length <= 0 {
			return nil, fmt.Errorf("outage window %q: want start+length, e.g. 4s+3s", part)
		}
		ws = append(ws, window{start, length})
	}
	return ws, nil
}

func (w window) String() string { return w.Start.String() + "+" + w.Length.String() }

// windowsFlag is a flag.Value for -bank-outage.
type windowsFlag struct{ ws *[]window }

func (f windowsFlag) String() string {
	if f.ws == nil {
		return ""
	}
	var s []string
	for _, w := range *f.ws {
		s = append(s, w.String())
	}
	return strings.Join(s, ",")
}

func (f windowsFlag) Set(s string) error {
	ws, err := parseWindows(s)
	if err != nil {
		return err
	}
	*f.ws = ws
	return nil
}

// chargeRequest is the body of POST /charges.
type chargeRequest struct {
	OrderID  string `json:"order_id"`
	Amount   string `json:"amount"`
	Currency string `json:"currency"`
}

// charge is one entry of the bank's ledger.
type charge struct {
	ID  int64  `json:"id"`
	Key string `json:"idempotency_key"`
	chargeRequest
}

// bank is the fake bank. Its ledger is in memory: one charge per idempotency
// key.
type bank struct {
	faults  bankFaults
	hangFor time.Duration // how long a "timeout" charge takes to answer
	start   atomic.Int64  // unix nanos the outage windows count from

	mu      sync.Mutex
	rnd     *rand.Rand
	ledger  map[string]charge // by idempotency key
	nextID  int64
	repeats int64 // charges answered from the ledger (same key again)

	calls, failed atomic.Int64
	ledger1s      callLedger // calls per 1 s window, 429s, calls during a Retry-After (flow.go)

	srv *http.Server
	ln  net.Listener
	wg  sync.WaitGroup
}

// startBank serves a bank on a loopback port until close is called. A
// "timeout" charge answers after hangFor (the client's timeout, doubled).
func startBank(f bankFaults, hangFor time.Duration) (*bank, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("bank listener: %w", err)
	}
	b := &bank{
		faults: f, hangFor: hangFor, ln: ln,
		rnd:    rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 2)),
		ledger: map[string]charge{},
	}
	b.restartClock()
	mux := http.NewServeMux()
	mux.HandleFunc("POST /charges", b.handleCharge)
	b.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	b.wg.Go(func() { _ = b.srv.Serve(ln) })
	return b, nil
}

// URL is the bank's base URL.
func (b *bank) URL() string { return "http://" + b.ln.Addr().String() }

// close stops the server and waits for it.
func (b *bank) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = b.srv.Shutdown(ctx)
	b.wg.Wait()
}

// restartClock makes the outage windows count from now.
func (b *bank) restartClock() { b.start.Store(time.Now().UnixNano()) }

// inOutage reports whether the bank is in one of its outage windows.
func (b *bank) inOutage(now time.Time) bool { return b.within(b.faults.Outages, now) }

// within reports whether now falls in one of ws, counted from the bank's clock.
func (b *bank) within(ws []window, now time.Time) bool {
	since := now.Sub(time.Unix(0, b.start.Load()))
	for _, w := range ws {
		if since >= w.Start && since < w.Start+w.Length {
			return true
		}
	}
	return false
}

func (b *bank) handleCharge(w http.ResponseWriter, r *http.Request) {
	if b.calls.Add(1) == b.faults.ClockAtCall {
		b.restartClock()
	}
	now := time.Now()
	defer b.ledger1s.arrive(now)() // until the answer is written
	if b.throttle(w, now) {
		return
	}
	key := r.Header.Get("Idempotency-Key")
	var req chargeRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&req); err != nil || key == "" {
		http.Error(w, "bad charge request", http.StatusBadRequest)
		return
	}
	b.mu.Lock()
	roll := b.rnd.Float64()
	b.mu.Unlock()
	if b.inOutage(time.Now()) || roll < b.faults.FailureRate {
		b.failed.Add(1)
		http.Error(w, "bank unavailable", http.StatusServiceUnavailable)
		return
	}
	hang := roll < b.faults.FailureRate+b.faults.TimeoutRate
	if d := b.faults.Latency; d > 0 && !hang {
		time.Sleep(d)
	}
	b.mu.Lock()
	c, seen := b.ledger[key]
	if seen {
		b.repeats++
	} else {
		b.nextID++
		c = charge{ID: b.nextID, Key: key, chargeRequest: req}
		b.ledger[key] = c
	}
	b.mu.Unlock()
	if hang {
		// Charged, but the answer comes too late: the client times out and
		// retries with the same key, which the ledger answers.
		b.failed.Add(1)
		select {
		case <-time.After(b.hangFor):
		case <-r.Context().Done():
		}
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(c)
}

// bankFigures is what the bank's ledger says after a run.
type bankFigures struct {
	Calls, Failed  int64         // requests received; answered 503 or too late
	Charges        int64         // distinct charges (idempotency keys)
	Repeats        int64         // requests answered from the ledger
	DoubleCharged  int64         // orders with more than one charge
	ChargedPrefix  int64         // charges whose order id has the run's prefix
	Flow           ledgerFigures // calls per 1 s window and 429s (flow.go)
	chargedByOrder map[string]int
}

// figures reads the ledger, counting charges of orders whose id starts
// with prefix ("" for all).
func (b *bank) figures(prefix string) bankFigures {
	b.mu.Lock()
	defer b.mu.Unlock()
	f := bankFigures{Calls: b.calls.Load(), Failed: b.failed.Load(), Repeats: b.repeats,
		Charges: int64(len(b.ledger)), Flow: b.ledger1s.figures(), chargedByOrder: map[string]int{}}
	for _, c := range b.ledger {
		if strings.HasPrefix(c.OrderID, prefix) {
			f.ChargedPrefix++
			f.chargedByOrder[c.OrderID]++
		}
	}
	for _, n := range f.chargedByOrder {
		if n > 1 {
			f.DoubleCharged++
		}
	}
	return f
}

// bankClient charges through a circuit breaker named "bank", and the flow
// limits the Set gives that name (flow.go).
type bankClient struct {
	url      string
	http     *http.Client
	timeout  time.Duration
	breakers *breaker.Set
	requests *prometheus.CounterVec // payments_bank_requests_total{result}, flow.go
}

// errBankUnavailable is a 5xx answer from the bank: retriable.
var errBankUnavailable = errors.New("bank unavailable")

// Charge charges p once per idempotency key. A timeout or a 5xx is a
// retriable error (in-process retries, then the retry tiers), counted by the
// breaker; while the breaker is open the error is a *breaker.OpenError and the
// consumer pauses instead of retrying. A 429 is the bank's request to wait:
// its Retry-After goes back through the Set as handler.RetryAfter, which pauses
// every call to the bank for that long, and the error is a
// *breaker.ThrottleError, so the message waits for it too (no retry spent,
// nothing forwarded; messages that need no bank call go on). Calls wait for the bank's rate limit, if any, inside the Set. Any
// other 4xx is permanent.
func (c *bankClient) Charge(ctx context.Context, key string, p Payment) error {
	body, err := json.Marshal(chargeRequest{OrderID: p.OrderID, Amount: string(p.Amount), Currency: p.Currency})
	if err != nil {
		return handler.Permanent(err)
	}
	return c.breakers.Do(ctx, "bank", func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, c.timeout)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url+"/charges", bytes.NewReader(body))
		if err != nil {
			return handler.Permanent(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		resp, err := c.http.Do(req)
		if err != nil {
			c.count(0)
			if errors.Is(err, context.DeadlineExceeded) {
				return fmt.Errorf("bank: no answer within %s: %w", c.timeout, err)
			}
			return fmt.Errorf("bank: %w", err)
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		c.count(resp.StatusCode)
		switch {
		case resp.StatusCode == http.StatusTooManyRequests:
			return tooManyRequests(resp.Header.Get("Retry-After"))
		case resp.StatusCode >= 500:
			return fmt.Errorf("bank: HTTP %d: %w", resp.StatusCode, errBankUnavailable)
		case resp.StatusCode >= 400:
			return handler.Permanent(fmt.Errorf("bank refused the charge: HTTP %d", resp.StatusCode))
		}
		return nil
	})
}

// bankFlags are the bank's command-line settings, shared by both modes.
type bankFlags struct {
	faults   bankFaults
	timeout  time.Duration  // client timeout of one charge
	cooldown time.Duration  // breaker open time
	limits   breaker.Limits // the client's rate and calls in flight toward the bank; zero: none (flow.go)
}

// register adds the bank flags to fs with the given defaults.
func (bf *bankFlags) register(fs *flag.FlagSet) {
	fs.Float64Var(&bf.faults.FailureRate, "bank-failure-rate", bf.faults.FailureRate, "fraction of bank charges answered 503 (retriable)")
	fs.Float64Var(&bf.faults.TimeoutRate, "bank-timeout-rate", bf.faults.TimeoutRate, "fraction of bank charges answered after -bank-timeout (charged, but the client gives up and retries)")
	fs.DurationVar(&bf.faults.Latency, "bank-latency", bf.faults.Latency, "latency the bank adds to every charge")
	fs.Var(windowsFlag{&bf.faults.Outages}, "bank-outage", "bank outage windows from its start, start+length, comma-separated (e.g. 4s+3s)")
	fs.DurationVar(&bf.timeout, "bank-timeout", bf.timeout, "client timeout of one bank charge")
	fs.DurationVar(&bf.cooldown, "breaker-cooldown", bf.cooldown, "how long the bank's circuit breaker stays open before a half-open probe")
	bf.registerFlow(fs) // -bank-rate, -bank-burst, -bank-max-in-flight, -bank-throttle, -bank-retry-after (flow.go)
}

// validate checks the bank flags.
func (bf bankFlags) validate() error {
	f := bf.faults
	switch {
	case f.FailureRate < 0 || f.TimeoutRate < 0 || f.FailureRate+f.TimeoutRate > 1:
		return usagef("-bank-failure-rate and -bank-timeout-rate must be >= 0 and sum to at most 1")
	case f.Latency < 0:
		return usagef("-bank-latency must be >= 0")
	case bf.timeout <= 0 || bf.cooldown <= 0:
		return usagef("-bank-timeout and -breaker-cooldown must be > 0")
	}
	return bf.validateFlow()
}

// describe is a one-line summary of the faults, for logs and the demo header.
func (f bankFaults) describe() string {
	if f.FailureRate == 0 && f.TimeoutRate == 0 && f.Latency == 0 && len(f.Outages) == 0 && len(f.Throttles) == 0 {
		return "no faults"
	}
	var parts []string
	if f.FailureRate > 0 {
		parts = append(parts, strconv.FormatFloat(f.FailureRate*100, 'f', -1, 64)+"% 503s")
	}
	if f.TimeoutRate > 0 {
		parts = append(parts, strconv.FormatFloat(f.TimeoutRate*100, 'f', -1, 64)+"% timeouts")
	}
	if f.Latency > 0 {
		parts = append(parts, f.Latency.String()+" latency")
	}
	for _, w := range f.Outages {
		parts = append(parts, "outage "+w.String())
	}
	for _, w := range f.Throttles {
		parts = append(parts, "429 Retry-After "+f.RetryAfter.String()+" in "+w.String())
	}
	return strings.Join(parts, ", ")
}
