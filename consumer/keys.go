package consumer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/idemhq/idem/handler"
)

// KeyFunc derives the idempotency key of a message: the identity of the
// business event, the same for every copy of it (a producer's retry, a
// redelivery, a replay). Returning "" or an error means the message has no
// valid key; Config.MissingKey then decides (by default the message is
// dead-lettered with idem-error-kind "missing-key" and the handler is not
// called). A KeyFunc is called from several goroutines at once and must not
// keep m. A panic in it is recovered and treated as an error.
//
// The built-in extractors are HeaderKey (the default, header
// "idempotency-key"), RecordKey, JSONField and FirstOf. Their errors name
// them, e.g. `JSONField("order.id"): no field "order"`, and so does the WARN
// Run logs when the first records of a topic all miss their key.
type KeyFunc func(m *handler.Message) (string, error)

// String names the function, for logs: "consumer.HeaderKey",
// "consumer.JSONField", "main.orderKey"; "func literal in main.main" for an
// anonymous function. The arguments of an extractor (a header name, a path)
// are not part of the name; its errors carry them. (The built-in
// constructors are marked noinline so that their closures keep their names.)
func (f KeyFunc) String() string {
	if f == nil {
		return "<nil>"
	}
	fn := runtime.FuncForPC(reflect.ValueOf(f).Pointer())
	if fn == nil {
		return "KeyFunc"
	}
	name := fn.Name()
	if i := strings.LastIndexByte(name, '/'); i >= 0 {
		name = name[i+1:]
	}
	name = strings.TrimSuffix(name, "-fm")
	literal := false
	for {
		i := strings.LastIndexByte(name, '.')
		if i < 0 || !strings.HasPrefix(name[i+1:], "func") {
			break
		}
		name, literal = name[:i], true
	}
	switch name {
	case "consumer.HeaderKey", "consumer.RecordKey", "consumer.JSONField", "consumer.FirstOf":
		return name // a built-in extractor's closure
	}
	if literal {
		return "func literal in " + name
	}
	return name
}

// HeaderKey returns a KeyFunc reading the last header named name (header
// names are case-sensitive). A message without that header, or with an empty
// value, has no key.
//
//go:noinline
func HeaderKey(name string) KeyFunc {
	return func(m *handler.Message) (string, error) {
		v, ok := m.Header(name)
		if !ok {
			return "", fmt.Errorf("HeaderKey(%q): no header %q", name, name)
		}
		if len(v) == 0 {
			return "", fmt.Errorf("HeaderKey(%q): header %q is empty", name, name)
		}
		return string(v), nil
	}
}

// RecordKey returns a KeyFunc using the Kafka record key as the idempotency
// key. Use it only when the producer's record key identifies the event (an
// event id), not an entity that receives many events (an order id with many
// status changes would make every event after the first a duplicate). A
// record with an empty or null key has no key.
//
//go:noinline
func RecordKey() KeyFunc {
	return func(m *handler.Message) (string, error) {
		if len(m.Key) == 0 {
			return "", errors.New("RecordKey(): the record has no key")
		}
		return string(m.Key), nil
	}
}

