package consumer

import (
	"errors"
	"fmt"
	"strings"

	"github.com/idemhq/idem/internal/configerr"
)

// badEach records each error joined in err (errors.Join) as a problem of
// field, so that a group's validator that reports every problem at once
// gives one error per problem.
func badEach(l *configerr.List, field string, err error) {
	if err == nil {
		return
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			badEach(l, field, e)
		}
		return
	}
	l.Check(field, err)
}

// ErrInvalidConfig is matched (errors.Is) by every error Validate returns,
// and by Run's error for a nil handler. Each problem names the field, its
// value and the rule it breaks, e.g. "consumer: invalid config:
// Config.Concurrency = 0: must be between 1 and 1024"; Validate joins them
// all (errors.Join).
var ErrInvalidConfig = errors.New("consumer: invalid config")

// Validate reports every problem of c (with defaults applied) at once, each
// matching ErrInvalidConfig; nil if c can run.
func (c Config) Validate() error {
	c = c.withDefaults()
	errs := configerr.New(ErrInvalidConfig, "Config.")
	if len(c.Brokers) == 0 {
		errs.Bad("Brokers", c.Brokers, "at least one broker address is required")
	}
	for _, b := range c.Brokers {
		if strings.TrimSpace(b) == "" || !strings.Contains(b, ":") {
			errs.Bad("Brokers", b, `each broker must be "host:port"`)
		}
	}
	if strings.TrimSpace(c.Group) == "" {
		errs.Bad("Group", c.Group, "a consumer group id is required")
	}
	if len(c.Topics) == 0 {
		errs.Bad("Topics", c.Topics, "at least one topic is required")
	}
	seen := map[string]bool{}
	for _, t := range c.Topics {
		if t == "" {
			errs.Bad("Topics", c.Topics, "topic names must not be empty")
		}
		if seen[t] {
			errs.Bad("Topics", t, "listed twice")
		}
		seen[t] = true
	}
	if c.Dedupe == nil {
		errs.Bad("Dedupe", nil, "a dedupe store is required (dedupe.NewPostgres(pool), or dedupe.NewMemory() for tests)")
	}
	if c.MaxKeyLength < 0 {
		errs.Bad("MaxKeyLength", c.MaxKeyLength, "must be > 0")
	}
	if c.MissingKey != MissingKeyDeadLetter && c.MissingKey != MissingKeyUseCoordinates {
		errs.Bad("MissingKey", c.MissingKey, "unknown policy")
	}
	if c.ShutdownGrace < 0 {
		errs.Bad("ShutdownGrace", c.ShutdownGrace, "must be > 0")
	}
	if rt := c.Sarama.Consumer.Group.Rebalance.Timeout; c.ShutdownGrace >= rt {
		errs.Bad("ShutdownGrace", c.ShutdownGrace, fmt.Sprintf("must be shorter than Sarama.Consumer.Group.Rebalance.Timeout (%s)", rt))
	}
	if c.CommitInterval < 0 {
		errs.Bad("CommitInterval", c.CommitInterval, "must be > 0")
	}
	if c.OutageBackoff < 0 {
		errs.Bad("OutageBackoff", c.OutageBackoff, "must be > 0")
	}
	if c.InstanceID != "" {
		if err := validInstanceID(c.InstanceID); err != nil {
			errs.Bad("InstanceID", c.InstanceID, err.Error())
		}
	}
	c.validateTransactions(errs)
	if c.Retry.Attempts < 1 {
		errs.Bad("Retry.Attempts", c.Retry.Attempts, "must be >= 1 (1: no in-process retries; 0: the default, 4)")
	}
	if err := c.Retry.Tiers.Validate(); err != nil {
		errs.Bad("Retry.Tiers", c.Retry.Tiers.Delays, err.Error())
	}
	for _, t := range c.Topics {
		if t == "" {
			continue
		}
		if err := c.Retry.Tiers.ValidateNames(t, c.Group); err != nil && strings.TrimSpace(c.Group) != "" {
			errs.Bad("Retry.Tiers", t, err.Error())
		}
	}
	if c.Ordering.keyed && c.Ordering.db == nil {
		errs.Bad("Ordering", c.Ordering, "ByKey needs the PostgreSQL pool that holds the parked messages: ByKey(pool), not ByKey(nil)")
	}
	if c.StallWarning < 0 {
		errs.Bad("StallWarning", c.StallWarning, "must be > 0")
	}
	if c.StartAt != StartOldest && c.StartAt != StartNewest {
		errs.Bad("StartAt", c.StartAt, "unknown start position")
	}
	if c.Concurrency < 1 || c.Concurrency > 1024 {
		errs.Bad("Concurrency", c.Concurrency, "must be between 1 and 1024")
	}
	if c.LaneBy != LaneByIdempotencyKey && c.LaneBy != LaneByKafkaKey {
		errs.Bad("LaneBy", c.LaneBy, "unknown lane key")
	}
	if c.Batch.MaxMessages < 0 || c.Batch.MaxMessages > 10000 {
		errs.Bad("Batch.MaxMessages", c.Batch.MaxMessages, "must be between 0 and 10000")
	}
	if c.Batch.MaxWait < 0 {
		errs.Bad("Batch.MaxWait", c.Batch.MaxWait, "must be >= 0")
	}
	validateRetention(c, errs)
	if c.Retry.Backoff.Base < 0 {
		errs.Bad("Retry.Backoff.Base", c.Retry.Backoff.Base, "must be > 0")
	}
	if ix := c.failureIndex(); ix != nil {
		badEach(errs, "FailureIndex", ix.Validate())
	}
	badEach(errs, "Limits.Adaptive", c.Limits.Adaptive.validate())
	badEach(errs, "Defer", c.validateDefer())
	c.validateEncryption(errs)
	badEach(errs, "Expiry", c.Expiry.policy().Validate())
	c.validateRoutes(errs)
	if c.Retry.Backoff.Max < c.Retry.Backoff.Base {
		errs.Bad("Retry.Backoff.Max", c.Retry.Backoff.Max, fmt.Sprintf("must be >= Retry.Backoff.Base (%s)", c.Retry.Backoff.Base))
	} else if len(c.Retry.Rules) > 0 && c.Retry.Tiers.Validate() == nil && c.Retry.Backoff.Base >= 0 && c.Retry.Attempts >= 1 {
		c.validateRules(errs) // only once the fallback's own fields passed: recovery.New checks them again
	}
	return errs.Err()
}
