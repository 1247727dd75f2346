package recovery_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/recovery"
	"github.com/idemhq/idem/retrytopic"
)

var (
	errFraud   = errors.New("bank: fraud suspected")
	errInvalid = errors.New("payment: invalid amount")
)

// declineError is a typed error for As.
type declineError struct{ reason string }

func (e *declineError) Error() string { return "declined: " + e.reason }

// today is the fallback of a consumer with Config's documented defaults
// (consumer/config.go defaults(): Retry.Attempts 4, Retry.Backoff {100ms,
// 5s}, Retry.Tiers retrytopic.Policy{}) and two tiers.
func today() recovery.Fallback {
	return recovery.Fallback{
		Attempts: 1 + 3,
		Backoff:  recovery.Backoff{Base: 100 * time.Millisecond, Max: 5 * time.Second},
		Retry:    retrytopic.Policy{Delays: []time.Duration{time.Second, 10 * time.Second}},
	}
}

func newPolicy(tb testing.TB, rules ...recovery.Rule) *recovery.Policy {
	tb.Helper()
	p, err := recovery.New(today(), rules...)
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	return p
}

func pgErr(code string) error { return &pgconn.PgError{Code: code, Message: "sql"} }

// TestMatchers runs every matcher against errors that it must and must not
// match, bare and wrapped (fmt %w, handler's markers, errors.Join).
func TestMatchers(t *testing.T) {
	wraps := map[string]func(error) error{
		"bare":      func(e error) error { return e },
		"fmt":       func(e error) error { return fmt.Errorf("charge %s: %w", "p-1", e) },
		"permanent": func(e error) error { return fmt.Errorf("x: %w", handler.Permanent(e)) },
		"retry":     func(e error) error { return handler.RetryAfter(e, time.Second) },
		"join":      func(e error) error { return errors.Join(errors.New("other"), e) },
	}
	var netErr net.Error = &net.DNSError{Err: "no such host", IsTimeout: true}
	tests := []struct {
		name  string
		m     recovery.Matcher
		match []error
		miss  []error
		skip  string // a wrapping that changes what the matcher looks at
	}{
		{"Is", recovery.Is(errFraud), []error{errFraud}, []error{errInvalid, errors.New(errFraud.Error())}, ""},
		{"As pointer", recovery.As[*declineError](), []error{&declineError{"limit"}}, []error{errFraud}, ""},
		{"As interface", recovery.As[net.Error](), []error{netErr}, []error{errFraud}, ""},
		{"As fs", recovery.As[*fs.PathError](), []error{&fs.PathError{Op: "open", Path: "/x", Err: os.ErrNotExist}}, []error{os.ErrNotExist}, ""},
		// Permanent outranks timeout (handler.ErrorKind): a permanent timeout is permanent.
		{"Kind timeout", recovery.Kind(handler.KindTimeout), []error{fmt.Errorf("call: %w", handler.ErrTimeout)}, []error{errFraud, handler.Decode(errFraud)}, "permanent"},
		{"Kind decode,panic", recovery.Kind(handler.KindDecode, handler.KindPanic), []error{handler.Decode(errInvalid), &handler.PanicError{Value: "boom"}}, []error{errInvalid}, ""},
		{"SQLState class", recovery.SQLState("23"), []error{pgErr("23505"), pgErr("23503")}, []error{pgErr("40001"), errFraud}, ""},
		{"SQLState code", recovery.SQLState("40001", "40P01"), []error{pgErr("40001"), pgErr("40P01")}, []error{pgErr("40002"), pgErr("23505")}, ""},
		{"HTTPStatus", recovery.HTTPStatus(402, 422), []error{handler.HTTPStatus(errFraud, 402), handler.HTTPStatus(errInvalid, 422)}, []error{handler.HTTPStatus(errFraud, 400), errFraud}, ""},
		{"HTTPStatusRange", recovery.HTTPStatusRange(400, 499), []error{handler.HTTPStatus(errInvalid, 400), handler.HTTPStatus(errInvalid, 499)}, []error{handler.HTTPStatus(errInvalid, 500), handler.HTTPStatus(errInvalid, 399)}, ""},
		{"Func", recovery.Func("fraud text", func(err error) bool { return strings.Contains(err.Error(), "fraud") }), []error{errFraud}, []error{errInvalid}, ""},
		{"AnyOf", recovery.AnyOf(recovery.Is(errFraud), recovery.HTTPStatus(402)), []error{errFraud, handler.HTTPStatus(errInvalid, 402)}, []error{errInvalid}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for wname, wrap := range wraps {
				if wname == tt.skip {
					continue
				}
				for _, e := range tt.match {
					if err := wrap(e); !tt.m.Match(err) {
						t.Errorf("%s does not match %s-wrapped %v", tt.m, wname, e)
					}
				}
				for _, e := range tt.miss {
					if err := wrap(e); tt.m.Match(err) {
						t.Errorf("%s matches %s-wrapped %v", tt.m, wname, e)
					}
				}
			}
			if tt.m.Match(nil) {
				t.Errorf("%s matches nil", tt.m)
			}
		})
	}
	if (recovery.Matcher{}).Match(errFraud) {
		t.Error("the zero Matcher matches")
	}
}

