package serde

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/idemhq/idem/handler"
)

// Options configures a Codec. The zero value decodes; Encode needs Subject.
type Options struct {
	// Subject is the registry subject Encode writes under, by Confluent's
	// default naming "<topic>-value". Encode uses Schema registered under it
	// when Schema is set, else its latest version. Decode does not use it:
	// a record names its writer's schema by id.
	// Default: "" (Encode fails).
	Subject string

	// Schema is the codec's own schema text, when the format has one
	// besides T:
	//   - Avro: the reader's schema. Decode resolves each writer's schema
	//     into it (Avro schema resolution: added fields take their
	//     defaults, removed ones are skipped, promotions apply), and a
	//     writer's schema it cannot resolve is a decode error. Encode
	//     registers it under Subject (the registry returns the id it
	//     already has) and writes with it. Without it, Decode reads with
	//     the writer's schema, matching fields to T's by their avro tags.
	//   - JSON Schema: registered under Subject for Encode; Decode
	//     validates against the writer's schema.
	//   - Protobuf: the .proto text registered under Subject for Encode;
	//     without it Encode uses Subject's latest version, which must hold
	//     T's message. Decode checks that the record's message is T's.
	// Default: "" (see each format).
	Schema string
}

// Codec decodes record values in Confluent's wire format into T and
// encodes T into them, with the schemas of a Registry. Make one with Avro,
// Protobuf or JSONSchema; it is safe for concurrent use. Its Decode method
// is what handler.Typed and handler.TypedBatch take.
//
// The wire format: byte 0 is the magic byte 0, bytes 1–4 the schema's
// registry id (big-endian), then, for Protobuf only, the path of the
// message in the schema's file as a count and indexes (zigzag varints; a
// single 0 byte stands for the first message, [0]), then the payload.
type Codec[T any] struct {
	reg    *Registry
	opts   Options
	format string // typeAvro, typeProtobuf or typeJSON
	decode func(s *Schema, body []byte, v *T, aux *any) error
	encode func(s *Schema, v T) ([]byte, error)

	mu     sync.Mutex
	writer *Schema // the schema Encode registered (Options.Schema set)

	// last is the writer's schema Decode met last: a topic's records
	// mostly share one, found here without the registry's lock (which
	// every partition's decodes would otherwise take). scratch holds the
	// *decodeScratch[T] Decode borrows.
	last    atomic.Pointer[Schema]
	scratch sync.Pool
}

// decodeScratch is what one Decode borrows, from one pool: the T it
// decodes into, so that the value the caller gets is its only copy, not a
// second allocation, and the format's own reusable state (Avro: its
// reader), which decode keeps in aux.
type decodeScratch[T any] struct {
	v   T
	aux any
}

// Decode decodes m's value into a T. Its errors:
//   - a value that cannot be read (not in the wire format, an unknown
//     schema id, a schema of another format or a message that is not T's,
//     a payload that does not decode or validate, a writer's schema the
//     reader's cannot resolve, a tombstone): handler.Decode wrapping a
//     *DecodeError, dead-lettered at once with its bytes unchanged;
//   - the registry unavailable: an *UnavailableError (wait);
//   - ctx's own error when ctx ends while the schema is fetched.
//
// A schema is fetched once per id; decoding a record whose schema is cached
// makes no request.
func (c *Codec[T]) Decode(ctx context.Context, m *handler.Message) (T, error) {
	var v T
	if m.Value == nil {
		return v, handler.Decode(&DecodeError{Err: errors.New("a tombstone (null value) has no schema")})
	}
	id, body, err := header(m.Value)
	if err != nil {
		return v, err
	}
	s := c.last.Load()
	if s == nil || s.ID != id {
		if s, err = c.reg.SchemaByID(ctx, id); err != nil {
			return v, err
		}
		c.last.Store(s)
	}
	if s.Type != c.format {
		err = fmt.Errorf("the record's schema is %s, this codec reads %s", s.Type, c.format)
	} else {
		p, _ := c.scratch.Get().(*decodeScratch[T])
		if p == nil {
			p = new(decodeScratch[T])
		}
		err = c.decode(s, body, &p.v, &p.aux)
		v, p.v = p.v, v // v is the zero T here: the scratch value goes back cleared
		c.scratch.Put(p)
	}
	if err != nil {
		return v, handler.Decode(&DecodeError{SchemaID: id, Subject: c.reg.subjectOf(ctx, id), Err: err})
	}
	return v, nil
}

