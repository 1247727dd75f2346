package serde

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/bufbuild/protocompile"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// maxIndexes bounds the message index path a record may carry: deeper
// nesting than this is not a real schema, and the bound keeps a corrupt
// count from allocating without limit.
const maxIndexes = 32

// Protobuf returns a Codec for Protobuf records decoded into T, a generated
// message type (a pointer such as *orderspb.Order) of
// google.golang.org/protobuf. Decode reads the record's message index path,
// finds that message in the writer's schema (the .proto text the registry
// holds, compiled with github.com/bufbuild/protocompile, well-known imports
// included), checks that it is T's message (by full name), and unmarshals
// the payload into a new T. Fields the writer has and T lacks are kept as
// unknown fields: Protobuf's own evolution rules apply.
func Protobuf[T proto.Message](reg *Registry, opts Options) (*Codec[T], error) {
	var zero T
	want := zero.ProtoReflect().Descriptor()
	c := &Codec[T]{reg: reg, opts: opts, format: typeProtobuf}
	c.decode = func(s *Schema, body []byte, v *T, _ *any) error {
		md, payload, err := s.protoMessage(body)
		if err != nil {
			return err
		}
		if md.FullName() != want.FullName() {
			return fmt.Errorf("the record is a %s, this codec reads %s", md.FullName(), want.FullName())
		}
		m := zero.ProtoReflect().New().Interface().(T)
		if err := proto.Unmarshal(payload, m); err != nil {
			return fmt.Errorf("the Protobuf payload does not decode as %s: %w", md.FullName(), err)
		}
		*v = m
		return nil
	}
	c.encode = func(s *Schema, v T) ([]byte, error) {
		index, err := s.protoIndex(want.FullName())
		if err != nil {
			return nil, err
		}
		b := appendHeader(nil, s.ID, index)
		return proto.MarshalOptions{}.MarshalAppend(b, v)
	}
	return c, nil
}

// protoFile returns s compiled as a .proto file, with the files it imports
// (its references, then the well-known types).
func (s *Schema) protoFile() (protoreflect.FileDescriptor, error) {
	s.once.Do(func() {
		if s.Type != typeProtobuf {
			s.err = fmt.Errorf("schema id %d is %s, not PROTOBUF", s.ID, s.Type)
			return
		}
		name := "idem-schema-" + strconv.Itoa(s.ID) + ".proto"
		files := map[string]string{name: s.Text}
		for _, r := range s.refs {
			files[r.name] = r.text
		}
		comp := protocompile.Compiler{
			Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{
				Accessor: protocompile.SourceAccessorFromMap(files),
			}),
			MaxParallelism: 1,
		}
		fds, err := comp.Compile(context.Background(), name)
		if err != nil {
			s.err = fmt.Errorf("the writer's .proto schema does not compile: %w", err)
			return
		}
		s.parsed = protoreflect.FileDescriptor(fds[0])
	})
	if s.err != nil {
		return nil, s.err
	}
	return s.parsed.(protoreflect.FileDescriptor), nil
}

// protoMessage reads the message index path at the start of body and
// returns the message of s it names, and the payload after it.
func (s *Schema) protoMessage(body []byte) (protoreflect.MessageDescriptor, []byte, error) {
	fd, err := s.protoFile()
	if err != nil {
		return nil, nil, err
	}
	index, payload, err := confluent.DecodeIndex(body, maxIndexes)
	if err != nil {
		return nil, nil, fmt.Errorf("the message index path does not decode (%d indexes at most): %w", maxIndexes, err)
	}
	var md protoreflect.MessageDescriptor
	msgs := fd.Messages()
	for depth, i := range index {
		if i < 0 || i >= msgs.Len() {
			return nil, nil, fmt.Errorf("message index path %v: no message %d at depth %d (the schema has %d there)", index, i, depth, msgs.Len())
		}
		md = msgs.Get(i)
		msgs = md.Messages()
	}
	if md == nil {
		return nil, nil, errors.New("an empty message index path")
	}
	return md, payload, nil
}

// protoIndex returns the message index path of the message named name in
// s.
func (s *Schema) protoIndex(name protoreflect.FullName) ([]int, error) {
	fd, err := s.protoFile()
	if err != nil {
		return nil, err
	}
	var walk func(msgs protoreflect.MessageDescriptors, path []int) []int
	walk = func(msgs protoreflect.MessageDescriptors, path []int) []int {
		for i := range msgs.Len() {
			md := msgs.Get(i)
			p := append(path[:len(path):len(path)], i)
			if md.FullName() == name {
				return p
			}
			if found := walk(md.Messages(), p); found != nil {
				return found
			}
		}
		return nil
	}
	if p := walk(fd.Messages(), nil); p != nil {
		return p, nil
	}
	return nil, fmt.Errorf("schema id %d has no message %s", s.ID, name)
}
