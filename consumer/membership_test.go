package consumer

import (
	"strings"
	"testing"
)

// TestValidateInstanceID checks Kafka's rules for InstanceID.
func TestValidateInstanceID(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(c *Config)
		field  string // "" means valid
	}{
		{"pod name", func(c *Config) { c.InstanceID = "payments-7f9c-0" }, ""},
		{"249 characters", func(c *Config) { c.InstanceID = strings.Repeat("a", 249) }, ""},
		{"dots and underscores", func(c *Config) { c.InstanceID = "host_1.example" }, ""},

		{"instance id of 250 characters", func(c *Config) { c.InstanceID = strings.Repeat("a", 250) }, "InstanceID"},
		{"instance id with a slash", func(c *Config) { c.InstanceID = "ns/pod" }, "InstanceID"},
		{"instance id with a space", func(c *Config) { c.InstanceID = "pod 1" }, "InstanceID"},
		{"instance id dot", func(c *Config) { c.InstanceID = "." }, "InstanceID"},
		{"instance id dot dot", func(c *Config) { c.InstanceID = ".." }, "InstanceID"},
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
