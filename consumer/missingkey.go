package consumer

import (
	"fmt"
)

// MissingKeyPolicy says what happens to a message without a valid idempotency
// key (no key, an empty one, one longer than MaxKeyLength, or a KeyFunc error).
type MissingKeyPolicy int

const (
	// MissingKeyDeadLetter sends the message to the dead-letter topic with
	// idem-error-kind "missing-key". The default: without a key, idem cannot
	// make a retry safe, so it refuses to guess.
	MissingKeyDeadLetter MissingKeyPolicy = iota
	// MissingKeyUseCoordinates uses "<topic>/<partition>/<offset>" of the
	// original record as the key. Redelivery of the same record is then
	// deduplicated, but a producer that sends the same event twice gets two
	// effects: only for streams where the producer never retries.
	MissingKeyUseCoordinates
)

// String returns "dead-letter" or "use-coordinates".
func (p MissingKeyPolicy) String() string {
	switch p {
	case MissingKeyDeadLetter:
		return "dead-letter"
	case MissingKeyUseCoordinates:
		return "use-coordinates"
	}
	return fmt.Sprintf("MissingKeyPolicy(%d)", int(p))
}

// keys checks the key group: MaxKeyLength and MissingKey.
func (c configCheck) keys() {
	if c.MaxKeyLength < 0 {
		c.errs.Bad("MaxKeyLength", c.MaxKeyLength, "must be > 0")
	}
	if c.MissingKey != MissingKeyDeadLetter && c.MissingKey != MissingKeyUseCoordinates {
		c.errs.Bad("MissingKey", c.MissingKey, "unknown policy")
	}
}
