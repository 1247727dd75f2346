package docdefaults

import (
	"fmt"
	"log/slog"
	"testing"
	"time"
)

// sample is the config Check reads in its own test.
type sample struct {
	// Wait is a duration. Default: 5s.
	Wait time.Duration
	// Base and Max share a line.
	// Default: 100ms and 10s.
	Base, Max time.Duration
	// Size is a count. Default: 1,000.
	Size int
	// Name is a string.
	// Default: "idem".
	Name string
	// On is a switch. Default: false.
	On bool
	// Logger logs. Default: slog.Default().
	Logger *slog.Logger
	// Hook is optional. Default: nil, nothing is called.
	Hook func()
	// Required has no default. Required.
	Required string
}

// recorder counts the errors Check reports.
type recorder struct {
	testing.TB
	errs []string
}

func (r *recorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}
func (r *recorder) Helper() {}

func TestCheck(t *testing.T) {
	good := sample{Wait: 5 * time.Second, Base: 100 * time.Millisecond, Max: 10 * time.Second, Size: 1000, Name: "idem", Logger: slog.Default()}
	r := &recorder{TB: t}
	if n := Check(r, ".", "sample", good); n != 8 || len(r.errs) != 0 {
		t.Fatalf("Check(good) checked %d lines with errors %q; want 8 and none", n, r.errs)
	}
	bad := good
	bad.Max, bad.Size, bad.Logger, bad.Hook = time.Second, 7, nil, func() {}
	r = &recorder{TB: t}
	Check(r, ".", "sample", bad)
	if len(r.errs) != 4 {
		t.Fatalf("Check(bad) reported %q; want Max, Size, Logger and Hook", r.errs)
	}
}
