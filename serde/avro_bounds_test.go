package serde

import (
	"encoding/binary"
	"runtime"
	"strings"
	"testing"
	"unsafe"

	"github.com/hamba/avro/v2"
	"github.com/modern-go/reflect2"
)

// avroLong is n as Avro writes a long: zig-zag, then a varint.
func avroLong(n int64) []byte {
	return binary.AppendUvarint(nil, uint64(n<<1^n>>63))
}

// allocated runs f and returns the bytes the process allocated meanwhile.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// A poison record whose array claims far more items than its payload has
// bytes, or whose string claims more bytes, fails to decode before anything
// is allocated for it, on every Avro path: the record decoder, hamba/avro's
// (a resolved schema, a struct it alone matches), and the generic decode
// the console and the CLI display. Unbounded, hamba/avro made the whole
// slice from the block count first: 2^40 items ran the process out of
// memory (a fatal error, found by FuzzAvroRecordDecoder), 2^28 allocated
// 4 GiB. A record whose array does fit its payload still decodes.
func TestAvroArrayCountIsBoundedByThePayload(t *testing.T) {
	schema, err := avro.ParseWithCache(recOrderSchema, "", &avro.SchemaCache{})
	if err != nil {
		t.Fatal(err)
	}
	head := []byte{0, 0, 0, 0} // id "", customer "", cents 0, currency ""
	poisons := map[string][]byte{
		"an array of 2^28 items":   append(append(append([]byte{}, head...), avroLong(1<<28)...), 0),
		"an array of 2^40 items":   append(append(append([]byte{}, head...), avroLong(1<<40)...), 0),
		"a string of 2^30 bytes":   append(avroLong(1<<30), 'x'),
		"a block of -2^28 items":   append(append(append(append([]byte{}, head...), avroLong(-(1<<28))...), avroLong(4)...), 0),
		"an array of 5,000 items":  append(append(append([]byte{}, head...), avroLong(5000)...), 0),
		"items beyond 2 × payload": append(append(append([]byte{}, head...), avroLong(1<<13)...), make([]byte, 4000)...),
	}
	ptrType := reflect2.TypeOf((*recOrder)(nil))
	decoders := map[string]avro.ValDecoder{
		"record decoder": newAvroRecordDecoder(schema, ptrType),
		"hamba/avro's":   avro.DefaultConfig.DecoderOf(schema, ptrType),
	}
	r := avro.NewReader(nil, 0)
	for name, payload := range poisons {
		for dname, dec := range decoders {
			var err error
			if n := allocated(func() { err = avroDecode(dec, r, payload, unsafe.Pointer(new(recOrder))) }); n > 64<<20 {
				t.Errorf("%s, %s: a %d-byte payload allocated %d MiB", name, dname, len(payload), n>>20)
			}
			if err == nil || !strings.Contains(err.Error(), "does not decode") {
				t.Errorf("%s, %s: err = %v, want a decode error", name, dname, err)
			}
		}
		var v any
		if n := allocated(func() { err = avroUnmarshal(schema, payload, &v) }); n > 64<<20 {
			t.Errorf("%s, generic: a %d-byte payload allocated %d MiB", name, len(payload), n>>20)
		}
		if err == nil {
			t.Errorf("%s, generic: decoded %v", name, v)
		}
	}
	items := make([]string, 3000) // 3,000 one-byte items: in a 3 KiB payload, above the least bound
	body, err := avro.Marshal(schema, recOrder{Items: items})
	if err != nil {
		t.Fatal(err)
	}
	for dname, dec := range decoders {
		var got recOrder
		if err := avroDecode(dec, r, body, unsafe.Pointer(&got)); err != nil || len(got.Items) != len(items) {
			t.Errorf("%s: a record of %d items decodes to %d, %v", dname, len(items), len(got.Items), err)
		}
	}
}
