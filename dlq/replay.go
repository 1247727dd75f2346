package dlq

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/forward"
)

// errBadFilter is wrapped by the errors ParseFilter returns.
var errBadFilter = errors.New("dlq: bad filter")

// Filter selects records for Replay. A zero Filter matches every record; each
// set field must match (AND).
type Filter struct {
	// Kind matches idem-error-kind exactly ("retriable", "permanent", …).
	Kind handler.Kind
	// Error matches idem-error anywhere in the message (an unanchored regexp,
	// so a plain substring works).
	Error *regexp.Regexp
	// Key matches the record key, the derived idempotency key
	// (idem-idempotency-key) or the idempotency-key header exactly.
	Key string
	// Fingerprint matches the record's Fingerprint by prefix (as List shows it).
	Fingerprint string
}

// ParseFilter parses the CLI form "kind=permanent,error~=timeout,key=pay-42,
// fingerprint=3fa2". Terms are separated by commas; a comma followed by
// something other than a known term name belongs to the previous value (so
// regexps may contain commas). An empty string is the zero Filter. An error
// names the term at fault and what the terms may be.
func ParseFilter(s string) (Filter, error) {
	var f Filter
	s = strings.TrimSpace(s)
	if s == "" {
		return f, nil
	}
	names := []string{"kind=", "error~=", "key=", "fingerprint="}
	// Split at commas that start a known term.
	var terms []string
	start := 0
	for i := 0; i < len(s); i++ {
		if s[i] != ',' {
			continue
		}
		rest := strings.TrimLeft(s[i+1:], " ")
		for _, n := range names {
			if strings.HasPrefix(rest, n) {
				terms = append(terms, s[start:i])
				start = i + 1
				break
			}
		}
	}
	terms = append(terms, s[start:])
	for _, t := range terms {
		t = strings.TrimSpace(t)
		switch {
		case strings.HasPrefix(t, "kind="):
			k := handler.Kind(strings.TrimPrefix(t, "kind="))
			switch k {
			case handler.KindRetriable, handler.KindPermanent, handler.KindPanic, handler.KindMissingKey, handler.KindInvalidKey, handler.KindDecode, handler.KindTimeout:
			default:
				return Filter{}, fmt.Errorf("%w: kind %q: want one of retriable, permanent, panic, missing-key, invalid-key, decode, timeout", errBadFilter, k)
			}
			f.Kind = k
		case strings.HasPrefix(t, "error~="):
			expr := strings.TrimPrefix(t, "error~=")
			re, err := regexp.Compile(expr)
			if err != nil {
				return Filter{}, fmt.Errorf("%w: error~=%q: %v", errBadFilter, expr, err)
			}
			f.Error = re
		case strings.HasPrefix(t, "key="):
			f.Key = strings.TrimPrefix(t, "key=")
		case strings.HasPrefix(t, "fingerprint="):
			f.Fingerprint = strings.TrimPrefix(t, "fingerprint=")
		default:
			return Filter{}, fmt.Errorf("%w: term %q: want kind=…, error~=…, key=… or fingerprint=…", errBadFilter, t)
		}
	}
	return f, nil
}

// Match reports whether r passes every set field of f.
func (f Filter) Match(r *Record) bool {
	if f.Kind != "" && r.Failure.Kind != f.Kind {
		return false
	}
	if f.Error != nil && !f.Error.MatchString(r.Failure.Error) {
		return false
	}
	if f.Key != "" && !r.HasKey(f.Key) {
		return false
	}
	if f.Fingerprint != "" && !strings.HasPrefix(r.Fingerprint(), f.Fingerprint) {
		return false
	}
	return true
}

