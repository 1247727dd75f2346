package consumer

import (
	"context"
	"fmt"
	"regexp"

	"github.com/IBM/sarama"
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

// testHooks are points tests can observe or act at, carried by Run's ctx
// (export_test.go): nil in production.
type testHooks struct {
	// session is called by every session's Setup: tests follow the
	// session's generation with it.
	session func(s sarama.ConsumerGroupSession)
	// beforeCommit is the transaction owner's BeforeCommit hook.
	beforeCommit func(records int) error
	// startStep is called before each try of a start-up step that talks to
	// the cluster or the database (setup.retry), with the step's name; an
	// error it returns is that try's result.
	startStep func(what string) error
}

type testHooksKey struct{}

// hooksOf returns the test hooks of ctx, or nil.
func hooksOf(ctx context.Context) *testHooks {
	h, _ := ctx.Value(testHooksKey{}).(*testHooks)
	return h
}
