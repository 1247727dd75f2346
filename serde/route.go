package serde

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/hamba/avro/v2"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/idemhq/idem/handler"
)

// RecordName returns the name of the record a message's value holds, in a
// schema registry's wire format: what consumer.Config.TypeOf takes to route
// the records of one topic by type (assign the method value:
// TypeOf: registry.RecordName). It is
//   - Avro: the full name of the writer's schema ("shop.OrderPlaced"), or
//     its type for a schema without a name ("string");
//   - Protobuf: the full name of the message the record's index path names
//     ("shop.v1.OrderReturned");
//   - JSON Schema: the schema's "title", else its "$id", else "".
//
// A value not in the wire format, or a schema id the registry does not
// know, is a handler.Decode error (the consumer dead-letters the record,
// kind decode); a registry that is down an *UnavailableError (it waits). A
// schema is fetched once per id, on context.Background bounded by
// RegistryConfig.Timeout, and shared with the codecs.
func (r *Registry) RecordName(m *handler.Message) (string, error) {
	ctx := context.Background()
	id, body, err := header(m.Value)
	if err != nil {
		return "", err
	}
	s, err := r.SchemaByID(ctx, id)
	if err != nil {
		return "", err
	}
	var name string
	if s.Type == typeProtobuf {
		var md protoreflect.MessageDescriptor
		if md, _, err = s.protoMessage(body); err == nil {
			name = string(md.FullName())
		}
	} else {
		name, err = s.recordName()
	}
	if err != nil {
		return "", handler.Decode(&DecodeError{SchemaID: id, Subject: r.subjectOf(ctx, id), Err: err})
	}
	return name, nil
}

// Subject returns a subject the schema of a message's value is registered
// under (the first the registry lists for its id; "" when it lists none),
// for consumer.Config.TypeOf (TypeOf: registry.Subject): with Confluent's
// RecordNameStrategy or TopicRecordNameStrategy a subject names the type.
// It is asked once per id. Its errors are RecordName's.
func (r *Registry) Subject(m *handler.Message) (string, error) {
	id, _, err := header(m.Value)
	if err != nil {
		return "", err
	}
	return r.subjectFor(context.Background(), id)
}

// recordName is RecordName of an Avro or JSON Schema schema, made once.
func (s *Schema) recordName() (string, error) {
	s.nameOnce.Do(func() {
		switch s.Type {
		case typeAvro:
			sch, err := s.avro()
			if err != nil {
				s.nameErr = err
				return
			}
			if n, ok := sch.(avro.NamedSchema); ok {
				s.name = n.FullName()
			} else {
				s.name = string(sch.Type())
			}
		default: // JSON Schema
			var doc struct {
				Title string `json:"title"`
				ID    string `json:"$id"`
			}
			if err := json.Unmarshal([]byte(s.Text), &doc); err != nil {
				s.nameErr = fmt.Errorf("the JSON Schema does not parse: %w", err)
				return
			}
			s.name = doc.Title
			if s.name == "" {
				s.name = doc.ID
			}
		}
	})
	return s.name, s.nameErr
}
