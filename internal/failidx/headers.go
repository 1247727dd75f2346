package failidx

import (
	"encoding/binary"
	"errors"
)

// encodeHeaders packs headers into the records table's headers column: for
// each header, the uvarint length of its key, the key, the uvarint length of
// its value plus one (0 for a nil value), the value.
func encodeHeaders(hs []Header) []byte {
	out := make([]byte, 0, 64)
	for _, h := range hs {
		out = binary.AppendUvarint(out, uint64(len(h.Key)))
		out = append(out, h.Key...)
		if h.Value == nil {
			out = binary.AppendUvarint(out, 0)
			continue
		}
		out = binary.AppendUvarint(out, uint64(len(h.Value))+1)
		out = append(out, h.Value...)
	}
	return out
}

var errBadHeaders = errors.New("index: headers column does not decode")

// decodeHeaders is encodeHeaders' inverse.
func decodeHeaders(b []byte) ([]Header, error) {
	out := []Header{}
	next := func(plusOne bool) ([]byte, error) {
		n, k := binary.Uvarint(b)
		if k <= 0 {
			return nil, errBadHeaders
		}
		b = b[k:]
		if plusOne {
			if n == 0 {
				return nil, nil
			}
			n--
		}
		if n > uint64(len(b)) {
			return nil, errBadHeaders
		}
		v := append([]byte{}, b[:n]...)
		b = b[n:]
		return v, nil
	}
	for len(b) > 0 {
		key, err := next(false)
		if err != nil {
			return nil, err
		}
		value, err := next(true)
		if err != nil {
			return nil, err
		}
		out = append(out, Header{Key: key, Value: value})
	}
	return out, nil
}
