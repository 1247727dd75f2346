package consumer

import (
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/idemhq/idem/dedupe"
)

// TestValidateMembershipAndTransactions checks the rules of InstanceID and
// Transactions, one broken field at a time.
func TestValidateMembershipAndTransactions(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(c *Config)
		field  string // "" means valid
	}{
		{"pod name", func(c *Config) { c.InstanceID = "payments-7f9c-0" }, ""},
		{"249 characters", func(c *Config) { c.InstanceID = strings.Repeat("a", 249) }, ""},
		{"dots and underscores", func(c *Config) { c.InstanceID = "host_1.example" }, ""},
		{"transactions", func(c *Config) { c.Transactions.Enabled = true }, ""},
		{"transactions, static, batches", func(c *Config) {
			c.Transactions.Enabled, c.InstanceID, c.Batch.MaxMessages = true, "m-1", 50
		}, ""},
		{"transactions with lanes", func(c *Config) { c.Transactions.Enabled, c.Concurrency = true, 4 }, ""},
		{"transactions with adaptive lanes", func(c *Config) { c.Transactions.Enabled, c.Limits.Adaptive = true, &Adaptive{Max: 8} }, ""},

		{"instance id of 250 characters", func(c *Config) { c.InstanceID = strings.Repeat("a", 250) }, "InstanceID"},
		{"instance id with a slash", func(c *Config) { c.InstanceID = "ns/pod" }, "InstanceID"},
		{"instance id with a space", func(c *Config) { c.InstanceID = "pod 1" }, "InstanceID"},
		{"instance id dot", func(c *Config) { c.InstanceID = "." }, "InstanceID"},
		{"instance id dot dot", func(c *Config) { c.InstanceID = ".." }, "InstanceID"},
		{"negative transaction timeout", func(c *Config) { c.Transactions.Timeout = -time.Second }, "Transactions.Timeout"},
		{"transaction timeout not above the commit interval", func(c *Config) {
			c.Transactions.Enabled, c.CommitInterval, c.Transactions.Timeout = true, 5*time.Second, 5*time.Second
		}, "Transactions.Timeout"},
		{"transactions with ordering", func(c *Config) { c.Transactions.Enabled, c.Ordering = true, ByKey(someDB{}) }, ""},
		{"transactions read uncommitted", func(c *Config) { c.Transactions.Enabled, c.ReadUncommitted = true, true }, "ReadUncommitted"},
		{"transactions on an old protocol", func(c *Config) {
			c.Transactions.Enabled = true
			c.Sarama = sarama.NewConfig()
			c.Sarama.Version = sarama.V2_4_0_0
		}, "Sarama"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := validConfig()
			tt.mutate(&c)
			errs := configErrors(c.Validate())
			if tt.field == "" {
				if len(errs) > 0 {
					t.Fatalf("Validate() = %v, want nil", errs)
				}
				return
			}
			for _, e := range errs {
				if e.Field == tt.field {
					return
				}
			}
			t.Fatalf("Validate() = %v, want an error on %s", errs, tt.field)
		})
	}
}

// someDB is a non-nil dedupe.DB for checks that never reach the database.
type someDB struct{ dedupe.DB }
