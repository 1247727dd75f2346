package retrytopic

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// TestPolicyDefaults checks the documented defaults against WithDefaults.
func TestPolicyDefaults(t *testing.T) {
	p := Policy{}.WithDefaults()
	if p.Retention != 7*24*time.Hour || defaultRetention != 7*24*time.Hour {
		t.Errorf("Retention = %s, documented 7 days", p.Retention)
	}
	if p.ReplicationFactor != -1 {
		t.Errorf("ReplicationFactor = %d, documented -1", p.ReplicationFactor)
	}
	if got := p.TierTopic("payments", "billing", 2); got != "payments.billing.retry.2" {
		t.Errorf("TierTopic = %q", got)
	}
	if got := p.DLQTopic("payments", "billing"); got != "payments.billing.dlq" {
		t.Errorf("DLQTopic = %q", got)
	}
	if len(p.Delays) != 0 {
		t.Errorf("Delays = %v, documented none", p.Delays)
	}
	// The zero Policy names topics without WithDefaults too.
	var z Policy
	if z.DLQ("a", "g") != "a.g.dlq" || z.Tier("a", "g", 1) != "a.g.retry.1" || z.Tiers("a", "g") != nil {
		t.Errorf("zero policy names: %q %q %v", z.DLQ("a", "g"), z.Tier("a", "g", 1), z.Tiers("a", "g"))
	}
	if err := z.Validate(); err != nil {
		t.Errorf("zero policy: Validate() = %v", err)
	}
}

func TestPolicyValidate(t *testing.T) {
	base := func() Policy { return Policy{Delays: []time.Duration{time.Second, 10 * time.Second}} }
	tests := []struct {
		name   string
		mutate func(*Policy)
		want   string // substring of the error; "" = valid
	}{
		{"defaults", func(*Policy) {}, ""},
		{"decreasing delays are allowed", func(p *Policy) { p.Delays = []time.Duration{time.Minute, time.Second} }, ""},
		{"zero delay", func(p *Policy) { p.Delays[1] = 0 }, "Delays[1]"},
		{"negative delay", func(p *Policy) { p.Delays[0] = -time.Second }, "Delays[0]"},
		{"bad replication", func(p *Policy) { p.ReplicationFactor = -2 }, "ReplicationFactor"},
		{"delay half the retention", func(p *Policy) { p.Retention = 2 * time.Hour; p.Delays[1] = time.Hour }, ""},
		{"delay above half the retention", func(p *Policy) { p.Retention = 2 * time.Hour; p.Delays[1] = time.Hour + time.Second },
			"Delays[1] = 1h0m1s (tier 2) is more than half its retention 2h0m0s"},
		{"delay above half the default retention", func(p *Policy) { p.Delays[0] = 4 * 24 * time.Hour }, "retention 168h0m0s"},
		{"infinite retention: no bound", func(p *Policy) { p.Retention = -1; p.Delays[0] = 365 * 24 * time.Hour }, ""},
		{"empty tier name", func(p *Policy) { p.TierTopic = func(string, string, int) string { return "" } }, "empty"},
		{"same tier names", func(p *Policy) { p.TierTopic = func(t, g string, n int) string { return t + ".retry" } }, "same as"},
		{"dlq equals tier", func(p *Policy) { p.DLQTopic = func(t, g string) string { return defaultTierTopic(t, g, 1) } }, "same as"},
		{"dlq equals source", func(p *Policy) { p.DLQTopic = func(t, g string) string { return t } }, "source topic"},
		{"illegal char", func(p *Policy) { p.DLQTopic = func(t, g string) string { return t + "/dlq" } }, "[a-zA-Z0-9._-]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := base()
			tt.mutate(&p)
			err := p.Validate()
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidPolicy) {
				t.Fatalf("Validate() = %v, want ErrInvalidPolicy", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Validate() = %v, want it to mention %q", err, tt.want)
			}
		})
	}
}

func TestPolicyNext(t *testing.T) {
	p := Policy{Delays: []time.Duration{time.Second, time.Minute}}
	if got := p.Topics("o", "g"); strings.Join(got, ",") != "o.g.retry.1,o.g.retry.2,o.g.dlq" {
		t.Fatalf("Topics = %v", got)
	}
	tests := []struct {
		tier  int
		dest  string
		next  int
		delay time.Duration
	}{
		{0, "o.g.retry.1", 1, time.Second},
		{1, "o.g.retry.2", 2, time.Minute},
		{2, "o.g.dlq", 0, 0},
		{7, "o.g.dlq", 0, 0},
	}
	for _, tt := range tests {
		dest, next, delay := p.Next("o", "g", tt.tier)
		if dest != tt.dest || next != tt.next || delay != tt.delay {
			t.Errorf("Next(tier %d) = %q %d %s, want %q %d %s", tt.tier, dest, next, delay, tt.dest, tt.next, tt.delay)
		}
	}
	if dest, next, _ := (Policy{}).Next("o", "g", 0); dest != "o.g.dlq" || next != 0 {
		t.Errorf("zero policy Next = %q %d", dest, next)
	}
}
