package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/pflag"

	"github.com/idemhq/idem/serde"
)

// schemaOpts are idem produce's flags for writing each line in Confluent's
// wire format with a schema of the registry.
type schemaOpts struct {
	subject, message, registry string
	id                         int
}

func addSchemaFlags(f *pflag.FlagSet, o *schemaOpts) {
	f.StringVar(&o.subject, "schema-subject", "", "encode each line, a JSON document, with the latest schema of this registry subject (Avro, Protobuf or JSON Schema, in Confluent's wire format)")
	f.IntVar(&o.id, "schema-id", 0, "encode each line with the schema of this registry id instead")
	f.StringVar(&o.message, "schema-message", "", "Protobuf only: the message each line is (full or short name; default the schema's first)")
	f.StringVar(&o.registry, "registry-url", "", "the schema registry's Confluent-compatible API (env SCHEMA_REGISTRY_URL); basic auth from IDEM_REGISTRY_USER and IDEM_REGISTRY_PASSWORD, a token from IDEM_REGISTRY_TOKEN")
}

// encodeLines replaces each line's value, a JSON document, by its encoding
// with the schema o names; without --schema-subject or --schema-id it
// returns lines as they are. A line that does not fit stops everything
// before anything is sent, naming the line.
func (a *app) encodeLines(ctx context.Context, o schemaOpts, lines []line) ([]line, error) {
	switch {
	case o.subject == "" && o.id == 0:
		if o.message != "" {
			return nil, errors.New("--schema-message needs --schema-subject or --schema-id")
		}
		return lines, nil
	case o.subject != "" && o.id != 0:
		return nil, errors.New("give --schema-subject (its latest schema) or --schema-id, not both")
	case o.id < 0:
		return nil, fmt.Errorf("--schema-id %d: must be a registry id (> 0)", o.id)
	}
	url := o.registry
	if url == "" {
		url = a.env("SCHEMA_REGISTRY_URL")
	}
	if url == "" {
		return nil, errors.New("--schema-subject and --schema-id need the registry: give --registry-url or set SCHEMA_REGISTRY_URL (make services writes it)")
	}
	reg, err := a.newRegistry(url)
	if err != nil {
		return nil, err
	}
	var s *serde.Schema
	if o.subject != "" {
		s, err = reg.Latest(ctx, o.subject)
	} else {
		s, err = reg.SchemaByID(ctx, o.id)
	}
	if err != nil {
		return nil, fmt.Errorf("schema: nothing produced: %w", err)
	}
	out := make([]line, len(lines))
	for i, l := range lines {
		v, err := reg.EncodeJSON(ctx, s, o.message, l.value)
		if err != nil {
			return nil, fmt.Errorf("line %d does not fit schema id %d (%s): nothing produced: %w", l.n, s.ID, s.Type, err)
		}
		l.value = v
		out[i] = l
	}
	return out, nil
}
