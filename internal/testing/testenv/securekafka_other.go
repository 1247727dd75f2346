//go:build !linux

package testenv

import "os/exec"

// dieWithParent does nothing where the kernel has no parent-death signal;
// the broker is stopped by the test's cleanup.
func dieWithParent(*exec.Cmd) {}