// ReplayOptions configure Replay.
type ReplayOptions struct {
	// Topic is the dead-letter topic. Required.
	Topic string
	// To is where records go. "" (or "source") sends each record back to
	// its idem-original-topic, to the partition it came from
	// (idem-original-partition) when that exists, with only its original
	// headers (none of the wire contract's idem-* headers), so the consumer
	// sees it as a fresh record.
	//
	// Any other value names a topic, typically a retry tier (idem never
	// guesses tier names: a policy may have no tiers or name them its own
	// way). A record sent to a named topic keeps its idem-* headers, so its
	// history (attempts, original coordinates, first failure) is kept, with
	// idem-due-at set to now and idem-tier set as Tier says; a consumer
	// reading the topic as that tier of the record's group handles it at
	// once and forwards it onwards as its policy says. A record that has no
	// idem-* headers is sent with its headers as they are, and a named topic
	// equal to the record's idem-original-topic is treated as "". A topic
	// that is really called "source" cannot be named. Whatever the
	// destination, a replayed record also carries idem-replay-of, naming
	// the dead-letter record it came from (Record.ReplayedFrom reads it).
	//
	// Replay never creates a topic: a named topic that does not exist is an
	// error wrapping ErrUnknownTopic before any record is read; with "",
	// each record's original topic is checked before anything is sent, and
	// Replay stops (ErrUnknownTopic) having sent and committed nothing.
	// Default: "" (each record's origin).
	To string
	// Tier is the idem-tier written on records sent to a named topic (To
	// not ""); set it to the tier number the topic is in the record's
	// consumer group's retry policy. A consumer that reads a record whose
	// idem-tier does not match the topic treats it as a fresh record of that
	// topic. Ignored when To is "".
	// Default: 0, meaning n when the topic has the default name of tier n,
	// retrytopic.Policy{}.Tier(original-topic, group, n), for the record's
	// idem-original-topic and idem-consumer-group, else 1.
	Tier int
	// Filter selects the records to send. Default: all.
	Filter Filter
	// AllowedTopics are topics a record may be replayed to besides its
	// origin topic and the origin's retry tiers for the record's group
	// (<origin>.<group>.retry.<n>). A record whose destination is none of
	// these makes Replay fail before anything is
	// sent or committed. The CLI's --replay-topic.
	// Default: none.
	AllowedTopics []string
	// DropUnmatched allows a replay that leaves records of the pending range
	// unsent: records the filter does not match, and stubs (never sent). They
	// stop being pending when the admin group is committed past the range.
	// Without it, such a replay is refused (ErrUnmatched) before anything is
	// sent or committed. The CLI's --drop-unmatched-from-pending.
	// Default: false.
	DropUnmatched bool
	// Rate caps sends per second. Default: 0, unlimited.
	Rate float64
	// DryRun reads and counts what would be replayed, sends nothing and
	// commits nothing. Destinations are checked as in a real run, so a dry run
	// fails where the real run would; it does not return ErrUnmatched (the
	// counts say what a real run would drop).
	DryRun bool
	// Progress, when set, is called after each record with the records
	// processed so far (sent or skipped) and the total pending when Replay
	// started. It is called from Replay's goroutine.
	Progress func(done, total int64)
	// Now is the clock for the idem-due-at of records sent to a named topic.
	// Default: time.Now.
	Now func() time.Time
}

// ReplayResult counts what Replay did.
type ReplayResult struct {
	// Pending is how many records were pending when Replay started.
	Pending int64
	// Replayed is how many records were sent (in a dry run: would be sent).
	Replayed int64
	// Skipped is how many pending records the filter did not match. After a
	// (non dry) run with DropUnmatched they are no longer pending.
	Skipped int64
	// Stubs locate the pending stubs the filter matched: never sent, and,
	// like Skipped records, no longer pending after a run with DropUnmatched.
	Stubs []Position
}

// ErrNoOrigin is wrapped by Replay's error when, replaying to each record's
// origin (ReplayOptions.To ""), a record lacks the idem-original-topic
// header it needs to be routed. Replay stops before sending anything.
var ErrNoOrigin = forward.ErrNoOrigin

// ErrUnmatched is wrapped by Replay's error when the pending range holds
// records the replay would not send (filtered out, or stubs) and
// ReplayOptions.DropUnmatched is off: nothing was sent or committed.
var ErrUnmatched = errors.New("dlq: replay would drop records it does not send from pending")

// ErrNothingMatched is wrapped by Replay's error when records are pending but
// none would be sent (none matches the filter, or only stubs do): nothing was
// sent or committed. With nothing pending, Replay returns nil and zero counts.
var ErrNothingMatched = errors.New("dlq: no pending record to replay")

