package failidx

import (
	"errors"

	"github.com/idemhq/idem/internal/seal"
)

// encodeHeaders packs headers into the records table's headers column, in
// seal.AppendHeaders' form: for each header, the uvarint length of its key,
// the key, the uvarint length of its value plus one (0 for a nil value), the
// value.
func encodeHeaders(hs []Header) []byte { return seal.AppendHeaders(make([]byte, 0, 64), hs) }

var errBadHeaders = errors.New("index: headers column does not decode")

// decodeHeaders is encodeHeaders' inverse.
func decodeHeaders(b []byte) ([]Header, error) {
	hs, err := seal.ReadHeaders(b)
	if err != nil {
		return nil, errBadHeaders
	}
	return hs, nil
}
