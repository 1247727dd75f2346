package console

import (
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Logins and bad bearer tokens are rate-limited per client address: each
// address has a budget of loginBurst attempts, refilled by one every
// loginRefill. A login, and a bearer token that matches no token, spends
// one; an address whose budget is spent gets 429 for every login and every
// bearer token, good or bad, until it refills, so guessing gains nothing.
const (
	loginBurst  = 10
	loginRefill = 6 * time.Second
	// maxTracked bounds the addresses the limiter remembers; the idlest
	// are forgotten first.
	maxTracked = 10000
)

// limiter holds a rate.Limiter per client address.
type limiter struct {
	mu    sync.Mutex
	by    map[string]*tracked
	now   func() time.Time
	rate  rate.Limit
	burst int
}

type tracked struct {
	lim  *rate.Limiter
	seen time.Time
}

func newLimiter(now func() time.Time, burst int) *limiter {
	return &limiter{by: map[string]*tracked{}, now: now, rate: rate.Every(loginRefill), burst: burst}
}

// get returns client's limiter, creating it.
func (l *limiter) get(client string) *rate.Limiter {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	t, ok := l.by[client]
	if !ok {
		if len(l.by) >= maxTracked {
			l.forget(now)
		}
		t = &tracked{lim: rate.NewLimiter(l.rate, l.burst)}
		l.by[client] = t
	}
	t.seen = now
	return t.lim
}

// forget drops the addresses whose budget is full again (idle long
// enough), or, when none is, the one seen longest ago.
func (l *limiter) forget(now time.Time) {
	oldest, at := "", now
	for k, t := range l.by {
		if t.lim.TokensAt(now) >= float64(l.burst) {
			delete(l.by, k)
			continue
		}
		if t.seen.Before(at) {
			oldest, at = k, t.seen
		}
	}
	if len(l.by) >= maxTracked {
		delete(l.by, oldest)
	}
}

// ok reports whether client has budget left (without spending it).
func (l *limiter) ok(client string) bool {
	if l == nil {
		return true
	}
	return l.get(client).TokensAt(l.now()) >= 1
}

// spend takes one attempt from client's budget and reports whether there
// was one.
func (l *limiter) spend(client string) bool {
	if l == nil {
		return true
	}
	return l.get(client).AllowN(l.now(), 1)
}

// clientAddr is the address requests are rate-limited by: the connection's
// peer, or behind a proxy the last hop of X-Forwarded-For (the one the
// proxy added).
func clientAddr(r *http.Request, behindProxy bool) string {
	if behindProxy {
		if xff := r.Header.Values("X-Forwarded-For"); len(xff) > 0 {
			hops := strings.Split(xff[len(xff)-1], ",")
			if last := strings.TrimSpace(hops[len(hops)-1]); last != "" {
				return last
			}
		}
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}
