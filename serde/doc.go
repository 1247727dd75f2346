// Package serde reads and writes Kafka record values in Confluent's wire
// format — Avro, Protobuf and JSON Schema, with their schemas in a schema
// registry — so that a handler gets a decoded value instead of bytes.
//
//	reg, err := serde.NewRegistry(serde.RegistryConfig{URL: os.Getenv("SCHEMA_REGISTRY_URL")})
//	if err != nil {
//		log.Fatal(err)
//	}
//	payments, err := serde.Avro[Payment](reg, serde.Options{Subject: "payments-value"})
//	if err != nil {
//		log.Fatal(err)
//	}
//	// p is decoded; m has the headers, the key and Origin().
//	h = handler.Typed(payments.Decode, func(ctx context.Context, p Payment, m *handler.Message) error {
//		return bank.Charge(ctx, p)
//	})
//
// # The wire format
//
// Byte 0 is the magic byte 0; bytes 1–4 the schema's registry id,
// big-endian; for Protobuf, the path of the record's message in the
// schema's file follows (a count and the indexes, zigzag varints; a single
// 0 byte stands for [0], the first message); then the payload: Avro's
// binary encoding, Protobuf's, or JSON text. A Codec reads the id, fetches
// the writer's schema once per id from the Registry, and decodes with it:
//   - Avro (Avro, github.com/hamba/avro/v2): into a struct with avro tags.
//     With Options.Schema (the reader's schema) each writer's schema is
//     resolved into the reader's, so a service with a newer compatible
//     schema reads old records.
//   - Protobuf (Protobuf, google.golang.org/protobuf): into a generated
//     message type; the writer's .proto text is compiled
//     (github.com/bufbuild/protocompile) to check that the record's message
//     is the handler's.
//   - JSON Schema (JSONSchema, github.com/santhosh-tekuri/jsonschema/v6):
//     validated against the writer's schema, then unmarshalled with
//     encoding/json.
//
// Registry.EncodeJSON and Registry.DecodeJSON do the same without a Go
// type, for tools (`idem produce --schema-subject`) and for display.
//
// # What can go wrong
//
// Every error is one of two kinds, and the consumer acts on the kind:
//   - The record cannot be read: not in the wire format (wrong magic byte,
//     shorter than 5 bytes), a schema id the registry does not know, a
//     payload that does not decode with its schema (truncated, corrupt), a
//     Protobuf message index the schema does not have or a message that is
//     not the handler's, a writer's schema the reader's cannot resolve, a
//     document its JSON Schema rejects. That is handler.Decode wrapping a
//     *DecodeError (with the schema id when known): consumer.Run
//     dead-letters the record at once, kind "decode", its bytes unchanged.
//   - The registry cannot answer (refused, timed out, 5xx, 401, 403, 429):
//     an *UnavailableError. It wraps a *breaker.OpenError, so consumer.Run
//     treats it as a dependency that is down: it rolls back, spends no
//     attempt, dead-letters nothing, pauses for the error's RetryAfter
//     (RegistryConfig.OutagePause, 2s) and then tries the same record
//     again. Only records whose schema is not cached yet need the registry.
//
// # Why franz-go's pkg/sr
//
// The Registry's HTTP layer is github.com/twmb/franz-go/pkg/sr, a module of
// its own that does not pull in the franz-go Kafka client: it speaks the
// whole Confluent REST API (ids, subjects, references, registration), does
// basic and bearer authentication, TLS and several URLs, and has the wire
// format's header codec (ConfluentHeader, message indexes included). What
// it does not do, and this package adds: caching (an id's schema never
// changes, so it is fetched once; concurrent misses share one request; a
// subject's latest version is kept for SubjectTTL), references resolved for
// the schema compilers, and the sorting of failures into "the record is
// bad" and "the registry is down" that the consumer's classification
// needs. Its serde (sr.Serde) needs each Go type registered against an id
// beforehand, which does not fit a consumer that meets ids as records
// arrive, so the codecs here are our own.
package serde