// TestDecideOrder: the first matching rule decides, the fallback decides
// when none matches (or for nil), and each rule's zero fields are the
// fallback's.
func TestDecideOrder(t *testing.T) {
	p := newPolicy(t,
		recovery.Rule{Name: "fraud", Match: recovery.Is(errFraud), Attempts: 1, Tiers: &recovery.Ladder{}, DLQ: "payments.dlq.fraud"},
		recovery.Rule{Name: "declines", Match: recovery.As[*declineError](), Attempts: 2},
		recovery.Rule{Match: recovery.AnyOf(recovery.Is(errFraud), recovery.Is(errInvalid)), Attempts: 7}, // fraud never gets here
	)
	tests := []struct {
		name     string
		err      error
		rule     int
		ruleName string
		attempts int
	}{
		{"fraud", fmt.Errorf("charge: %w", errFraud), 0, "fraud", 1},
		{"fraud in a decline chain: rule 0 is first", errors.Join(&declineError{"x"}, errFraud), 0, "fraud", 1},
		{"decline", &declineError{"limit"}, 1, "declines", 2},
		{"invalid", errInvalid, 2, "rule 2", 7},
		{"no match", errors.New("io"), -1, "default", 4},
		{"nil", nil, -1, "default", 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := p.Decide(tt.err)
			if d.Rule != tt.rule || d.Name != tt.ruleName || d.Attempts != tt.attempts {
				t.Fatalf("Decide = rule %d %q, %d attempts; want rule %d %q, %d", d.Rule, d.Name, d.Attempts, tt.rule, tt.ruleName, tt.attempts)
			}
		})
	}
	// Inherited fields: declines keeps the fallback's backoff, tiers and DLQ.
	d := p.Decide(&declineError{"limit"})
	if d.Backoff != today().Backoff || !slices.Equal(d.Retry.Delays, today().Retry.Delays) || d.Retry.DLQ("payments", "billing") != "payments.billing.dlq" {
		t.Fatalf("declines: %+v, want the fallback's backoff, tiers and DLQ", d)
	}
	if got := d.Retry.Tiers("payments", "billing"); !slices.Equal(got, []string{"payments.billing.retry.1", "payments.billing.retry.2"}) {
		t.Fatalf("declines tiers = %q", got)
	}
}

