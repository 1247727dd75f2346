package serde

import (
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
	"unsafe"

	"github.com/hamba/avro/v2"
	"github.com/modern-go/reflect2"
)

// recOrder is the 7-field order of the typed-handler benchmarks (bench/).
type recOrder struct {
	ID        string   `avro:"id"`
	Customer  string   `avro:"customer"`
	Cents     int64    `avro:"cents"`
	Currency  string   `avro:"currency"`
	Items     []string `avro:"items"`
	CreatedAt int64    `avro:"created_at"`
	Note      *string  `avro:"note"`
}

const recOrderSchema = `{"type":"record","name":"Order","namespace":"idem.serdetest","fields":[
	{"name":"id","type":"string"},{"name":"customer","type":"string"},{"name":"cents","type":"long"},
	{"name":"currency","type":"string"},{"name":"items","type":{"type":"array","items":"string"}},
	{"name":"created_at","type":"long"},{"name":"note","type":["null","string"],"default":null}]}`

type recSub struct {
	A int32  `avro:"a"`
	B string `avro:"b"`
}

// recShapes has a field of each kind the record decoder hands to
// hamba/avro or decodes itself.
type recShapes struct {
	Alt    *string          `avro:"alt"`
	Sub    *recSub          `avro:"sub"`
	Raw    *[]byte          `avro:"raw"`
	N      *int64           `avro:"n"`
	Color  string           `avro:"color"`
	Tags   map[string]int64 `avro:"tags"`
	Hash   [4]byte          `avro:"hash"`
	Nested recSub           `avro:"nested"`
	Subs   []recSub         `avro:"subs"`
	Again  *recSub          `avro:"again"`
	Slice  []string         `avro:"slice"`
}

const recShapesSchema = `{"type":"record","name":"Shapes","namespace":"idem.serdetest","fields":[
	{"name":"alt","type":["string","null"]},
	{"name":"sub","type":["null",{"type":"record","name":"Sub","fields":[{"name":"a","type":"int"},{"name":"b","type":"string"}]}]},
	{"name":"raw","type":["null","bytes"]},
	{"name":"n","type":["null","long"]},
	{"name":"color","type":{"type":"enum","name":"Color","symbols":["RED","GREEN","BLUE"]}},
	{"name":"tags","type":{"type":"map","values":"long"}},
	{"name":"hash","type":{"type":"fixed","name":"Hash","size":4}},
	{"name":"nested","type":"Sub"},
	{"name":"subs","type":{"type":"array","items":"Sub"}},
	{"name":"again","type":["null","Sub"]},
	{"name":"slice","type":["null",{"type":"array","items":"string"}]}]}`

// recNode is a recursive record: its field next refers to the record
// itself.
type recNode struct {
	V    int64    `avro:"v"`
	Next *recNode `avro:"next"`
}

const recNodeSchema = `{"type":"record","name":"Node","namespace":"idem.serdetest","fields":[
	{"name":"v","type":"long"},{"name":"next","type":["null","Node"]}]}`

// recPtr returns a pointer to a copy of v.
func recPtr[V any](v V) *V { return &v }

func recOrders() []recOrder {
	return []recOrder{
		{ID: "order-00000001", Customer: "customer-0042", Cents: 125_000, Currency: "EUR",
			Items: []string{"sku-1", "sku-2", "sku-3"}, CreatedAt: 1_780_000_000_000, Note: recPtr("leave at the door")},
		{ID: "order-00000002", Customer: "c", Cents: -1, Currency: "", Items: []string{}, CreatedAt: 0},
		{ID: "", Items: []string{""}, Note: recPtr("")},
	}
}

