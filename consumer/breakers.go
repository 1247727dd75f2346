package consumer

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/breaker"
	"github.com/idemhq/idem/internal/coremetrics"
)

// BreakerMetrics returns a hook for breaker.Settings.OnStateChange that
// exports every breaker's state (idem_breaker_state), its transitions
// (idem_breaker_transitions_total) and the seconds it spent open
// (idem_breaker_open_seconds_total) on reg, the same registry as
// Config.Registerer (registering twice on one registry reuses the
// collectors). A breaker has an idem_breaker_state series of 0 (closed) from
// its creation on (breaker.New, or a Set's first use of the name), since the
// breaker announces itself to the hook with from == to == Closed; that call
// counts no transition. It returns an error when reg refuses them: another collector
// with one of their names but a different shape. The hook is safe for
// concurrent use. See the example.
//
// The consumer itself needs no breaker configuration: any handler error that
// satisfies breaker.IsOpen pauses consumption.
func BreakerMetrics(reg prometheus.Registerer) (func(name string, from, to breaker.State), error) {
	m, err := coremetrics.New(reg)
	if err != nil {
		return nil, err
	}
	var mu sync.Mutex
	openedAt := map[string]time.Time{}
	return func(name string, from, to breaker.State) {
		m.BreakerState.WithLabelValues(name).Set(float64(stateCode(to)))
		if from == to {
			return // a new breaker's announcement: a series, no transition
		}
		m.BreakerTransition.WithLabelValues(name, from.String(), to.String()).Inc()
		mu.Lock()
		defer mu.Unlock()
		if to == breaker.Open {
			if _, ok := openedAt[name]; !ok {
				openedAt[name] = time.Now()
			}
		}
		if to == breaker.Closed {
			if t, ok := openedAt[name]; ok {
				m.BreakerOpen.WithLabelValues(name).Add(time.Since(t).Seconds())
				delete(openedAt, name)
			}
		}
	}, nil
}

// stateCode is idem_breaker_state's value: 0 closed, 1 half-open, 2 open.
func stateCode(s breaker.State) int {
	switch s {
	case breaker.HalfOpen:
		return 1
	case breaker.Open:
		return 2
	}
	return 0
}
