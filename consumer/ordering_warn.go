package consumer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/internal/keyorder"
)

// orderingDB is where the parked rows of this group live: ByKey's pool,
// else the database of a Dedupe store that exposes one (DB() dedupe.DB);
// nil when neither is known.
func orderingDB(cfg Config) dedupe.DB {
	if cfg.Ordering.db != nil {
		return cfg.Ordering.db
	}
	if d, ok := cfg.Dedupe.(interface{ DB() dedupe.DB }); ok {
		return d.DB()
	}
	return nil
}

// warnUnread logs at WARN, at start, the parked messages of this group that
// this Run will not read, with counts, topics and the command that releases
// them: all of them when ordering is off; with Ordering ByKey, those of topics
// not in Config.Topics, those whose head sits in a retry tier beyond
// len(Retry.Tiers.Delays) (removed from the policy), and those whose head has
// waited in its tier longer than the tier topic keeps records (retention.ms):
// its tier record expired, so it never comes back. Their offsets are
// committed, so without a release they stay stranded. It never fails Run: a
// database it cannot read (or without the ordering tables) is skipped.
func (s setup) warnUnread(ctx context.Context, client sarama.Client) {
	db := orderingDB(s.cfg)
	if db == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	keys, err := keyorder.List(ctx, db, s.cfg.Group, "")
	if err != nil {
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "42P01" { // undefined_table: ordering never used here
			s.log.Debug("idem: cannot look for parked messages", "err", err)
		}
		return
	}
	type unread struct {
		keys, parked int
		oldest       time.Time
		reason       string
	}
	var topics []string
	byTopic := map[string]*unread{}
	var retention map[string]time.Duration // of the tier topics, read once when needed
	for _, k := range keys {
		var reason string
		switch {
		case !s.order:
			reason = "ordering is off (Config.Ordering is not ByKey)"
		case !slices.Contains(s.cfg.Topics, k.Topic):
			reason = "the topic is not in Config.Topics"
		case k.Tier > len(s.policy.Delays):
			reason = fmt.Sprintf("heads wait in retry tier %d, but Retry.Tiers.Delays has %d tiers", k.Tier, len(s.policy.Delays))
		case k.Head != "" && !k.Pending && k.Tier > 0 && !k.Since.IsZero():
			tier := s.policy.Tier(k.Topic, s.cfg.Group, k.Tier)
			if retention == nil {
				retention = s.retentions(client, subscribed(s.cfg)[len(s.cfg.Topics):])
			}
			d, ok := retention[tier]
			if !ok || d < 0 || time.Since(k.Since) <= d {
				continue
			}
			reason = fmt.Sprintf("heads waited in retry tier %d longer than its retention.ms (%s): their tier records expired", k.Tier, d)
		default:
			continue
		}
		u := byTopic[k.Topic]
		if u == nil {
			u = &unread{reason: reason}
			byTopic[k.Topic] = u
			topics = append(topics, k.Topic)
		}
		u.keys++
		u.parked += k.Parked
		if !k.OldestParked.IsZero() && (u.oldest.IsZero() || k.OldestParked.Before(u.oldest)) {
			u.oldest = k.OldestParked
		}
	}
	for _, t := range topics {
		u := byTopic[t]
		age := time.Duration(0)
		if !u.oldest.IsZero() {
			age = time.Since(u.oldest).Round(time.Second)
		}
		s.log.Warn("idem: parked messages this consumer will not read; their offsets are committed, so release them",
			"topic", t, "keys", u.keys, "parked", u.parked, "oldest_age", age, "reason", u.reason,
			"list", fmt.Sprintf("idem ordering list --group %s --topic %s", s.cfg.Group, t),
			"release", fmt.Sprintf("idem ordering release --group %s --topic %s --all --to source", s.cfg.Group, t))
	}
}
