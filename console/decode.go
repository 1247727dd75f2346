package console

import (
	"context"
	"time"

	"github.com/idemhq/idem/handler"
)

// decodeTimeout bounds the registry requests of one value's decoding (the
// first for each schema id; later ones are cached).
const decodeTimeout = 5 * time.Second

// schemaView names the registry schema a value was decoded with.
type schemaView struct {
	ID      int    `json:"id"`
	Subject string `json:"subject,omitempty"`
	Type    string `json:"type"` // AVRO, PROTOBUF or JSON
}

// decodeValue decodes val, a value in a schema registry's wire format, to
// JSON with Config.Registry. dec is nil when there is no registry or val is
// not in the wire format (its first byte is not 0); err says why a value in
// it did not decode (a schema the registry does not know, a truncated
// value, the registry unavailable): it is then shown as its bytes.
func (s *server) decodeValue(val []byte) (dec []byte, sch *schemaView, err error) {
	if s.cfg.Registry == nil || len(val) < 5 || val[0] != 0 {
		return nil, nil, nil
	}
	ctx, cancel := context.WithTimeout(s.ctx, decodeTimeout)
	defer cancel()
	dec, schema, err := s.cfg.Registry.DecodeJSON(ctx, val)
	if err != nil {
		return nil, nil, err
	}
	sch = &schemaView{ID: schema.ID, Type: schema.Type}
	sch.Subject, _ = s.cfg.Registry.Subject(&handler.Message{Value: val})
	return dec, sch, nil
}

// maskable returns the values as Config.Mask sees them: each decoded to
// JSON when it is in a schema registry's wire format (decodeValue), so
// that the masked paths, and the values they hold in free text, are found
// in the decoded fields.
func (s *server) maskable(vals ...[]byte) [][]byte {
	out := make([][]byte, len(vals))
	for i, v := range vals {
		out[i] = v
		if dec, _, _ := s.decodeValue(v); dec != nil {
			out[i] = dec
		}
	}
	return out
}
