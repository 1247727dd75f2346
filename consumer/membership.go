package consumer

import (
	"fmt"
	"regexp"
)

// maxInstanceIDLength is Kafka's limit on group.instance.id (as on topic
// names).
const maxInstanceIDLength = 249

var instanceIDChars = regexp.MustCompile(`^[a-zA-Z0-9._-]+$`)

// validInstanceID applies Kafka's rules for group.instance.id
// (JoinGroupRequest.validateGroupInstanceId): non-empty, not "." or "..", at
// most 249 characters of [a-zA-Z0-9._-].
func validInstanceID(id string) error {
	switch {
	case id == "." || id == "..":
		return fmt.Errorf(`must not be "." or ".."`)
	case len(id) > maxInstanceIDLength:
		return fmt.Errorf("is %d characters long; Kafka allows at most %d", len(id), maxInstanceIDLength)
	case !instanceIDChars.MatchString(id):
		return fmt.Errorf("may hold only ASCII letters, digits, '.', '_' and '-' (use e.g. the pod name)")
	}
	return nil
}