// recPayloads returns the encodings of values with schema.
func recPayloads[T any](t testing.TB, schema avro.Schema, values []T) [][]byte {
	t.Helper()
	var out [][]byte
	for _, v := range values {
		b, err := avro.Marshal(schema, v)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
	return out
}

// recDecoders returns the record decoder of schema into T and
// hamba/avro's, failing when the record decoder does not stand in.
func recDecoders[T any](t testing.TB, text string) (avro.Schema, avro.ValDecoder, avro.ValDecoder) {
	t.Helper()
	schema, err := avro.ParseWithCache(text, "", &avro.SchemaCache{})
	if err != nil {
		t.Fatal(err)
	}
	ptrType := reflect2.TypeOf((*T)(nil))
	ours := newAvroRecordDecoder(schema, ptrType)
	if ours == nil {
		t.Fatalf("no record decoder for %T", *new(T))
	}
	return schema, ours, avro.DefaultConfig.DecoderOf(schema, ptrType)
}

// decodeAlike decodes payload into two values into returns with both
// decoders and fails unless both fail or both give equal values; it
// returns whether they failed. Their errors are the same but for a payload
// that ends inside a field: the record decoder stops there, truncated,
// while hamba/avro's goes on reading nothing into the later fields, some of
// which report another error then (a fixed: "Hash: unexpected EOF").
func decodeAlike[T any](t testing.TB, ours, hamba avro.ValDecoder, into func() *T, payload []byte) bool {
	t.Helper()
	r := avro.NewReader(nil, 0) // avroDecode bounds it by the payload
	got, want := into(), into()
	gotErr := avroDecode(ours, r, payload, unsafe.Pointer(got))
	wantErr := avroDecode(hamba, r, payload, unsafe.Pointer(want))
	if (gotErr == nil) != (wantErr == nil) ||
		gotErr != nil && !errors.Is(gotErr, io.EOF) && gotErr.Error() != wantErr.Error() {
		t.Fatalf("payload % x: the record decoder's error is %v, hamba/avro's %v", payload, gotErr, wantErr)
	}
	if gotErr == nil && !reflect.DeepEqual(got, want) {
		t.Fatalf("payload % x: the record decoder gives %+v, hamba/avro %+v", payload, *got, *want)
	}
	return gotErr != nil
}

// diffRecords decodes the encodings of values, every prefix of them and
// each into a value that holds another record already (the decoders reuse
// what the pointers point to) with the record decoder and with hamba/avro's,
// and fails where the two differ.
func diffRecords[T any](t *testing.T, text string, values []T) {
	t.Helper()
	schema, ours, hamba := recDecoders[T](t, text)
	payloads := recPayloads(t, schema, values)
	fresh := func() *T { return new(T) }
	for i, p := range payloads {
		if decodeAlike(t, ours, hamba, fresh, p) {
			t.Fatalf("value %d does not decode", i)
		}
		for n := range len(p) {
			if !decodeAlike(t, ours, hamba, fresh, p[:n]) {
				t.Fatalf("value %d cut to %d of its %d bytes decodes", i, n, len(p))
			}
		}
		for j := range values {
			holding := func() *T { v := new(T); *v = deepCopy(t, schema, values[j]); return v }
			decodeAlike(t, ours, hamba, holding, p)
		}
	}
}

// deepCopy returns a copy of v that shares no memory with it (through an
// encoding with schema), so a decode into it leaves v as it was.
func deepCopy[T any](t testing.TB, schema avro.Schema, v T) T {
	t.Helper()
	b, err := avro.Marshal(schema, v)
	if err != nil {
		t.Fatal(err)
	}
	var c T
	if err := avro.Unmarshal(schema, b, &c); err != nil {
		t.Fatal(err)
	}
	return c
}

// The record decoder decodes what hamba/avro's decodes into the same
// values, and fails where it fails, with the same error but for a
// truncation (decodeAlike): whole payloads, every truncation of them,
// union indexes out of range.
func TestAvroRecordDecoderMatchesHamba(t *testing.T) {
	t.Run("order", func(t *testing.T) { diffRecords(t, recOrderSchema, recOrders()) })
	t.Run("shapes", func(t *testing.T) {
		diffRecords(t, recShapesSchema, []recShapes{
			{Alt: recPtr("alt"), Sub: &recSub{A: 7, B: "b"}, Raw: recPtr([]byte{1, 2, 3}), N: recPtr(int64(-9)), Color: "GREEN",
				Tags: map[string]int64{"x": 1, "y": -2}, Hash: [4]byte{1, 2, 3, 4}, Nested: recSub{A: -1, B: "n"},
				Subs: []recSub{{A: 1}, {B: "two"}}, Again: &recSub{A: 3}, Slice: []string{"s"}},
			{Color: "RED", Tags: map[string]int64{}, Subs: []recSub{}},
			{Raw: recPtr([]byte{}), N: recPtr(int64(0)), Color: "BLUE", Tags: map[string]int64{}, Sub: &recSub{}, Subs: []recSub{}, Slice: []string{}},
		})
	})
	t.Run("recursive", func(t *testing.T) {
		diffRecords(t, recNodeSchema, []recNode{{V: 1}, {V: 1, Next: &recNode{V: 2, Next: &recNode{V: 3}}}})
	})
	t.Run("union index out of range", func(t *testing.T) {
		schema, ours, hamba := recDecoders[recOrder](t, recOrderSchema)
		p := recPayloads(t, schema, recOrders()[1:2])[0]     // note nil: it ends with the union index 0
		for _, idx := range []byte{0x04, 0x01, 0x7e, 0x80} { // 2, -1, 63, an int cut short
			bad := append(p[:len(p)-1:len(p)-1], idx, 2, 'x') // then a string "x"
			if !decodeAlike(t, ours, hamba, func() *recOrder { return new(recOrder) }, bad) {
				t.Fatalf("union index byte %#x decodes", idx)
			}
		}
	})
	t.Run("the value a pointer field holds is reused", func(t *testing.T) {
		schema, ours, hamba := recDecoders[recOrder](t, recOrderSchema)
		p := recPayloads(t, schema, recOrders()[:1])[0]
		for _, dec := range []avro.ValDecoder{ours, hamba} {
			held := "held"
			v := recOrder{Note: &held}
			if err := avroDecode(dec, avro.NewReader(nil, 0), p, unsafe.Pointer(&v)); err != nil {
				t.Fatal(err)
			}
			if v.Note != &held || held != *recOrders()[0].Note {
				t.Fatalf("%T: note %p %q, want the held string %p set to the record's", dec, v.Note, *v.Note, &held)
			}
		}
	})
}

// newAvroDecoder takes the record decoder for a writer's schema read as it
// is and a struct that matches it by tags only; any other case is
// hamba/avro's.
func TestAvroRecordDecoderChosen(t *testing.T) {
	evolved := strings.Replace(recOrderSchema, `"default":null}`,
		`"default":null},{"name":"channel","type":"string","default":"web"}`, 1)
	parse := func(text string) avro.Schema {
		s, err := avro.ParseWithCache(text, "", &avro.SchemaCache{})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	chosen := func(writer string, reader avro.Schema, ptrType reflect2.Type) bool {
		t.Helper()
		d := newAvroDecoder(&Schema{ID: 1, Type: typeAvro, Text: writer}, reader, ptrType)
		if d.err != nil {
			t.Fatal(d.err)
		}
		_, ok := d.dec.(*avroRecordDecoder)
		return ok
	}
	orderType := reflect2.TypeOf((*recOrder)(nil))
	note := func(tag string) reflect.StructField {
		return reflect.StructField{Name: "Note", Type: reflect.TypeFor[*string](), Tag: reflect.StructTag(tag)}
	}
	memo := func(tag string) reflect.StructField {
		return reflect.StructField{Name: "Memo", Type: reflect.TypeFor[*string](), Tag: reflect.StructTag(tag)}
	}
	// capital names its note field Note, which an exported Go field can
	// have as its name.
	capital := strings.Replace(recOrderSchema, `"name":"note"`, `"name":"Note"`, 1)
	tests := []struct {
		name    string
		writer  string
		reader  avro.Schema
		ptrType reflect2.Type
		want    bool
	}{
		{"no reader's schema", recOrderSchema, nil, orderType, true},
		{"the writer's schema as the reader's", recOrderSchema, parse(recOrderSchema), orderType, true},
		{"a field more, tagged", recOrderSchema, nil, orderWith(note(`avro:"note"`), memo(`avro:"memo"`)), true},
		{"a tag with a capital", capital, nil, orderWith(note(`avro:"Note"`)), true},
		{"a resolved schema", recOrderSchema, parse(evolved), orderType, false},
		{"an embedded field", recOrderSchema, nil, orderWith(note(`avro:"note"`),
			reflect.StructField{Name: "RecMemo", Type: reflect.TypeFor[*RecMemo](), Anonymous: true}), false},
		{"a field matched by its name", capital, nil, orderWith(note(``)), false},
		{"a schema field the struct lacks", recOrderSchema, nil, orderWith(), false},
		{"a field tagged for JSON only", recOrderSchema, nil, orderWith(note(`json:"note"`)), false},
		{"a tag with an option", recOrderSchema, nil, orderWith(note(`avro:"note,omitempty"`)), false},
		{"two fields with one tag", recOrderSchema, nil, orderWith(note(`avro:"note"`), memo(`avro:"note"`)), false},
		{"a tagged field and one of the tag's name", capital, nil, orderWith(memo(`avro:"Note"`), note(``)), false},
		{"a TextUnmarshaler", recOrderSchema, nil, reflect2.TypeOf((*recOrderText)(nil)), false},
		{"a UnionConverter", recOrderSchema, nil, reflect2.TypeOf((*recOrderUnion)(nil)), false},
		{"a map", recOrderSchema, nil, reflect2.TypeOf((*map[string]any)(nil)), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := chosen(tt.writer, tt.reader, tt.ptrType); got != tt.want {
				t.Fatalf("record decoder chosen: %v, want %v", got, tt.want)
			}
		})
	}

	// What it chooses decodes the order, whether it resolves or not.
	p := recPayloads(t, parse(recOrderSchema), recOrders()[:1])[0]
	for _, reader := range []avro.Schema{nil, parse(evolved)} {
		var got recOrder
		d := newAvroDecoder(&Schema{ID: 1, Type: typeAvro, Text: recOrderSchema}, reader, orderType)
		if err := avroDecode(d.dec, avro.NewReader(nil, 0), p, unsafe.Pointer(&got)); err != nil {
			t.Fatal(err)
		}
		if want := recOrders()[0]; !reflect.DeepEqual(got, want) {
			t.Fatalf("decoded %+v, want %+v", got, want)
		}
	}
}

// RecMemo is embedded in an order (exported: reflect.StructOf embeds no
// unexported type).
type RecMemo struct {
	Memo *string `avro:"memo"`
}

// recOrderText and recOrderUnion are orders that hamba/avro would treat
// as a whole, by their methods.
type (
	recOrderText  recOrder
	recOrderUnion recOrder
)

func (*recOrderText) UnmarshalText([]byte) error { return nil }
func (*recOrderUnion) FromAny(any) error         { return nil }
func (*recOrderUnion) ToAny() (any, error)       { return nil, nil }

// orderWith returns the pointer type of a struct of recOrder's fields but
// its last (note), with last after them.
func orderWith(last ...reflect.StructField) reflect2.Type {
	ot := reflect.TypeFor[recOrder]()
	fields := make([]reflect.StructField, 0, ot.NumField()+len(last))
	for i := range ot.NumField() - 1 {
		fields = append(fields, ot.Field(i))
	}
	return reflect2.Type2(reflect.PointerTo(reflect.StructOf(append(fields, last...))))
}

// FuzzAvroRecordDecoder decodes any bytes as an order with the record
// decoder and with hamba/avro's and fails where the two differ.
func FuzzAvroRecordDecoder(f *testing.F) {
	schema, ours, hamba := recDecoders[recOrder](f, recOrderSchema)
	for _, p := range recPayloads(f, schema, recOrders()) {
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		decodeAlike(t, ours, hamba, func() *recOrder { return new(recOrder) }, payload)
	})
}
