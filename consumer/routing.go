package consumer

import (
	"fmt"
	"log/slog"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/coremetrics"
	"github.com/idemhq/idem/internal/wire"
)

// The message path's side of routes (route.go): which route a message
// takes, and the outcomes of the messages that take none.

// routing is a worker's stage of routes: Config.Filter, the route of the
// message in hand, and the outcome of a message no route takes. It holds
// nothing but the worker, so routing{w} costs nothing to make.
type routing struct{ *worker }

// useRoute makes rt the route of the message in hand: its handler,
// policies and metrics are the ones the worker's steps use.
func (w *worker) useRoute(rt *route) {
	w.rt = rt
	w.mx = w.mxs[rt.idx]
	w.ob.route = rt.name
}

// routeMessage runs Config.Filter on msg and finds its route (routeOf).
// done reports that msg reached its outcome here and was settled: filtered
// out, skipped or dead-lettered because no route takes it, or
// dead-lettered because its type cannot be read (kind decode). Otherwise
// its route is in use. errStopping: the partition is stopping.
func (w routing) routeMessage(cm *sarama.ConsumerMessage, msg *handler.Message, src wire.Source, o origin) (done bool, err error) {
	if reason := w.r.routes.filtered(msg, w.log); reason != "" {
		w.useRoute(w.r.routes.none)
		w.r.m.Filtered.WithLabelValues(w.r.cfg.Group, cm.Topic, reason).Inc()
		w.r.m.Messages.WithLabelValues(w.r.cfg.Group, cm.Topic, "", coremetrics.OutcomeSkipped).Inc()
		if w.debug {
			w.log.Debug("idem: message filtered out", "offset", cm.Offset, "reason", reason)
		}
		return true, w.settle(cm)
	}
	skip, failed, err := w.findRoute(msg)
	switch {
	case err != nil:
		return true, err
	case skip:
		return true, w.settle(cm)
	case failed == nil:
		return false, nil
	}
	if _, err := w.forward(w.failure(src, cm.Key, cm.Value, cm.Headers, o, msg, failed), msg); err != nil {
		return true, err
	}
	return true, w.settle(cm)
}

// findRoute finds the route of msg (a message read, or a parked one whose
// turn came in a drain, ordering.go), waiting out Config.TypeOf's outage,
// and puts it in use. When none takes it, the policies of the messages no
// route takes are in use and it is counted: skip reports that
// Config.Unmatched skips it, else failed is what it is dead-lettered with
// (no route takes it; its type cannot be read, kind decode).
// errStopping: the partition is stopping.
func (w routing) findRoute(msg *handler.Message) (skip bool, failed error, err error) {
	t := w.r.routes
	var rt *route
	var typ string
	var typErr error
	if err := w.untilUp(func() error {
		rt, typ, typErr = t.lookup(msg)
		return typErr
	}); err == errStopping {
		return false, nil, err
	}
	if rt != nil {
		w.useRoute(rt)
		return false, nil, nil
	}
	w.useRoute(t.none)
	switch {
	case handler.IsDecode(typErr):
		return false, typErr, nil
	case t.unmatched == UnmatchedSkip:
		w.r.m.Unmatched.WithLabelValues(w.r.cfg.Group, msg.Topic, coremetrics.UnmatchedSkipped).Inc()
		w.r.m.Messages.WithLabelValues(w.r.cfg.Group, msg.Topic, "", coremetrics.OutcomeSkipped).Inc()
		if w.debug {
			w.log.Debug("idem: no route takes the message; skipped", "offset", msg.Offset, "type", typ, "err", typErr)
		}
		return true, nil, nil
	}
	w.r.m.Unmatched.WithLabelValues(w.r.cfg.Group, msg.Topic, coremetrics.UnmatchedDeadLettered).Inc()
	return false, unmatchedError(msg, typ, typErr), nil
}

// unmatchedError is the error a message no route takes is dead-lettered
// with: permanent (it fails the same way until a route takes it; replay
// it then), naming its topic and type.
func unmatchedError(msg *handler.Message, typ string, typErr error) error {
	err := fmt.Errorf("consumer: no route takes the message (topic %q, type %q)", msg.Origin().Topic, typ)
	if typErr != nil {
		err = fmt.Errorf("consumer: no route takes the message (topic %q; Config.TypeOf: %w)", msg.Origin().Topic, typErr)
	}
	return handler.Permanent(err)
}

// filtered returns the reason Config.Filter gives to skip msg, or "". A
// Filter that panics keeps the message (logged at ERROR on log).
func (t *routeTable) filtered(msg *handler.Message, log *slog.Logger) (reason string) {
	f := t.filter
	if f == nil {
		return ""
	}
	defer func() {
		if v := recover(); v != nil {
			log.Error("idem: Config.Filter panicked; handling the message", "offset", msg.Offset, "panic", fmt.Sprint(v))
			reason = ""
		}
	}()
	return f(msg)
}

// routeOf returns the route of cm for the lanes' dispatcher (laneOf), and
// the message it was looked up with: nil when no route takes it or the
// partition is stopping (its lane then does not matter: the worker finds
// out).
func (c *claim) routeOf(cm *sarama.ConsumerMessage) (*route, *handler.Message) {
	msg := toMessage(cm)
	if c.tier { // routed by its first topic
		o := c.r.originOf(cm)
		msg.Original.Topic = o.topic
	}
	var rt *route
	_ = c.untilUp(func() (err error) {
		rt, _, err = c.r.routes.lookup(msg)
		return err
	})
	return rt, msg
}

// newRouteMetrics resolves the hot-path collectors of topic for every
// route of r, indexed by route.idx.
func newRouteMetrics(r *runner, topic string) []partMetrics {
	mxs := make([]partMetrics, len(r.routes.all))
	for i, rt := range r.routes.all {
		mxs[i] = newPartMetrics(r.m, r.cfg.Group, topic, rt.name)
	}
	return mxs
}