// TestFallbackIsToday: with no rules, every decision is the consumer's
// behaviour without rules, for every kind of error: Retry.Attempts handler calls
// per delivery, the same full-jitter window, and the same route (tier n+1 of
// Config.Retry.Tiers, then its DLQ) as retrytopic.Policy.WithDefaults().Next, which
// the consumer calls today (consumer/forward.go, failure).
func TestFallbackIsToday(t *testing.T) {
	for _, cfg := range []retrytopic.Policy{
		{}, // Config's default: no tiers
		{Delays: []time.Duration{time.Second, 10 * time.Second, time.Minute}},
		{Delays: []time.Duration{time.Second}, DLQTopic: func(t, g string) string { return "dead." + t }, TierTopic: func(t, g string, n int) string { return fmt.Sprintf("r%d.%s", n, t) }},
	} {
		fb := today()
		fb.Retry = cfg
		p, err := recovery.New(fb)
		if err != nil {
			t.Fatal(err)
		}
		want := cfg.WithDefaults()
		for _, e := range []error{errFraud, handler.Permanent(errFraud), handler.Decode(errFraud), handler.ErrTimeout, &handler.PanicError{Value: 1}, pgErr("23505"), handler.HTTPStatus(errFraud, 500)} {
			d := p.Decide(e)
			if d.Rule != -1 || d.Attempts != 4 || d.Backoff != fb.Backoff {
				t.Fatalf("Decide(%v) = %+v, want the fallback", e, d)
			}
			for tier := 0; tier <= len(cfg.Delays)+1; tier++ {
				gd, gn, gdl := d.Retry.Next("payments", "billing", tier)
				wd, wn, wdl := want.Next("payments", "billing", tier)
				if gd != wd || gn != wn || gdl != wdl {
					t.Fatalf("Next(tier %d) = %s %d %s, today %s %d %s", tier, gd, gn, gdl, wd, wn, wdl)
				}
			}
			if got, w := d.Retry.DLQ("payments", "billing"), want.DLQ("payments", "billing"); got != w {
				t.Fatalf("DLQ = %s, today %s", got, w)
			}
			if d.Retry.Retention != want.Retention || d.Retry.ReplicationFactor != want.ReplicationFactor {
				t.Fatalf("retention, replication = %s, %d; today %s, %d", d.Retry.Retention, d.Retry.ReplicationFactor, want.Retention, want.ReplicationFactor)
			}
		}
		if got, w := p.TierTopics("payments", "billing"), want.Tiers("payments", "billing"); !slices.Equal(got, w) {
			t.Fatalf("TierTopics = %q, today %q", got, w)
		}
		if got := p.DLQTopics("payments", "billing"); !slices.Equal(got, []string{want.DLQ("payments", "billing")}) {
			t.Fatalf("DLQTopics = %q", got)
		}
	}
}