// JSONField returns a KeyFunc reading the field at path in the record value,
// which must be a JSON object. path is dotted: "id" is the top-level field
// "id", "meta.event_id" the field "event_id" of the object "meta". The field
// must be a non-empty string or a number; a number's key is its JSON text
// exactly as written ("42", "1.5e3"). A path that does not exist, null, an
// empty string, a boolean, an object or an array gives an error naming the
// path, so the message has no key (kind missing-key). A value that is not
// JSON, or whose parents on the path are not JSON objects, is a
// handler.Decode error (kind decode): the record itself is malformed.
//
// The value is parsed once per message (and again by your handler if it
// decodes the value too): about 4µs for a 200-byte value on a 2-core machine
// (BenchmarkKeyExtractors), against 20ns for HeaderKey; cheap next to a
// database round trip, noticeable only with a memory store.
//
//go:noinline
func JSONField(path string) KeyFunc {
	parts := strings.Split(path, ".")
	name := fmt.Sprintf("JSONField(%q)", path)
	var pathErr error
	if path == "" || strings.Contains("."+path+".", "..") {
		pathErr = fmt.Errorf("%s: invalid path: want dotted field names such as \"meta.event_id\"", name)
	}
	return func(m *handler.Message) (string, error) {
		if pathErr != nil {
			return "", pathErr
		}
		raw := json.RawMessage(m.Value)
		for i, p := range parts {
			var obj map[string]json.RawMessage
			if err := json.Unmarshal(raw, &obj); err != nil || obj == nil {
				where := "the value"
				if i > 0 {
					where = fmt.Sprintf("%q", strings.Join(parts[:i], "."))
				}
				var syntax *json.SyntaxError
				if errors.As(err, &syntax) {
					return "", handler.Decode(fmt.Errorf("%s: %s is not valid JSON: %w", name, where, err))
				}
				return "", handler.Decode(fmt.Errorf("%s: %s is not a JSON object", name, where))
			}
			v, ok := obj[p]
			if !ok {
				return "", fmt.Errorf("%s: no field %q", name, strings.Join(parts[:i+1], "."))
			}
			raw = v
		}
		raw = bytes.TrimSpace(raw)
		switch {
		case len(raw) > 0 && raw[0] == '"':
			var s string
			if err := json.Unmarshal(raw, &s); err != nil {
				return "", fmt.Errorf("%s: %w", name, err)
			}
			if s == "" {
				return "", fmt.Errorf("%s: the field is an empty string", name)
			}
			return s, nil
		case len(raw) > 0 && (raw[0] == '-' || (raw[0] >= '0' && raw[0] <= '9')):
			return string(raw), nil
		}
		kind := "null"
		switch {
		case len(raw) > 0 && raw[0] == '{':
			kind = "an object"
		case len(raw) > 0 && raw[0] == '[':
			kind = "an array"
		case len(raw) > 0 && (raw[0] == 't' || raw[0] == 'f'):
			kind = "a boolean"
		}
		return "", fmt.Errorf("%s: the field is %s, want a string or a number", name, kind)
	}
}

// FirstOf returns a KeyFunc trying fs in order and returning the first key
// found (non-empty, without an error). When none finds one, the error lists
// every extractor's reason. FirstOf() with no argument never finds a key.
//
//	consumer.FirstOf(consumer.HeaderKey("idempotency-key"), consumer.JSONField("event_id"))
//
//go:noinline
func FirstOf(fs ...KeyFunc) KeyFunc {
	fs = append([]KeyFunc(nil), fs...)
	return func(m *handler.Message) (string, error) {
		var reasons []string
		for _, f := range fs {
			if f == nil {
				continue
			}
			k, err := f(m)
			if err == nil && k != "" {
				return k, nil
			}
			if err == nil {
				err = fmt.Errorf("%s: empty key", f)
			}
			reasons = append(reasons, err.Error())
		}
		return "", fmt.Errorf("FirstOf: no key found (%s)", strings.Join(reasons, "; "))
	}
}

// keySample is how many records of a topic Run looks at before it decides
// whether the KeyFunc finds keys there.
const keySample = 10

// keyWatch notices a KeyFunc that finds no key in the first records of a
// topic (typically an existing topic whose producers never set the
// idempotency-key header) and logs one WARN for it: otherwise every record
// would quietly go to the dead-letter topic.
type keyWatch struct {
	mu     sync.Mutex
	topics map[string]*keyTopic
}

type keyTopic struct {
	done    bool
	missing map[[2]int64]bool // partition, offset of the records without a key
}

// observe records whether the source record at (topic, partition, offset)
// had a key (err == nil). Each record counts once, however often it is
// looked at. It returns true exactly once per topic: when the first keySample
// records seen all missed their key.
func (w *keyWatch) observe(topic string, partition int32, offset int64, err error) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.topics == nil {
		w.topics = map[string]*keyTopic{}
	}
	t := w.topics[topic]
	if t == nil {
		t = &keyTopic{missing: map[[2]int64]bool{}}
		w.topics[topic] = t
	}
	if t.done {
		return false
	}
	if err == nil {
		t.done, t.missing = true, nil
		return false
	}
	t.missing[[2]int64{int64(partition), offset}] = true
	if len(t.missing) < keySample {
		return false
	}
	t.done, t.missing = true, nil
	return true
}

