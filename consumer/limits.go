package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/breaker"
)

// LimitsConfig is Config.Limits: how the handler's calls to its
// dependencies are bounded.
type LimitsConfig struct {
	// Breakers is the breaker.Set the handler calls its dependencies
	// through, when it has flow limits (Set.SetLimits: a rate and calls in
	// flight per dependency, the budget of the whole group). Run registers
	// its series (breaker.NewLimitCollector: idem_dependency_*) on
	// Registerer and, after each rebalance and every 5 s, splits the budget
	// across the group's members: Set.SetShare(1/members). Until a member
	// has counted the group it uses the whole budget; during a rebalance
	// members may briefly use more than their share.
	// Default: nil (no limits split; the handler may still use a Set).
	Breakers *breaker.Set

	// Adaptive makes the handler calls in flight adapt to the latency and
	// the 429s of the dependencies (see Adaptive): each partition gets
	// Adaptive.Max lanes (Config.Concurrency is then ignored) and a
	// member-wide AIMD limit, exported as idem_lanes, decides how many run
	// at once.
	// Default: nil (a fixed Config.Concurrency).
	Adaptive *Adaptive
}

// Flow limits per dependency (issue 21): the handler calls its dependencies
// through Config.Limits.Breakers (breaker.Set.Do), whose limits (Set.SetLimits)
// are the budget of the whole consumer group. Run exports the Set's limit
// series and splits the budget across the group's members: after each
// rebalance, and every 5 s, it asks the group coordinator how many members
// the group has and calls Set.SetShare(1/members) when the count changed. Until the first answer a member uses
// the whole budget, and during a rebalance members that have not rescaled
// yet may briefly use more than their share (breaker.Set.SetShare).

// throttleWait waits out a *breaker.ThrottleError of one dependency (its
// rate or in-flight limit, or its Retry-After pause): only the message that
// needs the dependency waits, the member's other partitions and lanes go on
// (unlike an open breaker, which pauses them all). err may also be any
// other error breaker.IsThrottled reports (a registry's 429 met by a
// KeyFunc: untilUp). It logs the pause at WARN at most once a second for
// the member. false: the partition is stopping.
func (c *claim) throttleWait(err error) bool {
	d, _ := breaker.RetryAfter(err)
	d = max(d, 10*time.Millisecond)
	if last := c.r.throttleLog.Load(); time.Since(time.Unix(0, last)) >= time.Second &&
		c.r.throttleLog.CompareAndSwap(last, time.Now().UnixNano()) {
		var te *breaker.ThrottleError
		if errors.As(err, &te) {
			c.log.Warn("idem: dependency throttled; messages that need it wait", "breaker", te.Name, "reason", string(te.Reason), "retry_after", d)
		} else {
			c.log.Warn("idem: dependency throttled; messages that need it wait", "err", err, "retry_after", d)
		}
	}
	return sleep(c.stopCtx, d)
}

// registerLimits registers Config.Limits.Breakers' limit collector
// (breaker.NewLimitCollector: idem_dependency_*) on Config.Registerer. The
// same Set registered already by another Run on one registry is fine.
func registerLimits(cfg Config) error {
	if cfg.Limits.Breakers == nil || cfg.Registerer == nil {
		return nil
	}
	if err := cfg.Registerer.Register(breaker.NewLimitCollector(cfg.Limits.Breakers)); err != nil {
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			return fmt.Errorf("consumer: register the limit metrics of Config.Limits.Breakers: %w", err)
		}
	}
	return nil
}

// shares splits Config.Limits.Breakers' budget across the group's members: each
// session's Setup signals it (rebalanced) and watch, running for Run's
// lifetime, counts the group's members and sets the Set's share. It also
// recounts every shareRecount: a member whose partitions a cooperative
// rebalance left alone gets no new session, so no Setup tells it that others
// joined (TestRateLimitSplitAcrossMembers failed in CI that way: the first
// member kept the whole budget), and a count taken while the group was
// still joining can be short.
type shares struct {
	set  *breaker.Set
	kick chan struct{} // one pending recount at most
}

// shareRecount is how often the members are counted again without a
// rebalance signal.
const shareRecount = 5 * time.Second

func newShares(set *breaker.Set) *shares {
	if set == nil {
		return nil
	}
	return &shares{set: set, kick: make(chan struct{}, 1)}
}

// rebalanced asks watch to recount the members; it never blocks.
func (s *shares) rebalanced() {
	if s == nil {
		return
	}
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// start runs watch on wg until ctx is done.
func (s *shares) start(ctx context.Context, wg *sync.WaitGroup, client sarama.Client, r *runner) {
	if s == nil {
		return
	}
	wg.Go(func() { s.watch(ctx, client, r.cfg.Group, r.log, r.wait.outage) })
}

// watch recounts the group's members at each signal of rebalanced and sets
// the Set's share to 1/members. A failed count keeps the share in force
// (logged) and is tried again after a short wait.
func (s *shares) watch(ctx context.Context, client sarama.Client, group string, log *slog.Logger, wait func(n int) time.Duration) {
	admin, err := sarama.NewClusterAdminFromClient(client) // closing it would close the shared client
	if err != nil {
		log.Warn("idem: cannot split the dependencies' limits across the group: no admin client", "err", err)
		return
	}
	recount := time.NewTicker(shareRecount)
	defer recount.Stop()
	last := 0
	for n := 0; ; {
		select {
		case <-ctx.Done():
			return
		case <-s.kick:
		case <-recount.C:
		}
		members, err := groupMembers(admin, group)
		if err == nil && members > 0 {
			n = 0
			if members == last {
				continue
			}
			if err := s.set.SetShare(1 / float64(members)); err != nil {
				log.Warn("idem: set the dependencies' share", "members", members, "err", err)
				continue
			}
			last = members
			log.Debug("idem: dependencies' limits split across the group", "members", members)
			continue
		}
		n++
		log.Warn("idem: cannot count the group's members; the dependencies' share is unchanged", "err", err, "try", n)
		if !sleep(ctx, wait(n)) {
			return
		}
		s.rebalanced() // try again
	}
}

// groupMembers is the number of members of group, from its coordinator.
func groupMembers(admin sarama.ClusterAdmin, group string) (int, error) {
	ds, err := admin.DescribeConsumerGroups([]string{group})
	if err != nil {
		return 0, err
	}
	for _, d := range ds {
		if d.GroupId != group {
			continue
		}
		if d.Err != sarama.ErrNoError {
			return 0, d.Err
		}
		return len(d.Members), nil
	}
	return 0, fmt.Errorf("group %s not described", group)
}