// TestIssueRules is the issue's example: a fraud decline goes straight to
// payments.dlq.fraud, a timeout gets 5 attempts and two tiers of its own, a
// validation error goes to the DLQ at once; anything else keeps today's
// behaviour.
func TestIssueRules(t *testing.T) {
	p := newPolicy(t,
		recovery.Rule{Name: "fraud", Match: recovery.Is(errFraud), Attempts: 1, Tiers: &recovery.Ladder{}, DLQ: "payments.dlq.fraud"},
		recovery.Rule{Name: "timeout", Match: recovery.Kind(handler.KindTimeout), Attempts: 5,
			Backoff: recovery.Backoff{Base: time.Second, Max: 30 * time.Second},
			Tiers:   &recovery.Ladder{Name: "slow", Delays: []time.Duration{time.Minute, 10 * time.Minute}}},
		recovery.Rule{Name: "validation", Match: recovery.HTTPStatus(400, 422), Attempts: 1, Tiers: &recovery.Ladder{}},
	)
	const topic, group = "payments", "billing"
	type hop struct {
		dest  string
		tier  int
		delay time.Duration
	}
	route := func(d recovery.Decision, tier int) hop {
		dest, n, delay := d.Retry.Next(topic, group, tier)
		return hop{dest, n, delay}
	}

	fraud := p.Decide(handler.Permanent(fmt.Errorf("charge: %w", errFraud)))
	if fraud.Name != "fraud" || fraud.Attempts != 1 || route(fraud, 0) != (hop{"payments.dlq.fraud", 0, 0}) || fraud.Retry.DLQ(topic, group) != "payments.dlq.fraud" {
		t.Fatalf("fraud: %+v, first hop %+v", fraud, route(fraud, 0))
	}
	timeout := p.Decide(fmt.Errorf("bank: %w", handler.ErrTimeout))
	if timeout.Name != "timeout" || timeout.Attempts != 5 || timeout.Backoff.Max != 30*time.Second {
		t.Fatalf("timeout: %+v", timeout)
	}
	for tier, want := range []hop{
		{"payments.billing.retry.slow.1", 1, time.Minute},
		{"payments.billing.retry.slow.2", 2, 10 * time.Minute},
		{"payments.billing.dlq", 0, 0},
	} {
		if got := route(timeout, tier); got != want {
			t.Fatalf("timeout at tier %d goes to %+v, want %+v", tier, got, want)
		}
	}
	validation := p.Decide(handler.HTTPStatus(errInvalid, 422))
	if validation.Name != "validation" || validation.Attempts != 1 || route(validation, 0) != (hop{"payments.billing.dlq", 0, 0}) {
		t.Fatalf("validation: %+v, first hop %+v", validation, route(validation, 0))
	}
	other := p.Decide(errors.New("bank: 500"))
	if other.Rule != -1 || route(other, 0) != (hop{"payments.billing.retry.1", 1, time.Second}) {
		t.Fatalf("other: %+v, first hop %+v", other, route(other, 0))
	}
	// A record on tier 1 of the default ladder whose error is now a timeout
	// climbs on: tier 2 of the timeout's ladder, never back down.
	if got := route(timeout, 1); got.tier != 2 {
		t.Fatalf("from tier 1 a timeout goes to %+v, want tier 2", got)
	}

	wantTiers := []string{"payments.billing.retry.1", "payments.billing.retry.2", "payments.billing.retry.slow.1", "payments.billing.retry.slow.2"}
	if got := p.TierTopics(topic, group); !slices.Equal(got, wantTiers) {
		t.Fatalf("TierTopics = %q, want %q", got, wantTiers)
	}
	if got := p.DLQTopics(topic, group); !slices.Equal(got, []string{"payments.billing.dlq", "payments.dlq.fraud"}) {
		t.Fatalf("DLQTopics = %q", got)
	}
	for _, tt := range []struct {
		name  string
		n     int
		delay time.Duration
		ok    bool
	}{
		{"payments.billing.retry.2", 2, 10 * time.Second, true},
		{"payments.billing.retry.slow.1", 1, time.Minute, true},
		{"payments.billing.retry.slow.3", 0, 0, false},
		{"payments.billing.dlq", 0, 0, false},
	} {
		if n, d, ok := p.Tier(topic, group, tt.name); n != tt.n || d != tt.delay || ok != tt.ok {
			t.Errorf("Tier(%s) = %d, %s, %v; want %d, %s, %v", tt.name, n, d, ok, tt.n, tt.delay, tt.ok)
		}
	}
	// One policy per family of topics, the fallback's first.
	pols := p.Retries(topic, group)
	var got [][]string
	for _, pol := range pols {
		got = append(got, pol.Topics(topic, group))
	}
	want := [][]string{
		{"payments.billing.retry.1", "payments.billing.retry.2", "payments.billing.dlq"},
		{"payments.dlq.fraud"},
		{"payments.billing.retry.slow.1", "payments.billing.retry.slow.2", "payments.billing.dlq"},
		{"payments.billing.dlq"},
	}
	if !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("Retries topics = %q, want %q", got, want)
	}
	if err := p.ValidateNames(topic, group); err != nil {
		t.Fatal(err)
	}
}