// Replay republishes the pending records of opts.Topic that match
// opts.Filter, in offset order per partition, keeping key and value byte for
// byte and the original headers (so the idempotency-key header: a record
// that was in fact handled is a duplicate the consumer's inbox drops).
//
// Replay works on a contiguous range: the records pending when it starts
// (from the admin group's committed offset to the end offsets at that
// moment), because "pending" is one committed offset per partition. It first
// reads the whole range without sending: when records are pending but none
// would be sent it returns ErrNothingMatched, and when some record would be left unsent (not
// matched by the filter, or a stub, which is never sent: its value was left
// out) it returns ErrUnmatched unless opts.DropUnmatched; either way nothing
// is sent or committed. Every destination is checked in that pass too.
// Then it sends each matching record, once acknowledged (acks=all), and
// commits the admin group past the whole range: records it did not send stay
// in the topic (Show finds them) but List, Depth and later Replays do not
// see them. A second Replay does not repeat the first.
//
// If Replay stops while sending (ctx done, a send failing), it commits past
// the records it dealt with and not past the one it stopped at, and returns
// the error with the counts so far: running it again resumes where it
// stopped. A dry run reads once, sends and commits nothing, and returns the
// counts (and ErrNothingMatched when nothing would be sent).
func (c *Client) Replay(ctx context.Context, opts ReplayOptions) (ReplayResult, error) {
	var res ReplayResult
	if opts.To == "" {
		opts.To = forward.ReplayToSource
	}
	if opts.Rate < 0 {
		return res, fmt.Errorf("dlq: replay rate %v: must be >= 0", opts.Rate)
	}
	if opts.Tier < 0 {
		return res, fmt.Errorf("dlq: replay tier %d: must be >= 0", opts.Tier)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.To != forward.ReplayToSource {
		if err := c.checkTopic(opts.To); err != nil {
			return res, fmt.Errorf("dlq: replay to %q: %w", opts.To, err)
		}
	}
	spans, err := c.pending(ctx, opts.Topic)
	if err != nil {
		return res, err
	}
	for _, s := range spans {
		n, err := c.count(ctx, opts.Topic, s)
		if err != nil {
			return res, err
		}
		res.Pending += n
	}
	// The read-only pass: counts, stubs, destinations.
	exists := map[string]bool{opts.To: opts.To != forward.ReplayToSource}
	err = c.scan(ctx, opts.Topic, spans, func(r *Record) error {
		switch {
		case !opts.Filter.Match(r):
			res.Skipped++
		case r.IsStub():
			res.Stubs = append(res.Stubs, Position{Partition: r.Partition, Offset: r.Offset})
		default:
			if _, err := forward.CheckReplayTarget(r.Failure.OriginalTopic, r.Failure.Group, opts.To, opts.AllowedTopics); err != nil {
				return fmt.Errorf("offset %d: %w", r.Offset, err)
			}
			rec, err := replayRecord(r, opts)
			if err != nil {
				return err
			}
			if !exists[rec.Topic] {
				if err := c.checkTopic(rec.Topic); err != nil {
					return fmt.Errorf("offset %d: %w", r.Offset, err)
				}
				exists[rec.Topic] = true
			}
			res.Replayed++
		}
		if opts.DryRun && opts.Progress != nil {
			opts.Progress(res.Replayed+res.Skipped+int64(len(res.Stubs)), res.Pending)
		}
		return nil
	})
	if err != nil {
		if !opts.DryRun {
			res.Replayed = 0 // counted "would send"; nothing was
		}
		return res, fmt.Errorf("dlq: replay %s: nothing sent or committed: %w", opts.Topic, err)
	}
	unsent := res.Skipped + int64(len(res.Stubs))
	switch {
	case res.Pending == 0:
		return res, nil
	case res.Replayed == 0:
		return res, fmt.Errorf("%w in %s: %d pending, %d not matched by the filter, %d stubs; nothing sent or committed",
			ErrNothingMatched, opts.Topic, res.Pending, res.Skipped, len(res.Stubs))
	case opts.DryRun:
		return res, nil
	case unsent > 0 && !opts.DropUnmatched:
		return res, fmt.Errorf("%w: %s has %d pending records; %d match, %d are not matched by the filter and %d are stubs (never replayed): nothing sent or committed",
			ErrUnmatched, opts.Topic, res.Pending, res.Replayed, res.Skipped, len(res.Stubs))
	}
	sent, err := c.send(ctx, opts, spans, res.Pending)
	res.Replayed = sent
	return res, err
}

// send is Replay's second pass: it sends the matching records of spans that
// are not stubs and commits the admin group past what it dealt with. It
// returns how many it sent.
func (c *Client) send(ctx context.Context, opts ReplayOptions, spans []span, pending int64) (int64, error) {
	fwd, err := c.forwarder()
	if err != nil {
		return 0, fmt.Errorf("dlq: replay: %w", err)
	}
	var interval time.Duration
	if opts.Rate > 0 {
		interval = time.Duration(float64(time.Second) / opts.Rate)
	}
	var next time.Time
	var sent, done int64
	for _, s := range spans {
		if s.Start >= s.End {
			continue
		}
		reached := s.Start // next offset not yet dealt with
		err := c.scan(ctx, opts.Topic, []span{s}, func(r *Record) error {
			if opts.Filter.Match(r) && !r.IsStub() {
				rec, err := replayRecord(r, opts)
				if err != nil {
					return err
				}
				if interval > 0 {
					if err := forward.WaitDue(ctx, next, nil); err != nil {
						return err
					}
					next = maxTime(next, time.Now()).Add(interval)
				}
				if err := fwd.Forward(ctx, rec); err != nil {
					return err
				}
				sent++
			}
			reached = r.Offset + 1
			done++
			if opts.Progress != nil {
				opts.Progress(done, pending)
			}
			return nil
		})
		if err == nil {
			reached = s.End
		}
		if reached > s.Start {
			if cerr := c.commit(opts.Topic, map[int32]int64{s.Partition: reached}); cerr != nil {
				return sent, errors.Join(err, cerr)
			}
		}
		if err != nil {
			return sent, fmt.Errorf("dlq: replay %s/%d stopped at offset %d: %w", opts.Topic, s.Partition, reached, err)
		}
	}
	return sent, nil
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// replayRecord builds the record Replay sends for r, as opts.To and
// opts.Tier say (see forward.Replay, which the failure console's replay
// calls too).
func replayRecord(r *Record, opts ReplayOptions) (forward.Record, error) {
	return forward.Replay(forward.DeadLetter{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Key: r.Key,
		Value: r.Value, Headers: r.Headers, Failure: r.Failure, HasFailure: r.HasFailure}, opts.To, opts.Tier, opts.Now())
}
