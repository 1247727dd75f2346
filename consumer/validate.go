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
//
// Validate checks the fields Run reads itself; each group's check
// (configCheck's retry, batch, transactions, ...) lives beside the
// code that reads the group, adds to the one configerr.List, and is called
// from here.
func (c Config) Validate() error {
	c = c.withDefaults()
	errs := configerr.New(ErrInvalidConfig, "Config.")
	v := configCheck{Config: c, errs: errs}
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
	v.keys()
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
	v.transactions()
	v.retry()
	v.ordering()
	if c.StallWarning < 0 {
		errs.Bad("StallWarning", c.StallWarning, "must be > 0")
	}
	v.startAt()
	v.lanes()
	v.batch()
	v.retention()
	if ix := c.failureIndex(); ix != nil {
		badEach(errs, "FailureIndex", ix.Validate())
	}
	badEach(errs, "Limits.Adaptive", c.Limits.Adaptive.validate())
	badEach(errs, "Defer", c.validateDefer())
	v.encryption()
	badEach(errs, "Expiry", c.Expiry.policy().Validate())
	v.routes()
	return errs.Err()
}

// configCheck is the validation of one Config (Validate): each group's check
// is a method that lives beside the code that reads the group and adds its
// problems, each naming its field, to the one list, errs.
type configCheck struct {
	Config
	errs *configerr.List
}
