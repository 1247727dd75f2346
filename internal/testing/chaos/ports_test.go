package chaos

import (
	"slices"
	"testing"
)

func TestEphemeralPorts(t *testing.T) {
	got := EphemeralPorts(19092, 15432, 45039, 21092)
	if slices.Contains(got, 19092) || slices.Contains(got, 15432) || slices.Contains(got, 21092) {
		t.Errorf("EphemeralPorts = %v: the harness's default ports are below the ephemeral range", got)
	}
	if !slices.Contains(got, 45039) {
		t.Errorf("EphemeralPorts = %v: want 45039, inside Linux's default ephemeral range", got)
	}
}