// warnNoKeys logs the WARN of keyWatch for topic.
func (r *runner) warnNoKeys(topic string, kf KeyFunc, err error) {
	fate := "each goes to the dead-letter topic (MissingKey: MissingKeyDeadLetter)"
	if r.cfg.MissingKey == MissingKeyUseCoordinates {
		fate = "each is deduplicated by its coordinates only (MissingKey: MissingKeyUseCoordinates)"
	}
	r.log.Warn("idem: the first records of a topic have no idempotency key; "+fate+"; set Config.KeyFunc to where the key is",
		slog.String("topic", topic), slog.Int("records", keySample),
		slog.String("key_func", kf.String()), slog.String("last_error", err.Error()),
		slog.String("fix", "consumer.RecordKey(), consumer.JSONField(\"event_id\"), consumer.FirstOf(...), or MissingKey: consumer.MissingKeyUseCoordinates"))
}

// key derives and checks the idempotency key. It is checked before any
// database call: a key the inbox cannot store, or that would make a poor
// identifier, follows the MissingKey policy with kind invalid-key; a KeyFunc
// error marked handler.Decode (a value that is not JSON under JSONField)
// follows it with kind decode, any other with kind missing-key. A KeyFunc
// that meets a dependency that is down (breaker.IsOpen) waits for it
// (untilUp) and is called again; errStopping: the partition is stopping.
func (w *worker) key(msg *handler.Message, o origin) (string, error) {
	r := w.r
	var k string
	err := w.untilUp(func() (err error) {
		k, err = callKeyFunc(w.rt.keyFunc, msg)
		return err
	})
	if err == errStopping {
		return "", err
	}
	if err != nil && !handler.IsDecode(err) { // a record that does not decode keeps kind decode
		err = &handler.MissingKeyError{Reason: "KeyFunc: " + err.Error()}
	} else if err == nil {
		err = checkKey(k, r.cfg.MaxKeyLength)
	}
	// Once a record of the claim's topic had a key, keyWatch has decided
	// the topic for good: its process-wide lock is not taken again.
	if own := o.topic == w.tp.topic; o.tier == 0 && !w.tier && !(own && w.keyed) {
		if r.keys.observe(o.topic, o.partition, o.offset, err) {
			r.warnNoKeys(o.topic, w.rt.keyFunc, err)
		}
		w.keyed = own && err == nil
	}
	if err == nil {
		return k, nil
	}
	if r.cfg.MissingKey == MissingKeyUseCoordinates {
		return o.topic + "/" + strconv.Itoa(int(o.partition)) + "/" + strconv.FormatInt(o.offset, 10), nil
	}
	return "", err
}

// checkKey validates an idempotency key: not empty, at most max bytes, valid
// UTF-8 and free of NUL bytes (PostgreSQL text rejects both, SQLSTATE 22021).
// The error is a *handler.MissingKeyError; Invalid is set for a key that is
// present but unusable.
func checkKey(k string, max int) error {
	switch {
	case k == "":
		return &handler.MissingKeyError{Reason: "empty or absent"}
	case len(k) > max:
		return &handler.MissingKeyError{Reason: fmt.Sprintf("%d bytes, longer than MaxKeyLength %d", len(k), max), Invalid: true}
	}
	// One scan, eight bytes at a time, of the common key: ASCII without NUL.
	// From the first word with a NUL or a byte ≥ 0x80 on, the two checks
	// below decide (the ASCII before it changes neither answer).
	const lo, hi = 0x0101010101010101, 0x8080808080808080
	for len(k) >= 8 {
		w := uint64(k[0]) | uint64(k[1])<<8 | uint64(k[2])<<16 | uint64(k[3])<<24 |
			uint64(k[4])<<32 | uint64(k[5])<<40 | uint64(k[6])<<48 | uint64(k[7])<<56
		if (w|(w-lo)&^w)&hi != 0 { // a byte ≥ 0x80, or (all below it) a zero byte
			break
		}
		k = k[8:]
	}
	for len(k) > 0 && k[0] != 0 && k[0] < utf8.RuneSelf {
		k = k[1:]
	}
	switch {
	case k == "":
		return nil
	case !utf8.ValidString(k):
		return &handler.MissingKeyError{Reason: "not valid UTF-8", Invalid: true}
	case strings.IndexByte(k, 0) >= 0:
		return &handler.MissingKeyError{Reason: "contains a NUL byte", Invalid: true}
	}
	return nil
}

// callKeyFunc calls f, turning a panic into an error: a KeyFunc that panics
// on one bad payload must not take the consumer down.
func callKeyFunc(f KeyFunc, msg *handler.Message) (k string, err error) {
	defer func() {
		if v := recover(); v != nil {
			k, err = "", fmt.Errorf("panic: %v", v)
		}
	}()
	return f(msg)
}