// Encode encodes v in the wire format with the writer schema of Options
// (Options.Schema registered under Options.Subject, else the subject's
// latest version). Its errors: Options.Subject unset, a value the schema
// cannot encode (handler.Permanent: it never will), the registry
// unavailable (*UnavailableError), or the registry's refusal of the schema.
func (c *Codec[T]) Encode(ctx context.Context, v T) ([]byte, error) {
	s, err := c.writerSchema(ctx)
	if err != nil {
		return nil, err
	}
	b, err := c.encode(s, v)
	if err != nil {
		return nil, handler.Permanent(fmt.Errorf("serde: encode with schema id %d (subject %q): %w", s.ID, c.opts.Subject, err))
	}
	return b, nil
}

// Key returns a key extractor for consumer.Config.KeyFunc (assign it: the
// types match) that decodes the value and returns field of it: a
// schema-encoded payload can then carry the idempotency key, as
// consumer.JSONField lets a JSON one. An empty result means no key (kind
// missing-key); a record that does not decode keeps kind decode.
//
// A KeyFunc has no context: the decode runs on context.Background, bounded
// by RegistryConfig.Timeout per request. The value is decoded twice per
// message (here and in the handler); a schema fetched here is cached for
// the handler.
//
// A registry outage met here (an *UnavailableError, only for a schema id
// not yet cached) makes consumer.Run wait for the registry, spending no
// attempt, and extract the key again once it is back.
func (c *Codec[T]) Key(field func(v T) string) func(m *handler.Message) (string, error) {
	return func(m *handler.Message) (string, error) {
		v, err := c.Decode(context.Background(), m)
		if err != nil {
			return "", err
		}
		return field(v), nil
	}
}

// writerSchema is the schema Encode writes with.
func (c *Codec[T]) writerSchema(ctx context.Context) (*Schema, error) {
	if c.opts.Subject == "" {
		return nil, fmt.Errorf("serde: Encode needs Options.Subject: the subject to write under (e.g. \"<topic>-value\")")
	}
	if c.opts.Schema == "" {
		return c.reg.Latest(ctx, c.opts.Subject)
	}
	c.mu.Lock()
	s := c.writer
	c.mu.Unlock()
	if s != nil {
		return s, nil
	}
	s, err := c.reg.Register(ctx, c.opts.Subject, c.format, c.opts.Schema)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.writer = s
	c.mu.Unlock()
	return s, nil
}

// confluent is Confluent's wire format header, from pkg/sr.
var confluent sr.ConfluentHeader

// header reads the magic byte and the schema id of a value.
func header(b []byte) (id int, body []byte, err error) {
	if len(b) == 0 || b[0] != 0 {
		first := "no byte"
		if len(b) > 0 {
			first = fmt.Sprintf("0x%02x", b[0])
		}
		return 0, nil, handler.Decode(&DecodeError{Err: fmt.Errorf("not in Confluent's wire format: the first byte is %s, want the magic byte 0x00", first)})
	}
	id, body, err = confluent.DecodeID(b)
	if err != nil {
		return 0, nil, handler.Decode(&DecodeError{Err: fmt.Errorf("not in Confluent's wire format: %d bytes, want at least 5 (magic byte and schema id)", len(b))})
	}
	return id, body, nil
}

// appendHeader appends the magic byte, id and, for Protobuf, the message
// index path to b.
func appendHeader(b []byte, id int, index []int) []byte {
	b, _ = confluent.AppendEncode(b, id, index) // never fails
	return b
}

// decodeErr is a decode failure of the record written with schema id.
func decodeErr(id int, err error) error {
	return handler.Decode(&DecodeError{SchemaID: id, Err: err})
}
