package chaos

import (
	"fmt"
	"os"
	"strings"
)

// EphemeralPorts returns the ports of ports that fall in the kernel's
// ephemeral range (/proc/sys/net/ipv4/ip_local_port_range; 32768–60999 when
// it cannot be read), where an outgoing connection may take one between a
// restart's stop and its bind: a broker or database restarted by a fault
// then fails to come back, and the run fails for a reason of its own
// making. The tools warn; ports below 32768 (the defaults) are safe.
func EphemeralPorts(ports ...int) []int {
	lo, hi := 32768, 60999
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		var l, h int
		if _, err := fmt.Sscan(strings.TrimSpace(string(b)), &l, &h); err == nil && l > 0 && h >= l {
			lo, hi = l, h
		}
	}
	var out []int
	for _, p := range ports {
		if p >= lo && p <= hi {
			out = append(out, p)
		}
	}
	return out
}
