package consumer

import "github.com/idemhq/idem/breaker"

// untilUp runs f, a step before the dedupe store's unit of work that may
// need a dependency (a KeyFunc or Config.TypeOf reading the value through a
// schema registry), until it returns anything but an open breaker
// (breaker.IsOpen: serde's *UnavailableError, say), and returns that. An
// open breaker is an outage like one met by the handler: it closes the gate
// (every claimed partition pauses for its RetryAfter), no attempt is
// spent, nothing is forwarded, and f runs again once the gate lets this
// claim through (as the half-open probe, or when another claim's probe
// opened it). A *breaker.ThrottleError (a limit or a 429: the dependency is
// up but asks to wait) is not an open breaker: only this message waits, for
// its RetryAfter, and the gate stays open. errStopping: the partition is
// stopping.
func (c *claim) untilUp(f func() error) error {
	probe := false
	for {
		err := f()
		throttled := err != nil && breaker.IsThrottled(err)
		open := err != nil && breaker.IsOpen(err) && !throttled
		if probe {
			if open {
				c.r.gate.trip(err)
			}
			c.r.gate.probeDone(open)
			probe = false
		}
		if throttled { // a limit or a 429 of one dependency: this message waits, as a handler's does
			if !c.throttleWait(err) {
				return errStopping
			}
			continue
		}
		if !open {
			return err
		}
		if !probe {
			c.r.gate.trip(err)
		}
		if c.debug {
			c.log.Debug("idem: a dependency of the key or the route is down; waiting", "err", err)
		}
		var ok bool
		if probe, ok = c.r.gate.wait(c.stopCtx); !ok {
			return errStopping
		}
	}
}
