package consumer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/idemhq/idem/dedupe"
)

// readinessTimeout bounds one store ping of (*Readiness).Check when the
// caller's ctx has no earlier deadline.
const readinessTimeout = 2 * time.Second

// ErrNotReady is wrapped by every error (*Readiness).Check returns.
var ErrNotReady = errors.New("consumer: not ready")

// Readiness reports whether a running consumer can do its work, for a
// /readyz endpoint (metrics.NewServeMux takes its Check method). Create it
// with NewReadiness, set it as Config.Readiness, and call Check from any
// goroutine. One Readiness belongs to one Run call at a time.
type Readiness struct {
	mu      sync.Mutex
	running bool
	joined  bool
	group   string
	claims  map[tp]int // claimed partitions (a count: a partition may be claimed again before its old claim ended)
	ping    func(ctx context.Context) error
}

// NewReadiness returns a Readiness that is not ready until a Run using it
// has joined its group.
func NewReadiness() *Readiness { return &Readiness{claims: map[tp]int{}} }

// Check returns nil once the consumer group is joined and the dedupe store
// (Config.Dedupe, and ByKey's pool with Config.Ordering ByKey) of the claimed
// partitions is reachable; otherwise an error wrapping ErrNotReady that says
// which: Run not started (or returned), the group not joined yet or between
// generations, or the store failing, with its error. A service that runs an
// outbox relay next to Run checks the relay's outbox.Health too, in the
// function it gives its /readyz (package outbox, section Relay).
//
// The store is pinged on every call that finds partitions claimed, bounded
// by 2s (when ctx has no earlier deadline): a store with a method Ping(context.Context) error is
// asked through it; dedupe.Memory is always reachable; any other store runs
// Process for the reserved key "idem:readiness-probe" with a function that
// fails at once, so the store's transaction is opened and rolled back and
// nothing is recorded. A member with no partition claimed (more members than
// partitions) is ready without a ping.
func (r *Readiness) Check(ctx context.Context) error {
	r.mu.Lock()
	running, joined, group, ping := r.running, r.joined, r.group, r.ping
	var claimed []string
	for t := range r.claims {
		claimed = append(claimed, TopicPartition{t.topic, t.partition}.String())
	}
	r.mu.Unlock()
	slices.Sort(claimed)
	switch {
	case !running:
		return fmt.Errorf("%w: consumer is not running", ErrNotReady)
	case !joined:
		return fmt.Errorf("%w: group %q not joined yet", ErrNotReady, group)
	case len(claimed) == 0 || ping == nil:
		return nil
	}
	pctx, cancel := context.WithTimeout(ctx, readinessTimeout)
	defer cancel()
	if err := ping(pctx); err != nil {
		const show = 8
		names := claimed
		if len(names) > show {
			names = append(names[:show:show], fmt.Sprintf("… %d more", len(claimed)-show))
		}
		return fmt.Errorf("%w: store of claimed partitions [%s] unreachable: %w", ErrNotReady, strings.Join(names, " "), err)
	}
	return nil
}

// start marks the Readiness as used by a Run of group with ping.
func (r *Readiness) start(group string, ping func(ctx context.Context) error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.running, r.joined, r.group, r.ping = true, false, group, ping
	clear(r.claims)
}

// stop marks Run as returned.
func (r *Readiness) stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.running, r.joined = false, false
	clear(r.claims)
}

// setJoined records whether a group session is live.
func (r *Readiness) setJoined(on bool) {
	r.mu.Lock()
	r.joined = on
	r.mu.Unlock()
}

// claimed records a claim of t starting (on) or ending.
func (r *Readiness) claimed(t tp, on bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.claims == nil {
		r.claims = map[tp]int{}
	}
	if on {
		r.claims[t]++
	} else if r.claims[t]--; r.claims[t] <= 0 {
		delete(r.claims, t)
	}
}

// probeKey is the reserved idempotency key the readiness ping processes and
// rolls back.
const probeKey = "idem:readiness-probe"

// errProbe is what the readiness ping's function returns to roll back.
var errProbe = errors.New("consumer: readiness probe")

// pinger is a dedupe store that can be pinged directly.
type pinger interface {
	Ping(ctx context.Context) error
}

// storePing returns the function that checks cfg's stores are reachable.
func storePing(cfg Config) func(ctx context.Context) error {
	store := cfg.Dedupe
	var ping func(ctx context.Context) error
	switch s := store.(type) {
	case pinger:
		ping = s.Ping
	case *dedupe.Memory:
		ping = func(context.Context) error { return nil }
	default:
		rec := dedupe.Record{Group: cfg.Group, Key: probeKey}
		ping = func(ctx context.Context) error {
			_, err := store.Process(ctx, rec, func(context.Context) error { return errProbe })
			switch {
			case errors.Is(err, errProbe), errors.Is(err, dedupe.ErrInProgress):
				return nil // the store opened its unit of work: reachable
			case err == nil:
				return nil // a Duplicate: the store answered
			}
			return fmt.Errorf("dedupe store: %w", err)
		}
	}
	if !cfg.Ordering.keyed || cfg.Ordering.db == nil {
		return ping
	}
	db := cfg.Ordering.db
	return func(ctx context.Context) error {
		if err := ping(ctx); err != nil {
			return err
		}
		var one int
		if err := db.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
			return fmt.Errorf("ordering database: %w", err)
		}
		return nil
	}
}
