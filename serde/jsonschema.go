package serde

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// jsonBase is the base URL the JSON Schemas of a Registry are compiled
// under; a reference named "other.json" is added as jsonBase+"other.json",
// which is what a relative $ref resolves to. Nothing is ever fetched from
// it: the compiler loads no remote document.
const jsonBase = "https://schemas.idem.invalid/"

// JSONSchema returns a Codec for JSON records validated with JSON Schema
// (github.com/santhosh-tekuri/jsonschema/v6: drafts 4 to 2020-12, the draft
// a schema's $schema names, 2020-12 without one) and decoded into T with
// encoding/json. Decode validates the document against the writer's schema
// (a document it rejects is a decode error) before it unmarshals it; Encode
// marshals v and validates it against the schema it writes with.
func JSONSchema[T any](reg *Registry, opts Options) (*Codec[T], error) {
	c := &Codec[T]{reg: reg, opts: opts, format: typeJSON}
	c.decode = func(s *Schema, body []byte, v *T, _ *any) error {
		if err := s.validateJSON(body); err != nil {
			return err
		}
		if err := json.Unmarshal(body, v); err != nil {
			return fmt.Errorf("the JSON document does not unmarshal into %T: %w", *v, err)
		}
		return nil
	}
	c.encode = func(s *Schema, v T) ([]byte, error) {
		b, err := json.Marshal(v)
		if err != nil {
			return nil, err
		}
		if err := s.validateJSON(b); err != nil {
			return nil, err
		}
		return append(appendHeader(make([]byte, 0, 5+len(b)), s.ID, nil), b...), nil
	}
	return c, nil
}

// jsonSchema returns s compiled as a JSON Schema, with the schemas it
// references added under their names.
func (s *Schema) jsonSchema() (*jsonschema.Schema, error) {
	s.once.Do(func() {
		if s.Type != typeJSON {
			s.err = fmt.Errorf("schema id %d is %s, not JSON", s.ID, s.Type)
			return
		}
		c := jsonschema.NewCompiler()
		for _, r := range s.refs {
			doc, err := jsonschema.UnmarshalJSON(strings.NewReader(r.text))
			if err == nil {
				err = c.AddResource(jsonBase+r.name, doc)
			}
			if err != nil {
				s.err = fmt.Errorf("the referenced schema %q: %w", r.name, err)
				return
			}
		}
		name := jsonBase + "idem-schema-" + strconv.Itoa(s.ID) + ".json"
		doc, err := jsonschema.UnmarshalJSON(strings.NewReader(s.Text))
		if err == nil {
			err = c.AddResource(name, doc)
		}
		var sch *jsonschema.Schema
		if err == nil {
			sch, err = c.Compile(name)
		}
		if err != nil {
			s.err = fmt.Errorf("the writer's JSON Schema does not compile: %w", err)
			return
		}
		s.parsed = sch
	})
	if s.err != nil {
		return nil, s.err
	}
	return s.parsed.(*jsonschema.Schema), nil
}

// validateJSON checks that doc is JSON its schema accepts.
func (s *Schema) validateJSON(doc []byte) error {
	sch, err := s.jsonSchema()
	if err != nil {
		return err
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
	if err != nil {
		return fmt.Errorf("the payload is not JSON: %w", err)
	}
	if err := sch.Validate(inst); err != nil {
		return fmt.Errorf("the document breaks its JSON Schema: %w", err)
	}
	return nil
}
