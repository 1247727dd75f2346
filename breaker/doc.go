// Package breaker is a circuit breaker: after consecutive failures of a
// dependency, stop calling it for a cool-down, then let a probe through.
//
// A handler wraps each call to a dependency in a named breaker:
//
//	set, err := breaker.NewSet(breaker.Settings{}) // defaults: 5 failures, 30s cool-down
//	if err != nil {
//		log.Fatal(err)
//	}
//	h := handler.Func(func(ctx context.Context, m *handler.Message) error {
//		return set.Do(ctx, "bank-api", func(ctx context.Context) error {
//			return bank.Charge(ctx, Payment{OrderID: string(m.Key)})
//		})
//	})
//
// # States
//
// A breaker starts Closed: calls go through and their outcomes are counted.
// After Settings.ConsecutiveFailures failures in a row (or, if
// Settings.FailureRatio is set, when the failure ratio of the current
// Settings.Window reaches it over at least Settings.MinRequests calls) it
// opens. While Open, Do does not call fn and returns an *OpenError whose
// RetryAfter is the time left of the cool-down (Settings.OpenTimeout, counted
// from the moment it opened). When the cool-down is over the breaker is
// HalfOpen: the next Settings.HalfOpenProbes calls go through as probes, any
// others get an *OpenError with a short RetryAfter. If the probes succeed
// the breaker closes with fresh counts; if one fails it opens again for a
// full cool-down. Set.Do documents every detail.
//
// # What counts as a failure
//
// nil is a success. A context error returned while the caller's ctx is done
// is not counted (the caller gave up; think partition revoked). Any other
// error is judged by Settings.IsFailure, whose default counts
// everything except handler.Permanent/handler.Decode errors (bad input is not
// the dependency failing) and an *OpenError or *ThrottleError of another
// breaker. A dependency's request to wait (handler.RetryAfter returned by fn)
// is not counted either: see below. An error not counted neither extends nor
// breaks a failure streak, and a probe that ends that way frees its slot for
// another probe.
//
// # How the consumer uses it
//
// When a handler's error wraps an *OpenError or a *ThrottleError (IsOpen,
// RetryAfter), the consumer treats the dependency as down rather than the message as bad: it
// rolls the transaction back, spends no retry budget, sends nothing to a retry
// or dead-letter topic, and pauses its partitions for RetryAfter (for a
// *ThrottleError only the message that needs the dependency waits, the other
// partitions go on). It then
// redelivers; the first call after the cool-down is the half-open probe. Its
// success closes the breaker and consumption goes on; its failure reopens it
// and the consumer pauses for a full cool-down again. Other partitions that
// arrive while the probe runs get HalfOpen *OpenErrors with RetryAfter of at
// most one second and pause briefly.
//
// Breakers do not export their states themselves: Settings.OnStateChange is
// the hook the consumer (or the user) wires to metrics and logs, and
// Set.States reports every breaker's state for a gauge. The flow limits below
// have a collector of their own, NewLimitCollector.
//
// # Quotas: rate limits, calls in flight, and Retry-After
//
// A breaker handles outages. A dependency with a quota (a bank, a PSP) needs
// two more things, which a Set keeps next to its breakers, per dependency:
//
//	set.SetLimits("bank", breaker.Limits{Rate: 200, Burst: 3, MaxInFlight: 16})
//	set.SetShare(1.0 / 3) // the consumer, on each rebalance: 1/members
//
// Limits are a rate (a token bucket from golang.org/x/time/rate) and a cap on
// the calls in flight. They are the whole consumer group's budget: each member
// enforces Limits scaled by its share (Set.SetShare), so a quota of 200 calls
// a second holds however many members the group has. Set.Do waits for a token
// and a slot, at most Limits.MaxWait (1s by default); past that it does not
// call fn and returns a *ThrottleError whose RetryAfter is the wait it would
// have needed. Waiting is not an attempt: the breaker does not count it, and a
// ctx that ends while waiting returns its error, uncounted.
//
// A dependency at its quota answers 429 with a Retry-After. fn reports it by
// returning handler.RetryAfter(err, d) from inside Do. Then the breaker does
// not count the call (the dependency is up), every call to that dependency is
// paused for d (without calling fn, each gets a *ThrottleError with
// RetryAfter = the time left), and the call itself returns a *ThrottleError
// carrying the answer. Only fn's errors are taken as such an answer: a
// handler's own handler.RetryAfter, returned outside any Do (a row lock, its
// own reasons), pauses no dependency and is retried by the consumer as usual.
//
// *ThrottleError satisfies IsOpen (and IsThrottled), Rejected when fn did not
// run, and RetryAfter, so a consumer handles it as it handles an open breaker
// (below): the partition waits; no retry budget is spent; nothing goes to a
// retry or dead-letter topic. Set.LimitStates reports, per dependency, the
// current limits of this member, the calls in flight, and counters of the
// time waited, the time paused and the calls throttled, for metrics;
// NewLimitCollector exports them to Prometheus (idem_dependency_rate_limit,
// idem_dependency_max_in_flight, idem_dependency_in_flight,
// idem_dependency_throttled_seconds_total and idem_dependency_throttled_total,
// by dependency).
//
// # Why this package does not wrap gobreaker
//
// github.com/sony/gobreaker/v2 is the usual Go circuit breaker, and wrapping
// it was the first plan. We don't wrap gobreaker because gobreaker v2.4.0 cannot
// be driven by a fake clock: every decision (beforeRequest, afterRequest,
// currentState, toNewGeneration, State) reads time.Now directly and Settings
// has no clock hook. Its only way to inject state, DistributedCircuitBreaker,
// holds a store lock around the whole request, which serialises every call
// (so half-open could never let several probes through at once) and spins on
// that lock with time.Sleep. Wrapping it would leave the cool-down, the
// window and half-open testable only with real sleeps, and OpenError.RetryAfter
// would be computed from a clock the breaker's own transitions do not use.
//
// The state machine here is small and keeps gobreaker's semantics: the same
// three states (same values and names), generations (an outcome that arrives
// after a state change is ignored), excluded outcomes that free a half-open
// slot, closing after MaxRequests (HalfOpenProbes) probe successes and
// reopening on any probe failure, a panic counted as a failure. A test runs
// the same outcome sequences through gobreaker and this package and checks
// that they trip at the same call. The deliberate differences: every timing
// decision uses Settings.Now; the failure streak is not cleared when a Window
// ends (a dependency that fails every call is down however slowly it is
// called); the ratio counts only finished, counted calls; and OnStateChange
// runs without the lock held, in order.
//
// The package holds no mutable package-level state.
package breaker
