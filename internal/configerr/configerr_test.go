package configerr

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

var errBad = errors.New("pkg: invalid configuration")

func TestListReportsEveryProblem(t *testing.T) {
	l := New(errBad, "Config.")
	if err := l.Err(); err != nil {
		t.Fatalf("empty List: Err() = %v, want nil", err)
	}
	l.Bad("Name", "", "required")
	l.Bad("Size", -1, "must be >= 0")
	l.Check("Nested", nil)
	cause := errors.New("too big")
	l.Check("Nested", cause)
	l.NonNegative(map[string]time.Duration{"Wait": -time.Second, "Poll": 0})
	l.Add(nil)
	l.Add(fmt.Errorf("%w: Config.Table: bad name", errBad))
	err := l.Err()
	if !errors.Is(err, errBad) || !errors.Is(err, cause) {
		t.Fatalf("Err() = %v, want it to match the sentinel and the nested cause", err)
	}
	for _, want := range []string{`Config.Name = "": required`, "Config.Size = -1: must be >= 0", "Config.Nested: too big", "Config.Table: bad name", "Config.Wait = -1s: must be >= 0"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Err() = %q, want it to contain %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "Config.Poll") {
		t.Errorf("Err() = %q names Config.Poll, whose zero selects its default", err)
	}
	var e *Error
	if !errors.As(err, &e) || e.Field != "Config.Name" || e.Value != "" || e.Rule != "required" {
		t.Fatalf("errors.As(*Error) = %+v, want the first problem, Config.Name", e)
	}
}
