package serde

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/hamba/avro/v2"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/idemhq/idem/handler"
)

// EncodeJSON encodes doc, one JSON document, in Confluent's wire format
// with schema s, without a Go type: what `idem produce --schema-subject`
// does with each line.
//   - AVRO: doc is Avro's JSON encoding (a union's value as
//     {"type": value}) or plain JSON (a nullable union's value bare, a
//     union's first branch that fits); timestamps and dates may be numbers
//     or RFC 3339 strings.
//   - PROTOBUF: doc is the proto3 JSON mapping of message (its full or
//     short name; "" is the file's first message).
//   - JSON: doc must satisfy the JSON Schema; it is written compacted.
//
// An error says which field does not fit; it is handler.Permanent (the
// document never will).
func (r *Registry) EncodeJSON(ctx context.Context, s *Schema, message string, doc []byte) ([]byte, error) {
	b, err := encodeJSON(s, message, doc)
	if err != nil {
		return nil, handler.Permanent(fmt.Errorf("serde: encode with schema id %d: %w", s.ID, err))
	}
	return b, nil
}

func encodeJSON(s *Schema, message string, doc []byte) ([]byte, error) {
	switch s.Type {
	case typeAvro:
		sch, err := s.avro()
		if err != nil {
			return nil, err
		}
		dec := json.NewDecoder(bytes.NewReader(doc))
		dec.UseNumber()
		var v any
		if err := dec.Decode(&v); err != nil {
			return nil, fmt.Errorf("not JSON: %w", err)
		}
		native, err := avroNative(sch, v, "")
		if err != nil {
			return nil, err
		}
		body, err := avro.Marshal(sch, native)
		if err != nil {
			return nil, err
		}
		return append(appendHeader(nil, s.ID, nil), body...), nil
	case typeProtobuf:
		md, err := s.protoByName(message)
		if err != nil {
			return nil, err
		}
		m := dynamicpb.NewMessage(md)
		if err := protojson.Unmarshal(doc, m); err != nil {
			return nil, fmt.Errorf("not %s in proto3's JSON mapping: %w", md.FullName(), err)
		}
		index, err := s.protoIndex(md.FullName())
		if err != nil {
			return nil, err
		}
		return proto.MarshalOptions{}.MarshalAppend(appendHeader(nil, s.ID, index), m)
	default:
		if err := s.validateJSON(doc); err != nil {
			return nil, err
		}
		var out bytes.Buffer
		if err := json.Compact(&out, doc); err != nil {
			return nil, err
		}
		return append(appendHeader(nil, s.ID, nil), out.Bytes()...), nil
	}
}

