package consumer

import (
	"cmp"
	"context"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/idemhq/idem/internal/coremetrics"
)

// claimSet is the registry of the partitions this member has claimed now.
// The stall and lag watchers read it; a claim registers itself when it
// starts and deregisters when it ends.
type claimSet struct {
	group string
	m     *coremetrics.Metrics
	log   *slog.Logger
	parts sync.Map // tp → *claim
	// kick asks watchLag for a sample now: a partition was claimed, so its
	// lag series exists from the start, not only after LagInterval.
	kick chan struct{}
}

func newClaimSet(group string, m *coremetrics.Metrics, log *slog.Logger) *claimSet {
	return &claimSet{group: group, m: m, log: log, kick: make(chan struct{}, 1)}
}

// claimed reports whether t is claimed now.
func (cs *claimSet) claimed(t tp) bool {
	_, ok := cs.parts.Load(t)
	return ok
}

// stall tracks how long a partition has been failing on the message at its
// head: since the first failed try of that message (an outage, a handler
// failure being retried, a forward that did not go through) until the message
// reaches an outcome and is marked. Waiting for a retry record's due time,
// for an open breaker's cool-down or for a dependency's limit or 429
// (breaker.IsThrottled) is not a stall.
type stall struct {
	mu     sync.Mutex
	since  time.Time // zero: flowing
	cause  error
	warned time.Time
}

// failed records a failed try of the current message.
func (s *stall) failed(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.since.IsZero() {
		s.since = time.Now()
	}
	s.cause = err
}

// clear records that the current message reached its outcome.
func (s *stall) clear() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.since, s.cause, s.warned = time.Time{}, nil, time.Time{}
}

// check returns how long the partition has been stalled, and the last cause
// when a warning is due (stalled at least after, and no warning in the last
// minute).
func (s *stall) check(now time.Time, after time.Duration) (d time.Duration, warn error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.since.IsZero() {
		return 0, nil
	}
	d = now.Sub(s.since)
	if d >= after && now.Sub(s.warned) >= time.Minute {
		s.warned = now
		return d, s.cause
	}
	return d, nil
}

// watchStalls refreshes idem_partition_stalled_seconds of every claimed
// partition every few seconds, and logs a WARN with the cause once a minute
// for each partition stalled longer than Config.StallWarning.
func (cs *claimSet) watchStalls(ctx context.Context, after time.Duration) {
	t := time.NewTicker(min(max(after/4, 100*time.Millisecond), 5*time.Second))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		cs.parts.Range(func(_, v any) bool {
			p := v.(*claim)
			var d time.Duration
			var cause error
			for _, s := range p.stalls {
				if sd, c := s.check(now, after); sd > d || c != nil {
					d = max(d, sd)
					cause = cmp.Or(c, cause)
				}
			}
			p.stalled.Set(d.Seconds())
			if cause != nil {
				p.log.Warn("idem: partition stalled on one message", "for", d.Round(time.Second), "cause", cause)
			}
			return true
		})
	}
}

// register adds p to the partitions watched for stalls, and returns the
// function that removes it.
func (cs *claimSet) register(p *claim) func() {
	part := strconv.Itoa(int(p.tp.partition))
	p.stalled = cs.m.PartitionStalled.WithLabelValues(cs.group, p.tp.topic, part)
	p.stalled.Set(0)
	cs.parts.Store(p.tp, p)
	select {
	case cs.kick <- struct{}{}: // sample the new partition's lag now
	default:
	}
	return func() {
		if cs.parts.CompareAndDelete(p.tp, p) { // not yet claimed again by a newer session
			cs.m.PartitionStalled.DeleteLabelValues(cs.group, p.tp.topic, part)
		}
	}
}
