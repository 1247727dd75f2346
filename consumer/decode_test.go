package consumer_test

import (
	"testing"
	"time"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/wire"
)

// Issue 18 #15: under JSONField a record whose value is not JSON is
// dead-lettered with kind decode, not missing-key.
func TestJSONFieldNonJSONIsDecode(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	cfg := e.config()
	cfg.KeyFunc = consumer.JSONField("id")
	e.produceLarge(sizeRecord{key: "x", value: []byte("not json")}, sizeRecord{key: "y", value: []byte(`{"id":"y"}`)})
	start(t, cfg, effectHandler())
	e.waitEffect("y", 60*time.Second)
	m := e.onlyDLQRecord(30 * time.Second)
	if got := header(m, wire.HeaderErrorKind); got != string(handler.KindDecode) {
		t.Fatalf("%s = %q, want decode", wire.HeaderErrorKind, got)
	}
}