// DecodeJSON decodes value, a record value in Confluent's wire format, to
// JSON for display (a dead letter, a console page), and returns the schema
// it names. Avro values come out as hamba/avro's generic form (records as
// objects, bytes as base64), Protobuf ones in proto3's JSON mapping, JSON
// ones as they are. Its errors are Codec.Decode's.
func (r *Registry) DecodeJSON(ctx context.Context, value []byte) ([]byte, *Schema, error) {
	id, body, err := header(value)
	if err != nil {
		return nil, nil, err
	}
	s, err := r.SchemaByID(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	out, err := decodeJSON(s, body)
	if err != nil {
		return nil, s, decodeErr(id, err)
	}
	return out, s, nil
}

func decodeJSON(s *Schema, body []byte) ([]byte, error) {
	switch s.Type {
	case typeAvro:
		sch, err := s.avro()
		if err != nil {
			return nil, err
		}
		var v any
		if err := avroUnmarshal(sch, body, &v); err != nil {
			return nil, err
		}
		return json.Marshal(v)
	case typeProtobuf:
		md, payload, err := s.protoMessage(body)
		if err != nil {
			return nil, err
		}
		m := dynamicpb.NewMessage(md)
		if err := proto.Unmarshal(payload, m); err != nil {
			return nil, fmt.Errorf("the Protobuf payload does not decode as %s: %w", md.FullName(), err)
		}
		return protojson.Marshal(m)
	default:
		if err := s.validateJSON(body); err != nil {
			return nil, err
		}
		return body, nil
	}
}

// protoByName finds the message named name (full or short) in s, or its
// first message when name is "".
func (s *Schema) protoByName(name string) (protoreflect.MessageDescriptor, error) {
	fd, err := s.protoFile()
	if err != nil {
		return nil, err
	}
	if name == "" {
		if fd.Messages().Len() == 0 {
			return nil, fmt.Errorf("schema id %d has no message", s.ID)
		}
		return fd.Messages().Get(0), nil
	}
	if md := fd.Messages().ByName(protoreflect.Name(name)); md != nil {
		return md, nil
	}
	if md, ok := findMessage(fd.Messages(), protoreflect.FullName(strings.TrimPrefix(name, "."))); ok {
		return md, nil
	}
	return nil, fmt.Errorf("schema id %d has no message %q", s.ID, name)
}

func findMessage(msgs protoreflect.MessageDescriptors, name protoreflect.FullName) (protoreflect.MessageDescriptor, bool) {
	for i := range msgs.Len() {
		md := msgs.Get(i)
		if md.FullName() == name {
			return md, true
		}
		if d, ok := findMessage(md.Messages(), name); ok {
			return d, true
		}
	}
	return nil, false
}

// avroNative converts v, decoded from JSON with UseNumber, to the Go value
// hamba/avro encodes with schema sch. path names the field, for errors.
func avroNative(sch avro.Schema, v any, path string) (any, error) {
	at := func(format string, args ...any) error {
		where := path
		if where == "" {
			where = "the document"
		}
		return fmt.Errorf("%s: %s", where, fmt.Sprintf(format, args...))
	}
	switch s := sch.(type) {
	case *avro.RefSchema:
		return avroNative(s.Schema(), v, path)
	case *avro.RecordSchema:
		obj, ok := v.(map[string]any)
		if !ok {
			return nil, at("want an object for record %s, got %s", s.FullName(), jsonKind(v))
		}
		out := make(map[string]any, len(obj))
		for _, f := range s.Fields() {
			fv, ok := obj[f.Name()]
			if !ok {
				continue // hamba/avro writes the field's default, or says it has none
			}
			n, err := avroNative(f.Type(), fv, join(path, f.Name()))
			if err != nil {
				return nil, err
			}
			out[f.Name()] = n
		}
		return out, nil
	case *avro.ArraySchema:
		arr, ok := v.([]any)
		if !ok {
			return nil, at("want an array, got %s", jsonKind(v))
		}
		out := make([]any, len(arr))
		for i, e := range arr {
			n, err := avroNative(s.Items(), e, fmt.Sprintf("%s[%d]", path, i))
			if err != nil {
				return nil, err
			}
			out[i] = n
		}
		return out, nil
	case *avro.MapSchema:
		obj, ok := v.(map[string]any)
		if !ok {
			return nil, at("want an object for a map, got %s", jsonKind(v))
		}
		out := make(map[string]any, len(obj))
		for k, e := range obj {
			n, err := avroNative(s.Values(), e, join(path, k))
			if err != nil {
				return nil, err
			}
			out[k] = n
		}
		return out, nil
	case *avro.UnionSchema:
		return avroUnion(s, v, path)
	case *avro.EnumSchema:
		str, ok := v.(string)
		if !ok {
			return nil, at("want a string (a symbol of enum %s), got %s", s.FullName(), jsonKind(v))
		}
		return str, nil
	case *avro.FixedSchema:
		str, ok := v.(string)
		if !ok {
			return nil, at("want a string for fixed %s, got %s", s.FullName(), jsonKind(v))
		}
		return latin1(str), nil
	case *avro.PrimitiveSchema:
		return avroPrimitive(s, v, at)
	}
	return nil, at("unsupported Avro schema %s", sch.Type())
}

// avroUnion converts v for a union: null, Avro's JSON encoding
// {"branch": value}, a nullable union's bare value, or the first branch
// that fits.
func avroUnion(s *avro.UnionSchema, v any, path string) (any, error) {
	nullable := false
	for _, t := range s.Types() {
		if t.Type() == avro.Null {
			nullable = true
		}
	}
	if v == nil {
		if nullable {
			return nil, nil
		}
		return nil, fmt.Errorf("%s: null is not a branch of the union", orDoc(path))
	}
	// hamba/avro takes a nullable union's value bare, any other union's as
	// map[branch name]value.
	simple := nullable && len(s.Types()) == 2
	wrap := func(t avro.Schema, n any) any {
		if simple {
			return n
		}
		return map[string]any{branchName(t): n}
	}
	if obj, ok := v.(map[string]any); ok && len(obj) == 1 {
		for k, e := range obj {
			for _, t := range s.Types() {
				if branchName(t) == k {
					n, err := avroNative(t, e, path)
					if err != nil {
						return nil, err
					}
					return wrap(t, n), nil
				}
			}
		}
	}
	var errs []error
	for _, t := range s.Types() {
		if t.Type() == avro.Null {
			continue
		}
		n, err := avroNative(t, v, path)
		if err == nil {
			return wrap(t, n), nil
		}
		errs = append(errs, err)
	}
	return nil, fmt.Errorf("%s: fits no branch of the union: %w", orDoc(path), errors.Join(errs...))
}

// branchName is the name Avro's JSON encoding gives a union branch.
func branchName(t avro.Schema) string {
	if n, ok := t.(avro.NamedSchema); ok {
		return n.FullName()
	}
	if r, ok := t.(*avro.RefSchema); ok {
		return r.Schema().FullName()
	}
	return string(t.Type())
}

func avroPrimitive(s *avro.PrimitiveSchema, v any, at func(string, ...any) error) (any, error) {
	logical := ""
	if ls := s.Logical(); ls != nil {
		logical = string(ls.Type())
	}
	num, isNum := v.(json.Number)
	str, isStr := v.(string)
	switch s.Type() {
	case avro.Null:
		if v != nil {
			return nil, at("want null, got %s", jsonKind(v))
		}
		return nil, nil
	case avro.Boolean:
		b, ok := v.(bool)
		if !ok {
			return nil, at("want true or false, got %s", jsonKind(v))
		}
		return b, nil
	case avro.String:
		if !isStr {
			return nil, at("want a string, got %s", jsonKind(v))
		}
		return str, nil
	case avro.Bytes:
		if !isStr {
			return nil, at("want a string (bytes), got %s", jsonKind(v))
		}
		return latin1(str), nil
	case avro.Float, avro.Double:
		if !isNum {
			return nil, at("want a number, got %s", jsonKind(v))
		}
		f, err := num.Float64()
		if err != nil {
			return nil, at("%v", err)
		}
		if s.Type() == avro.Float {
			return float32(f), nil
		}
		return f, nil
	case avro.Int, avro.Long:
		switch {
		case isStr && (logical == string(avro.Date) || strings.HasPrefix(logical, "timestamp") || strings.HasPrefix(logical, "local-timestamp")):
			t, err := time.Parse(time.RFC3339Nano, str)
			if err != nil && logical == string(avro.Date) {
				t, err = time.Parse(time.DateOnly, str)
			}
			if err != nil {
				return nil, at("want an RFC 3339 time for %s: %v", logical, err)
			}
			return t.UTC(), nil
		case !isNum:
			return nil, at("want an integer, got %s", jsonKind(v))
		}
		n, err := num.Int64()
		if err != nil {
			return nil, at("want an integer: %v", err)
		}
		switch logical {
		case string(avro.Date):
			return time.Unix(n*86400, 0).UTC(), nil
		case string(avro.TimestampMillis), string(avro.LocalTimestampMillis):
			return time.UnixMilli(n).UTC(), nil
		case string(avro.TimestampMicros), string(avro.LocalTimestampMicros):
			return time.UnixMicro(n).UTC(), nil
		case string(avro.TimeMillis):
			return time.Duration(n) * time.Millisecond, nil
		case string(avro.TimeMicros):
			return time.Duration(n) * time.Microsecond, nil
		}
		if s.Type() == avro.Int {
			if n < math.MinInt32 || n > math.MaxInt32 {
				return nil, at("%d does not fit an Avro int", n)
			}
			return int(n), nil
		}
		return n, nil
	}
	return nil, at("unsupported Avro type %s", s.Type())
}

// latin1 turns Avro's JSON encoding of bytes (one code point per byte) into
// bytes; a code point above 255 is kept as its UTF-8 bytes.
func latin1(s string) []byte {
	out := make([]byte, 0, len(s))
	for _, r := range s {
		if r < 256 {
			out = append(out, byte(r))
		} else {
			out = append(out, string(r)...)
		}
	}
	return out
}

func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case json.Number:
		return "a number"
	case string:
		return "a string"
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("%T", v)
}

func join(path, field string) string {
	if path == "" {
		return field
	}
	return path + "." + field
}

func orDoc(path string) string {
	if path == "" {
		return "the document"
	}
	return path
}
