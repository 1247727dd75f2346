package consumer

import (
	"context"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/internal/forward"
)

// testHooks are points tests can observe or act at, carried by Run's ctx
// (the _export_test.go files): nil in production.
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
	// sendFault is called before each try of a forward's send (runner.send);
	// an error it returns is that try's result, as a send refused before it
	// reached the broker would return it (the transaction stays intact).
	sendFault func(rec forward.Record) error
	// beforeSend is the transaction owner's BeforeSend hook; failed returns
	// the owner's Failed channel.
	beforeSend func(rec forward.Record, failed func() <-chan struct{})
	// afterSend is the transaction owner's AfterSend hook.
	afterSend func(rec forward.Record, err error)
	// lagNow is the lag watcher's clock (lag.go): what it compares due times
	// with.
	lagNow func() time.Time
	// dispatched is called by the transactional producer's dispatcher for
	// each record it takes (a sarama.ProducerInterceptor): the record has
	// passed its check that a transaction is open.
	dispatched func(msg *sarama.ProducerMessage)
}

// interceptor is a sarama.ProducerInterceptor calling f.
type interceptor func(msg *sarama.ProducerMessage)

func (f interceptor) OnSend(msg *sarama.ProducerMessage) { f(msg) }

type testHooksKey struct{}

// hooksOf returns the test hooks of ctx, or nil.
func hooksOf(ctx context.Context) *testHooks {
	h, _ := ctx.Value(testHooksKey{}).(*testHooks)
	return h
}
