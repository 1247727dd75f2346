package kafkaauth

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestTokenProviderRefreshesBeforeExpiry drives Apply's refreshing provider with a
// clock of the test's: a token is kept until 80 % of its lifetime, then
// replaced; a failed fetch keeps the old token while it is valid and fails
// once it has expired; a token without expiry is kept.
func TestTokenProviderRefreshesBeforeExpiry(t *testing.T) {
	start := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	now := start
	fetches := 0
	var fail error
	expiry := func(at time.Time) time.Time { return at.Add(100 * time.Second) }
	p := newRefreshing(func(ctx context.Context) (string, time.Time, error) {
		if _, ok := ctx.Deadline(); !ok {
			t.Error("fetch without a deadline")
		}
		if fail != nil {
			return "", time.Time{}, fail
		}
		fetches++
		return "tok-" + string(rune('0'+fetches)), expiry(now), nil
	})
	p.now = func() time.Time { return now }
	token := func() string {
		t.Helper()
		tok, err := p.Token()
		if err != nil {
			t.Fatalf("at %s: %v", now.Sub(start), err)
		}
		return tok.Token
	}
	steps := []struct {
		at   time.Duration
		want string
	}{
		{0, "tok-1"},
		{50 * time.Second, "tok-1"},
		{79 * time.Second, "tok-1"},
		{80 * time.Second, "tok-2"}, // 80 % of 100 s: refreshed 20 s before expiry
		{120 * time.Second, "tok-2"},
		{161 * time.Second, "tok-3"},
	}
	for _, s := range steps {
		now = start.Add(s.at)
		if got := token(); got != s.want {
			t.Fatalf("at %s: %s, want %s", s.at, got, s.want)
		}
	}

	// The identity provider fails: the kept token (fetched at 161 s,
	// expiring at 261 s) is still given out while it is valid.
	fail = errors.New("idp down")
	now = start.Add(250 * time.Second)
	if got := token(); got != "tok-3" {
		t.Fatalf("during the outage: %s, want the kept tok-3", got)
	}
	now = start.Add(261 * time.Second)
	if _, err := p.Token(); !errors.Is(err, fail) {
		t.Fatalf("after the kept token expired: %v, want the fetch error", err)
	}
	fail = nil
	if got := token(); got != "tok-4" {
		t.Fatalf("after the outage: %s, want tok-4", got)
	}

	// A token without expiry is kept.
	expiry = func(time.Time) time.Time { return time.Time{} }
	now = now.Add(time.Hour)
	if got := token(); got != "tok-5" {
		t.Fatalf("%s, want tok-5", got)
	}
	now = now.Add(1000 * time.Hour)
	if got := token(); got != "tok-5" || fetches != 5 {
		t.Fatalf("%s after %d fetches: a token without expiry was not kept", got, fetches)
	}
}

func TestTokenProviderEmptyToken(t *testing.T) {
	p := newRefreshing(func(context.Context) (string, time.Time, error) {
		return "", time.Now().Add(time.Hour), nil
	})
	if _, err := p.Token(); err == nil {
		t.Fatal("an empty token was accepted")
	}
}
