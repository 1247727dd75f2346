//go:build !idem_mutate

package mutate

// On reports whether mechanism name is switched off. Without the build tag
// idem_mutate it is always false.
func On(name string) bool { return false }
