package dlq

import "github.com/idemhq/idem/internal/wire"

// ReplayedFrom returns the dead-letter record r was replayed from: the
// position named by its last idem-replay-of header. Every replay writes that
// header (Replay, and the failure console's replay and edit-and-retry),
// replacing any earlier one, as "<dlq topic>/<partition>/<offset>"; it is not
// one of the wire contract's headers, so a consumer's forwards keep it, and a
// replayed record that fails again reaches the dead-letter topic with it. ok
// is false when r has none, or it does not parse.
func (r *Record) ReplayedFrom() (topic string, p Position, ok bool) {
	v, found := r.header(wire.HeaderReplayOf)
	if !found {
		return "", Position{}, false
	}
	topic, part, off, ok := wire.ParseReplayOf(v)
	if !ok {
		return "", Position{}, false
	}
	return topic, Position{Partition: part, Offset: off}, true
}
