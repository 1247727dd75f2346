package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/serde"
)

// schemaNote says which registry schema a shown value was decoded with
// (ID, Subject, Type), or why a value in the registry's wire format was
// not (Err): it is then shown as its bytes.
type schemaNote struct {
	ID      int
	Subject string
	Type    string
	Err     error
}

// newRegistry is a schema registry client of url, with basic auth from
// IDEM_REGISTRY_USER and IDEM_REGISTRY_PASSWORD or a token from
// IDEM_REGISTRY_TOKEN.
func (a *app) newRegistry(url string) (*serde.Registry, error) {
	return serde.NewRegistry(serde.RegistryConfig{URL: url,
		Username: a.env("IDEM_REGISTRY_USER"), Password: a.env("IDEM_REGISTRY_PASSWORD"), BearerToken: a.env("IDEM_REGISTRY_TOKEN")})
}

// registry is the dlq commands' schema registry (--registry-url, or
// SCHEMA_REGISTRY_URL), made once; nil without one.
func (a *app) registry() (*serde.Registry, error) {
	if a.registryURL == "" || a.reg != nil {
		return a.reg, nil
	}
	reg, err := a.newRegistry(a.registryURL)
	if err != nil {
		return nil, fmt.Errorf("--registry-url: %w", err)
	}
	a.reg = reg
	return reg, nil
}

// decodeValue returns v decoded to JSON when it is in a schema registry's
// wire format (its first byte 0, then a schema id) and the dlq commands
// have a registry, with the schema it was decoded with; a value in that
// format that does not decode keeps its bytes (dec nil) and the note says
// why. A value in no such format, or no registry: nil, nil.
func (a *app) decodeValue(ctx context.Context, v []byte) (dec []byte, note *schemaNote) {
	reg, err := a.registry()
	if err != nil || reg == nil || len(v) < 5 || v[0] != 0 {
		return nil, nil
	}
	dec, s, err := reg.DecodeJSON(ctx, v)
	if err != nil {
		var de *serde.DecodeError
		if errors.As(err, &de) && de.SchemaID == 0 {
			return nil, nil // not in the wire format after all
		}
		return nil, &schemaNote{Err: err}
	}
	note = &schemaNote{ID: s.ID, Type: s.Type}
	note.Subject, _ = reg.Subject(&handler.Message{Value: v})
	return dec, note
}

// maskable returns v as --mask sees it: decoded to JSON when it is a
// registry value (decodeValue), so that the masked paths, and the values
// they hold in free text, are found in the decoded fields.
func (a *app) maskable(ctx context.Context, v []byte) []byte {
	if dec, _ := a.decodeValue(ctx, v); dec != nil {
		return dec
	}
	return v
}

// heading is the payload's heading in show's text.
func (n *schemaNote) heading() string {
	switch {
	case n == nil:
		return "payload:"
	case n.Err != nil:
		return "payload (not decoded: " + text(oneLine(n.Err.Error())) + "):"
	case n.Subject != "":
		return fmt.Sprintf("payload (decoded with schema id %d, subject %s, %s):", n.ID, text(n.Subject), n.Type)
	}
	return fmt.Sprintf("payload (decoded with schema id %d, %s):", n.ID, n.Type)
}

// json is the note in show --json: {"id", "subject", "type"} or
// {"error"}; nil without one.
func (n *schemaNote) json() any {
	switch {
	case n == nil:
		return nil
	case n.Err != nil:
		return map[string]any{"error": n.Err.Error()}
	}
	return map[string]any{"id": n.ID, "subject": n.Subject, "type": n.Type}
}