// TestValidation: each bad rule is reported with its index and name, every
// problem at once, each starting "recovery: invalid policy".
func TestValidation(t *testing.T) {
	ok := recovery.Is(errFraud)
	tests := []struct {
		name  string
		fb    func(*recovery.Fallback)
		rules []recovery.Rule
		want  []string
	}{
		{"no matcher", nil, []recovery.Rule{{Name: "fraud"}}, []string{`rule 0 ("fraud"): Match has no matcher`}},
		{"no matcher, unnamed second rule", nil, []recovery.Rule{{Match: ok}, {Attempts: 2}}, []string{"rule 1: Match has no matcher"}},
		{"Is(nil)", nil, []recovery.Rule{{Match: recovery.Is(nil)}}, []string{"rule 0: Match Is(nil): the target error is nil"}},
		{"Func nil", nil, []recovery.Rule{{Match: recovery.Func("x", nil)}}, []string{"rule 0: Match Func(x): the match function is nil"}},
		{"Kind none", nil, []recovery.Rule{{Match: recovery.Kind()}}, []string{"rule 0: Match Kind(): no kind given"}},
		{"Kind unknown", nil, []recovery.Rule{{Match: recovery.Kind("expired")}}, []string{`unknown kind "expired"`}},
		{"SQLState length", nil, []recovery.Rule{{Match: recovery.SQLState("2")}}, []string{`rule 0: Match SQLState(2): "2" is neither a class`}},
		{"SQLState chars", nil, []recovery.Rule{{Match: recovery.SQLState("4o001")}}, []string{`"4o001" has 'o'`}},
		{"SQLState none", nil, []recovery.Rule{{Match: recovery.SQLState()}}, []string{"no SQLSTATE class or code given"}},
		{"HTTPStatus range", nil, []recovery.Rule{{Match: recovery.HTTPStatus(200, 4220)}}, []string{"4220 is not an HTTP status"}},
		{"HTTPStatus none", nil, []recovery.Rule{{Match: recovery.HTTPStatus()}}, []string{"no status code given"}},
		{"HTTPStatusRange inverted", nil, []recovery.Rule{{Match: recovery.HTTPStatusRange(499, 400)}}, []string{"want 100 <= lo <= hi <= 599"}},
		{"AnyOf bad", nil, []recovery.Rule{{Match: recovery.AnyOf(ok, recovery.Matcher{})}}, []string{"matcher 1: has no matcher"}},
		{"AnyOf empty", nil, []recovery.Rule{{Match: recovery.AnyOf()}}, []string{"no matcher given"}},
		{"negative attempts", nil, []recovery.Rule{{Match: ok, Attempts: -1}}, []string{"rule 0: Attempts = -1, must be >= 1"}},
		{"negative backoff", nil, []recovery.Rule{{Match: ok, Backoff: recovery.Backoff{Base: -time.Second}}}, []string{"rule 0: Backoff.Base = -1s, must be >= 0"}},
		{"backoff max below base", nil, []recovery.Rule{{Match: ok, Backoff: recovery.Backoff{Base: 10 * time.Second}}}, []string{"rule 0: Backoff.Max = 5s, must be >= Backoff.Base (10s)"}},
		{"blank DLQ", nil, []recovery.Rule{{Match: ok, DLQ: " "}}, []string{`rule 0: DLQTopic`, `has ' '`}},
		{"illegal DLQ", nil, []recovery.Rule{{Match: ok, DLQ: "payments/fraud"}}, []string{`has '/'`}},
		{"DLQ is a tier", nil, []recovery.Rule{{Match: ok, DLQ: "topic.group.retry.1"}}, []string{`the same as TierTopic(n=1)`}},
		{"ladder without name", nil, []recovery.Rule{{Match: ok, Tiers: &recovery.Ladder{Delays: []time.Duration{time.Second}}}}, []string{"rule 0: Tiers has delays [1s] but no Name"}},
		{"ladder name illegal", nil, []recovery.Rule{{Match: ok, Tiers: &recovery.Ladder{Name: "a b", Delays: []time.Duration{time.Second}}}}, []string{"has ' '"}},
		{"ladder delay zero", nil, []recovery.Rule{{Match: ok, Tiers: &recovery.Ladder{Name: "x", Delays: []time.Duration{0}}}}, []string{"rule 0: Delays[0] = 0s, must be > 0"}},
		{"ladder delay past retention", nil, []recovery.Rule{{Match: ok, Tiers: &recovery.Ladder{Name: "x", Delays: []time.Duration{4 * 24 * time.Hour}}}}, []string{"more than half its retention"}},
		{"ladder named twice", nil, []recovery.Rule{
			{Match: ok, Tiers: &recovery.Ladder{Name: "slow", Delays: []time.Duration{time.Minute}}},
			{Name: "b", Match: ok, Tiers: &recovery.Ladder{Name: "slow", Delays: []time.Duration{time.Hour}}},
		}, []string{`rule 1 ("b"): Tiers "slow" has delays [1h0m0s], but rule 0 gave it [1m0s]`}},
		{"fallback attempts", func(f *recovery.Fallback) { f.Attempts = 0 }, nil, []string{"fallback: Attempts = 0, must be >= 1"}},
		{"fallback backoff", func(f *recovery.Fallback) { f.Backoff.Max = time.Millisecond }, nil, []string{"fallback: Backoff.Max = 1ms"}},
		{"fallback retry", func(f *recovery.Fallback) { f.Retry.Delays = []time.Duration{-time.Second} }, nil, []string{"fallback: Retry: Delays[0] = -1s"}},
		{"every problem at once", nil, []recovery.Rule{{Name: "a"}, {Name: "b", Match: ok, Attempts: -2}, {Name: "c", Match: ok, DLQ: "#"}},
			[]string{`rule 0 ("a"): Match has no matcher`, `rule 1 ("b"): Attempts = -2`, `rule 2 ("c"): DLQTopic`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fb := today()
			if tt.fb != nil {
				tt.fb(&fb)
			}
			p, err := recovery.New(fb, tt.rules...)
			if err == nil || p != nil {
				t.Fatalf("New = %v, %v; want an error", p, err)
			}
			if err == nil || !strings.Contains(err.Error(), "recovery: invalid policy") {
				t.Fatalf("error %v is not an invalid-policy error", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not say %q:\n%v", w, err)
				}
			}
		})
	}
	// The same ladder named by two rules with the same delays is one ladder.
	slow := func() *recovery.Ladder { return &recovery.Ladder{Name: "slow", Delays: []time.Duration{time.Minute}} }
	p := newPolicy(t, recovery.Rule{Match: ok, Tiers: slow()}, recovery.Rule{Match: recovery.Is(errInvalid), Tiers: slow(), DLQ: "x.dlq"})
	if got := p.TierTopics("t", "g"); !slices.Equal(got, []string{"t.g.retry.1", "t.g.retry.2", "t.g.retry.slow.1"}) {
		t.Fatalf("TierTopics = %q", got)
	}
}

