package handler_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemhq/idem/handler"
)

func TestDeferUntil(t *testing.T) {
	now := time.Now()
	tests := []struct {
		name    string
		err     error
		want    time.Time // the DeferError's Until; checked when tooFar is false
		nearNow bool      // Until is within a second of now
		tooFar  bool
	}{
		{name: "an hour", err: handler.DeferUntil(now.Add(time.Hour)), want: now.Add(time.Hour)},
		{name: "zero: as soon as possible", err: handler.DeferUntil(time.Time{}), want: time.Time{}},
		{name: "past: kept as given", err: handler.DeferUntil(now.Add(-time.Hour)), want: now.Add(-time.Hour)},
		{name: "far past", err: handler.DeferUntil(time.Unix(0, 0)), want: time.Unix(0, 0)},
		{name: "just under MaxDefer", err: handler.DeferUntil(now.Add(handler.MaxDefer - time.Minute)), want: now.Add(handler.MaxDefer - time.Minute)},
		{name: "beyond MaxDefer", err: handler.DeferUntil(now.Add(handler.MaxDefer + time.Minute)), tooFar: true},
		{name: "year 9999", err: handler.DeferUntil(time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)), tooFar: true},
		{name: "unix ms read as seconds", err: handler.DeferUntil(time.Unix(now.UnixMilli(), 0)), tooFar: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			until, ok := handler.DeferredUntil(tt.err)
			if tt.tooFar {
				if ok || !strings.Contains(tt.err.Error(), "handler: defer beyond MaxDefer") || !handler.IsPermanent(tt.err) {
					t.Fatalf("err = %v (deferred %v): want a permanent error, defer beyond MaxDefer", tt.err, ok)
				}
				if handler.ErrorKind(tt.err) != handler.KindPermanent {
					t.Fatalf("kind %q, want permanent", handler.ErrorKind(tt.err))
				}
				return
			}
			if !ok {
				t.Fatalf("DeferredUntil(%v) = false", tt.err)
			}
			if tt.nearNow {
				if d := until.Sub(now); d < -time.Second || d > 6*time.Second {
					t.Fatalf("Until %v is %v from now", until, d)
				}
				return
			}
			if !until.Equal(tt.want) {
				t.Fatalf("Until = %v, want %v", until, tt.want)
			}
		})
	}
}

func TestDeferredUntilThroughWrapping(t *testing.T) {
	at := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	err := fmt.Errorf("bank closed: %w", handler.DeferUntil(time.Now().Add(time.Hour).Truncate(time.Hour)))
	if _, ok := handler.DeferredUntil(err); !ok {
		t.Fatalf("a wrapped DeferError is not found: %v", err)
	}
	var d *handler.DeferError
	if !errors.As(err, &d) {
		t.Fatal("errors.As does not find *DeferError")
	}
	if got := (&handler.DeferError{Until: at}).Error(); got != "handler: deferred until 2030-01-02T03:04:05Z" {
		t.Fatalf("Error() = %q", got)
	}
	if _, ok := handler.DeferredUntil(errors.New("plain")); ok {
		t.Fatal("a plain error is deferred")
	}
	if _, ok := handler.DeferredUntil(nil); ok {
		t.Fatal("nil is deferred")
	}
}