// TestValidateNames checks the names a real topic and group give.
func TestValidateNames(t *testing.T) {
	p := newPolicy(t, recovery.Rule{Match: recovery.Is(errFraud), DLQ: "payments"})
	err := p.ValidateNames("payments", "billing")
	if (err == nil || !strings.Contains(err.Error(), "recovery: invalid policy")) || !strings.Contains(err.Error(), `rule 0: DLQTopic for topic "payments" group "billing" is "payments", the same as the source topic`) {
		t.Fatalf("ValidateNames = %v", err)
	}
	p = newPolicy(t, recovery.Rule{Match: recovery.Is(errFraud), DLQ: "a.b.retry.slow.1"},
		recovery.Rule{Match: recovery.Is(errInvalid), Tiers: &recovery.Ladder{Name: "slow", Delays: []time.Duration{time.Minute}}})
	if err := p.ValidateNames("a", "b"); err == nil || !strings.Contains(err.Error(), `dead-letter topic "a.b.retry.slow.1" of topic "a" group "b" is also a retry tier`) {
		t.Fatalf("ValidateNames = %v", err)
	}
	if err := p.ValidateNames("other", "b"); err != nil {
		t.Fatalf("ValidateNames(other) = %v", err)
	}
}

// TestDecideIsPureAndConcurrent: Decide reads only its argument and the
// immutable policy, so concurrent calls agree (run with -race).
func TestDecideIsPureAndConcurrent(t *testing.T) {
	p := newPolicy(t, recovery.Rule{Match: recovery.Is(errFraud), Attempts: 1})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 8)
	for g := 0; g < 8; g++ {
		go func() {
			for i := 0; i < 1000 && ctx.Err() == nil; i++ {
				if d := p.Decide(errFraud); d.Rule != 0 {
					done <- fmt.Errorf("Decide(fraud) = rule %d", d.Rule)
					return
				}
				if d := p.Decide(errInvalid); d.Rule != -1 {
					done <- fmt.Errorf("Decide(invalid) = rule %d", d.Rule)
					return
				}
			}
			done <- nil
		}()
	}
	for g := 0; g < 8; g++ {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

// TestBackoffFullJitter checks Backoff.Delay as a distribution: retry n's
// waits stay in [0, min(Max, Base*2^(n-1))] and spread over the whole window
// (full jitter, not jitter around the mean); degenerate and huge inputs stay
// in bounds.
func TestBackoffFullJitter(t *testing.T) {
	b := recovery.Backoff{Base: 100 * time.Millisecond, Max: 5 * time.Second}
	r := rand.New(rand.NewPCG(1, 2))
	for n := 1; n <= 10; n++ {
		ceil := min(b.Max, b.Base<<(n-1))
		var lo, hi int
		for i := 0; i < 2000; i++ {
			d := b.Delay(n, r)
			if d < 0 || d > ceil {
				t.Fatalf("n=%d: Delay = %v, outside [0, %v]", n, d, ceil)
			}
			if d < ceil/10 {
				lo++
			}
			if d > ceil*9/10 {
				hi++
			}
		}
		// Uniform on the window: about 200 of 2000 in each tenth.
		if lo < 120 || hi < 120 {
			t.Fatalf("n=%d: %d samples in the lowest tenth, %d in the highest; want about 200 each", n, lo, hi)
		}
	}
	for _, n := range []int{63, 64, 1000} {
		if d := b.Delay(n, r); d < 0 || d > b.Max {
			t.Fatalf("n=%d: Delay = %v, outside [0, Max]", n, d)
		}
	}
	huge := recovery.Backoff{Base: time.Duration(1) << 62, Max: time.Duration(1<<63 - 1)}
	if d := huge.Delay(3, r); d < 0 {
		t.Fatalf("overflow: Delay = %v", d)
	}
	for _, c := range []struct {
		b recovery.Backoff
		n int
	}{{recovery.Backoff{}, 1}, {b, 0}, {b, -1}} {
		if d := c.b.Delay(c.n, r); d != 0 {
			t.Fatalf("%+v.Delay(%d) = %v, want 0", c.b, c.n, d)
		}
	}
}

// TestDecisionIsACopy: changing a Decision changes nothing in the Policy.
func TestDecisionIsACopy(t *testing.T) {
	p := newPolicy(t)
	d := p.Decide(errFraud)
	d.Retry.Delays[0] = time.Hour
	if got := p.Decide(errFraud).Retry.Delays[0]; got != time.Second {
		t.Fatalf("tier 1 delay after a caller changed its Decision: %s, want 1s", got)
	}
}
